-- resume_destination: relays claim $1 again; returns the row if it was paused.
--   $1 destination
DELETE FROM outbox.paused_destinations WHERE destination = $1 RETURNING destination
