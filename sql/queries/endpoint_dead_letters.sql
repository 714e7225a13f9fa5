-- endpoint_dead_letters: a webhook service endpoint's own dead letters (migration 0041: not
-- those of a deleted endpoint of its id), the last to die first, a page at a time; or one of
-- them. The columns are dlq_list.sql's, and a page's cursor.
--   $1 endpoint id   $2 only those that died before this cursor (a row's `cursor`, the last of
--   the page before: "dead_at@id"), or ''   $3 limit   $4 only this dead letter, or 0
--   $5 a payload over this many bytes is left out (payload NULL; `payload_size` says how big)
-- Walks dead_letters_endpoint_dead_at_idx (endpoint_id, dead_at, id) backwards to the limit.
SELECT d.id, d.destination, d.ordering_key, d.idempotency_key::text AS idempotency_key,
       d.event_type, d.headers::text AS headers,
       CASE WHEN s.size > $5::bigint THEN NULL
            WHEN d.payload IS NOT NULL THEN d.payload::text
            ELSE 'base64:' || encode(d.payload_bytes, 'base64') END AS payload,
       s.size AS payload_size,
       d.attempts, d.reason, d.last_error,
       to_char(d.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"') AS created_at,
       to_char(d.dead_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"') AS dead_at,
       to_char(d.dead_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') || '@' || d.id
         AS cursor
FROM outbox.dead_letters d
JOIN outbox.endpoints e ON e.id = d.endpoint_id
CROSS JOIN LATERAL (SELECT coalesce(octet_length(d.payload::text),
                                    octet_length(d.payload_bytes)) AS size) s
WHERE d.endpoint_id = $1
  AND ($4::bigint = 0 OR d.id = $4::bigint)
  AND (NULLIF($2, '') IS NULL
       OR (d.dead_at, d.id) < (split_part(NULLIF($2, ''), '@', 1)::timestamptz,
                               split_part(NULLIF($2, ''), '@', 2)::bigint))
  AND outbox.dead_letter_is_endpoints_own(d.dead_at, d.reason, e.id, e.created_at)
ORDER BY d.dead_at DESC, d.id DESC
LIMIT $3
