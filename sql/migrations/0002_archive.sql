-- 0002: an optional archive of delivered messages, and nothing else.
-- Migrations are append-only: never edit a released one, add the next number.
--
-- Delivered messages leave outbox.messages (settle.sql deletes them), so the queue table
-- holds only the working set. When archiving is switched on, the same settle statement also
-- copies each delivered row here; `CleanupArchive` (relay/store/include/outbox_relay/retention.h)
-- deletes rows older than the retention in small batches. Nothing here touches the claim path.
--
-- The copy, for reference (to be added to sql/queries/settle.sql; $2 switches it on). The
-- `delivered` CTE must then return every column the archive needs:
--
--   delivered AS (
--     DELETE FROM outbox.messages m USING input i
--     WHERE m.id = i.id AND m.lease_owner = i.token AND i.outcome = 'delivered'
--     RETURNING m.id, m.destination, m.ordering_key, m.idempotency_key, m.event_type,
--               m.headers, m.payload, m.payload_bytes, m.attempts, m.created_at
--   ), archived AS (
--     INSERT INTO outbox.delivered_archive (id, destination, ordering_key, idempotency_key,
--                                           event_type, headers, payload, payload_bytes,
--                                           attempts, created_at, delivered_at)
--     SELECT d.id, d.destination, d.ordering_key, d.idempotency_key, d.event_type, d.headers,
--            d.payload, d.payload_bytes, d.attempts + 1, d.created_at, clock_timestamp()
--     FROM delivered d
--     WHERE $2::boolean
--     ON CONFLICT (id) DO NOTHING
--     RETURNING id
--   ), ...
--
-- (`attempts + 1`: the archive counts every attempt, the delivering one included.)

CREATE TABLE outbox.delivered_archive (
  id              bigint      PRIMARY KEY,  -- the message id it had in outbox.messages
  destination     text        NOT NULL,
  ordering_key    text,
  idempotency_key uuid        NOT NULL,
  event_type      text        NOT NULL,
  headers         jsonb       NOT NULL,
  payload         jsonb,
  payload_bytes   bytea,
  attempts        integer     NOT NULL,     -- delivery attempts, the successful one included
  created_at      timestamptz NOT NULL,     -- when it was enqueued
  delivered_at    timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- Retention deletes the oldest rows first, by delivered_at.
CREATE INDEX delivered_archive_delivered_at_idx ON outbox.delivered_archive (delivered_at);

REVOKE ALL ON outbox.delivered_archive FROM PUBLIC;
GRANT SELECT, INSERT, DELETE ON outbox.delivered_archive TO outbox_relay;
