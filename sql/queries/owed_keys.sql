-- owed_keys: which of these ordering keys of a webhook service destination still have rows of
-- their own for an endpoint (endpoint_id set): a fan-out of a message with such a key waits
-- for them. One probe of messages_endpoint_key_idx per key, stopping at its first entry.
--   $1 destination   $2 jsonb array of ordering keys
-- As `SELECT DISTINCT ordering_key ... WHERE ordering_key = ANY(...)` it read every entry of
-- each key (20,200 for 4 keys, one of them 20,000 deep) and then sorted them (review).
SELECT k.key
FROM (SELECT DISTINCT jsonb_array_elements_text($2::jsonb) AS key) k
WHERE EXISTS (SELECT 1 FROM outbox.messages m
              WHERE m.destination = $1 AND m.endpoint_id IS NOT NULL AND m.ordering_key = k.key)
