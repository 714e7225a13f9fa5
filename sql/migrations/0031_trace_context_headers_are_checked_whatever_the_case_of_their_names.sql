-- 0031: the trace context headers are checked under any case of their names. "Traceparent"
-- went unchecked, and a message could carry it beside a checked "traceparent": a webhook
-- carries one header of a name (the first in byte order, "Traceparent"), while the relay logged
-- the trace id of the other (review). Two of them whose names differ only in case are refused.
-- As 0015's otherwise.
CREATE OR REPLACE FUNCTION outbox.validate_message(destination text, ordering_key text,
                                                   headers jsonb, event_type text, context text)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
  bad_key text;
BEGIN
  IF destination IS NULL OR destination = '' THEN
    RAISE EXCEPTION '%: destination must not be empty', context
      USING ERRCODE = 'invalid_parameter_value',
            HINT = 'Pass the destination name configured in the relay, e.g. ''orders''.';
  END IF;
  IF length(destination) > 255 THEN
    RAISE EXCEPTION '%: destination is % characters long, the limit is 255', context, length(destination)
      USING ERRCODE = 'invalid_parameter_value', HINT = 'Use a shorter destination name.';
  END IF;
  IF (SELECT s.refuse_unknown_destinations FROM outbox.settings s)
     AND EXISTS (SELECT 1 FROM outbox.destinations)
     AND NOT EXISTS (SELECT 1 FROM outbox.destinations d WHERE d.name = validate_message.destination) THEN
    RAISE EXCEPTION '%: destination "%" is unknown: no relay config names it (outbox.destinations)', context, left(destination, 255)
      USING ERRCODE = 'invalid_parameter_value',
            HINT = 'Check the name against outbox-relay destinations list; a new destination is '
                   'registered when a relay whose config has it starts, or with '
                   'outbox-relay destinations add NAME.';
  END IF;
  IF ordering_key = '' THEN
    RAISE EXCEPTION '%: ordering_key must be NULL or non-empty', context
      USING ERRCODE = 'invalid_parameter_value',
            HINT = 'Pass NULL for messages without an order, or an entity id such as ''order-42''.';
  END IF;
  IF octet_length(ordering_key) > 1024 THEN
    RAISE EXCEPTION '%: ordering_key is % bytes long, the limit is 1024', context, octet_length(ordering_key)
      USING ERRCODE = 'invalid_parameter_value',
            HINT = 'Use an entity id as the key (''order-42''), or a hash of a longer one.';
  END IF;
  IF headers IS NULL OR jsonb_typeof(headers) <> 'object' THEN
    RAISE EXCEPTION '%: headers must be a JSON object, got %', context, coalesce(jsonb_typeof(headers), 'NULL')
      USING ERRCODE = 'invalid_parameter_value',
            HINT = 'Pass headers as a JSON object of string values, e.g. ''{"tenant": "acme"}''.';
  END IF;
  SELECT h.key INTO bad_key FROM jsonb_each(headers) h WHERE jsonb_typeof(h.value) <> 'string' LIMIT 1;
  IF bad_key IS NOT NULL THEN
    RAISE EXCEPTION '%: header "%" is not a string', context, bad_key
      USING ERRCODE = 'invalid_parameter_value',
            HINT = 'Every header value must be a JSON string; quote numbers and booleans.';
  END IF;
  IF (SELECT count(*) FROM jsonb_object_keys(headers)) > 64 THEN
    RAISE EXCEPTION '%: headers has % entries, the limit is 64', context, (SELECT count(*) FROM jsonb_object_keys(headers))
      USING ERRCODE = 'invalid_parameter_value', HINT = 'Put bulk data in the payload, not in headers.';
  END IF;
  SELECT h.key INTO bad_key FROM jsonb_object_keys(headers) h(key)
    WHERE h.key = '' OR octet_length(h.key) > 255 LIMIT 1;
  IF bad_key IS NOT NULL THEN
    RAISE EXCEPTION '%: header name "%" must be 1 to 255 bytes long', context, left(bad_key, 40)
      USING ERRCODE = 'invalid_parameter_value', HINT = 'Use a short header name such as ''tenant''.';
  END IF;
  SELECT h.key INTO bad_key FROM jsonb_each_text(headers) h WHERE octet_length(h.value) > 4096 LIMIT 1;
  IF bad_key IS NOT NULL THEN
    RAISE EXCEPTION '%: header "%" has a value over 4096 bytes', context, bad_key
      USING ERRCODE = 'invalid_parameter_value', HINT = 'Put bulk data in the payload, not in headers.';
  END IF;
  -- Under any case of their names: HTTP header names are case-insensitive, and a webhook
  -- carries one header of a name (0031).
  SELECT h.key INTO bad_key FROM jsonb_each_text(headers) h
    WHERE lower(h.key) = 'traceparent' AND NOT (
       h.value ~ '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$'
       AND left(h.value, 2) <> 'ff'
       AND substr(h.value, 4, 32) <> repeat('0', 32)
       AND substr(h.value, 37, 16) <> repeat('0', 16))
    LIMIT 1;
  IF bad_key IS NOT NULL THEN
    RAISE EXCEPTION '%: header "%" is not a W3C traceparent: "%"', context, bad_key,
                    left(headers->>bad_key, 60)
      USING ERRCODE = 'invalid_parameter_value',
            HINT = 'Write it as version-traceid-parentid-flags in lowercase hex, e.g. '
                   '''00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01'' (ids not all zero), '
                   'or leave the header out.';
  END IF;
  SELECT h.key INTO bad_key FROM jsonb_each_text(headers) h
    WHERE lower(h.key) = 'tracestate' AND octet_length(h.value) > 512 LIMIT 1;
  IF bad_key IS NOT NULL THEN
    RAISE EXCEPTION '%: header "%" is % bytes long, the limit is 512', context, bad_key,
                    octet_length(headers->>bad_key)
      USING ERRCODE = 'invalid_parameter_value',
            HINT = 'Drop list members from the right, as the W3C trace context specification says.';
  END IF;
  SELECT min(h.key) INTO bad_key FROM jsonb_object_keys(headers) h(key)
    WHERE lower(h.key) IN ('traceparent', 'tracestate')
    GROUP BY lower(h.key) HAVING count(*) > 1 LIMIT 1;
  IF bad_key IS NOT NULL THEN
    RAISE EXCEPTION '%: header "%" is set twice, under names that differ only in case',
                    context, lower(bad_key)
      USING ERRCODE = 'invalid_parameter_value',
            HINT = 'Set traceparent and tracestate once each, in lowercase.';
  END IF;
  IF event_type IS NULL THEN
    RAISE EXCEPTION '%: event_type must not be NULL', context
      USING ERRCODE = 'invalid_parameter_value', HINT = 'Pass '''' when the message has no event type.';
  END IF;
  IF octet_length(event_type) > 255 THEN
    RAISE EXCEPTION '%: event_type is % bytes long, the limit is 255', context, octet_length(event_type)
      USING ERRCODE = 'invalid_parameter_value', HINT = 'Use a short name such as ''order.paid''.';
  END IF;
END
$$;

REVOKE ALL ON FUNCTION outbox.validate_message(text, text, jsonb, text, text) FROM PUBLIC;
