-- 0027: the scheduling horizon is a year of the UTC calendar, whatever the session's time
-- zone. `ts + interval '1 year'` on a timestamptz steps the session's local calendar: at
-- 2024-02-28T20:00Z a session in Asia/Tokyo (already 29 February there) got a horizon of
-- 2025-02-27T20:00Z, a UTC session and the C++ SDK 2025-02-28T20:00Z, and DST moved it by an
-- hour in zones such as America/New_York: a message the SDK accepted was refused by the
-- database, aborting the caller's transaction (review; tests/sdk/sdk_pgtest.cc). The body of
-- outbox.insert_message is 0025's otherwise.
CREATE FUNCTION outbox.scheduling_horizon(ts timestamptz) RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp
RETURN ((ts AT TIME ZONE 'UTC') + interval '1 year') AT TIME ZONE 'UTC';

REVOKE ALL ON FUNCTION outbox.scheduling_horizon(timestamptz) FROM PUBLIC;

CREATE OR REPLACE FUNCTION outbox.insert_message(destination text, payload jsonb, payload_bytes bytea,
                                      ordering_key text, headers jsonb, event_type text,
                                      deliver_after timestamptz, idempotency_key uuid,
                                      context text)
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
  PERFORM outbox.validate_message(destination, ordering_key, headers, event_type, context);
  -- The payload as the relay sends it: jsonb as its text, bytea as its bytes.
  payload_size := coalesce(octet_length(payload::text), octet_length(payload_bytes), 0);
  SELECT s.max_payload_bytes INTO max_payload FROM outbox.settings s;
  IF payload_size > max_payload THEN
    RAISE EXCEPTION '%: payload is % bytes, the limit is % (outbox.settings.max_payload_bytes)',
                    context, payload_size, max_payload
      USING ERRCODE = 'program_limit_exceeded',
            HINT = 'Store large documents in your own table or an object store and send a reference; '
                   'or, as the schema owner, raise the limit: UPDATE outbox.settings SET max_payload_bytes = ...';
  END IF;
  IF deliver_after IS NOT NULL AND NOT isfinite(deliver_after) THEN
    RAISE EXCEPTION '%: deliver_after must be a finite time, got %', context, deliver_after
      USING ERRCODE = 'invalid_parameter_value',
            HINT = 'Pass NULL to deliver as soon as the transaction commits, or a time at most 1 year ahead.';
  END IF;
  IF deliver_after > outbox.scheduling_horizon(ts) THEN
    RAISE EXCEPTION '%: deliver_after % is more than 1 year ahead (the scheduling horizon)', context, deliver_after
      USING ERRCODE = 'invalid_parameter_value',
            HINT = 'Schedule at most 1 year ahead; keep later work in your own table and enqueue it nearer the time.';
  END IF;
  PERFORM pg_current_xact_id();
  -- Shared with every writer until commit; outbox.set_bucket_count takes it alone, so it
  -- re-buckets no count under a row still being written (the count is read after the lock).
  PERFORM pg_advisory_xact_lock_shared(7079, 2);
  IF current_setting('transaction_isolation') = 'read committed' THEN
    bucket_count := (SELECT p.bucket_count FROM outbox.partitioning p);
  ELSE
    -- Read from the transaction's snapshot, the count may be one a change has since replaced
    -- (0019): locking the row fails with a serialization failure (40001) if so.
    SELECT p.bucket_count INTO bucket_count FROM outbox.partitioning p FOR SHARE;
  END IF;
  IF ordering_key IS NOT NULL THEN
    PERFORM pg_advisory_xact_lock(hashtextextended(destination || chr(31) || ordering_key, 7079));
    bucket := (hashtextextended(destination || chr(31) || ordering_key, 0) & 32767) % bucket_count;
  ELSE
    bucket := floor(random() * bucket_count);
  END IF;
  INSERT INTO outbox.messages AS m (destination, ordering_key, idempotency_key, event_type,
                                    headers, payload, payload_bytes, deliver_after, parked,
                                    created_at, bucket, due_at)
  VALUES (destination, ordering_key, coalesce(idempotency_key, gen_random_uuid()), event_type,
          headers, payload, payload_bytes, coalesce(deliver_after, ts),
          -- a message due later goes straight to the slow lane
          coalesce(deliver_after, ts) > ts + interval '1 second', ts, bucket,
          -- due from now, or from its time if that is later (one in the past is due now)
          greatest(coalesce(deliver_after, ts), ts))
  -- A key already queued, or written by a transaction that commits while this one waits on
  -- it, inserts nothing: refused below by name. (No EXCEPTION block: it would open a
  -- subtransaction per message, and more than 64 of those in one transaction overflow every
  -- snapshot's subxid cache.)
  ON CONFLICT ON CONSTRAINT messages_idempotency_key_key DO NOTHING
  RETURNING m.id INTO new_id;
  IF new_id IS NULL THEN
    RAISE EXCEPTION '%: idempotency key % is already queued', context, idempotency_key
      USING ERRCODE = 'unique_violation',
            HINT = 'Each message needs its own idempotency key; omit it to get a random one.';
  END IF;
  RETURN new_id;
END
$$;

REVOKE ALL ON FUNCTION outbox.insert_message(text, jsonb, bytea, text, jsonb, text, timestamptz, uuid, text)
  FROM PUBLIC;
