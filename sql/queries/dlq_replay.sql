-- dlq_replay: put dead letters back in the queue with their idempotency keys. They get new
-- ids (so they queue behind their key's pending messages) and enter the slow lane.
--   $1 dead-letter ids as an array literal ('{1,2}'), or '' for all   $2 destination, or '' for any
WITH picked AS (
  DELETE FROM outbox.dead_letters d
  WHERE (NULLIF($1, '') IS NULL OR d.id = ANY(NULLIF($1, '')::bigint[]))
    AND (NULLIF($2, '') IS NULL OR d.destination = $2)
  RETURNING d.*
)
INSERT INTO outbox.messages (destination, ordering_key, idempotency_key, event_type, headers,
                             payload, payload_bytes, deliver_after, parked, created_at,
                             last_error, bucket, endpoint_id)
SELECT destination, ordering_key, idempotency_key, event_type, headers, payload,
       payload_bytes, clock_timestamp(), true, created_at, 'replayed from dead letter ' || id,
       CASE WHEN ordering_key IS NULL THEN floor(random() * p.bucket_count)
            ELSE (hashtextextended(destination || chr(31) || ordering_key, 0) & 32767) % p.bucket_count END,
       endpoint_id
FROM picked, outbox.partitioning p ORDER BY id
RETURNING id
