-- settle_delivered: settle.sql for what nearly every settle is, a batch of plain deliveries
-- with the archive off: the same outcome as settle.sql given those ids and tokens ($3, $4
-- there; $1 '[]', $2 false), without the machinery of the other outcomes. Its DELETE returns
-- the few columns the key wakes and the lease records need, where settle.sql's returns whole
-- messages (for the archive and for fan-outs) into a CTE that every later part reads.
--   $1 ids and $2 lease tokens (parallel arrays) of the delivered messages
--   $3 text: the settling relay's instance id in partitioned mode, else '' (woke_elsewhere)
-- Returns settle.sql's columns: delivered, woken, woke_others, gone and written say what they
-- say there; the other outcomes are 0 and nothing is deferred.
WITH settler AS (
  SELECT $3::text AS instance_id
), input AS (
  SELECT d.id, d.token FROM unnest($1::bigint[], $2::uuid[]) AS d(id, token)
), delivered AS (
  DELETE FROM outbox.messages m USING input i
  WHERE m.id = i.id AND m.lease_owner = i.token
  RETURNING m.id, m.destination, m.ordering_key, m.endpoint_id, i.token
), left_queue AS (
  SELECT id, destination, ordering_key, endpoint_id, token FROM delivered
), settled AS (
  SELECT token FROM delivered
), matched AS (
  SELECT (SELECT count(*) FROM input) = (SELECT count(*) FROM delivered) AS all_inputs
),
-- @include settle_wakes_and_leases.sql
-- @include deliveries_settled.sql
