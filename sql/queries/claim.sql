-- claim: lease the next deliverable messages of one destination, from both lanes, in one
-- statement. See docs/adr/0001-claim-path.md.
--   $1 destination   $2 fresh-lane cursor (exclusive)   $3 fresh-lane limit
--   $4 slow-lane limit   $5 lease token (uuid)   $6 lease duration in milliseconds
-- Returns one row of snapshot facts (for the cursor) joined to every leased message.
WITH fresh AS (
  SELECT m.id, m.destination, m.ordering_key, m.deliver_after
  FROM outbox.messages m
  WHERE m.destination = $1 AND m.id > $2 AND NOT m.parked AND m.lease_owner IS NULL
  ORDER BY m.id
  LIMIT $3
  FOR UPDATE SKIP LOCKED
), slow AS (
  SELECT m.id, m.destination, m.ordering_key, m.deliver_after
  FROM outbox.messages m
  WHERE m.destination = $1 AND m.parked AND m.deliver_after <= now() AND m.lease_owner IS NULL
  ORDER BY m.deliver_after, m.id
  LIMIT $4
  FOR UPDATE SKIP LOCKED
), scan AS (
  SELECT * FROM fresh UNION ALL SELECT * FROM slow
),
-- @include claim_settle_scan.sql
), facts AS (
  SELECT (SELECT CASE WHEN is_called THEN last_value ELSE last_value - 1 END
            FROM outbox.messages_id_seq) AS seq_value,
         pg_snapshot_xmin(pg_current_snapshot())::text AS snap_xmin,
         -- An xid assigned now, after the previous claim read its sequence value: every
         -- transaction that took an id up to that value holds a smaller xid (ADR 0001).
         pg_current_xact_id()::text AS own_xid,
         (SELECT count(*) FROM fresh) AS fresh_scanned,
         -- The cursor may not pass what a scan that stopped at its limit did not reach.
         CASE WHEN (SELECT count(*) FROM fresh) >= $3 THEN (SELECT max(id) FROM fresh) END
           AS fresh_full_bound,
         (SELECT count(*) FROM held) AS held,
         (SELECT coalesce(jsonb_agg(DISTINCT blocked_key), '[]'::jsonb) FROM held
           WHERE blocked_key IS NOT NULL)::text AS blocked_keys
)
SELECT f.seq_value, f.snap_xmin, f.own_xid, f.fresh_scanned, f.fresh_full_bound, f.held, f.blocked_keys,
       l.id, l.ordering_key, l.idempotency_key, l.event_type, l.headers, l.payload,
       l.payload_bytes, l.attempts, l.created_us
FROM facts f LEFT JOIN leased l ON true
ORDER BY l.id
