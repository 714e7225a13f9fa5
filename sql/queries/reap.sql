-- reap: return messages whose lease expired (their relay was killed or stalled) to the
-- queue. Counts as a failed attempt, so a message that keeps killing relays dead-letters.
-- Returns the destination of every row returned.
UPDATE outbox.messages
SET lease_owner = NULL, lease_until = NULL, parked = true, attempts = attempts + 1,
    deliver_after = clock_timestamp(),
    last_error = 'lease expired: the relay that held it stopped or stalled'
WHERE lease_until < clock_timestamp()
RETURNING destination
