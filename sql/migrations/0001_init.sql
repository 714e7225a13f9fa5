-- 0001: the outbox schema: queue table, dead letters, enqueue API, roles.
-- Migrations are append-only: never edit a released one, add the next number.

CREATE SCHEMA IF NOT EXISTS outbox;

-- Roles are cluster-wide, so create them only when missing. Both are NOLOGIN:
-- applications GRANT them to their own login roles (see docs/roles.md).
DO $$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'outbox_writer') THEN
    CREATE ROLE outbox_writer NOLOGIN;
  END IF;
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'outbox_relay') THEN
    CREATE ROLE outbox_relay NOLOGIN;
  END IF;
END
$$;

CREATE TABLE outbox.messages (
  -- CACHE 1 (the default) matters: ids must be handed out in one global order, see the ADR.
  id              bigint GENERATED ALWAYS AS IDENTITY (CACHE 1) PRIMARY KEY,
  destination     text        NOT NULL,
  ordering_key    text,
  idempotency_key uuid        NOT NULL,
  event_type      text        NOT NULL DEFAULT '',
  headers         jsonb       NOT NULL DEFAULT '{}'::jsonb,
  payload         jsonb,
  payload_bytes   bytea,
  deliver_after   timestamptz NOT NULL,
  attempts        integer     NOT NULL DEFAULT 0,
  -- parked: the row left the fresh lane (scheduled for later, blocked behind an earlier
  -- message of its key, waiting for a retry, or returned by the reaper). It is then claimed
  -- through messages_parked_idx. Fresh rows are claimed by id from a cursor instead.
  parked          boolean     NOT NULL DEFAULT false,
  lease_owner     uuid,
  lease_until     timestamptz,
  last_error      text,
  created_at      timestamptz NOT NULL,
  -- Partition-assignment mode (claim_mode: partitioned): the logical bucket, from a hash of
  -- the ordering key (random without one), out of outbox.partitioning.bucket_count.
  bucket          smallint    NOT NULL DEFAULT 0,
  CONSTRAINT messages_idempotency_key_key UNIQUE (idempotency_key),
  CONSTRAINT messages_destination_check CHECK (destination <> '' AND length(destination) <= 255),
  CONSTRAINT messages_one_payload_check CHECK (num_nonnulls(payload, payload_bytes) = 1),
  CONSTRAINT messages_headers_object_check CHECK (jsonb_typeof(headers) = 'object'),
  CONSTRAINT messages_lease_check CHECK ((lease_owner IS NULL) = (lease_until IS NULL))
) WITH (
  -- Room on each page for the lease update to stay HOT (it changes no indexed column). A claim
  -- leases runs of consecutive rows, i.e. whole pages: at ~360-byte rows, 70 left room for
  -- only ~40% of them and the rest wrote new entries into every index (measured in
  -- docs/benchmarks.md); 40 keeps nearly all of them HOT, at the cost of a larger table.
  fillfactor = 40,
  -- A queue table churns: vacuum early and hard so dead tuples do not pile up.
  autovacuum_vacuum_scale_factor = 0.01,
  autovacuum_vacuum_threshold = 1000,
  autovacuum_vacuum_insert_scale_factor = 0.01,
  autovacuum_analyze_scale_factor = 0.02,
  autovacuum_vacuum_cost_limit = 2000,
  autovacuum_vacuum_cost_delay = 1
);

-- The fresh lane: rows never claimed nor parked, in id order per destination. The relay
-- scans it from a cursor, so the dead entries that deliveries leave at its head are not
-- walked again (docs/adr/0001-claim-path.md). Leasing a row changes no indexed column,
-- so the lease update stays HOT.
CREATE INDEX messages_fresh_idx ON outbox.messages (destination, id) WHERE NOT parked;

-- The fresh lane of one bucket, for claim_mode: partitioned.
CREATE INDEX messages_fresh_bucket_idx ON outbox.messages (destination, bucket, id) WHERE NOT parked;

-- The slow lane: parked rows in the order they become due. A row blocked behind an
-- earlier message of its key waits at deliver_after = 'infinity' until that one settles.
CREATE INDEX messages_parked_idx ON outbox.messages (destination, deliver_after, id) WHERE parked;

