-- wake_keys: wake the head of each given key if it was parked at 'infinity' although no
-- earlier message of the key is left. Closes the race in which a claim parks a row behind a
-- predecessor whose settle commits right after the claim's snapshot: the claim loop rechecks
-- the keys it just blocked for a second (dispatcher.cc), instead of leaving them to the
-- periodic wake_orphans sweep.
--   $1 destination   $2 jsonb array of [ordering key, endpoint id or null] pairs: a key is
--                       the ordering key within its endpoint (claim_settle_scan.sql)
-- Each key's head is its first entry in messages_key_order_idx (ORDER BY ... LIMIT 1), and the
-- heads are then read by primary key. Written as `m.id = (SELECT min(id) ...)` per candidate,
-- the planner read every parked row of the destination (and min() every row of the key) for a
-- recheck of one key: 35,000 rows for a key 5,000 deep (claim_plan_pgtest.cc).
UPDATE outbox.messages m
SET deliver_after = clock_timestamp()
WHERE m.id = ANY (ARRAY(
        SELECT h.id
        FROM (SELECT DISTINCT value ->> 0 AS ordering_key, value ->> 1 AS endpoint_id
              FROM jsonb_array_elements($2::jsonb)) k
        CROSS JOIN LATERAL (
          SELECT n.id FROM outbox.messages n
          WHERE n.destination = $1 AND n.ordering_key = k.ordering_key
            AND n.endpoint_id IS NOT DISTINCT FROM k.endpoint_id
          ORDER BY n.id LIMIT 1) h))
  AND m.parked AND m.deliver_after = 'infinity' AND m.lease_owner IS NULL
RETURNING m.id
