-- settle: record the outcome of delivered messages, fenced by lease token: a relay whose
-- lease expired (and was taken back by the reaper) settles nothing.
--   $1 jsonb array of {"id", "token", "outcome": delivered|retry|dead|release|fanout,
--                       "delay_ms" (retry, release), "error" (retry, dead),
--                       "counted": whether this outcome ends an attempt (dead),
--                       "children" (fanout): what the message's endpoints did not take, each
--                         {"endpoint", "outcome": retry|dead|release, "delay_ms", "error",
--                          "attempts": attempts it already had, "incarnation" (optional): the
--                          endpoint's created_at in microseconds since the epoch, when the
--                          copy was sent; an endpoint of that id created at another time is
--                          another endpoint, and a deleted one is owed a dead letter},
--                       "absent_as_of_us" (retry, release; optional): the message is known not
--                         to be in its sink as of this time, microseconds since the epoch
--                         (migration 0012)}
--       A fanout message leaves the queue like a delivered one; each child becomes a row of
--       its endpoint (migration 0008), or a dead letter of its endpoint.
--   $2 boolean: also copy delivered messages to outbox.delivered_archive
--   $3 ids and $4 lease tokens (parallel arrays) of plain deliveries: outcome `delivered`
--       without anything else to say, the bulk of every settle, passed as arrays because
--       unpacking them costs a fraction of unpacking as many JSON objects
--   $5 text: the settling relay's instance id in partitioned mode, else '' (woke_elsewhere)
-- What a fan-out leaves an endpoint is written into the destination the endpoint is in now;
-- the relay runs this after trying the endpoints' move locks (Store::SettleStatement), and
-- leaves out the fan-outs whose lock was held. A fan-out that needs a key lock another
-- transaction holds is not written at all (its row stays, leased); its id is returned in
-- `deferred`, for the relay to write again later.
-- Returns counts of delivered, dead, retried, released and woken rows, whether it woke the
-- other relays (woke_others: rows handed back due now, or woken in another relay's bucket),
-- and of `gone`: inputs
-- whose row no longer exists (settled by an earlier run of this same write whose reply was
-- lost, e.g. in a database restart, or delivered by another relay after the lease expired).
-- The rest were fenced: the row is there, leased by someone else or returned to the queue.
WITH input AS (
  SELECT * FROM jsonb_to_recordset($1::jsonb)
    AS x(id bigint, token uuid, outcome text, delay_ms bigint, error text, counted boolean,
         children jsonb, absent_as_of_us bigint)
  UNION ALL
  SELECT d.id, d.token, 'delivered', NULL, NULL, NULL, NULL, NULL
  FROM unnest($3::bigint[], $4::uuid[]) AS d(id, token)
), fanout_children AS MATERIALIZED (
  -- What each fan-out leaves its endpoints, with the message's destination and key.
  SELECT i.id, m.destination, m.ordering_key, c.endpoint, c.outcome, c.incarnation
  FROM input i
  JOIN outbox.messages m ON m.id = i.id AND m.lease_owner = i.token
  CROSS JOIN LATERAL jsonb_to_recordset(i.children)
         AS c(endpoint text, outcome text, incarnation bigint)
  WHERE i.outcome = 'fanout'
), endpoint_rows AS MATERIALIZED (
  -- Where those endpoints are now: an endpoint moved to another destination (`endpoints
  -- update --destination`, which takes its queued rows and dead letters along) gets what it
  -- is owed there, not in the destination its message was claimed from, whose service no
  -- longer loads it. The relay tried each endpoint's move lock (outbox.endpoint_lock_key,
  -- migration 0018) in a statement before this one and holds it, shared: no move is under way
  -- or can begin before this write commits, and a move committed before is in this snapshot.
  -- A child that names the endpoint it was sent under (incarnation) and finds it gone
  -- (deleted, or deleted and added again with its id) is a dead letter of the deleted one: as
  -- its queued rows became when it was deleted (BuryRowsOfDeletedEndpoint).
  SELECT e.id, e.destination,
         (extract(epoch FROM e.created_at) * 1000000)::bigint AS incarnation
  FROM outbox.endpoints e
  WHERE e.id IN (SELECT endpoint FROM fanout_children)
), fanout_keys AS (
  -- outbox.insert_message's per-key lock of each endpoint key a fan-out writes a row for:
  -- an uncommitted writer of the key (a dlq or archive replay of the endpoint's row, or an
  -- application writing a key that reads the same) holds it, and no row of the key may become
  -- claimable while an earlier one is invisible. A dead letter of an endpoint takes none.
  SELECT f.id, hashtextextended(coalesce(e.destination, f.destination) || chr(31) ||
                                f.endpoint || ':' || f.ordering_key, 7079) AS lock_key
  FROM fanout_children f
  LEFT JOIN endpoint_rows e ON e.id = f.endpoint
  WHERE f.outcome <> 'dead' AND f.ordering_key IS NOT NULL
    AND (f.incarnation IS NULL OR f.incarnation IS NOT DISTINCT FROM e.incarnation)
), key_locks AS MATERIALIZED (
  -- Tried, not waited for: a transaction left open would otherwise hold every outcome of this
  -- write (and of the relay, whose one settler waits with it). No rows, no locks.
  SELECT k.lock_key, pg_try_advisory_xact_lock(k.lock_key) AS got
  FROM (SELECT DISTINCT lock_key FROM fanout_keys) k
), deferred AS MATERIALIZED (
  -- Fan-outs with a lock held elsewhere: nothing of them is written now (the relay writes them
  -- again later, still under their lease).
  SELECT DISTINCT f.id FROM fanout_keys f JOIN key_locks l USING (lock_key) WHERE NOT l.got
), delivered AS (
  DELETE FROM outbox.messages m USING input i
  WHERE m.id = i.id AND m.lease_owner = i.token AND i.outcome IN ('delivered', 'fanout')
    AND NOT EXISTS (SELECT 1 FROM deferred f WHERE f.id = i.id)
  RETURNING m.id, m.destination, m.ordering_key, m.idempotency_key, m.event_type, m.headers,
            m.payload, m.payload_bytes, m.attempts, m.created_at, m.endpoint_id, m.bucket,
            m.due_at, i.children, i.token
), archived AS (
  INSERT INTO outbox.delivered_archive (id, destination, ordering_key, idempotency_key,
                                        event_type, headers, payload, payload_bytes,
                                        attempts, created_at, delivered_at, endpoint_id)
  SELECT d.id, d.destination, d.ordering_key, d.idempotency_key, d.event_type, d.headers,
         d.payload, d.payload_bytes, d.attempts + 1, d.created_at, clock_timestamp(),
         d.endpoint_id
  FROM delivered d
  WHERE $2::boolean
  ON CONFLICT (id) DO NOTHING
  RETURNING id
), owed AS (
  -- What a fanned-out message's endpoints did not take, in the destination each endpoint is
  -- in now; what a deleted endpoint was owed, a dead letter in the message's destination.
  SELECT CASE WHEN g.gone THEN d.destination ELSE coalesce(e.destination, d.destination) END
           AS destination, d.ordering_key,
         d.idempotency_key, d.event_type, d.headers, d.payload, d.payload_bytes, d.created_at,
         d.due_at, c.endpoint, CASE WHEN g.gone THEN 'dead' ELSE c.outcome END AS outcome,
         c.delay_ms, c.error,
         CASE WHEN g.gone THEN 'endpoint ' || c.endpoint || ' was deleted' ELSE c.error END
           AS reason,
         c.attempts
  FROM delivered d
  CROSS JOIN LATERAL jsonb_to_recordset(d.children)
         AS c(endpoint text, outcome text, delay_ms bigint, error text, attempts integer,
              incarnation bigint)
  LEFT JOIN endpoint_rows e ON e.id = c.endpoint
  CROSS JOIN LATERAL (SELECT c.incarnation IS NOT NULL
                             AND c.incarnation IS DISTINCT FROM e.incarnation AS gone) g
  WHERE d.children IS NOT NULL
), spawned AS (
  -- Parked: they enter through the slow lane when due, behind their endpoint's earlier rows of
  -- the same key. ON CONFLICT: the endpoint already holds this message (written again).
  -- Pending since their message was (due_at, migration 0025), however often they are handed
  -- back.
  INSERT INTO outbox.messages (destination, ordering_key, idempotency_key, event_type, headers,
                               payload, payload_bytes, deliver_after, attempts, parked,
                               last_error, created_at, bucket, endpoint_id, due_at)
  SELECT o.destination, o.endpoint || ':' || o.ordering_key,
         outbox.endpoint_delivery_id(o.idempotency_key, o.endpoint), o.event_type, o.headers,
         o.payload, o.payload_bytes,
         clock_timestamp() + make_interval(secs => coalesce(o.delay_ms, 0) / 1000.0),
         o.attempts, true, o.error, o.created_at,
         CASE WHEN o.ordering_key IS NULL THEN floor(random() * p.bucket_count)
              ELSE (hashtextextended(o.destination || chr(31) || o.endpoint || ':' ||
                                     o.ordering_key, 0) & 32767) % p.bucket_count END,
         o.endpoint, o.due_at
  -- Their keys' locks were taken (key_locks) before any of these rows takes its id: `owed`
  -- comes from `delivered`, which reads `deferred`.
  FROM owed o, outbox.partitioning p
  WHERE o.outcome <> 'dead'
  ON CONFLICT (idempotency_key) DO NOTHING
  RETURNING id
), dead AS (
  DELETE FROM outbox.messages m USING input i
  WHERE m.id = i.id AND m.lease_owner = i.token AND i.outcome = 'dead'
  RETURNING m.id, m.destination, m.ordering_key, m.idempotency_key, m.event_type, m.headers,
            m.payload, m.payload_bytes, m.attempts, m.created_at, i.error, i.counted,
            m.endpoint_id, i.token
), buried AS (
  INSERT INTO outbox.dead_letters (id, destination, ordering_key, idempotency_key, event_type,
                                   headers, payload, payload_bytes, attempts, reason,
                                   last_error, created_at, endpoint_id)
  SELECT d.id, d.destination, d.ordering_key, d.idempotency_key, d.event_type, d.headers,
         d.payload, d.payload_bytes, d.attempts + CASE WHEN d.counted THEN 1 ELSE 0 END,
         d.error, d.error, d.created_at, d.endpoint_id
  FROM dead d
  UNION ALL
  -- An endpoint refused a fanned-out message for good: a dead letter of that endpoint, with
  -- an id of its own.
  SELECT nextval('outbox.messages_id_seq'), o.destination, o.endpoint || ':' || o.ordering_key,
         outbox.endpoint_delivery_id(o.idempotency_key, o.endpoint), o.event_type, o.headers,
         o.payload, o.payload_bytes, o.attempts, o.reason, o.error, o.created_at, o.endpoint
  FROM owed o
  WHERE o.outcome = 'dead'
  RETURNING id
), retried AS (
  UPDATE outbox.messages m
  SET lease_owner = NULL, lease_until = NULL, parked = true, attempts = m.attempts + 1,
      deliver_after = clock_timestamp() + make_interval(secs => i.delay_ms / 1000.0),
      last_error = i.error,
      absent_as_of = coalesce(to_timestamp(i.absent_as_of_us / 1000000.0), m.absent_as_of)
  FROM input i
  WHERE m.id = i.id AND m.lease_owner = i.token AND i.outcome = 'retry'
  RETURNING m.id, i.token
), released AS (
  UPDATE outbox.messages m
  -- Shutdown, or an endpoint that stopped sending for a while (delay_ms): handed back
  -- undelivered; no attempt is counted.
  SET lease_owner = NULL, lease_until = NULL, parked = true,
      deliver_after = clock_timestamp() + make_interval(secs => coalesce(i.delay_ms, 0) / 1000.0),
      absent_as_of = coalesce(to_timestamp(i.absent_as_of_us / 1000000.0), m.absent_as_of)
  FROM input i
  WHERE m.id = i.id AND m.lease_owner = i.token AND i.outcome = 'release'
  RETURNING m.id, i.token, coalesce(i.delay_ms, 0) <= 0 AS due_now
), handed_back AS (
  -- Rows handed back due at once (a relay that stops) are for the other relays to claim:
  -- wake them as a new message does. The insert trigger (migration 0013) does not fire for an
  -- UPDATE, and the other relays would otherwise wait for their poll_interval_ms.
  SELECT pg_notify('outbox_messages', '') FROM (SELECT 1 FROM released WHERE due_now LIMIT 1) r
), settler AS (
  SELECT $5::text AS instance_id
), left_queue AS (
  SELECT id, destination, ordering_key, endpoint_id, token FROM delivered
  UNION ALL SELECT id, destination, ordering_key, endpoint_id, token FROM dead
), settled AS (
  SELECT token FROM delivered UNION ALL SELECT token FROM dead
  UNION ALL SELECT token FROM retried UNION ALL SELECT token FROM released
), matched AS (
  -- Every input matched its row (the usual case): `gone` and `written` need no second look.
  SELECT (SELECT count(*) FROM input) = (SELECT count(*) FROM delivered) +
           (SELECT count(*) FROM dead) + (SELECT count(*) FROM retried) +
           (SELECT count(*) FROM released) AS all_inputs
),
-- @include settle_wakes_and_leases.sql
SELECT (SELECT count(*) FROM delivered) AS delivered, (SELECT count(*) FROM dead) AS dead,
       -- Dead letters of endpoints that refused a fanned-out message for good.
       (SELECT count(*) FROM buried) - (SELECT count(*) FROM dead) AS endpoint_dead,
       (SELECT count(*) FROM retried) AS retried, (SELECT count(*) FROM released) AS released,
       (SELECT count(*) FROM woken) AS woken, (SELECT count(*) FROM archived) AS archived,
       (SELECT count(*) FROM spawned) AS spawned,
       (SELECT count(*) FROM handed_back) + (SELECT count(*) FROM woke_elsewhere) AS woke_others,
       -- The statement's snapshot still holds the rows it deletes itself. (A subquery in a
       -- CASE branch not taken is not run.)
       CASE WHEN (SELECT all_inputs FROM matched) THEN 0
            ELSE (SELECT count(*) FROM input i
                   WHERE NOT EXISTS (SELECT 1 FROM outbox.messages m WHERE m.id = i.id)) END
         AS gone,
       -- What this write did, by id, for the metrics (a fenced outcome counts nothing); NULL
       -- when it did what every input asked.
       CASE WHEN NOT (SELECT all_inputs FROM matched) THEN
         (SELECT coalesce(jsonb_agg(w.id), '[]'::jsonb)
            FROM (SELECT id FROM delivered UNION ALL SELECT id FROM buried
                  UNION ALL SELECT id FROM retried UNION ALL SELECT id FROM released) w)::text
       END AS written,
       -- Fan-outs not written (a key lock held elsewhere); NULL when none.
       (SELECT jsonb_agg(id) FROM deferred)::text AS deferred
