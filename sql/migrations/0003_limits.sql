-- 0003: limits on what a message may carry, enforced at write time with errors that name
-- the argument (docs/sdk.md, "Limits"). Before, an ordering key over ~2.7 kB failed with a
-- btree error about messages_key_order_idx, and deliver_after => 'infinity' (or 9999-12-31)
-- was taken: 'infinity' is the relay's own marker for "blocked behind an earlier message of
-- its key", so such a message went out at once with a key and never without one.
--
--   ordering_key   1 to 1024 bytes
--   event_type     at most 255 bytes
--   headers        at most 64; names 1 to 255 bytes; values at most 4096 bytes
--   deliver_after  finite, at most 1 year ahead (the scheduling horizon)

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

-- As in 0001, plus the check of deliver_after against the scheduling horizon.
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
BEGIN
  PERFORM outbox.validate_message(destination, ordering_key, headers, event_type);
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

-- 'infinity' in deliver_after means one thing only: parked behind an earlier message of its
-- key (the claim sets it; settling that message wakes it). Writers can no longer set it (above);
-- the table now refuses it for anything else. Rows an earlier version accepted with
-- deliver_after 'infinity' or '-infinity' from a writer become due at their enqueue time,
-- which is what their writer got before for keyed ones, and what unkeyed ones never got.
UPDATE outbox.messages
SET deliver_after = created_at
WHERE NOT isfinite(deliver_after) AND NOT (parked AND ordering_key IS NOT NULL);
ALTER TABLE outbox.messages ADD CONSTRAINT messages_blocked_check
  CHECK (isfinite(deliver_after) OR (parked AND ordering_key IS NOT NULL));
