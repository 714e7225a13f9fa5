-- 0016: the partitioned mode's coordination (outbox.coordinate, outbox.set_bucket_count).
-- * A relay frozen inside its heartbeat's transaction holds no other relay for long.
--   outbox.coordinate takes the coordinator's transaction-scoped lock (7079, 1). A caller
--   frozen (SIGSTOP, a network cut) after that and before its COMMIT kept the lock until TCP
--   gave up on the connection, hours by default: every other relay's heartbeat waited behind
--   it and the frozen relay's buckets were never handed on. The function now sets
--   idle_in_transaction_session_timeout for its own transaction to the lease it was given (at
--   least 1 s), so the server ends such a session once it idles that long. The relay itself
--   calls it in a single autocommit statement (no idle moment inside the transaction).
-- * Each relay is declared dead by the lease it runs with (stored with its heartbeat), not by
--   the lease of whoever heartbeats next: during a rollout that changed partition_lease_ms, a
--   relay on a short lease deleted a peer on a longer one at every heartbeat, and their buckets
--   moved back and forth. A row without one (written before this migration) is judged by the
--   caller's lease, as before.
-- * set_bucket_count holds the coordinator's lock while it re-buckets the queue (a while, on a
--   big one), and every relay's heartbeat waits behind it. Those relays are alive: the first
--   heartbeat afterwards deleted every other relay whose lease ran out during the wait, and
--   all buckets moved twice. The time it held the lock is now added to every heartbeat, and
--   the relays are told to take the buckets it freed at once ('rebalance').
-- * A relay that joins or leaves moves only its share of the buckets. "Bucket b goes to the
--   (b mod n)-th live relay" moved 48 of 64 buckets from 4 relays to 5 (each move resets a
--   cursor and re-initialises an exactly-once producer); each relay now keeps what it owns up
--   to its share.
-- The bodies are 0014's otherwise.

ALTER TABLE outbox.relay_instances ADD COLUMN dead_after interval;

CREATE OR REPLACE FUNCTION outbox.coordinate(instance uuid, dead_after interval, leaving boolean,
                                  description text DEFAULT '')
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
    INSERT INTO outbox.relay_instances AS r (instance_id, heartbeat_at, description, dead_after)
    VALUES (instance, clock_timestamp(), coordinate.description, coordinate.dead_after)
    ON CONFLICT (instance_id) DO UPDATE SET heartbeat_at = excluded.heartbeat_at,
                                            dead_after = excluded.dead_after;
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

CREATE OR REPLACE FUNCTION outbox.set_bucket_count(new_count integer) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
  held_since timestamptz;
BEGIN
  PERFORM pg_advisory_xact_lock(7079, 2);
  PERFORM pg_advisory_xact_lock(7079, 1);
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
