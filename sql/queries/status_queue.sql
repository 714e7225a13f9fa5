-- status_queue: what the queue holds, per destination, in one pass over outbox.messages
-- (the working set only: delivered rows are deleted). For `outbox-relay status` and the
-- metrics collector; see docs/operations.md.
--   depth      not leased: fresh, scheduled, blocked behind its key, or waiting for a retry
--   in_flight  leased by a relay
--   retrying   not leased and failed at least once (attempts > 0)
--   blocked    not leased, due, but waiting behind an earlier message of its key
--   expired_leases  leased, lease already expired (the reaper will return them)
--   oldest_pending_age_seconds  longest wait among unleased messages that are due or blocked
--     or retrying: counted from when the message first became due (due_at, written by the
--     insert and never moved: a hand-back or a key's wake-up does not reset it, migration
--     0025; a fan-out's endpoint row takes its message's, a replayed row the replay's time).
--     A row without it (written before 0025, or an endpoint row of such a message) counts
--     from its deliver_after, or enqueue if later, while never tried, and from enqueue once
--     tried or blocked. Scheduled messages that are not due yet
--     do not count. 0 when nothing waits.
WITH q AS (
  SELECT m.destination, m.lease_owner, m.lease_until, m.attempts, m.parked, m.deliver_after,
         coalesce(m.due_at,
                  CASE WHEN m.attempts = 0 AND m.deliver_after <> 'infinity'::timestamptz
                       THEN greatest(m.deliver_after, m.created_at) ELSE m.created_at END)
           AS pending_since
  FROM outbox.messages m
)
SELECT destination,
       count(*) FILTER (WHERE lease_owner IS NULL) AS depth,
       count(*) FILTER (WHERE lease_owner IS NOT NULL) AS in_flight,
       count(*) FILTER (WHERE lease_owner IS NULL AND attempts > 0) AS retrying,
       count(*) FILTER (WHERE lease_owner IS NULL AND parked
                          AND deliver_after = 'infinity'::timestamptz) AS blocked,
       count(*) FILTER (WHERE lease_owner IS NOT NULL AND lease_until < now()) AS expired_leases,
       coalesce(extract(epoch FROM now() - min(pending_since)
                          FILTER (WHERE lease_owner IS NULL AND pending_since <= now())), 0)::float8
         AS oldest_pending_age_seconds
FROM q
GROUP BY destination
ORDER BY destination
