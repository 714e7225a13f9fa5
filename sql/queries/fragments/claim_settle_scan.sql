-- Fragment of claim.sql and claim_partitioned.sql, spliced in where they say
-- `-- @include claim_settle_scan.sql`: given `fresh` and `scan` (the candidate rows, locked)
-- and `bound` (how far the fresh scan looked; whether the slow scan stopped at its limit),
-- lease the ready rows, park the rest, and return the facts the fresh-lane cursor and the
-- claim loop need with every leased row. Not a statement on its own; it ends the statement. `scan` has id, destination, ordering_key, endpoint_id and
-- deliver_after.
timed AS MATERIALIZED (
  -- Whether each row is due, read off the clock once: clock_timestamp(), not now(), since a
  -- row committed between this transaction's start and its snapshot is visible and due
  -- though its deliver_after may be later than now(). Read once because the lease and the
  -- park below must agree: reading the clock again in the park let a row that fell due in
  -- between be parked at 'infinity' as if blocked behind its key, and without a key nothing
  -- ever woke it.
  SELECT s.id, s.destination, s.ordering_key, s.endpoint_id,
         s.deliver_after <= clock_timestamp() AS due
  FROM scan s
), classified AS MATERIALIZED (
  -- Ready: due, and the head of its key: no earlier message of the key is still in the
  -- queue (pending, leased or waiting for a retry). A key is the ordering key within its
  -- endpoint (none for the application's messages): an endpoint's row is keyed
  -- "<endpoint>:<key>", and an application may key a message with the same text.
  SELECT t.id, t.ordering_key, t.endpoint_id, t.due,
         t.due AND (t.ordering_key IS NULL OR NOT EXISTS (
           SELECT 1 FROM outbox.messages p
           WHERE p.destination = t.destination AND p.ordering_key = t.ordering_key
             AND p.endpoint_id IS NOT DISTINCT FROM t.endpoint_id AND p.id < t.id)) AS ready
  FROM timed t
), leased AS (
  UPDATE outbox.messages m
  SET lease_owner = $5::uuid,
      lease_until = clock_timestamp() + make_interval(secs => $6::bigint / 1000.0)
  FROM classified r
  WHERE m.id = r.id AND r.ready
  -- The columns a row's life changes, as leased (a row that another relay claimed and handed
  -- back after this statement's snapshot is leased as it is now, with its new attempts); the
  -- message itself is read once, by the final SELECT. Returned here, every claimed payload
  -- was copied into this CTE's store and read back out: ~2 us of Postgres per message in
  -- kafka_drain (docs/benchmarks.md, session 30).
  RETURNING m.id, m.ordering_key, m.endpoint_id, m.attempts, m.parked, m.bucket,
            (extract(epoch FROM m.absent_as_of) * 1000000)::bigint AS absent_as_of_us
), held AS (
  -- Not ready: park it. A row that is due but blocked behind its key waits at 'infinity'
  -- until settling the earlier message wakes it (settle.sql).
  UPDATE outbox.messages m
  SET parked = true,
      deliver_after = CASE WHEN c.due THEN 'infinity'::timestamptz ELSE m.deliver_after END
  FROM classified c
  WHERE m.id = c.id AND NOT c.ready
  RETURNING m.id, CASE WHEN c.due THEN m.ordering_key END AS blocked_key, m.endpoint_id
), recorded AS (
  -- The record the reaper finds these leases by (migration 0011), ending no earlier than any
  -- of them: clock_timestamp() has moved on since `leased` read it.
  INSERT INTO outbox.leases (token, lease_until, ids, remaining)
  SELECT $5::uuid, clock_timestamp() + make_interval(secs => $6::bigint / 1000.0), array_agg(id),
         count(*)
  FROM leased
  HAVING count(*) > 0
), facts AS (
  -- The highest id handed out, read under the sequence's buffer lock. Not `SELECT last_value
  -- FROM outbox.messages_id_seq`: a heap scan reads the tuple after releasing that lock, and
  -- every 32nd nextval (the one that WAL-logs ahead) writes last_value + 32 there until its
  -- WAL record is in; a claim that read it would let the cursor pass ids not handed out yet.
  -- (Not observed on 2 cores; see tests/store/store_pgtest.cc.)
  SELECT coalesce(pg_sequence_last_value('outbox.messages_id_seq'), 0) AS seq_value,
         pg_snapshot_xmin(pg_current_snapshot())::text AS snap_xmin,
         -- An xid assigned now, after the previous claim read its sequence value: every
         -- transaction that took an id up to that value holds a smaller xid (ADR 0001).
         pg_current_xact_id()::text AS own_xid,
         (SELECT count(*) FROM fresh) AS fresh_scanned,
         (SELECT fresh_full_bound FROM bound) AS fresh_full_bound,
         (SELECT slow_full FROM bound) AS slow_full,
         (SELECT scanned_buckets FROM bound) AS scanned_buckets,
         (SELECT count(*) FROM held) AS held,
         -- [[key, endpoint or null], ...]: keys whose predecessor's settle may have committed
         -- after this snapshot without seeing the rows parked here (wake_keys.sql). Not a key
         -- whose head this claim leased: its settle comes after this commits, and wakes the
         -- next itself.
         (SELECT coalesce(jsonb_agg(DISTINCT jsonb_build_array(h.blocked_key, h.endpoint_id)),
                          '[]'::jsonb) FROM held h
           WHERE h.blocked_key IS NOT NULL
             AND NOT EXISTS (SELECT 1 FROM leased l
                             WHERE l.ordering_key = h.blocked_key
                               AND l.endpoint_id IS NOT DISTINCT FROM h.endpoint_id))::text
           AS blocked_keys
)
SELECT f.seq_value, f.snap_xmin, f.own_xid, f.fresh_scanned, f.fresh_full_bound, f.slow_full,
       f.held, f.blocked_keys, f.scanned_buckets,
       l.id, l.ordering_key, m.idempotency_key, m.event_type, m.headers, m.payload,
       m.payload_bytes, l.attempts, l.parked, l.endpoint_id, l.bucket,
       (extract(epoch FROM m.created_at) * 1000000)::bigint AS created_us, l.absent_as_of_us
-- What no writer changes (payload, headers, keys, created_at) from the row by primary key: this
-- statement's snapshot sees it as before the lease, the same message.
FROM facts f LEFT JOIN (leased l JOIN outbox.messages m ON m.id = l.id) ON true
-- In no particular order: the store sorts the batch by id (cheaper there than here).
