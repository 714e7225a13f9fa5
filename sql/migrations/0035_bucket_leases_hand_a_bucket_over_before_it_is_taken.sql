-- 0035: bucket leases (docs/adr/0003-bucket-leases.md): a relay with `bucket_leases: true`
-- holds its buckets' rows by owning the bucket, with nothing written in the rows. So:
-- * Each relay says in its heartbeat whether it does (relay_instances.bucket_leases, a new
--   argument of outbox.coordinate that older relays leave at false), and outbox.coordinate
--   refuses a relay whose mode differs from a live relay's: a row-lease relay would claim rows
--   a bucket-lease relay holds in memory, and the other way round (error 55000, naming the
--   other relay).
-- * A bucket that a rebalance moves away from a live bucket-lease relay is handed over before
--   it is taken (give before take). Its owner keeps it, marked `handing_to` the relay it goes
--   to, and the function returns it with `handing` true: the owner stops claiming from it,
--   waits until what it handed its sinks from the bucket is settled, and then names it in
--   `released` at its next call, which moves it. Moved at once as before: a dead owner's
--   buckets, a leaving owner's, and a row-lease owner's (their rows stay leased across the
--   move). A handover not given within the owner's `hand_over_within` (its heartbeat's; the
--   relay passes its shutdown_timeout_ms), counted from the handover's start whoever it goes
--   to meanwhile, is taken anyway, as after a crash: what the owner still had in flight may
--   then be delivered twice.
-- * The function runs with jit off: its statements on a few dozen rows are estimated at
--   millions, and JIT compiled them at every heartbeat (0.5 s each on 2 cores).
-- * The function returns a third column, `handing`; callers that read the first two by
--   position or name are unaffected. The old signature is dropped first (two overloads would
--   make existing calls ambiguous).
-- Written to run again over itself (IF NOT EXISTS, OR REPLACE). The body is 0026's otherwise.

ALTER TABLE outbox.relay_instances ADD COLUMN IF NOT EXISTS bucket_leases boolean NOT NULL DEFAULT false,
                                   ADD COLUMN IF NOT EXISTS hand_over_within interval;
ALTER TABLE outbox.bucket_owners ADD COLUMN IF NOT EXISTS handing_to uuid,
                                 ADD COLUMN IF NOT EXISTS handing_since timestamptz;

DROP FUNCTION IF EXISTS outbox.coordinate(uuid, interval, boolean, text, boolean);

CREATE OR REPLACE FUNCTION outbox.coordinate(instance uuid, dead_after interval, leaving boolean,
                                  description text DEFAULT '', exactly_once boolean DEFAULT false,
                                  bucket_leases boolean DEFAULT false,
                                  released integer[] DEFAULT '{}',
                                  hand_over_within interval DEFAULT interval '10 seconds')
