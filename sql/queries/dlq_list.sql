-- dlq_list: dead letters, newest first.
--   $1 destination or '' for all   $2 id or 0 for all   $3 limit
-- Ordered by the table's dead_at (dead_letters_dead_at_idx, or with a destination
-- dead_letters_destination_dead_at_idx, walked backwards to the limit): the output column of
-- the same name is text, and ordering by it sorted every dead letter (claim_plan_pgtest.cc).
SELECT id, destination, ordering_key, idempotency_key::text AS idempotency_key, event_type,
       headers::text AS headers,
       CASE WHEN payload IS NOT NULL THEN payload::text
            ELSE 'base64:' || encode(payload_bytes, 'base64') END AS payload,
       attempts, reason, last_error,
       to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"') AS created_at,
       to_char(dead_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"') AS dead_at
FROM outbox.dead_letters
WHERE (NULLIF($1, '') IS NULL OR destination = $1)
  AND ($2::bigint = 0 OR id = $2::bigint)
ORDER BY outbox.dead_letters.dead_at DESC, outbox.dead_letters.id DESC
LIMIT $3
