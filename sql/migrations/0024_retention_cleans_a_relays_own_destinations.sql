-- 0024: retention deletes only the cleaning relay's own destinations' dead letters and
-- archived deliveries. It deleted every destination's by the cleaning relay's ages, so in a
-- database several relays share, a relay keeping dead letters a day removed another team's
-- (review; tests/store/retention_pgtest.cc). The cleanup now walks one destination at a time,
-- oldest first, which these indexes serve without reading other destinations' rows.
--
-- The archive's index replaces delivered_archive_delivered_at_idx (retention was its only
-- reader), so an archived delivery still writes one index entry besides the primary key. The
-- dead letters keep dead_letters_dead_at_idx for `dlq purge --older-than` across destinations.
--
-- Building an index blocks writes to its table meanwhile: an archive of many millions of rows
-- holds up settles with archive_delivered on for the build. To avoid that, build them
-- beforehand (outside a transaction) and this migration finds them:
--   CREATE INDEX CONCURRENTLY IF NOT EXISTS delivered_archive_destination_idx
--     ON outbox.delivered_archive (destination, delivered_at);
--   CREATE INDEX CONCURRENTLY IF NOT EXISTS dead_letters_destination_dead_at_idx
--     ON outbox.dead_letters (destination, dead_at);
CREATE INDEX IF NOT EXISTS delivered_archive_destination_idx
  ON outbox.delivered_archive (destination, delivered_at);
DROP INDEX IF EXISTS outbox.delivered_archive_delivered_at_idx;
CREATE INDEX IF NOT EXISTS dead_letters_destination_dead_at_idx
  ON outbox.dead_letters (destination, dead_at);
