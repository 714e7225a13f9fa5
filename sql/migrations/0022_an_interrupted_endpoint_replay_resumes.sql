-- 0022: an archive replay to an endpoint (`endpoints replay`, POST /v1/endpoints/{id}/replay)
-- that fails part-way resumes where it stopped when it is asked again. It goes 500 archived
-- messages at a time, each part its own transaction; run again after a failure it started
-- over, and every message of the committed parts that the relay had delivered meanwhile (no
-- longer queued, so not skipped) was sent to the endpoint a second time (review, reproduced
-- in tests/store/store_pgtest.cc). A replay under way keeps its place here, written in the
-- same transaction as each part; the row goes when the replay finishes, so the same replay
-- asked again afterwards is a new one. One that stopped more than a day before it is asked
-- again starts over.
CREATE TABLE outbox.endpoint_replays (
  id           bigint      GENERATED ALWAYS AS IDENTITY UNIQUE,
  endpoint_id  text        NOT NULL REFERENCES outbox.endpoints (id) ON DELETE CASCADE,
  -- What was asked: messages delivered since this time, read once when the replay began
  -- ('-infinity' when one message was asked for), or the one message by its idempotency key
  -- or delivery id ('' when a time was).
  since        timestamptz NOT NULL,
  message      text        NOT NULL,
  -- The archive as it was when the replay began: ids up to this one.
  upto         bigint      NOT NULL,
  -- The archive id of the last message it has handled.
  done_through bigint      NOT NULL,
  queued       bigint      NOT NULL DEFAULT 0,
  started_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
  updated_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
  PRIMARY KEY (endpoint_id, since, message)
);

GRANT SELECT, INSERT, UPDATE, DELETE ON outbox.endpoint_replays TO outbox_relay;
