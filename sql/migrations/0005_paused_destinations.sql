-- 0005: destinations an operator paused (`outbox-relay pause DEST`). Every relay reads this
-- table about twice a second and claims nothing for a paused destination: no attempts spent,
-- no dead letters, while an endpoint is known to be down or under maintenance. What was
-- already in flight finishes. `outbox-relay resume DEST` deletes the row
-- (docs/operations.md, "Pausing a destination").
CREATE TABLE outbox.paused_destinations (
  destination text PRIMARY KEY,
  reason      text NOT NULL DEFAULT '',
  paused_at   timestamptz NOT NULL DEFAULT clock_timestamp()
);
REVOKE ALL ON outbox.paused_destinations FROM PUBLIC;
GRANT SELECT, INSERT, UPDATE, DELETE ON outbox.paused_destinations TO outbox_relay;
