-- paused_destinations: what operators paused, with their reasons (outbox-relay pause).
SELECT destination, reason FROM outbox.paused_destinations ORDER BY destination
