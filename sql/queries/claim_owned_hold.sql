-- claim_owned_hold: what claim_owned.sql found and did not hand out, and what its slow lane
-- handed out, written by Store::ClaimOwned right after it (docs/adr/0003-bucket-leases.md;
-- only when there is any: keyed rows behind their key, rows not yet due, retries). In the
-- buckets the relay still owns at the epochs it holds them by.
-- - A due row behind an earlier message of its key is parked at 'infinity', where the settle of
--   that message wakes it; if that message is gone by now (its settle committed since the
--   claim), it is parked due now instead, for the next claim's slow lane.
-- - A row not yet due is parked with its deliver_after, for the slow lane to find then.
-- - A row the slow lane handed out is held by moving its deliver_after a lease ahead (no lease
--   owner, no lease record): the next claims pass it, and if the relay dies it comes due again.
-- The claim loop of a destination must be its only one (claim_connections 1): the hold is a
-- statement after the claim, not a lock taken by it.
--   $1 ids due and behind their key   $2 ids not due   $3 ids the slow lane handed out
--   $4 lease duration in milliseconds   $5 relay instance id   $6 owned buckets   $7 epochs
-- Returns each row written: its id, and for a row parked at 'infinity' its key and endpoint
-- (claim.sql's blocked_keys: the relay rechecks them, as a settle may have committed after
-- this statement's snapshot without seeing the row parked).
WITH
-- @include owned_buckets.sql
, blocked AS (
  UPDATE outbox.messages m
  SET parked = true,
      deliver_after = CASE WHEN EXISTS (
                        SELECT 1 FROM outbox.messages p
                        WHERE p.destination = m.destination AND p.ordering_key = m.ordering_key
                          AND p.endpoint_id IS NOT DISTINCT FROM m.endpoint_id AND p.id < m.id)
                      THEN 'infinity'::timestamptz ELSE clock_timestamp() END
  WHERE m.id = ANY ($1::bigint[]) AND m.bucket = ANY (ARRAY(SELECT bucket FROM owned))
  RETURNING m.id, CASE WHEN m.deliver_after = 'infinity' THEN m.ordering_key END AS blocked_key,
            m.endpoint_id
), later AS (
  UPDATE outbox.messages m
  SET parked = true
  WHERE m.id = ANY ($2::bigint[]) AND m.bucket = ANY (ARRAY(SELECT bucket FROM owned))
  RETURNING m.id
), taken AS (
  UPDATE outbox.messages m
  SET deliver_after = clock_timestamp() + make_interval(secs => $4::bigint / 1000.0)
  WHERE m.id = ANY ($3::bigint[]) AND m.parked AND m.bucket = ANY (ARRAY(SELECT bucket FROM owned))
  RETURNING m.id
)
SELECT id, blocked_key, endpoint_id FROM blocked
UNION ALL SELECT id, NULL, NULL FROM later
UNION ALL SELECT id, NULL, NULL FROM taken
