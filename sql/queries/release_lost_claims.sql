-- release_lost_claims: hand back what claims whose reply never reached this relay may have
-- leased (the database restarted or the connection broke after the claim committed). The relay
-- never saw those rows, so nobody delivers them; without this they stay leased, and their keys
-- blocked, until the lease runs out. No delivery was tried: no attempt is counted. Parked and
-- due now, so the slow lane takes them at once. A claim that committed wrote its lease record
-- (migration 0011) in the same statement: its ids are probed by primary key, and the record
-- goes with them. A claim that did not commit left neither rows nor record.
--   $1 lease tokens of the lost claims ('{uuid,...}')
WITH lost AS (
  SELECT l.token, l.ids FROM outbox.leases l WHERE l.token = ANY ($1::uuid[])
), released AS (
  UPDATE outbox.messages m
  SET lease_owner = NULL, lease_until = NULL, parked = true, deliver_after = clock_timestamp()
  WHERE m.id = ANY ((SELECT array_agg(u.id) FROM lost, unnest(lost.ids) AS u(id))::bigint[])
    AND m.lease_owner = ANY ($1::uuid[])
  RETURNING m.id
), forgotten AS (
  DELETE FROM outbox.leases l USING lost WHERE l.token = lost.token
)
SELECT id FROM released
