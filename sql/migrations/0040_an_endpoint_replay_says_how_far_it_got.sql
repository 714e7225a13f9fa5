-- 0040: an archive replay to an endpoint says how far it got, while it runs and for a day after
-- it finished or failed (GET /v1/replays/{id}), so that it can run in the background
-- (POST /v1/endpoints/{id}/replay with `Prefer: respond-async`) for a client whose requests
-- time out long before a large archive is replayed. Until now its row went when it finished:
-- a client could not tell a finished replay from one never asked for.
-- * outbox.endpoint_replays.error: why the replay's last run failed, when the failure could be
--   written (a lost connection cannot write it); cleared when it is resumed.
-- * outbox.endpoint_replays_finished: a finished replay, moved here from
--   outbox.endpoint_replays (under its id) by the transaction of its last part. The table of
--   unfinished replays keeps its key, so a relay of an older release, running beside the new
--   ones while they roll out, still replays (its finished replays are not kept).
-- Whether a replay is running is not stored: a run holds a session-level advisory lock
-- (7080, id % 2^31) on its connection, which PostgreSQL releases with the connection, so a
-- run killed with its relay is not "running" for ever. Rows of both tables are deleted a day
-- after their last change, when the next replay begins.
-- Written to run again over itself (IF NOT EXISTS).
ALTER TABLE outbox.endpoint_replays ADD COLUMN IF NOT EXISTS error text;

CREATE TABLE IF NOT EXISTS outbox.endpoint_replays_finished (
  id          bigint      PRIMARY KEY,
  endpoint_id text        NOT NULL REFERENCES outbox.endpoints (id) ON DELETE CASCADE,
  since       timestamptz NOT NULL,
  message     text        NOT NULL,
  queued      bigint      NOT NULL,
  started_at  timestamptz NOT NULL,
  finished_at timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS endpoint_replays_finished_endpoint
  ON outbox.endpoint_replays_finished (endpoint_id);
CREATE INDEX IF NOT EXISTS endpoint_replays_finished_at
  ON outbox.endpoint_replays_finished (finished_at);

REVOKE ALL ON outbox.endpoint_replays_finished FROM PUBLIC;
GRANT SELECT, INSERT, DELETE ON outbox.endpoint_replays_finished TO outbox_relay;
GRANT SELECT ON outbox.endpoint_replays_finished TO outbox_reader;
