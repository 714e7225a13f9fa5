-- 0034: the reaper's scan of the whole queue for leases without a lease record (reap_full.sql,
-- the safety net for leases a relay older than schema version 11 takes while an upgrade rolls
-- out) is taken in turns by the relays together, not by each one: each relay scanned on its
-- first reap and every 60th after it, so every start (a restart, a rolling deploy, a relay
-- added) read the whole queue, and N relays read it N times per interval. A relay now scans
-- when no relay has for 60 of its reap intervals (queue_scan_turn.sql); the row below says
-- when the last scan began.
CREATE TABLE outbox.queue_scans (
  only_row     boolean     PRIMARY KEY DEFAULT true CHECK (only_row),
  last_scan_at timestamptz NOT NULL
);
-- A lease without a record already held: the first reap scans. None: the first scan comes one
-- interval from now, as the next one after a scan would.
INSERT INTO outbox.queue_scans (last_scan_at)
SELECT CASE WHEN EXISTS (SELECT 1 FROM outbox.messages m
                         WHERE m.lease_owner IS NOT NULL
                           AND NOT EXISTS (SELECT 1 FROM outbox.leases l
                                           WHERE l.token = m.lease_owner))
            THEN '-infinity'::timestamptz ELSE now() END;
GRANT SELECT, UPDATE ON outbox.queue_scans TO outbox_relay;
GRANT SELECT ON outbox.queue_scans TO outbox_reader;
