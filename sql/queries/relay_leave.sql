-- relay_leave: a relay shutting down cleanly stops counting as serving its destinations.
--   $1 instance id (uuid)
DELETE FROM outbox.relay_heartbeats WHERE instance_id = $1::uuid
