-- 0032: outbox.enqueue_many takes the writers' shared lock (7079, 2) before its keys' locks.
-- Every writer library writes through enqueue_many. It took the per-key locks of the batch
-- first and the shared lock only in outbox.insert_message, for its first element; a single
-- enqueue takes them the other way round. While outbox.set_bucket_count waited for its
-- exclusive lock behind a writer W holding the shared one, a batch B holding key K queued
-- behind the count change, and W, wanting K, queued behind B: a cycle that the deadlock
-- detector broke by reordering the wait queue, after deadlock_timeout (1 s by default), with
-- every writer of K stalled meanwhile. Now a batch takes the shared lock first, holds no key
-- while it waits for a count change, and the order of locks is the same for every writer.
-- The shared lock is taken after the first pass's checks: a refused batch still locks nothing.
-- (insert_message takes the shared lock again for each element: a lock already held costs a
-- lookup in the session's lock table.)
-- The function is as in 0015 but for that one statement.

CREATE OR REPLACE FUNCTION outbox.enqueue_many(messages jsonb)
RETURNS SETOF bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  m jsonb;
  i integer := 0;
  bad text;
  s text;
  y integer;
  mo integer;
  rfc3339_hint constant text :=
    'Write an RFC 3339 time with Z or a UTC offset, e.g. ''2030-01-01T12:00:00Z'' or '
    '''2030-01-01T14:00:00+02:00''; a time without one would be read in the session''s TimeZone.';
BEGIN
  IF messages IS NULL OR jsonb_typeof(messages) <> 'array' THEN
    RAISE EXCEPTION 'outbox.enqueue_many: messages must be a JSON array'
      USING ERRCODE = 'invalid_parameter_value', HINT = 'Pass ''[{"destination": ..., "payload": ...}, ...]''.';
  END IF;
  FOR m IN SELECT value FROM jsonb_array_elements(messages) LOOP
    IF jsonb_typeof(m) <> 'object' THEN
      RAISE EXCEPTION 'outbox.enqueue_many: element % is not a JSON object', i
        USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF m - '{destination,payload,payload_base64,ordering_key,headers,event_type,deliver_after,idempotency_key}'::text[]
       <> '{}'::jsonb THEN
      SELECT k INTO bad FROM jsonb_object_keys(m) k
        WHERE k NOT IN ('destination', 'payload', 'payload_base64', 'ordering_key', 'headers',
                        'event_type', 'deliver_after', 'idempotency_key') LIMIT 1;
      RAISE EXCEPTION 'outbox.enqueue_many: element % has unknown key "%"', i, bad
        USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF (m ? 'payload') = (m ? 'payload_base64') THEN
      RAISE EXCEPTION 'outbox.enqueue_many: element % needs exactly one of payload and payload_base64', i
        USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- Types: text fields are JSON strings (null: absent, where a field may be absent).
    bad := CASE
      WHEN jsonb_typeof(m->'destination') <> 'string' THEN 'destination'
      WHEN jsonb_typeof(m->'payload_base64') <> 'string' THEN 'payload_base64'
      WHEN jsonb_typeof(m->'ordering_key') NOT IN ('string', 'null') THEN 'ordering_key'
      WHEN jsonb_typeof(m->'event_type') NOT IN ('string', 'null') THEN 'event_type'
      WHEN jsonb_typeof(m->'deliver_after') NOT IN ('string', 'null') THEN 'deliver_after'
      WHEN jsonb_typeof(m->'idempotency_key') NOT IN ('string', 'null') THEN 'idempotency_key'
    END;
    IF bad IS NOT NULL THEN
      RAISE EXCEPTION 'outbox.enqueue_many: element %: % must be a JSON string, got %', i, bad, jsonb_typeof(m->bad)
        USING ERRCODE = 'invalid_parameter_value',
              HINT = CASE WHEN bad IN ('destination', 'payload_base64') THEN 'Quote the value'
                          ELSE 'Quote the value, or pass null or leave the key out for none' END
                     || ': a number or boolean is not turned into text, e.g. "' || bad || '": "'
                     || CASE bad WHEN 'destination' THEN 'orders' WHEN 'payload_base64' THEN 'AAE='
                                 WHEN 'ordering_key' THEN 'order-42' WHEN 'event_type' THEN 'order.paid'
                                 WHEN 'deliver_after' THEN '2030-01-01T12:00:00Z'
                                 ELSE '123e4567-e89b-12d3-a456-426614174000' END || '".';
    END IF;
    IF jsonb_typeof(m->'headers') <> 'object' THEN
      RAISE EXCEPTION 'outbox.enqueue_many: element %: headers must be a JSON object, got %', i, jsonb_typeof(m->'headers')
        USING ERRCODE = 'invalid_parameter_value',
              HINT = 'Pass headers as a JSON object of string values, e.g. {"tenant": "acme"}, or leave the key out.';
    END IF;
    -- Formats, as the casts of the second pass read them (a subset: nothing passes here that
    -- a cast refuses).
    s := m->>'idempotency_key';
    IF s !~ '^\{?[0-9A-Fa-f]{8}-?[0-9A-Fa-f]{4}-?[0-9A-Fa-f]{4}-?[0-9A-Fa-f]{4}-?[0-9A-Fa-f]{12}\}?$'
       OR (left(s, 1) = '{') <> (right(s, 1) = '}') THEN
      RAISE EXCEPTION 'outbox.enqueue_many: element %: idempotency_key "%" is not a UUID', i, left(s, 60)
        USING ERRCODE = 'invalid_parameter_value',
              HINT = 'Write it as 32 hex digits in groups of 8-4-4-4-12, e.g. '
                     '"123e4567-e89b-12d3-a456-426614174000"; leave it out to get a random one.';
    END IF;
    s := m->>'payload_base64';
    -- (the simplest pattern: about 9 ns a character, a quarter of the padding-aware one's)
    IF NOT (s ~ '^[A-Za-z0-9+/]*={0,2}$' AND octet_length(s) % 4 = 0)
       -- whitespace, as in MIME's line breaks, is skipped by decode
       AND NOT (translate(s, E' \t\r\n', '') ~ '^[A-Za-z0-9+/]*={0,2}$'
                AND octet_length(translate(s, E' \t\r\n', '')) % 4 = 0) THEN
      RAISE EXCEPTION 'outbox.enqueue_many: element %: payload_base64 is not base64', i
        USING ERRCODE = 'invalid_parameter_value',
              HINT = 'Encode the bytes in standard base64 (RFC 4648 section 4: A-Z a-z 0-9 + /, padded '
                     'with = to a multiple of 4 characters); the URL-safe alphabet (- and _) is not read.';
    END IF;
    s := m->>'deliver_after';
    -- (boolean matches only: a regexp_match with capture groups cost 1.5 ms an element)
    IF s IS NOT NULL AND lower(s) NOT IN ('infinity', '-infinity')
       AND s !~ '^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])[Tt ]([01][0-9]|2[0-3]):[0-5][0-9]'
                '(:([0-5][0-9]|60)(\.[0-9]+)?)? ?([Zz]|[+-](0[0-9]|1[0-5])(:?[0-5][0-9])?)$' THEN
      IF s ~ '^[0-9]{4}-[0-9]{2}-[0-9]{2}([Tt ][0-9]{2}:[0-9]{2}(:[0-9]{2}(\.[0-9]+)?)?)?$' THEN
        RAISE EXCEPTION 'outbox.enqueue_many: element %: deliver_after "%" has no UTC offset', i, s
          USING ERRCODE = 'invalid_parameter_value',
                HINT = 'Append Z for UTC (''' || s || 'Z'') or the offset of the time zone it was '
                       'written in (''+02:00''); a time without one would be read in the session''s TimeZone.';
      END IF;
      IF s ~ '^[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}(:[0-9]{2}(\.[0-9]+)?)? ?([Zz]|[+-][0-9]{2}(:?[0-9]{2})?)$' THEN
        RAISE EXCEPTION 'outbox.enqueue_many: element %: deliver_after "%" is not a valid time (a field is out of range)', i, s
          USING ERRCODE = 'invalid_parameter_value', HINT = rfc3339_hint;
      END IF;
      RAISE EXCEPTION 'outbox.enqueue_many: element %: deliver_after "%" is not an RFC 3339 time', i, left(s, 60)
        USING ERRCODE = 'invalid_parameter_value', HINT = rfc3339_hint;
    END IF;
    -- The day against its month (the pattern allows 31 everywhere), and year 0 (no such year).
    IF ascii(s) BETWEEN 48 AND 57 AND (substr(s, 9, 2)::integer > 28 OR left(s, 4) = '0000') THEN
      y := left(s, 4)::integer;
      mo := substr(s, 6, 2)::integer;
      IF y = 0 OR substr(s, 9, 2)::integer > (
           CASE WHEN mo = 2 THEN 28 + (y % 4 = 0 AND (y % 100 <> 0 OR y % 400 = 0))::integer
                WHEN mo IN (4, 6, 9, 11) THEN 30 ELSE 31 END) THEN
        RAISE EXCEPTION 'outbox.enqueue_many: element %: deliver_after "%" is not a valid time (a field is out of range)', i, s
          USING ERRCODE = 'invalid_parameter_value', HINT = rfc3339_hint;
      END IF;
    END IF;
    i := i + 1;
  END LOOP;
  -- The writers' shared lock first, as outbox.insert_message takes it before a key's lock:
  -- a batch that waits here for outbox.set_bucket_count holds no key that a single writer,
  -- itself holding the shared lock the count change waits for, could be waiting on.
  PERFORM pg_advisory_xact_lock_shared(7079, 2);
  -- Take the per-key locks of the whole batch up front, in one global order, so two
  -- batches that share keys queue behind each other instead of deadlocking.
  PERFORM pg_advisory_xact_lock(k.lock_key)
  FROM (SELECT DISTINCT hashtextextended((e->>'destination') || chr(31) || (e->>'ordering_key'), 7079) AS lock_key
        FROM jsonb_array_elements(messages) e
        WHERE coalesce(e->>'ordering_key', '') <> '' AND coalesce(e->>'destination', '') <> '') k
  ORDER BY k.lock_key;
  i := 0;
  FOR m IN SELECT value FROM jsonb_array_elements(messages) LOOP
    RETURN NEXT outbox.insert_message(
      m->>'destination',
      m->'payload',
      decode(m->>'payload_base64', 'base64'),
      m->>'ordering_key',
      coalesce(m->'headers', '{}'::jsonb),
      coalesce(m->>'event_type', ''),
      (m->>'deliver_after')::timestamptz,
      (m->>'idempotency_key')::uuid,
      'outbox.enqueue_many: element ' || i);
    i := i + 1;
  END LOOP;
END
$$;
