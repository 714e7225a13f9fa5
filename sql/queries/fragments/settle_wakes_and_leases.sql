-- Fragment of settle.sql and settle_delivered.sql, spliced in where they say
-- `-- @include settle_wakes_and_leases.sql`: what every settle does after writing its
-- outcomes. Given `settler` (instance_id: the settling relay's id in partitioned mode, else
-- ''), `left_queue` (id, destination, ordering_key, endpoint_id, token: the rows this write
-- took out of the queue, delivered or dead) and `settled` (token: one row per outcome written,
-- fenced ones not), it wakes the next message of each key that finished (`woken`), wakes the
-- other relays when one of those is theirs to claim (`woke_elsewhere`), and counts the
-- outcomes off their claims' lease records. Not a statement on its own: it ends with the
-- `claims_left` CTE, and the statement goes on with its final SELECT.
finished AS (
  -- A key is the ordering key within its endpoint (claim_settle_scan.sql).
  SELECT f.destination, f.ordering_key, f.endpoint_id, max(f.id) AS id
  FROM left_queue f
  WHERE f.ordering_key IS NOT NULL
  GROUP BY f.destination, f.ordering_key, f.endpoint_id
), woken AS (
  -- The next message of each finished key may now go: the key's first entry after it in
  -- messages_key_order_idx (ORDER BY ... LIMIT 1, which reads one entry; min(id), with a row or
  -- two estimated per key, was planned as an aggregate over the key's whole backlog: ~100 ms
  -- per settle for a key 10k messages deep), then those rows by primary key.
  UPDATE outbox.messages m
  SET deliver_after = clock_timestamp()
  WHERE m.id = ANY (ARRAY(
          SELECT nx.id
          FROM finished f
          CROSS JOIN LATERAL (
            SELECT n.id FROM outbox.messages n
            WHERE n.destination = f.destination AND n.ordering_key = f.ordering_key
              AND n.endpoint_id IS NOT DISTINCT FROM f.endpoint_id AND n.id > f.id
            ORDER BY n.id LIMIT 1) nx))
    AND m.parked AND m.deliver_after = 'infinity'
  RETURNING m.id, m.bucket, m.destination
), woke_elsewhere AS (
  -- Partitioned (`settler`: the settling relay's id): a woken row in a bucket another relay
  -- owns now (it moved while the key's head was in flight) is that relay's to claim: wake the
  -- relays, as a new message does; it waited for their poll_interval_ms. In the settling relay's own
  -- buckets its claim loop is woken in the process (the `woken` count), and nobody else's;
  -- nor in a bucket whose owner does not serve the row's destination, whose rows the relays
  -- that do claim as their own (claim_partitioned.sql): there every keyed settle woke every
  -- relay, as before migration 0013 (review). A bucket without an owner has no claimer.
  SELECT pg_notify('outbox_messages', '')
  FROM (SELECT 1 FROM woken w JOIN outbox.bucket_owners o ON o.bucket = w.bucket, settler s
        WHERE s.instance_id <> '' AND o.owner <> nullif(s.instance_id, '')::uuid
          AND NOT EXISTS (SELECT 1 FROM outbox.relay_heartbeats h
                          WHERE h.instance_id = o.owner AND NOT (w.destination = ANY (h.destinations)))
        LIMIT 1) r
), settled_claims AS (
  -- How many leases of each claim this write ended (a fenced outcome ends none).
  SELECT t.token, count(*) AS n
  FROM settled t
  GROUP BY t.token
), claim_records AS (
  -- The claims' lease records (migration 0011), locked in token order, as renew_leases.sql
  -- locks them: the relay renews the same claims on another connection, and two writers
  -- taking records in the orders their plans gave deadlocked.
  SELECT l.token, l.remaining, c.n
  FROM outbox.leases l JOIN settled_claims c ON c.token = l.token
  ORDER BY l.token
  FOR UPDATE OF l
), claims_done AS (
  -- The claim's record goes with its last lease, so the reaper only ever reads claims that a
  -- relay abandoned or stalled on ...
  DELETE FROM outbox.leases l USING claim_records c
  WHERE l.token = c.token AND c.remaining <= c.n
), claims_left AS (
  -- ... and otherwise counts what is left (one of the two, never both, for a record).
  UPDATE outbox.leases l SET remaining = l.remaining - c.n
  FROM claim_records c
  WHERE l.token = c.token AND c.remaining > c.n
)
