-- wake_orphans: safety net for a blocked row whose predecessor settled between the claim's
-- snapshot and its park (a benign race): wake the rows at 'infinity' that head their key.
-- One probe per blocked key, not per blocked row: only a key's first row can be its head. A
-- key is the ordering key within its endpoint (claim_settle_scan.sql).
--   $1 destination
WITH blocked_keys AS (
  SELECT DISTINCT ordering_key, endpoint_id
  FROM outbox.messages
  WHERE destination = $1 AND parked AND deliver_after = 'infinity'
)
UPDATE outbox.messages m
SET deliver_after = clock_timestamp()
FROM blocked_keys k
WHERE m.id = (SELECT min(n.id) FROM outbox.messages n
              WHERE n.destination = $1 AND n.ordering_key = k.ordering_key
                AND n.endpoint_id IS NOT DISTINCT FROM k.endpoint_id)
  AND m.parked AND m.deliver_after = 'infinity' AND m.lease_owner IS NULL
RETURNING m.id
