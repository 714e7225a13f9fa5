-- 0026: the last relay to leave hands its buckets back. outbox.coordinate divided the bucket
-- count by the number of relays left, none when the last one left: PL/pgSQL's first plans of
-- a session are custom plans, whose planning folded `bc / 0` and raised "division by zero",
-- so the hand-back failed, and the relay stayed registered with its buckets (and, delivering
-- exactly once, held set_bucket_count back) until its lease ran out (review;
-- tests/store/coordinate_pgtest.cc). The body is 0017's otherwise.
CREATE OR REPLACE FUNCTION outbox.coordinate(instance uuid, dead_after interval, leaving boolean,
                                  description text DEFAULT '', exactly_once boolean DEFAULT false)
RETURNS TABLE (bucket integer, epoch bigint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
  n integer;
  bc integer;
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
                                             exactly_once)
    VALUES (instance, clock_timestamp(), coordinate.description, coordinate.dead_after,
            coordinate.exactly_once)
    ON CONFLICT (instance_id) DO UPDATE SET heartbeat_at = excluded.heartbeat_at,
                                            dead_after = excluded.dead_after,
                                            exactly_once = excluded.exactly_once;
  END IF;
  -- (The parameter named in full: with use_column, a bare dead_after is now the column.)
  DELETE FROM outbox.relay_instances r
  WHERE r.heartbeat_at < clock_timestamp() - coalesce(r.dead_after, coordinate.dead_after);
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
  ), desired AS (
    SELECT k.b, k.holder AS want FROM kept k
    UNION ALL
    SELECT f.b, op.instance_id FROM free f LEFT JOIN openings op ON op.slot = f.slot
  )
  UPDATE outbox.bucket_owners o SET owner = d.want, epoch = o.epoch + 1
  FROM desired d
  WHERE o.bucket = d.b AND o.owner IS DISTINCT FROM d.want;
  IF leaving THEN
    PERFORM pg_notify('outbox_messages', 'rebalance');
  END IF;
  RETURN QUERY SELECT o.bucket, o.epoch FROM outbox.bucket_owners o WHERE o.owner = instance
               ORDER BY o.bucket;
END
$$;
