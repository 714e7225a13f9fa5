-- settle_owned_delivered: settle_delivered.sql for bucket leases (claim_owned.sql; docs/adr/
-- 0003-bucket-leases.md, plan step 2): the delivered rows are deleted only in buckets the relay
-- still owns at the epochs it holds them by, taken FOR SHARE in outbox.bucket_owners, so a
-- move of a bucket (outbox.coordinate updates its row) waits for the settle under way, and a
-- settle after it finds the new epoch and writes nothing there: the new owner delivers those
-- rows again, as after a lease that ran out. No token, no lease record. Key wakes as
-- settle_delivered.sql's.
--   $1 ids of the delivered messages   $2 owned buckets ('{1,5,9}')   $3 their epochs
--   $4 the relay's instance id (also woke_elsewhere's settler)
-- Returns settle_delivered.sql's columns; the fenced are the ids neither deleted nor gone.
WITH settler AS (
  SELECT $4::text AS instance_id
),
-- @include fenced_buckets.sql
, input AS (
  SELECT DISTINCT unnest($1::bigint[]) AS id
), delivered AS (
  -- The fence as an array: as a join (USING fence), the delete walked each bucket's index
  -- (19 ms for 500 rows, ADR 0003); as an array it probes the primary key.
  DELETE FROM outbox.messages m
  WHERE m.id = ANY ($1::bigint[]) AND m.bucket = ANY (ARRAY(SELECT bucket FROM fence))
  RETURNING m.id, m.destination, m.ordering_key, m.endpoint_id, NULL::uuid AS token
), left_queue AS (
  SELECT id, destination, ordering_key, endpoint_id, token FROM delivered
), settled AS (
  -- No lease records to count down.
  SELECT token FROM delivered WHERE false
), matched AS (
  SELECT (SELECT count(*) FROM input) = (SELECT count(*) FROM delivered) AS all_inputs
),
-- @include settle_wakes_and_leases.sql
-- @include deliveries_settled.sql
