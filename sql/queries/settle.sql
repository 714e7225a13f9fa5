-- settle: record the outcome of delivered messages, fenced by lease token: a relay whose
-- lease expired (and was taken back by the reaper) settles nothing.
--   $1 jsonb array of {"id", "token", "outcome": delivered|retry|dead|release,
--                       "delay_ms" (retry), "error" (retry, dead),
--                       "counted": whether this outcome ends an attempt (dead)}
--   $2 boolean: also copy delivered messages to outbox.delivered_archive
-- Returns counts of delivered, dead, retried, released and woken rows, and of `gone`: inputs
-- whose row no longer exists (settled by an earlier run of this same write whose reply was
-- lost, e.g. in a database restart, or delivered by another relay after the lease expired).
-- The rest were fenced: the row is there, leased by someone else or returned to the queue.
WITH input AS (
  SELECT * FROM jsonb_to_recordset($1::jsonb)
    AS x(id bigint, token uuid, outcome text, delay_ms bigint, error text, counted boolean)
), delivered AS (
  DELETE FROM outbox.messages m USING input i
  WHERE m.id = i.id AND m.lease_owner = i.token AND i.outcome = 'delivered'
  RETURNING m.id, m.destination, m.ordering_key, m.idempotency_key, m.event_type, m.headers,
            m.payload, m.payload_bytes, m.attempts, m.created_at
), archived AS (
  INSERT INTO outbox.delivered_archive (id, destination, ordering_key, idempotency_key,
                                        event_type, headers, payload, payload_bytes,
                                        attempts, created_at, delivered_at)
  SELECT d.id, d.destination, d.ordering_key, d.idempotency_key, d.event_type, d.headers,
         d.payload, d.payload_bytes, d.attempts + 1, d.created_at, clock_timestamp()
  FROM delivered d
  WHERE $2::boolean
  ON CONFLICT (id) DO NOTHING
  RETURNING id
), dead AS (
  DELETE FROM outbox.messages m USING input i
  WHERE m.id = i.id AND m.lease_owner = i.token AND i.outcome = 'dead'
  RETURNING m.id, m.destination, m.ordering_key, m.idempotency_key, m.event_type, m.headers,
            m.payload, m.payload_bytes, m.attempts, m.created_at, i.error, i.counted
), buried AS (
  INSERT INTO outbox.dead_letters (id, destination, ordering_key, idempotency_key, event_type,
                                   headers, payload, payload_bytes, attempts, reason,
                                   last_error, created_at)
  SELECT d.id, d.destination, d.ordering_key, d.idempotency_key, d.event_type, d.headers,
         d.payload, d.payload_bytes, d.attempts + CASE WHEN d.counted THEN 1 ELSE 0 END,
         d.error, d.error, d.created_at
  FROM dead d
  RETURNING id
), retried AS (
  UPDATE outbox.messages m
  SET lease_owner = NULL, lease_until = NULL, parked = true, attempts = m.attempts + 1,
      deliver_after = clock_timestamp() + make_interval(secs => i.delay_ms / 1000.0),
      last_error = i.error
  FROM input i
  WHERE m.id = i.id AND m.lease_owner = i.token AND i.outcome = 'retry'
  RETURNING m.id
), released AS (
  -- Shutdown: handed back undelivered; no attempt is counted.
  UPDATE outbox.messages m
  SET lease_owner = NULL, lease_until = NULL, parked = true, deliver_after = clock_timestamp()
  FROM input i
  WHERE m.id = i.id AND m.lease_owner = i.token AND i.outcome = 'release'
  RETURNING m.id
), finished AS (
  SELECT f.destination, f.ordering_key, max(f.id) AS id
  FROM (SELECT id, destination, ordering_key FROM delivered
        UNION ALL SELECT id, destination, ordering_key FROM dead) f
  WHERE f.ordering_key IS NOT NULL
  GROUP BY f.destination, f.ordering_key
), woken AS (
  -- The next message of each finished key may now go.
  UPDATE outbox.messages m
  SET deliver_after = clock_timestamp()
  FROM finished f
  WHERE m.id = (SELECT min(n.id) FROM outbox.messages n
                WHERE n.destination = f.destination AND n.ordering_key = f.ordering_key
                  AND n.id > f.id)
    AND m.parked AND m.deliver_after = 'infinity'
  RETURNING m.id
)
SELECT (SELECT count(*) FROM delivered) AS delivered, (SELECT count(*) FROM buried) AS dead,
       (SELECT count(*) FROM retried) AS retried, (SELECT count(*) FROM released) AS released,
       (SELECT count(*) FROM woken) AS woken, (SELECT count(*) FROM archived) AS archived,
       -- The statement's snapshot still holds the rows it deletes itself.
       (SELECT count(*) FROM input i
         WHERE NOT EXISTS (SELECT 1 FROM outbox.messages m WHERE m.id = i.id)) AS gone,
       -- What this write did, by id, for the metrics (a fenced outcome counts nothing).
       (SELECT coalesce(jsonb_agg(w.id), '[]'::jsonb)
          FROM (SELECT id FROM delivered UNION ALL SELECT id FROM buried
                UNION ALL SELECT id FROM retried) w)::text AS written
