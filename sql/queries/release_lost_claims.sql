-- release_lost_claims: hand back what claims whose reply never reached this relay may have
-- leased (the database restarted or the connection broke after the claim committed). The relay
-- never saw those rows, so nobody delivers them; without this they stay leased, and their keys
-- blocked, until the lease runs out. No delivery was tried: no attempt is counted. Parked and
-- due now, so the slow lane takes them at once.
--   $1 lease tokens of the lost claims ('{uuid,...}')
UPDATE outbox.messages
SET lease_owner = NULL, lease_until = NULL, parked = true, deliver_after = clock_timestamp()
WHERE lease_owner = ANY($1::uuid[])
RETURNING id
