-- claim_partitioned: claim.sql for claim_mode: partitioned. Scans only the buckets this relay
-- still owns at the epochs it knows (a relay whose buckets moved claims nothing from them),
-- one bucket at a time through messages_fresh_bucket_idx, so no scan walks rows of other
-- relays and there is nothing to skip. FOR UPDATE SKIP LOCKED stays as a guard for the
-- moment of a handover.
--   $1 destination   $2 fresh-lane cursor (exclusive)   $3 fresh-lane limit per bucket
--   $4 slow-lane limit   $5 lease token (uuid)   $6 lease duration in milliseconds
--   $7 relay instance id   $8 owned buckets ('{1,5,9}')   $9 their epochs ('{3,3,4}')
WITH owned AS (
  SELECT o.bucket
  FROM outbox.bucket_owners o
  JOIN unnest($8::integer[], $9::bigint[]) AS mine(bucket, epoch)
    ON o.bucket = mine.bucket AND o.epoch = mine.epoch
  WHERE o.owner = $7::uuid
), fresh AS (
  SELECT f.id, f.destination, f.ordering_key, f.deliver_after, f.bucket
  FROM owned CROSS JOIN LATERAL (
    SELECT m.id, m.destination, m.ordering_key, m.deliver_after, m.bucket
    FROM outbox.messages m
    WHERE m.destination = $1 AND m.bucket = owned.bucket AND m.id > $2
      AND NOT m.parked AND m.lease_owner IS NULL
    ORDER BY m.id
    LIMIT $3
    FOR UPDATE SKIP LOCKED
  ) f
), slow AS (
  SELECT m.id, m.destination, m.ordering_key, m.deliver_after, m.bucket
  FROM outbox.messages m
  WHERE m.destination = $1 AND m.parked AND m.deliver_after <= now() AND m.lease_owner IS NULL
    AND m.bucket IN (SELECT bucket FROM owned)
  ORDER BY m.deliver_after, m.id
  LIMIT $4
  FOR UPDATE SKIP LOCKED
), scan AS (
  SELECT id, destination, ordering_key, deliver_after FROM fresh
  UNION ALL SELECT id, destination, ordering_key, deliver_after FROM slow
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
         -- The cursor may pass no bucket whose scan stopped at its limit.
         (SELECT min(top) FROM (SELECT max(id) AS top FROM fresh GROUP BY bucket
                                HAVING count(*) >= $3) full_buckets) AS fresh_full_bound,
         (SELECT count(*) FROM held) AS held,
         (SELECT coalesce(jsonb_agg(DISTINCT blocked_key), '[]'::jsonb) FROM held
           WHERE blocked_key IS NOT NULL)::text AS blocked_keys
)
SELECT f.seq_value, f.snap_xmin, f.own_xid, f.fresh_scanned, f.fresh_full_bound, f.held, f.blocked_keys,
       l.id, l.ordering_key, l.idempotency_key, l.event_type, l.headers, l.payload,
       l.payload_bytes, l.attempts, l.created_us
FROM facts f LEFT JOIN leased l ON true
ORDER BY l.id
