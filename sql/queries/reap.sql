-- reap: return messages whose lease expired (their relay was killed or stalled) to the
-- queue. Counts as a failed attempt, so a message that keeps killing relays dead-letters.
-- Finds them through the claims' lease records (migration 0011) that ended: settles delete a
-- claim's record with its last lease, so these are the claims a relay abandoned or stalled on,
-- and the work follows them, not the queue's length. Each record's ids are probed by primary
-- key; one settled meanwhile is gone or no longer leased under that token and is passed over.
-- Messages first, then records: the order settle and renew_leases lock them in. A lease
-- renewed meanwhile is left alone: its message and its record are checked against the clock
-- again. reap_full.sql is the same without the records, run now and then as a safety net.
-- Returns the destination of every row returned.
-- A row another transaction has locked (a settle in flight, typically a stalled relay's) is
-- passed over, not waited for, and its record kept for the next pass: waiting, the reaper
-- deadlocked with that settle, which locks its rows in its own order.
WITH expired AS (
  SELECT l.token, l.ids FROM outbox.leases l WHERE l.lease_until < clock_timestamp()
), due AS (
  -- One array of ids, so that the plan probes the primary key whatever the statistics say (a
  -- join with the records could be planned as a hash join over a scan of the queue). A row
  -- leased under any expired record's token whose own lease ended is expired, whichever
  -- record named it.
  SELECT m.id, m.lease_owner AS token
  FROM outbox.messages m
  WHERE m.id = ANY ((SELECT array_agg(u.id) FROM expired e, unnest(e.ids) AS u(id))::bigint[])
    AND m.lease_owner = ANY ((SELECT array_agg(e.token) FROM expired e)::uuid[])
    AND m.lease_until < clock_timestamp()
), taken AS (
  SELECT m.id
  FROM outbox.messages m
  WHERE m.id = ANY ((SELECT array_agg(id) FROM due)::bigint[])
    AND m.lease_owner = ANY ((SELECT array_agg(e.token) FROM expired e)::uuid[])
    AND m.lease_until < clock_timestamp()
  FOR UPDATE SKIP LOCKED
), returned AS (
  UPDATE outbox.messages m
  SET lease_owner = NULL, lease_until = NULL, parked = true, attempts = m.attempts + 1,
      deliver_after = clock_timestamp(),
      last_error = 'lease expired: the relay that held it stopped or stalled'
  WHERE m.id = ANY ((SELECT array_agg(id) FROM taken)::bigint[])
  RETURNING m.destination
), forgotten AS (
  -- Not the record of a row passed over.
  DELETE FROM outbox.leases l USING expired e
  WHERE l.token = e.token AND l.lease_until < clock_timestamp()
    AND l.token <> ALL ((SELECT coalesce(array_agg(d.token), '{}') FROM due d
                         WHERE d.id <> ALL ((SELECT coalesce(array_agg(id), '{}') FROM taken)::bigint[]))::uuid[])
), woke AS (
  -- The rows are due now, and another relay may be the one to claim them (any relay in
  -- claim_mode skip_locked; the bucket's owner in partitioned mode): wake them all as a new
  -- message does. The insert trigger (migration 0013) does not fire for an UPDATE.
  SELECT pg_notify('outbox_messages', '') FROM (SELECT 1 FROM returned LIMIT 1) r
)
SELECT r.destination FROM returned r, (SELECT count(*) FROM woke) w