-- Per-key order: "is there an earlier message of this key?" is one index probe.
CREATE INDEX messages_key_order_idx ON outbox.messages (destination, ordering_key, id)
  WHERE ordering_key IS NOT NULL;

CREATE TABLE outbox.dead_letters (
  id              bigint      PRIMARY KEY,  -- the message id it had in outbox.messages
  destination     text        NOT NULL,
  ordering_key    text,
  idempotency_key uuid        NOT NULL,
  event_type      text        NOT NULL,
  headers         jsonb       NOT NULL,
  payload         jsonb,
  payload_bytes   bytea,
  attempts        integer     NOT NULL,
  reason          text        NOT NULL,
  last_error      text,
  created_at      timestamptz NOT NULL,
  dead_at         timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX dead_letters_dead_at_idx ON outbox.dead_letters (dead_at);
CREATE INDEX dead_letters_destination_idx ON outbox.dead_letters (destination, id);

-- Partition-assignment mode: fixed logical buckets, each owned by one live relay.
-- The coordinator is this table and outbox.coordinate(); no other moving part.
CREATE TABLE outbox.partitioning (
  only_row     boolean PRIMARY KEY DEFAULT true CHECK (only_row),
  bucket_count integer NOT NULL DEFAULT 64 CHECK (bucket_count BETWEEN 1 AND 32768)
);
INSERT INTO outbox.partitioning DEFAULT VALUES;

CREATE TABLE outbox.relay_instances (
  instance_id  uuid PRIMARY KEY,
  started_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
  heartbeat_at timestamptz NOT NULL,
  description  text NOT NULL DEFAULT ''
);

CREATE TABLE outbox.bucket_owners (
  bucket integer PRIMARY KEY,
  owner  uuid,                      -- NULL: free
  epoch  bigint NOT NULL DEFAULT 0  -- fencing token: bumped on every change of owner
);

-- Heartbeat, failure detection and rebalancing in one serialised step. Returns the buckets
-- `instance` owns afterwards with their epochs. `leaving` hands every bucket back at once.
-- Assignment: live instances sorted by id; bucket b goes to instance b mod n, so every
-- instance holds floor(N/n) or ceil(N/n) buckets.
CREATE FUNCTION outbox.coordinate(instance uuid, dead_after interval, leaving boolean,
                                  description text DEFAULT '')
RETURNS TABLE (bucket integer, epoch bigint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
  n integer;
  bc integer := (SELECT p.bucket_count FROM outbox.partitioning p);
BEGIN
  PERFORM pg_advisory_xact_lock(7079, 1);
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

-- Changes the bucket count and re-buckets queued messages; every relay picks up the new
-- assignment at its next heartbeat.
CREATE FUNCTION outbox.set_bucket_count(new_count integer) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_advisory_xact_lock(7079, 1);
  UPDATE outbox.partitioning SET bucket_count = new_count;
  UPDATE outbox.messages m
  SET bucket = CASE WHEN m.ordering_key IS NULL THEN floor(random() * new_count)
                    ELSE (hashtextextended(m.destination || chr(31) || m.ordering_key, 0) & 32767) % new_count END;
  UPDATE outbox.bucket_owners SET owner = NULL, epoch = epoch + 1;
  DELETE FROM outbox.bucket_owners WHERE bucket >= new_count;
END
$$;

-- One notification per inserting statement, not per row: a wake-up, not a payload.
CREATE FUNCTION outbox.notify_relay() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('outbox_messages', '');
  RETURN NULL;
END
$$;
CREATE TRIGGER messages_notify_relay
  AFTER INSERT ON outbox.messages
  FOR EACH STATEMENT EXECUTE FUNCTION outbox.notify_relay();

-- Validation shared by both enqueue overloads. Raises with a message that names the
-- argument and a hint that says how to fix it; on error the caller's statement fails, so
-- no row is left behind.
CREATE FUNCTION outbox.validate_message(destination text, ordering_key text, headers jsonb,
                                        event_type text)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
  bad_key text;
BEGIN
  IF destination IS NULL OR destination = '' THEN
    RAISE EXCEPTION 'outbox.enqueue: destination must not be empty'
      USING ERRCODE = 'invalid_parameter_value',
            HINT = 'Pass the destination name configured in the relay, e.g. ''orders''.';
  END IF;
  IF length(destination) > 255 THEN
    RAISE EXCEPTION 'outbox.enqueue: destination is % characters long, the limit is 255', length(destination)
      USING ERRCODE = 'invalid_parameter_value', HINT = 'Use a shorter destination name.';
  END IF;
  IF ordering_key = '' THEN
    RAISE EXCEPTION 'outbox.enqueue: ordering_key must be NULL or non-empty'
      USING ERRCODE = 'invalid_parameter_value',
            HINT = 'Pass NULL for messages without an order, or an entity id such as ''order-42''.';
  END IF;
  IF headers IS NULL OR jsonb_typeof(headers) <> 'object' THEN
    RAISE EXCEPTION 'outbox.enqueue: headers must be a JSON object, got %', coalesce(jsonb_typeof(headers), 'NULL')
      USING ERRCODE = 'invalid_parameter_value',
            HINT = 'Pass headers as a JSON object of string values, e.g. ''{"tenant": "acme"}''.';
  END IF;
  SELECT h.key INTO bad_key FROM jsonb_each(headers) h WHERE jsonb_typeof(h.value) <> 'string' LIMIT 1;
  IF bad_key IS NOT NULL THEN
    RAISE EXCEPTION 'outbox.enqueue: header "%" is not a string', bad_key
      USING ERRCODE = 'invalid_parameter_value',
            HINT = 'Every header value must be a JSON string; quote numbers and booleans.';
  END IF;
  IF event_type IS NULL THEN
    RAISE EXCEPTION 'outbox.enqueue: event_type must not be NULL'
      USING ERRCODE = 'invalid_parameter_value', HINT = 'Pass '''' when the message has no event type.';
  END IF;
END
$$;

-- The one write path. Both overloads end here.
--  * It takes an xid before the row takes its id, so a relay can tell from snapshots
--    when every id up to a value is either committed or gone (docs/adr/0001-claim-path.md).
--  * It serialises writers of one (destination, ordering_key) with a transaction-scoped
--    advisory lock, so for one key the id order is the commit order.
CREATE FUNCTION outbox.insert_message(destination text, payload jsonb, payload_bytes bytea,
                                      ordering_key text, headers jsonb, event_type text,
                                      deliver_after timestamptz, idempotency_key uuid)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  new_id bigint;
  ts timestamptz := clock_timestamp();
  bucket_count integer := (SELECT p.bucket_count FROM outbox.partitioning p);
  bucket smallint;
BEGIN
  PERFORM outbox.validate_message(destination, ordering_key, headers, event_type);
  -- No EXCEPTION block here: it would open a subtransaction per message, and more than 64
  -- of those in one transaction overflow every snapshot's subxid cache.
  IF idempotency_key IS NOT NULL
     AND EXISTS (SELECT 1 FROM outbox.messages q WHERE q.idempotency_key = insert_message.idempotency_key) THEN
    RAISE EXCEPTION 'outbox.enqueue: idempotency key % is already queued', idempotency_key
      USING ERRCODE = 'unique_violation',
            HINT = 'Each message needs its own idempotency key; omit it to get a random one.';
  END IF;
  PERFORM pg_current_xact_id();
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

CREATE FUNCTION outbox.enqueue(destination text, payload jsonb, ordering_key text DEFAULT NULL,
                               headers jsonb DEFAULT '{}', event_type text DEFAULT '',
                               deliver_after timestamptz DEFAULT NULL,
                               idempotency_key uuid DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF payload IS NULL THEN
    RAISE EXCEPTION 'outbox.enqueue: payload must not be NULL'
      USING ERRCODE = 'invalid_parameter_value',
            HINT = 'Pass a JSON value (the JSON literal null is allowed: ''null''::jsonb).';
  END IF;
  RETURN outbox.insert_message(destination, payload, NULL, ordering_key, headers, event_type,
                               deliver_after, idempotency_key);
END
$$;

CREATE FUNCTION outbox.enqueue(destination text, payload bytea, ordering_key text DEFAULT NULL,
                               headers jsonb DEFAULT '{}', event_type text DEFAULT '',
                               deliver_after timestamptz DEFAULT NULL,
                               idempotency_key uuid DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF payload IS NULL THEN
    RAISE EXCEPTION 'outbox.enqueue: payload must not be NULL'
      USING ERRCODE = 'invalid_parameter_value', HINT = 'Pass the bytes to deliver (may be empty: ''''::bytea).';
  END IF;
  RETURN outbox.insert_message(destination, NULL, payload, ordering_key, headers, event_type,
                               deliver_after, idempotency_key);
END
$$;

-- Many messages in one round trip: a JSON array of objects with the keys destination,
-- payload (any JSON) or payload_base64 (bytes), ordering_key, headers, event_type,
-- deliver_after (ISO 8601), idempotency_key. Returns the ids in input order.
CREATE FUNCTION outbox.enqueue_many(messages jsonb)
RETURNS SETOF bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  m jsonb;
  i integer := 0;
  unknown text;
BEGIN
  IF messages IS NULL OR jsonb_typeof(messages) <> 'array' THEN
    RAISE EXCEPTION 'outbox.enqueue_many: messages must be a JSON array'
      USING ERRCODE = 'invalid_parameter_value', HINT = 'Pass ''[{"destination": ..., "payload": ...}, ...]''.';
  END IF;
  -- Take the per-key locks of the whole batch up front, in one global order, so two
  -- batches that share keys queue behind each other instead of deadlocking.
  PERFORM pg_advisory_xact_lock(k.lock_key)
  FROM (SELECT DISTINCT hashtextextended((e->>'destination') || chr(31) || (e->>'ordering_key'), 7079) AS lock_key
        FROM jsonb_array_elements(messages) e
        WHERE jsonb_typeof(e) = 'object' AND coalesce(e->>'ordering_key', '') <> ''
          AND coalesce(e->>'destination', '') <> '') k
  ORDER BY k.lock_key;
  FOR m IN SELECT value FROM jsonb_array_elements(messages) LOOP
    IF jsonb_typeof(m) <> 'object' THEN
      RAISE EXCEPTION 'outbox.enqueue_many: element % is not a JSON object', i
        USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT k INTO unknown FROM jsonb_object_keys(m) k
      WHERE k NOT IN ('destination', 'payload', 'payload_base64', 'ordering_key', 'headers',
                      'event_type', 'deliver_after', 'idempotency_key') LIMIT 1;
    IF unknown IS NOT NULL THEN
      RAISE EXCEPTION 'outbox.enqueue_many: element % has unknown key "%"', i, unknown
        USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF (m ? 'payload') = (m ? 'payload_base64') THEN
      RAISE EXCEPTION 'outbox.enqueue_many: element % needs exactly one of payload and payload_base64', i
        USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN NEXT outbox.insert_message(
      m->>'destination',
      m->'payload',
      CASE WHEN m ? 'payload_base64' THEN decode(m->>'payload_base64', 'base64') END,
      m->>'ordering_key',
      coalesce(m->'headers', '{}'::jsonb),
      coalesce(m->>'event_type', ''),
      (m->>'deliver_after')::timestamptz,
      (m->>'idempotency_key')::uuid);
    i := i + 1;
  END LOOP;
END
$$;

-- Privileges. The writer can only call the enqueue functions; the relay can read and
-- settle the queue but not write new messages except through the same function.
REVOKE ALL ON ALL TABLES IN SCHEMA outbox FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA outbox FROM PUBLIC;
GRANT USAGE ON SCHEMA outbox TO outbox_writer, outbox_relay;
GRANT EXECUTE ON FUNCTION outbox.enqueue(text, jsonb, text, jsonb, text, timestamptz, uuid),
                          outbox.enqueue(text, bytea, text, jsonb, text, timestamptz, uuid),
                          outbox.enqueue_many(jsonb)
  TO outbox_writer, outbox_relay;
-- INSERT only for `outbox-relay dlq replay`, which re-queues dead letters as parked rows.
GRANT SELECT, INSERT, UPDATE, DELETE ON outbox.messages TO outbox_relay;
GRANT SELECT, INSERT, DELETE ON outbox.dead_letters TO outbox_relay;
GRANT SELECT ON SEQUENCE outbox.messages_id_seq TO outbox_relay;
GRANT SELECT ON outbox.partitioning TO outbox_relay;
GRANT SELECT, INSERT, UPDATE, DELETE ON outbox.relay_instances, outbox.bucket_owners TO outbox_relay;
GRANT EXECUTE ON FUNCTION outbox.coordinate(uuid, interval, boolean, text) TO outbox_relay;
