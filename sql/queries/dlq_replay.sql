-- dlq_replay: put dead letters back in the queue with their idempotency keys. They get new
-- ids (so they queue behind their key's pending messages) and enter the slow lane.
-- A dead letter whose idempotency key is queued, or that shares its key with another dead
-- letter picked (an application that enqueued the same key again after the first died), is
-- held back: its insert would collide, and the whole replay failed. One per key (the oldest)
-- goes; the rest are returned as held back and stay dead letters.
-- Each replayed key takes outbox.insert_message's per-key lock, in one global order, before
-- any row takes its id: a replayed message then waits for an uncommitted writer of its key,
-- as another writer would, instead of being claimed while the writer's earlier row is not
-- visible yet (and both then in flight).
--   $1 the part's dead-letter ids as an array literal ('{1,2}'), from dlq_replay_part.sql,
--      which took their endpoints' move locks   $2 destination, or '' for any (one moved out
--      of it meanwhile is left)
-- Taken in parts by the caller, each its own transaction: every replayed key takes a lock, and
-- a whole queue of dead letters in one statement filled PostgreSQL's lock table ("out of
-- shared memory").
-- A dead letter of a webhook endpoint that is no longer there is held back too, as
-- `endpoint_deleted`: the endpoint was deleted, and one added since with its id is another (its
-- URL, its secret, its event types) that must not get it. The endpoint there now is the one it
-- died under when it died after that endpoint was created, and not as the copy of a deleted
-- endpoint (reason 'endpoint ID was deleted', which a settle may write after the id was
-- added again): outbox.dead_letter_is_endpoints_own (migration 0041), the rule every reader of
-- an endpoint's dead letters applies.
-- Returns (id, kind): the new message ids (kind `replayed`), and the ids of the dead letters
-- held back (`held_back`: their key; `endpoint_deleted`).
WITH candidates AS (
  SELECT d.id, d.idempotency_key,
         d.endpoint_id IS NULL OR EXISTS (
           SELECT 1 FROM outbox.endpoints e
           WHERE e.id = d.endpoint_id
             AND outbox.dead_letter_is_endpoints_own(d.dead_at, d.reason, e.id, e.created_at))
           AS deliverable
  FROM outbox.dead_letters d
  WHERE d.id = ANY($1::bigint[])
    AND (NULLIF($2, '') IS NULL OR d.destination = $2)
), chosen AS (
  SELECT DISTINCT ON (c.idempotency_key) c.id
  FROM candidates c
  WHERE c.deliverable
    AND NOT EXISTS (SELECT 1 FROM outbox.messages m WHERE m.idempotency_key = c.idempotency_key)
  ORDER BY c.idempotency_key, c.id
), picked AS (
  DELETE FROM outbox.dead_letters d
  WHERE d.id = ANY ((SELECT array_agg(id) FROM chosen)::bigint[])
  RETURNING d.*
), key_locks AS (
  SELECT count(*) AS n
  FROM (SELECT pg_advisory_xact_lock(k.lock_key)
        FROM (SELECT DISTINCT hashtextextended(destination || chr(31) || ordering_key, 7079) AS lock_key
              FROM picked WHERE ordering_key IS NOT NULL) k
        ORDER BY k.lock_key) l
), replayed AS (
  INSERT INTO outbox.messages (destination, ordering_key, idempotency_key, event_type, headers,
                               payload, payload_bytes, deliver_after, parked, created_at,
                               last_error, bucket, endpoint_id, due_at)
  SELECT destination, ordering_key, idempotency_key, event_type, headers, payload,
         payload_bytes, clock_timestamp(), true, created_at, 'replayed from dead letter ' || id,
         CASE WHEN ordering_key IS NULL THEN floor(random() * p.bucket_count)
              ELSE (hashtextextended(destination || chr(31) || ordering_key, 0) & 32767) % p.bucket_count END,
         endpoint_id,
         clock_timestamp()  -- pending since the replay (migration 0025), whatever hands it back
  FROM picked, outbox.partitioning p
  WHERE (SELECT n FROM key_locks) >= 0  -- every key locked before the first id is taken
  ORDER BY id
  RETURNING id
)
SELECT id, 'replayed' AS kind FROM replayed
UNION ALL
SELECT c.id, CASE WHEN c.deliverable THEN 'held_back' ELSE 'endpoint_deleted' END
FROM candidates c
WHERE c.id <> ALL ((SELECT coalesce(array_agg(id), '{}') FROM chosen)::bigint[])
