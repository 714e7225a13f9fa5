-- 0014: a bucket count change waits for the writers in flight. set_bucket_count re-bucketed
-- the rows it could see, so a message committed after it kept a bucket of the old count: with
-- fewer buckets no relay owned it, it was never claimed, and every later message of its key
-- parked behind it for good. Writers now hold a shared advisory lock (7079, 2) until they
-- commit and read the count after taking it; set_bucket_count takes that lock alone, so it
-- waits for the writers in flight and holds new ones back until it commits. coordinate()
-- reads the count after its own lock, so a heartbeat does not recreate buckets the change
-- just removed. The shared lock costs writers nothing measurable: one-row enqueue
-- transactions ran at 1.36-1.71k/s with 0007's function and 1.61-1.78k/s with this one
-- (pgbench, one client, alternating, 2 cores).

-- As in 0007, with the lock.
CREATE OR REPLACE FUNCTION outbox.insert_message(destination text, payload jsonb, payload_bytes bytea,
                                                 ordering_key text, headers jsonb, event_type text,
                                                 deliver_after timestamptz, idempotency_key uuid)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  new_id bigint;
  ts timestamptz := clock_timestamp();
  bucket_count integer;
  bucket smallint;
  payload_size bigint;
  max_payload integer;
BEGIN
  PERFORM outbox.validate_message(destination, ordering_key, headers, event_type);
  -- The payload as the relay sends it: jsonb as its text, bytea as its bytes.
  payload_size := coalesce(octet_length(payload::text), octet_length(payload_bytes), 0);
  SELECT s.max_payload_bytes INTO max_payload FROM outbox.settings s;
  IF payload_size > max_payload THEN
    RAISE EXCEPTION 'outbox.enqueue: payload is % bytes, the limit is % (outbox.settings.max_payload_bytes)',
                    payload_size, max_payload
      USING ERRCODE = 'program_limit_exceeded',
            HINT = 'Store large documents in your own table or an object store and send a reference; '
                   'or, as the schema owner, raise the limit: UPDATE outbox.settings SET max_payload_bytes = ...';
  END IF;
  IF deliver_after IS NOT NULL AND NOT isfinite(deliver_after) THEN
    RAISE EXCEPTION 'outbox.enqueue: deliver_after must be a finite time, got %', deliver_after
      USING ERRCODE = 'invalid_parameter_value',
            HINT = 'Pass NULL to deliver as soon as the transaction commits, or a time at most 1 year ahead.';
  END IF;
  IF deliver_after > ts + interval '1 year' THEN
    RAISE EXCEPTION 'outbox.enqueue: deliver_after % is more than 1 year ahead (the scheduling horizon)', deliver_after
      USING ERRCODE = 'invalid_parameter_value',
            HINT = 'Schedule at most 1 year ahead; keep later work in your own table and enqueue it nearer the time.';
  END IF;
  -- No EXCEPTION block here: it would open a subtransaction per message, and more than 64
  -- of those in one transaction overflow every snapshot's subxid cache.
  IF idempotency_key IS NOT NULL
     AND EXISTS (SELECT 1 FROM outbox.messages q WHERE q.idempotency_key = insert_message.idempotency_key) THEN
    RAISE EXCEPTION 'outbox.enqueue: idempotency key % is already queued', idempotency_key
      USING ERRCODE = 'unique_violation',
            HINT = 'Each message needs its own idempotency key; omit it to get a random one.';
  END IF;
  PERFORM pg_current_xact_id();
  -- Shared with every writer until commit; outbox.set_bucket_count takes it alone, so it
  -- re-buckets no count under a row still being written (the count is read after the lock).
  PERFORM pg_advisory_xact_lock_shared(7079, 2);
  bucket_count := (SELECT p.bucket_count FROM outbox.partitioning p);
  IF ordering_key IS NOT NULL THEN
    PERFORM pg_advisory_xact_lock(hashtextextended(destination || chr(31) || ordering_key, 7079));
    bucket := (hashtextextended(destination || chr(31) || ordering_key, 0) & 32767) % bucket_count;
  ELSE
    bucket := floor(random() * bucket_count);
  END IF;
  INSERT INTO outbox.messages AS m (destination, ordering_key, idempotency_key, event_type,
                                    headers, payload, payload_bytes, deliver_after, parked,
                                    created_at, bucket)
  VALUES (destination, ordering_key, coalesce(idempotency_key, gen_random_uuid()), event_type,
          headers, payload, payload_bytes, coalesce(deliver_after, ts),
          -- a message due later goes straight to the slow lane
          coalesce(deliver_after, ts) > ts + interval '1 second', ts, bucket)
  RETURNING m.id INTO new_id;
  RETURN new_id;
END
$$;

-- As in 0001, taking the writers' lock first.
CREATE OR REPLACE FUNCTION outbox.set_bucket_count(new_count integer) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_advisory_xact_lock(7079, 2);
  PERFORM pg_advisory_xact_lock(7079, 1);
  UPDATE outbox.partitioning SET bucket_count = new_count;
  UPDATE outbox.messages m
  SET bucket = CASE WHEN m.ordering_key IS NULL THEN floor(random() * new_count)
                    ELSE (hashtextextended(m.destination || chr(31) || m.ordering_key, 0) & 32767) % new_count END;
  UPDATE outbox.bucket_owners SET owner = NULL, epoch = epoch + 1;
  DELETE FROM outbox.bucket_owners WHERE bucket >= new_count;
END
$$;

-- As in 0001, reading the count under the lock.
CREATE OR REPLACE FUNCTION outbox.coordinate(instance uuid, dead_after interval, leaving boolean,
                                  description text DEFAULT '')
RETURNS TABLE (bucket integer, epoch bigint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
  n integer;
  bc integer;
BEGIN
  PERFORM pg_advisory_xact_lock(7079, 1);
  bc := (SELECT p.bucket_count FROM outbox.partitioning p);
  IF leaving THEN
    DELETE FROM outbox.relay_instances WHERE instance_id = instance;
  ELSE
    INSERT INTO outbox.relay_instances AS r (instance_id, heartbeat_at, description)
    VALUES (instance, clock_timestamp(), description)
    ON CONFLICT (instance_id) DO UPDATE SET heartbeat_at = excluded.heartbeat_at;
  END IF;
  DELETE FROM outbox.relay_instances r WHERE r.heartbeat_at < clock_timestamp() - dead_after;
  INSERT INTO outbox.bucket_owners (bucket) SELECT g FROM generate_series(0, bc - 1) g
  ON CONFLICT DO NOTHING;
  DELETE FROM outbox.bucket_owners o WHERE o.bucket >= bc;
  SELECT count(*) INTO n FROM outbox.relay_instances;
  WITH live AS (
    SELECT r.instance_id, (row_number() OVER (ORDER BY r.instance_id) - 1)::integer AS idx
    FROM outbox.relay_instances r
  ), desired AS (
    SELECT o.bucket AS b, l.instance_id AS want
    FROM outbox.bucket_owners o LEFT JOIN live l ON l.idx = o.bucket % greatest(n, 1)
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