RETURNS TABLE (bucket integer, epoch bigint, handing boolean)
-- Its statements on a few dozen rows are estimated at millions (the generate_series and CTE
-- joins of the rebalance): with JIT on, the server compiled the rebalance with optimisation at
-- every call, 0.5 s of a heartbeat on 2 cores (27 ms before the handover's CTE, already JIT).
SET jit = off
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
  n integer;
  bc integer;
  other record;
BEGIN
  -- Before the lock: a caller that stops answering inside this transaction (frozen before its
  -- COMMIT) has its session ended once it idles in it longer than the lease it asked for,
  -- which frees the lock; it is dead by then anyway.
  PERFORM set_config('idle_in_transaction_session_timeout',
                     (extract(epoch FROM greatest(coordinate.dead_after, interval '1 second'))
                      * 1000)::bigint::text,
                     true);
  PERFORM pg_advisory_xact_lock(7079, 1);
  bc := (SELECT p.bucket_count FROM outbox.partitioning p);
  IF leaving THEN
    DELETE FROM outbox.relay_instances WHERE instance_id = instance;
  ELSE
    INSERT INTO outbox.relay_instances AS r (instance_id, heartbeat_at, description, dead_after,
                                             exactly_once, bucket_leases, hand_over_within)
    VALUES (instance, clock_timestamp(), coordinate.description, coordinate.dead_after,
            coordinate.exactly_once, coordinate.bucket_leases, coordinate.hand_over_within)
    ON CONFLICT (instance_id) DO UPDATE SET heartbeat_at = excluded.heartbeat_at,
                                            dead_after = excluded.dead_after,
                                            exactly_once = excluded.exactly_once,
                                            bucket_leases = excluded.bucket_leases,
                                            hand_over_within = excluded.hand_over_within;
  END IF;
  -- (The parameter named in full: with use_column, a bare dead_after is now the column.)
  DELETE FROM outbox.relay_instances r
  WHERE r.heartbeat_at < clock_timestamp() - coalesce(r.dead_after, coordinate.dead_after);
  IF NOT leaving THEN
    SELECT r.instance_id, r.description, r.bucket_leases INTO other
    FROM outbox.relay_instances r
    WHERE r.instance_id <> instance AND r.bucket_leases <> coordinate.bucket_leases
    LIMIT 1;
    IF FOUND THEN
      -- Nothing of this call stays: the caller is not registered and takes no bucket.
      RAISE EXCEPTION 'outbox.coordinate: relay % (%) runs with bucket_leases %, this one with %',
        other.instance_id, other.description, other.bucket_leases::text,
        coordinate.bucket_leases::text
        USING ERRCODE = 'object_not_in_prerequisite_state',
              HINT = 'the relays of a partitioned fleet must agree on bucket_leases (a row-lease '
                     'relay would claim rows a bucket-lease relay holds): set it alike in every '
                     'relay''s config, or stop the others before starting this one '
                     '(docs/scaling.md)';
    END IF;
  END IF;
  INSERT INTO outbox.bucket_owners (bucket) SELECT g FROM generate_series(0, bc - 1) g
  ON CONFLICT DO NOTHING;
  DELETE FROM outbox.bucket_owners o WHERE o.bucket >= bc;
  -- At least 1: with none left (the last relay leaving) the shares below are of nobody, but
  -- planning folded bc / 0 in a session's first (custom) plans and the hand-back failed.
  SELECT greatest(count(*), 1) INTO n FROM outbox.relay_instances;
  -- Sticky shares: each live relay is owed floor(bc / n) buckets, one more for the bc % n that
  -- own the most now; it keeps what it owns up to that, and only the rest moves (to the
  -- relays short of their share). Nobody live: every bucket is free.
  WITH live AS (
    SELECT r.instance_id,
           (SELECT count(*) FROM outbox.bucket_owners o WHERE o.owner = r.instance_id) AS holds
    FROM outbox.relay_instances r
  ), quota AS (
    SELECT l.instance_id,
           bc / n + CASE WHEN row_number() OVER (ORDER BY l.holds DESC, l.instance_id) <= bc % n
                         THEN 1 ELSE 0 END AS share
    FROM live l
  ), ranked AS (
    SELECT o.bucket AS b, o.owner AS holder,
           row_number() OVER (PARTITION BY o.owner ORDER BY o.bucket) AS nth
    FROM outbox.bucket_owners o JOIN quota q ON q.instance_id = o.owner
  ), kept AS (
    SELECT k.b, k.holder FROM ranked k JOIN quota q ON q.instance_id = k.holder
    WHERE k.nth <= q.share
  ), free AS (
    SELECT o.bucket AS b, row_number() OVER (ORDER BY o.bucket) AS slot
    FROM outbox.bucket_owners o WHERE NOT EXISTS (SELECT 1 FROM kept k WHERE k.b = o.bucket)
  ), openings AS (
    SELECT q.instance_id, row_number() OVER (ORDER BY q.instance_id, g) AS slot
    FROM quota q
    CROSS JOIN LATERAL generate_series(1, q.share - (SELECT count(*) FROM kept k
                                                      WHERE k.holder = q.instance_id)) g
  ), desired AS MATERIALIZED (
    SELECT k.b, k.holder AS want FROM kept k
    UNION ALL
    SELECT f.b, op.instance_id FROM free f LEFT JOIN openings op ON op.slot = f.slot
  ), decided AS MATERIALIZED (
    -- Whether a bucket that should change owner does so now: not while a live bucket-lease
    -- owner still holds what it handed its sinks from it, unless it gave the bucket up or let
    -- the handover run past its time (the owner's, as it said in its heartbeat; the caller's
    -- for an owner that said none).
    SELECT d.b, d.want,
           o.owner IS DISTINCT FROM d.want AND (
             NOT EXISTS (SELECT 1 FROM outbox.relay_instances r
                         WHERE r.instance_id = o.owner AND r.bucket_leases)
             OR (o.owner = instance AND o.bucket = ANY (coordinate.released))
             OR o.handing_since < clock_timestamp() - coalesce(
                  (SELECT r.hand_over_within FROM outbox.relay_instances r
                   WHERE r.instance_id = o.owner),
                  coordinate.hand_over_within)) AS moves
    FROM desired d JOIN outbox.bucket_owners o ON o.bucket = d.b
  )
  UPDATE outbox.bucket_owners o
  SET owner = CASE WHEN x.moves THEN x.want ELSE o.owner END,
      epoch = CASE WHEN x.moves THEN o.epoch + 1 ELSE o.epoch END,
      handing_to = CASE WHEN x.moves OR o.owner IS NOT DISTINCT FROM x.want THEN NULL
                        ELSE x.want END,
      -- A handover's time runs from its start, whoever it goes to meanwhile: retargeted at
      -- every join and leave, a stuck owner's bucket was never taken.
      handing_since = CASE WHEN x.moves OR o.owner IS NOT DISTINCT FROM x.want THEN NULL
                           WHEN o.handing_to IS NOT NULL THEN o.handing_since
                           ELSE clock_timestamp() END
  FROM decided x
  WHERE o.bucket = x.b
    AND (o.owner IS DISTINCT FROM x.want OR o.handing_to IS NOT NULL);
  IF leaving THEN
    PERFORM pg_notify('outbox_messages', 'rebalance');
  END IF;
  RETURN QUERY SELECT o.bucket, o.epoch, o.handing_to IS NOT NULL FROM outbox.bucket_owners o
               WHERE o.owner = instance ORDER BY o.bucket;
END
$$;

REVOKE ALL ON FUNCTION outbox.coordinate(uuid, interval, boolean, text, boolean, boolean,
                                         integer[], interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION outbox.coordinate(uuid, interval, boolean, text, boolean, boolean,
                                            integer[], interval) TO outbox_relay;
