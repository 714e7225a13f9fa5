-- renew_leases: extend the leases of messages this relay still has in flight (queued in a
-- sink, being delivered, or delivered and waiting for the settle), so no lease expires while
-- its message is still being handled: no duplicate send, no attempt counted twice.
-- Fenced like settle: a lease that moved on (expired and reaped) is left alone. The claims'
-- lease records (migration 0011) are extended with them, ending no earlier than any of their
-- messages, so the reaper does not look at them before then.
--   $1 jsonb array of {"id", "token"}   $2 lease duration in milliseconds
WITH renewed AS (
  UPDATE outbox.messages m
  SET lease_until = clock_timestamp() + make_interval(secs => $2::bigint / 1000.0)
  FROM jsonb_to_recordset($1::jsonb) AS l(id bigint, token uuid)
  WHERE m.id = l.id AND m.lease_owner = l.token
  RETURNING m.id, l.token
), extended AS (
  UPDATE outbox.leases r
  SET lease_until = greatest(r.lease_until,
                             clock_timestamp() + make_interval(secs => $2::bigint / 1000.0))
  WHERE r.token IN (SELECT DISTINCT token FROM renewed)
)
SELECT id FROM renewed
