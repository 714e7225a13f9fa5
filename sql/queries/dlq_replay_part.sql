-- dlq_replay_part: the next part of a dlq replay, and the move locks (migration 0018) of its
-- dead letters' endpoints, shared, in one order. Run before dlq_replay.sql, in its own
-- statement of the same transaction (before the writers' lock, as a move takes them): a move
-- under way is waited for, so dlq_replay.sql's snapshot has its dead letters where the
-- endpoint went; a move that begins waits for the commit, and then takes the replayed rows
-- along. Without them, a move beside the replay swept the queue before the replayed row
-- committed, found its dead letter gone, and left the row in the old destination.
-- dlq_replay.sql then takes these dead letters and no others: read again, the part could hold
-- one committed, purged or moved meanwhile, of an endpoint whose lock was not taken (review).
--   $1 dead-letter ids as an array literal ('{1,2}'), or '' for all   $2 destination, or '' for any
--   $3 only dead letters with an id above this   $4 at most this many (the oldest first)
--   $5 only this webhook service endpoint's, or '' for any (a deleted endpoint's of its id
--      included: dlq_replay.sql holds them back)   $6 only those dead at or after this time,
--      or '' for any   $7 only ids up to this (a recovery: the largest when it began; what dies
--      while it runs, a recovered message dead again, has a higher one and is not chased)
-- Returns the part's dead-letter ids, in order; none when nothing is left.
WITH p AS (
  SELECT d.id, d.endpoint_id FROM outbox.dead_letters d
  WHERE (NULLIF($1, '') IS NULL OR d.id = ANY(NULLIF($1, '')::bigint[]))
    AND (NULLIF($2, '') IS NULL OR d.destination = $2)
    AND d.id > $3::bigint
    AND (NULLIF($5, '') IS NULL OR d.endpoint_id = $5)
    AND (NULLIF($6, '') IS NULL OR d.dead_at >= NULLIF($6, '')::timestamptz)
    AND d.id <= $7::bigint
  ORDER BY d.id
  LIMIT $4::bigint
), l AS (
  SELECT count(*) AS n FROM (
    SELECT pg_advisory_xact_lock_shared(outbox.endpoint_lock_key(e.endpoint_id))
    FROM (SELECT DISTINCT endpoint_id FROM p WHERE endpoint_id IS NOT NULL) e
    ORDER BY e.endpoint_id) x
)
SELECT p.id FROM p, l ORDER BY p.id
