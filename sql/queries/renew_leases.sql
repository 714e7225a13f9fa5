-- renew_leases: extend the leases of messages this relay still has in flight (queued in a
-- sink, being delivered, or delivered and waiting for the settle), so no lease expires while
-- its message is still being handled: no duplicate send, no attempt counted twice.
-- Fenced like settle: a lease that moved on (expired and reaped) is left alone. The claims'
-- lease records (migration 0011) are extended with them, ending no earlier than any of their
-- messages, so the reaper does not look at them before then.
-- A row another transaction has locked is passed over, not waited for: that is a settle in
-- flight writing it (or the reaper taking it back), and a renewal that waited deadlocked with
-- the settle, which locks its rows in its own order. The next renewal (a second later when
-- this one passed any over) takes it if it is still leased.
--   $1 jsonb array of {"id", "token"}   $2 lease duration in milliseconds
-- The queue's rows are probed by primary key from one array of ids, and each row's token is
-- looked up in one jsonb object of the held list, whatever the statistics say: as a join with
-- the held list, planned while the table was empty (a relay started on a quiet queue), the
-- statement walked the whole primary key on every renewal after a burst, and as a semi-join it
-- rescanned the held list for every row
-- (ClaimPlanTest.MaintenanceStatementsPlannedOnAnEmptyQueueReadTheirRowsAfterABurst).
WITH held AS (
  SELECT l.id, l.token FROM jsonb_to_recordset($1::jsonb) AS l(id bigint, token uuid)
  WHERE l.id IS NOT NULL  -- (jsonb_object_agg refuses a null key; such an entry names no row)
), mine AS (
  SELECT m.id
  FROM outbox.messages m
  WHERE m.id = ANY ((SELECT array_agg(h.id) FROM held h)::bigint[])
    AND m.lease_owner =
        ((SELECT jsonb_object_agg(h.id, h.token) FROM held h) ->> m.id::text)::uuid
  FOR UPDATE OF m SKIP LOCKED
), renewed AS (
  -- lease_owner is the held token: checked above, under the row's lock.
  UPDATE outbox.messages m
  SET lease_until = clock_timestamp() + make_interval(secs => $2::bigint / 1000.0)
  WHERE m.id = ANY ((SELECT array_agg(id) FROM mine)::bigint[])
  RETURNING m.id, m.lease_owner AS token
), records AS (
  -- The claims' records, locked in token order: a settle on another connection of this relay
  -- writes the records of the same claims, in that order too (settle.sql). Taken in whatever
  -- order the plan gave, a renewal holding one record and waiting for another deadlocked with
  -- a settle holding that one and waiting for the first.
  SELECT r.token FROM outbox.leases r
  WHERE r.token IN (SELECT token FROM renewed)
  ORDER BY r.token
  FOR UPDATE
), extended AS (
  UPDATE outbox.leases r
  SET lease_until = greatest(r.lease_until,
                             clock_timestamp() + make_interval(secs => $2::bigint / 1000.0))
  FROM records
  WHERE r.token = records.token
)
SELECT id FROM renewed
