-- claim_owned: the claim of bucket leases (docs/adr/0003-bucket-leases.md, plan step 2), for a
-- relay that owns every bucket it claims from: ownership of a bucket at its epoch is the lease
-- of its rows, so this statement only reads (claim.sql locks each row, leases it with an
-- UPDATE and records the lease). Not used by the relay yet: the dispatcher's side (what it
-- holds in memory, the handover of a bucket) is the ADR's step 3; outbox-bench's
-- sql_bucket_leases runs it through Store::ClaimOwned.
-- One plain scan from the cursor, the rows of buckets not owned at the epochs given filtered
-- out: the form for a relay owning all of a destination's buckets (a run per owned bucket is the
-- form for one owning a few, ADR 0003). What the relay already holds the cursor has passed; a
-- lane started over reads it again, and the relay drops what it holds.
-- Each row says whether it is ready (due, read off the clock once, and the head of its key: no
-- earlier message of the key still queued, as claim_settle_scan.sql decides). What is not
-- ready, and what the slow lane hands out, Store::ClaimOwned writes next with
-- claim_owned_hold.sql: the rare path. Deciding it here in CTEs and writing it in the same
-- statement cost 1.0-1.7 ms of Postgres CPU per claim of 500 unkeyed rows, where there was
-- nothing to write (ADR 0003, session 33).
--   $1 destination   $2 fresh-lane cursor (exclusive)   $3 fresh-lane limit
--   $4 slow-lane limit   $5 relay instance id   $6 owned buckets ('{1,5,9}')
--   $7 their epochs ('{3,3,4}')
-- Returns claim.sql's columns (held 0, blocked_keys '[]') and, per message, `due` and `ready`.
WITH
-- @include owned_buckets.sql
, me AS MATERIALIZED (
  -- This statement's xid, taken first, and its snapshot.
  SELECT pg_current_xact_id() AS xid, pg_current_snapshot() AS snap
), mine AS MATERIALIZED (
  -- The buckets to read, as an array; none when the relay owns them all (the form this plain
  -- scan is for), so that no row is checked against every bucket.
  SELECT CASE WHEN (SELECT count(*) FROM owned) < (SELECT p.bucket_count FROM outbox.partitioning p)
              THEN ARRAY(SELECT bucket FROM owned) END AS buckets,
  -- The cursor's snap_xmin, here to be read before the scans (the fresh lane reads `mine`
  -- first): the oldest transaction older than this statement's that may still commit queue
  -- rows this snapshot does not see, or this statement's own xid when there is none. Those are
  -- the snapshot's xip and the xids from its xmax up to ours (taken after the snapshot, though
  -- perhaps before by others); passed over are the settles of bucket-lease relays (their
  -- backends registered by Store::SettleOwned in outbox.bucket_lease_settlers, migration 0038:
  -- by (pid, backend_start), which no session chooses, where a name any session may take let
  -- a producer's transaction be passed over), which write no queue rows, found by their
  -- backends' xids. A settle that finished in between is not found, and counts as any
  -- transaction (it held the cursor back before). Those settles overlap the claims all the
  -- time: counted, they held the cursor back at every other claim, which read the last one's
  -- rows again (a third of a 100k drain's claims brought nothing new). FreshCursor passes a
  -- checkpoint only when its xid is at most this value (docs/adr/0001-claim-path.md).
         (SELECT coalesce(min(r.x), (SELECT xid FROM me))
          FROM (SELECT x FROM pg_snapshot_xip((SELECT snap FROM me)) x
                UNION ALL
                SELECT g::text::xid8
                FROM generate_series(pg_snapshot_xmax((SELECT snap FROM me))::text::bigint,
                                     (SELECT xid FROM me)::text::bigint - 1) g) r
          -- (xid is 32 bits, xid8 64: compared modulo 2^32, as a cast of xid8 text to xid fails
          -- past the first wraparound on PostgreSQL 16 and later.)
          WHERE r.x::text::bigint % 4294967296 <> ALL (ARRAY(
            SELECT a.backend_xid::text::bigint FROM pg_stat_get_activity(NULL) a
            JOIN outbox.bucket_lease_settlers s
              ON s.pid = a.pid AND s.backend_start = a.backend_start
            WHERE a.backend_xid IS NOT NULL))) AS snap_xmin
), fresh AS (
  SELECT m.id, m.ordering_key, m.idempotency_key, m.event_type, m.headers, m.payload,
         m.payload_bytes, m.attempts, m.parked, m.endpoint_id, m.bucket, m.created_at,
         m.absent_as_of, d.due,
         d.due AND (m.ordering_key IS NULL OR NOT EXISTS (
           SELECT 1 FROM outbox.messages p
           WHERE p.destination = m.destination AND p.ordering_key = m.ordering_key
             AND p.endpoint_id IS NOT DISTINCT FROM m.endpoint_id AND p.id < m.id)) AS ready
  FROM outbox.messages m
  CROSS JOIN LATERAL (SELECT m.deliver_after <= clock_timestamp() AS due) d
  -- As claim.sql: a range over messages_fresh_idx's columns, so a generic plan walks that
  -- index from the cursor.
  WHERE (m.destination, m.id) > ($1, $2) AND m.destination <= $1 AND NOT m.parked
    AND ((SELECT buckets FROM mine) IS NULL OR m.bucket = ANY ((SELECT buckets FROM mine)::integer[]))
  ORDER BY m.destination, m.id
  LIMIT $3
), slow AS (
  SELECT m.id, m.ordering_key, m.idempotency_key, m.event_type, m.headers, m.payload,
         m.payload_bytes, m.attempts, m.parked, m.endpoint_id, m.bucket, m.created_at,
         m.absent_as_of, true AS due,
         m.ordering_key IS NULL OR NOT EXISTS (
           SELECT 1 FROM outbox.messages p
           WHERE p.destination = m.destination AND p.ordering_key = m.ordering_key
             AND p.endpoint_id IS NOT DISTINCT FROM m.endpoint_id AND p.id < m.id) AS ready
  FROM outbox.messages m
  WHERE m.destination = $1 AND m.parked AND m.deliver_after <= now()
    AND ((SELECT buckets FROM mine) IS NULL OR m.bucket = ANY ((SELECT buckets FROM mine)::integer[]))
  ORDER BY m.deliver_after, m.id
  LIMIT $4
), facts AS (
  -- As claim_settle_scan.sql's, but for snap_xmin (read in `mine`, above).
  SELECT coalesce(pg_sequence_last_value('outbox.messages_id_seq'), 0) AS seq_value,
         (SELECT g.snap_xmin FROM mine g)::text AS snap_xmin,
         pg_current_xact_id()::text AS own_xid,
         (SELECT count(*) FROM fresh) AS fresh_scanned,
         CASE WHEN (SELECT count(*) FROM fresh) >= $3 THEN (SELECT max(id) FROM fresh) END
           AS fresh_full_bound,
         $4 > 0 AND (SELECT count(*) FROM slow) >= $4 AS slow_full
)
SELECT f.seq_value, f.snap_xmin, f.own_xid, f.fresh_scanned, f.fresh_full_bound, f.slow_full,
       0::bigint AS held, '[]'::text AS blocked_keys, NULL::text AS scanned_buckets,
       s.id, s.ordering_key, s.idempotency_key, s.event_type, s.headers, s.payload,
       s.payload_bytes, s.attempts, s.parked, s.endpoint_id, s.bucket,
       (extract(epoch FROM s.created_at) * 1000000)::bigint AS created_us,
       (extract(epoch FROM s.absent_as_of) * 1000000)::bigint AS absent_as_of_us, s.due, s.ready
FROM facts f LEFT JOIN (SELECT * FROM fresh UNION ALL SELECT * FROM slow) s ON true
