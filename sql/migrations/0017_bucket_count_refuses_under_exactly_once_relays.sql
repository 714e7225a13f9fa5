-- 0017: outbox.set_bucket_count refuses to run under a live exactly-once relay.
-- * It moves queued messages between buckets, and so between the Kafka transactional ids that
--   exactly-once relays fence each other by (one producer per bucket, docs/adr/0002): a message
--   in flight at one relay under bucket 3's producer could be claimed again under bucket 7's,
--   whose start fences nothing, and a read_committed consumer would see it twice. Only the
--   documentation said "with the relays stopped".
-- * Each relay now says in its heartbeat whether it delivers exactly once
--   (relay_instances.exactly_once, a new last argument of outbox.coordinate that older relays
--   leave at false). set_bucket_count raises an error naming the live ones, unless called
--   with force => true.
-- * Both functions get a parameter with a default, so existing calls keep working; the old
--   signatures are dropped first (two overloads would make those calls ambiguous).
-- The bodies are 0016's otherwise.

ALTER TABLE outbox.relay_instances ADD COLUMN exactly_once boolean NOT NULL DEFAULT false;

DROP FUNCTION outbox.coordinate(uuid, interval, boolean, text);
DROP FUNCTION outbox.set_bucket_count(integer);

CREATE FUNCTION outbox.coordinate(instance uuid, dead_after interval, leaving boolean,
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
  SELECT count(*) INTO n FROM outbox.relay_instances;
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

CREATE FUNCTION outbox.set_bucket_count(new_count integer, force boolean DEFAULT false)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
  held_since timestamptz;
  fencing text;
BEGIN
  -- Checked before the locks, so a refusal does not first wait for every writer of the queue
  -- (and hold new ones back meanwhile), and again under them, where no relay joins.
  FOR pass IN 1..2 LOOP
    IF pass = 2 THEN
      PERFORM pg_advisory_xact_lock(7079, 2);
      PERFORM pg_advisory_xact_lock(7079, 1);
    END IF;
    SELECT string_agg(format('%s (%s)', r.description, r.instance_id), ', '
                      ORDER BY r.description)
      INTO fencing
    FROM outbox.relay_instances r
    WHERE r.exactly_once
      AND r.heartbeat_at >= clock_timestamp() - coalesce(r.dead_after, interval '10 seconds');
    IF fencing IS NOT NULL AND NOT force THEN
      RAISE EXCEPTION 'outbox.set_bucket_count(%): live relays deliver exactly once: %',
                      new_count, fencing
        USING DETAIL = 'Changing the bucket count moves queued messages between buckets, and '
                       'so between the Kafka transactional ids these relays fence each other '
                       'by: a message in flight could be produced twice, and a read_committed '
                       'consumer would see both.',
              HINT = format('Stop those relays and run it again, or accept duplicates with '
                            'SELECT outbox.set_bucket_count(%s, force => true).', new_count);
    END IF;
  END LOOP;
  IF fencing IS NOT NULL THEN
    RAISE WARNING 'outbox.set_bucket_count(%) forced under exactly-once relays: %', new_count,
                  fencing;
  END IF;
  held_since := clock_timestamp();
  UPDATE outbox.partitioning SET bucket_count = new_count;
  UPDATE outbox.messages m
  SET bucket = CASE WHEN m.ordering_key IS NULL THEN floor(random() * new_count)
                    ELSE (hashtextextended(m.destination || chr(31) || m.ordering_key, 0) & 32767) % new_count END;
  UPDATE outbox.bucket_owners SET owner = NULL, epoch = epoch + 1;
  DELETE FROM outbox.bucket_owners WHERE bucket >= new_count;
  -- Heartbeats could not be written while this held the lock: that time is not held against
  -- the relays.
  UPDATE outbox.relay_instances SET heartbeat_at = heartbeat_at + (clock_timestamp() - held_since);
  PERFORM pg_notify('outbox_messages', 'rebalance');
END
$$;

REVOKE ALL ON FUNCTION outbox.coordinate(uuid, interval, boolean, text, boolean),
                       outbox.set_bucket_count(integer, boolean) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION outbox.coordinate(uuid, interval, boolean, text, boolean) TO outbox_relay;
