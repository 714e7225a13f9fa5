-- 0007: the payload size limit, kept in the database so no writer can bypass it (every
-- writer goes through outbox.insert_message). Default 1 MiB, as the payload the relay sends:
-- a jsonb payload's text, a bytea payload's bytes. Brokers and endpoints refuse large messages
-- anyway (Kafka's default message.max.bytes is about 1 MB); refusing at write time keeps the
-- business transaction from committing a message that can only be dead-lettered.
-- The schema owner changes it: UPDATE outbox.settings SET max_payload_bytes = 4194304;
CREATE TABLE outbox.settings (
  singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
  max_payload_bytes integer NOT NULL DEFAULT 1048576
    CHECK (max_payload_bytes BETWEEN 1 AND 1073741823)
);
INSERT INTO outbox.settings DEFAULT VALUES;
REVOKE ALL ON outbox.settings FROM PUBLIC;
GRANT SELECT ON outbox.settings TO outbox_relay;

-- As in 0003, plus the payload size check.
CREATE OR REPLACE FUNCTION outbox.insert_message(destination text, payload jsonb, payload_bytes bytea,
                                                 ordering_key text, headers jsonb, event_type text,
                                                 deliver_after timestamptz, idempotency_key uuid)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  new_id bigint;
  ts timestamptz := clock_timestamp();
  bucket_count integer := (SELECT p.bucket_count FROM outbox.partitioning p);
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
