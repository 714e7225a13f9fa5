-- archive_read: one destination's delivered messages delivered at or after a time, oldest
-- first, for `outbox-relay verify`. By delivery, not creation: a backlog created before the
-- window and delivered in it (an outage's), and a replayed dead letter (it keeps its
-- created_at), are what an operator verifies after an incident. Reads the archive's
-- (destination, delivered_at) index.
--   $1 destination   $2 since, milliseconds since the Unix epoch (0: all)
SELECT id, idempotency_key::text AS idempotency_key, ordering_key,
       (extract(epoch FROM created_at) * 1000)::bigint AS created_ms
FROM outbox.delivered_archive
WHERE destination = $1 AND delivered_at >= to_timestamp($2::bigint / 1000.0)
ORDER BY id
