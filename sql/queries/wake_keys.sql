-- wake_keys: wake the head of each given key if it was parked at 'infinity' although no
-- earlier message of the key is left. Closes the race in which a claim parks a row behind a
-- predecessor whose settle commits right after the claim's snapshot: the claim loop rechecks
-- the keys it just blocked for a second (dispatcher.cc), instead of leaving them to the
-- periodic wake_orphans sweep.
--   $1 destination   $2 jsonb array of ordering keys
UPDATE outbox.messages m
SET deliver_after = clock_timestamp()
FROM (SELECT DISTINCT value AS ordering_key FROM jsonb_array_elements_text($2::jsonb)) k
WHERE m.id = (SELECT min(n.id) FROM outbox.messages n
              WHERE n.destination = $1 AND n.ordering_key = k.ordering_key)
  AND m.parked AND m.deliver_after = 'infinity' AND m.lease_owner IS NULL
RETURNING m.id
