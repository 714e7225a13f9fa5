-- claim_partitioned: claim.sql for claim_mode: partitioned. Scans only the buckets this relay
-- still owns at the epochs it knows (a relay whose buckets moved claims nothing from them),
-- one bucket at a time through messages_fresh_bucket_idx, so no scan walks rows of other
-- relays. FOR UPDATE SKIP LOCKED keeps apart the claim loops of one relay
-- (claim_connections), which share its buckets, and guards the moment of a handover.
--   $1 destination   $2 fresh-lane cursor (exclusive)   $3 fresh-lane limit (the whole claim's)
--   $4 slow-lane limit   $5 lease token (uuid)   $6 lease duration in milliseconds
--   $7 relay instance id   $8 owned buckets ('{1,5,9}')   $9 their epochs ('{3,3,4}')
WITH owned AS (
  SELECT o.bucket
  FROM outbox.bucket_owners o
  JOIN unnest($8::integer[], $9::bigint[]) AS mine(bucket, epoch)
    ON o.bucket = mine.bucket AND o.epoch = mine.epoch
  WHERE o.owner = $7::uuid
  UNION ALL
  -- Buckets are owned across destinations: a bucket whose owner does not serve this
  -- destination (its heartbeat lists others) is claimed by every relay that does, as
  -- skip_locked would; its messages of this destination were claimed by nobody otherwise
  -- (tests/store/coordinate_pgtest.cc). Not by an exactly-once relay, whose producers are
  -- per owned bucket: there every relay must serve the same destinations (docs/scaling.md).
  -- (As an array unnested: a subquery's estimate here grew the claim's, and the lease UPDATE
  -- then hashed the whole queue to join its batch, tests/store/claim_plan_pgtest.cc.)
  SELECT unnest(ARRAY(
    SELECT o.bucket
    FROM outbox.bucket_owners o
    WHERE o.owner <> $7::uuid
      AND EXISTS (SELECT 1 FROM outbox.relay_heartbeats h
                  WHERE h.instance_id = o.owner AND NOT ($1 = ANY (h.destinations)))
      AND NOT coalesce((SELECT r.exactly_once FROM outbox.relay_instances r
                        WHERE r.instance_id = $7::uuid), false)))
), shares AS MATERIALIZED (
  -- Each lane's limit split evenly over the buckets scanned, rounded up: those of others
  -- above count too, or a relay owning 4 buckets beside 48 such locked and read 52 shares of
  -- a quarter of its limit each (review).
  SELECT ($3::integer + n - 1) / n AS fresh, ($4::integer + n - 1) / n AS slow
  FROM (SELECT greatest(count(*), 1)::integer AS n FROM owned) buckets
), fresh_scanned AS (
  SELECT f.id, f.destination, f.ordering_key, f.endpoint_id, f.deliver_after, f.bucket
  FROM owned CROSS JOIN LATERAL (
    SELECT m.id, m.destination, m.ordering_key, m.endpoint_id, m.deliver_after, m.bucket
    FROM outbox.messages m
    -- id > $2 written as (bucket, id) > (owned.bucket, $2), the same with bucket fixed: a
    -- bound messages_fresh_bucket_idx can start at, but the primary key cannot. With `id > $2`
    -- the planner, seeing the primary key in heap order, walked it from the cursor and
    -- filtered on the bucket when buckets were few: every bucket's scan read all buckets' rows
    -- (tests/store/claim_plan_pgtest.cc).
    WHERE m.destination = $1 AND m.bucket = owned.bucket AND (m.bucket, m.id) > (owned.bucket, $2)
      AND NOT m.parked AND m.lease_owner IS NULL
    ORDER BY m.id
    LIMIT (SELECT fresh FROM shares)
    FOR UPDATE SKIP LOCKED
  ) f
), fresh AS (
  -- At most the batch the relay asked for, however many buckets it shares (they took a share
  -- each too) and however the shares round up: the relay asked for $3 a bucket once, so a
  -- claim for 1 over 64 buckets leased 64, and one sharing buckets many times the sink's room
  -- (review). The lowest ids are kept; the rest, locked only until this statement commits,
  -- are scanned again by the next claim (`bound`).
  SELECT * FROM fresh_scanned
  ORDER BY id
  LIMIT $3
), slow_scanned AS (
  -- The slow lane (rows parked for a retry or a later time, now due) the same way, each owned
  -- bucket through messages_parked_bucket_idx (migration 0028): through messages_parked_idx
  -- and a filter on the bucket, a claim read every due row of other relays' buckets that fell
  -- due before its own (tests/store/claim_plan_pgtest.cc).
  SELECT s.id, s.destination, s.ordering_key, s.endpoint_id, s.deliver_after, s.bucket
  FROM owned CROSS JOIN LATERAL (
    SELECT m.id, m.destination, m.ordering_key, m.endpoint_id, m.deliver_after, m.bucket
    FROM outbox.messages m
    WHERE m.destination = $1 AND m.bucket = owned.bucket AND m.parked
      AND m.deliver_after <= now() AND m.lease_owner IS NULL
    ORDER BY m.deliver_after, m.id
    LIMIT (SELECT slow FROM shares)
    FOR UPDATE SKIP LOCKED
  ) s
), slow AS (
  -- At most $4, the earliest due kept; the rest are claimed next time.
  SELECT * FROM slow_scanned
  ORDER BY deliver_after, id
  LIMIT $4
), scan AS (
  SELECT id, destination, ordering_key, endpoint_id, deliver_after FROM fresh
  UNION ALL SELECT id, destination, ordering_key, endpoint_id, deliver_after FROM slow
), bound AS (
  -- The cursor may pass no bucket whose scan stopped at its limit, nor a row the cap above
  -- left out (all above the highest id it kept).
  SELECT least((SELECT min(top) FROM (SELECT max(id) AS top FROM fresh_scanned GROUP BY bucket
                                      HAVING count(*) >= (SELECT fresh FROM shares))
                                     full_buckets),
               CASE WHEN (SELECT count(*) FROM fresh_scanned) > (SELECT count(*) FROM fresh)
                    THEN (SELECT max(id) FROM fresh) END) AS fresh_full_bound,
         -- More may be due: a bucket's slow scan stopped at its share, or the cap left rows
         -- out. A claim can stop at one bucket's share with far fewer rows than $4 (all the
         -- due rows in one bucket), so the relay cannot tell this from the count it got.
         (SELECT count(*) FROM slow_scanned) > (SELECT count(*) FROM slow)
           OR EXISTS (SELECT 1 FROM slow_scanned GROUP BY bucket
                      HAVING count(*) >= (SELECT slow FROM shares))
           AS slow_full,
         -- The buckets scanned: besides the relay's own, those of owners whose heartbeat says
         -- they do not serve the destination, which come and go without the relay's own
         -- buckets changing. The cursor passed only rows of the buckets scanned (claim_loop.cc).
         (SELECT coalesce(string_agg(bucket::text, ',' ORDER BY bucket), '') FROM owned)
           AS scanned_buckets
),
-- @include claim_settle_scan.sql
