-- 0039: an archive replay to an endpoint sends each delivery once. A message whose fan-out the
-- endpoint did not take at once is archived twice: the message itself (its endpoint_id NULL),
-- and later the endpoint's own copy, its retry delivered (endpoint_id set). Both are the same
-- delivery (one webhook-id). The replay goes 500 archived messages at a time and skipped only
-- what was still queued: with the two rows in different parts, the first was often delivered
-- before the second part queued the copy, and the endpoint was sent the message twice (review,
-- reproduced in tests/store/store_pgtest.cc). The delivery ids a replay has queued are kept
-- here until it finishes (its outbox.endpoint_replays row goes, and these with it), so a
-- resumed replay skips them too.
-- Written to run again over itself (IF NOT EXISTS).
CREATE TABLE IF NOT EXISTS outbox.endpoint_replay_sent (
  replay_id   bigint NOT NULL REFERENCES outbox.endpoint_replays (id) ON DELETE CASCADE,
  delivery_id uuid   NOT NULL,
  PRIMARY KEY (replay_id, delivery_id)
);
REVOKE ALL ON outbox.endpoint_replay_sent FROM PUBLIC;
GRANT SELECT, INSERT, DELETE ON outbox.endpoint_replay_sent TO outbox_relay;
