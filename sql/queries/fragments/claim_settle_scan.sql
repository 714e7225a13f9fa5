-- Fragment of claim.sql and claim_partitioned.sql, spliced in where they say
-- `-- @include claim_settle_scan.sql`: given `scan` (the candidate rows, locked), lease the
-- ready ones and park the rest. Not a statement on its own.
ready AS (
  -- Due, and the head of its key: no earlier message of the key is still in the queue
  -- (pending, leased or waiting for a retry).
  -- clock_timestamp(), not now(): a row committed between this transaction's start and its
  -- snapshot is visible and due, though its deliver_after may be later than now().
  SELECT s.id FROM scan s
  WHERE s.deliver_after <= clock_timestamp()
    AND (s.ordering_key IS NULL OR NOT EXISTS (
          SELECT 1 FROM outbox.messages p
          WHERE p.destination = s.destination AND p.ordering_key = s.ordering_key
            AND p.id < s.id))
), leased AS (
  UPDATE outbox.messages m
  SET lease_owner = $5::uuid,
      lease_until = clock_timestamp() + make_interval(secs => $6::bigint / 1000.0)
  FROM ready r
  WHERE m.id = r.id
  RETURNING m.id, m.ordering_key, m.idempotency_key, m.event_type, m.headers, m.payload,
            m.payload_bytes, m.attempts,
            (extract(epoch FROM m.created_at) * 1000000)::bigint AS created_us
), held AS (
  -- Not ready: park it. A row that is due but blocked behind its key waits at 'infinity'
  -- until settling the earlier message wakes it (settle.sql).
  UPDATE outbox.messages m
  SET parked = true,
      deliver_after = CASE WHEN s.deliver_after <= clock_timestamp() THEN 'infinity'::timestamptz
                           ELSE s.deliver_after END
  FROM scan s
  WHERE m.id = s.id AND NOT EXISTS (SELECT 1 FROM ready r WHERE r.id = s.id)
  RETURNING m.id, CASE WHEN m.deliver_after = 'infinity' THEN m.ordering_key END AS blocked_key
