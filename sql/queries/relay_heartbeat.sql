-- relay_heartbeat: this relay is alive and serves these destinations (any claim mode).
-- Rows of relays silent for a day are removed on the way.
--   $1 instance id (uuid)   $2 destinations ('{orders,hooks}')   $3 description
--   $4 targets: jsonb, destination -> its target's health (0006)
WITH forgotten AS (
  DELETE FROM outbox.relay_heartbeats
  WHERE heartbeat_at < clock_timestamp() - interval '1 day' AND instance_id <> $1::uuid
)
INSERT INTO outbox.relay_heartbeats AS h
  (instance_id, destinations, description, heartbeat_at, targets)
VALUES ($1::uuid, $2::text[], $3, clock_timestamp(), $4::jsonb)
ON CONFLICT (instance_id) DO UPDATE
SET destinations = EXCLUDED.destinations, description = EXCLUDED.description,
    heartbeat_at = EXCLUDED.heartbeat_at, targets = EXCLUDED.targets
