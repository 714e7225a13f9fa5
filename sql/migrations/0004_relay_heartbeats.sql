-- 0004: which running relay serves which destination, in either claim mode. Each relay
-- upserts its row every few seconds (relay_heartbeat.sql) and deletes it on a clean shutdown;
-- a row whose heartbeat is old belongs to a relay that died. `outbox-relay status` and the
-- metrics show messages of destinations that no live relay serves, and no relay ever
-- dead-letters another relay's destinations: a rolling deploy that adds a destination, a
-- canary or another team's relay can share the queue (docs/operations.md).
CREATE TABLE outbox.relay_heartbeats (
  instance_id  uuid PRIMARY KEY,
  destinations text[] NOT NULL,
  description  text NOT NULL DEFAULT '',
  started_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
  heartbeat_at timestamptz NOT NULL
);
REVOKE ALL ON outbox.relay_heartbeats FROM PUBLIC;
GRANT SELECT, INSERT, UPDATE, DELETE ON outbox.relay_heartbeats TO outbox_relay;
