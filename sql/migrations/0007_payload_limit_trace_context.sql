-- 0007: the payload size limit, kept in the database so no writer can bypass it (every
-- writer goes through outbox.insert_message). Default 1 MiB, as the payload the relay sends:
-- a jsonb payload's text, a bytea payload's bytes. Brokers and endpoints refuse large messages
-- anyway (Kafka's default message.max.bytes is about 1 MB); refusing at write time keeps the
-- business transaction from committing a message that can only be dead-lettered.
-- The schema owner changes it: UPDATE outbox.settings SET max_payload_bytes = 4194304;
--
-- Also: W3C trace context in the headers (traceparent, tracestate) is checked for its format,
-- since the relay forwards it to Kafka and webhook consumers as it is (docs/sdk.md).
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

-- As in 0003, plus the trace context headers.
CREATE OR REPLACE FUNCTION outbox.validate_message(destination text, ordering_key text, headers jsonb,
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
  IF octet_length(ordering_key) > 1024 THEN
    RAISE EXCEPTION 'outbox.enqueue: ordering_key is % bytes long, the limit is 1024', octet_length(ordering_key)
      USING ERRCODE = 'invalid_parameter_value',
            HINT = 'Use an entity id as the key (''order-42''), or a hash of a longer one.';
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
  IF (SELECT count(*) FROM jsonb_object_keys(headers)) > 64 THEN
    RAISE EXCEPTION 'outbox.enqueue: headers has % entries, the limit is 64', (SELECT count(*) FROM jsonb_object_keys(headers))
      USING ERRCODE = 'invalid_parameter_value', HINT = 'Put bulk data in the payload, not in headers.';
  END IF;
  SELECT h.key INTO bad_key FROM jsonb_object_keys(headers) h(key)
    WHERE h.key = '' OR octet_length(h.key) > 255 LIMIT 1;
  IF bad_key IS NOT NULL THEN
    RAISE EXCEPTION 'outbox.enqueue: header name "%" must be 1 to 255 bytes long', left(bad_key, 40)
      USING ERRCODE = 'invalid_parameter_value', HINT = 'Use a short header name such as ''tenant''.';
  END IF;
  SELECT h.key INTO bad_key FROM jsonb_each_text(headers) h WHERE octet_length(h.value) > 4096 LIMIT 1;
  IF bad_key IS NOT NULL THEN
    RAISE EXCEPTION 'outbox.enqueue: header "%" has a value over 4096 bytes', bad_key
      USING ERRCODE = 'invalid_parameter_value', HINT = 'Put bulk data in the payload, not in headers.';
  END IF;
  -- W3C trace context (https://www.w3.org/TR/trace-context/): forwarded as it is, so it must
  -- be one a consumer can parse.
  IF headers ? 'traceparent' AND NOT (
       headers->>'traceparent' ~ '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$'
       AND left(headers->>'traceparent', 2) <> 'ff'
       AND substr(headers->>'traceparent', 4, 32) <> repeat('0', 32)
       AND substr(headers->>'traceparent', 37, 16) <> repeat('0', 16)) THEN
    RAISE EXCEPTION 'outbox.enqueue: header "traceparent" is not a W3C traceparent: "%"', left(headers->>'traceparent', 60)
      USING ERRCODE = 'invalid_parameter_value',
            HINT = 'Write it as version-traceid-parentid-flags in lowercase hex, e.g. '
                   '''00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01'' (ids not all zero), '
                   'or leave the header out.';
  END IF;
  IF headers ? 'tracestate' AND octet_length(headers->>'tracestate') > 512 THEN
    RAISE EXCEPTION 'outbox.enqueue: header "tracestate" is % bytes long, the limit is 512', octet_length(headers->>'tracestate')
      USING ERRCODE = 'invalid_parameter_value',
            HINT = 'Drop list members from the right, as the W3C trace context specification says.';
  END IF;
  IF event_type IS NULL THEN
    RAISE EXCEPTION 'outbox.enqueue: event_type must not be NULL'
      USING ERRCODE = 'invalid_parameter_value', HINT = 'Pass '''' when the message has no event type.';
  END IF;
  IF octet_length(event_type) > 255 THEN
    RAISE EXCEPTION 'outbox.enqueue: event_type is % bytes long, the limit is 255', octet_length(event_type)
      USING ERRCODE = 'invalid_parameter_value', HINT = 'Use a short name such as ''order.paid''.';
  END IF;
END
$$;
