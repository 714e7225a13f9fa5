-- pause_destination: relays stop claiming $1 until it is resumed. Pausing again replaces the
-- reason and keeps the original time.
--   $1 destination   $2 reason
INSERT INTO outbox.paused_destinations (destination, reason) VALUES ($1, $2)
ON CONFLICT (destination) DO UPDATE SET reason = excluded.reason
