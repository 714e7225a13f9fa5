-- reap_full: reap.sql without the lease records: a sequential scan of the queue for expired
-- leases, whatever took them. The safety net behind reap.sql (leases taken by a relay older
-- than migration 0011, still running through an upgrade); run by the relay whose reap took the
-- relays' turn at it (queue_scan_turn.sql, migration 0034). Counts as a failed attempt, like
-- reap.sql.
-- A row another transaction has locked is passed over (see reap.sql); a later pass takes it.
-- Returns the destination of every row returned.
-- A row whose claim still has a lease record is reap.sql's: it waits for the record (a renewal
-- extended it, renewing the claim's other rows), as reap.sql has it.
WITH taken AS (
  SELECT id FROM outbox.messages m
  WHERE lease_until < clock_timestamp()
    AND NOT EXISTS (SELECT 1 FROM outbox.leases l WHERE l.token = m.lease_owner)
  FOR UPDATE OF m SKIP LOCKED
), returned AS (
  UPDATE outbox.messages
  SET lease_owner = NULL, lease_until = NULL, parked = true, attempts = attempts + 1,
      deliver_after = clock_timestamp(),
      last_error = 'lease expired: the relay that held it stopped or stalled'
  WHERE id = ANY ((SELECT array_agg(id) FROM taken)::bigint[])
  RETURNING destination
), woke AS (
  -- Wakes every relay, as reap.sql does.
  SELECT pg_notify('outbox_messages', '') FROM (SELECT 1 FROM returned LIMIT 1) r
)
SELECT r.destination FROM returned r, (SELECT count(*) FROM woke) w
