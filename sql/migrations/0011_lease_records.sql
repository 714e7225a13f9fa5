-- 0011: one record per claim of the leases it took, so that the reaper finds expired leases
-- without reading the queue. Before, every relay's reaper ran `UPDATE ... WHERE lease_until <
-- now()` every reap_interval: a sequential scan of outbox.messages (no index may name the
-- lease columns, or the claim's lease update stops being HOT), ~0.6 s per pass with 1M
-- messages queued. Now the claim writes a record (token, lease end, the ids it leased, how
-- many are still leased) in the same statement, renewing a lease extends its record, the
-- settle counts its messages off and deletes the record when none is left, and the reaper
-- reads the records that ended and probes their ids by primary key: only claims a relay
-- abandoned or stalled on (docs/adr/0001-claim-path.md, "The reaper").
CREATE TABLE outbox.leases (
  token       uuid        PRIMARY KEY,  -- the claim's lease token: messages.lease_owner
  lease_until timestamptz NOT NULL,     -- never earlier than any of its messages' lease_until
  ids         bigint[]    NOT NULL,     -- the messages the claim leased
  remaining   integer     NOT NULL      -- of those, how many no settle has taken off yet
);
-- The ids out of line (TOAST, uncompressed) from 128 bytes on: the reaper's scan and every
-- settle's update of `remaining` then read and write rows of ~70 bytes, not the 2 KB of a
-- 500-id array kept inline (measured: 17 MB of heap to scan after 4,400 claims' churn, against
-- 0.7 MB).
ALTER TABLE outbox.leases ALTER COLUMN ids SET STORAGE EXTERNAL;
ALTER TABLE outbox.leases SET (toast_tuple_target = 128);
CREATE INDEX leases_lease_until_idx ON outbox.leases (lease_until);
REVOKE ALL ON outbox.leases FROM PUBLIC;
GRANT SELECT, INSERT, UPDATE, DELETE ON outbox.leases TO outbox_relay;

-- The leases held while this migration runs.
INSERT INTO outbox.leases (token, lease_until, ids, remaining)
SELECT lease_owner, max(lease_until), array_agg(id ORDER BY id), count(*)
FROM outbox.messages
WHERE lease_owner IS NOT NULL
GROUP BY lease_owner;
