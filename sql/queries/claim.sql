-- claim: lease the next deliverable messages of one destination, from both lanes, in one
-- statement. See docs/adr/0001-claim-path.md.
--   $1 destination   $2 fresh-lane cursor (exclusive)   $3 fresh-lane limit
--   $4 slow-lane limit   $5 lease token (uuid)   $6 lease duration in milliseconds
-- Returns one row of snapshot facts (for the cursor) joined to every leased message.
WITH fresh AS (
  SELECT m.id, m.destination, m.ordering_key, m.endpoint_id, m.deliver_after
  FROM outbox.messages m
  -- destination = $1 AND id > $2, written as a range over messages_fresh_idx's columns: a
  -- plan that does not know the destination (a generic plan) then has no way to walk the
  -- primary key from the cursor and filter on destination instead, which for a quiet
  -- destination beside a busy one meant reading the busy one's whole backlog per claim
  -- (tests/store/claim_plan_pgtest.cc). With `destination = $1` the planner treats the
  -- destination as a constant, and the primary key's id order then satisfies the ORDER BY.
  WHERE (m.destination, m.id) > ($1, $2) AND m.destination <= $1
    AND NOT m.parked AND m.lease_owner IS NULL
  ORDER BY m.destination, m.id
  LIMIT $3
  FOR UPDATE SKIP LOCKED
), slow AS (
  SELECT m.id, m.destination, m.ordering_key, m.endpoint_id, m.deliver_after
  FROM outbox.messages m
  WHERE m.destination = $1 AND m.parked AND m.deliver_after <= now() AND m.lease_owner IS NULL
  ORDER BY m.deliver_after, m.id
  LIMIT $4
  FOR UPDATE SKIP LOCKED
), scan AS (
  SELECT * FROM fresh UNION ALL SELECT * FROM slow
), bound AS (
  -- The cursor may not pass what a scan that stopped at its limit did not reach.
  SELECT CASE WHEN (SELECT count(*) FROM fresh) >= $3 THEN (SELECT max(id) FROM fresh) END
           AS fresh_full_bound,
         -- More may be due: the slow scan stopped at its limit.
         $4 > 0 AND (SELECT count(*) FROM slow) >= $4 AS slow_full,
         NULL::text AS scanned_buckets  -- every bucket (claim_partitioned.sql says which)
),
-- @include claim_settle_scan.sql
