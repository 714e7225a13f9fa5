-- wake_orphans: safety net for a blocked row whose predecessor settled between the claim's
-- snapshot and its park (a benign race): wake rows at 'infinity' that head their key.
--   $1 destination
UPDATE outbox.messages m
SET deliver_after = clock_timestamp()
WHERE m.destination = $1 AND m.parked AND m.deliver_after = 'infinity' AND m.lease_owner IS NULL
  AND NOT EXISTS (SELECT 1 FROM outbox.messages p
                  WHERE p.destination = m.destination AND p.ordering_key = m.ordering_key
                    AND p.id < m.id)
RETURNING m.id
