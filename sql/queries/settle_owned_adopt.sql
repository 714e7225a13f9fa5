-- settle_owned_adopt: the first statement of Store::SettleOwned's transaction for what is not
-- a plain delivery under bucket leases (docs/adr/0003-bucket-leases.md): retries, releases and
-- dead letters, the rare outcomes. The rows of buckets the relay still owns at the epochs it
-- holds them by (taken FOR SHARE in outbox.bucket_owners until the transaction ends, as
-- settle_owned_delivered.sql takes them) get the lease token $2 for this transaction, and
-- settle.sql then writes their outcomes as under row leases, fenced by that token: a row of a
-- bucket that moved has no such lease, and its outcome is fenced. settle.sql clears the lease
-- as it writes each outcome, before this transaction commits; no lease record is written.
--   $1 ids   $2 owned buckets ('{1,5,9}')   $3 their epochs   $4 the relay's instance id
--   $5 lease token (uuid)
-- Returns the ids that got the token.
WITH
-- @include fenced_buckets.sql
UPDATE outbox.messages m
SET lease_owner = $5::uuid, lease_until = clock_timestamp() + interval '1 minute'
WHERE m.id = ANY ($1::bigint[]) AND m.bucket = ANY (ARRAY(SELECT bucket FROM fence))
RETURNING m.id
