-- endpoint_dead_letters: a webhook service endpoint's own dead letters (migration 0041: not
-- those of a deleted endpoint of its id), newest first by id, a page at a time. The columns are
-- dlq_list.sql's.
--   $1 endpoint id   $2 only ids below this (the last page's last), or 0   $3 limit
-- Walks dead_letters_endpoint_idx (endpoint_id, id) backwards to the limit.
SELECT d.id, d.destination, d.ordering_key, d.idempotency_key::text AS idempotency_key,
       d.event_type, d.headers::text AS headers,
       CASE WHEN d.payload IS NOT NULL THEN d.payload::text
            ELSE 'base64:' || encode(d.payload_bytes, 'base64') END AS payload,
       d.attempts, d.reason, d.last_error,
       to_char(d.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"') AS created_at,
       to_char(d.dead_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"') AS dead_at
FROM outbox.dead_letters d
JOIN outbox.endpoints e ON e.id = d.endpoint_id
WHERE d.endpoint_id = $1
  AND ($2::bigint = 0 OR d.id < $2::bigint)
  AND outbox.dead_letter_is_endpoints_own(d.dead_at, d.reason, e.id, e.created_at)
ORDER BY d.id DESC
LIMIT $3
