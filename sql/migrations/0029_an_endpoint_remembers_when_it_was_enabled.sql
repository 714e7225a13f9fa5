-- 0029: when an endpoint was last enabled again (`endpoints enable`): the start of that
-- transaction. A relay that sees the change wakes what it held as disabled since then (rows
-- parked for the disabled hold from that time on), whenever it sees it and however long the
-- enable's own wake of the backlog took. NULL: never disabled and enabled again, or enabled by
-- a relay older than this version (the relay then takes the last minute's holds).
ALTER TABLE outbox.endpoints ADD COLUMN enabled_at timestamptz;
