-- 0010: the destinations relays serve, registered by each relay when it starts
-- (outbox.destinations), and an opt-in write-time guard that refuses a destination no relay
-- config names: a typo in a writer then fails its transaction with the name and the fix,
-- instead of queueing messages nobody will deliver (docs/sdk.md, "Limits"). Off by default, so
-- that deploying a writer before the relay that serves its new destination keeps working; the
-- schema owner turns it on: UPDATE outbox.settings SET refuse_unknown_destinations = true;
CREATE TABLE outbox.destinations (
  name          text        PRIMARY KEY CHECK (name <> '' AND length(name) <= 255),
  registered_at timestamptz NOT NULL DEFAULT now(),
  registered_by text        NOT NULL DEFAULT 'operator'  -- "relay <host>:<pid>" or "operator"
);
REVOKE ALL ON outbox.destinations FROM PUBLIC;
GRANT SELECT, INSERT ON outbox.destinations TO outbox_relay;

ALTER TABLE outbox.settings ADD COLUMN refuse_unknown_destinations boolean NOT NULL DEFAULT false;

-- As in 0007, plus the destination guard.
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
  -- 0010: a destination no relay config names is refused, when the schema owner turned the
  -- guard on and the registry holds at least one name.
  IF (SELECT s.refuse_unknown_destinations FROM outbox.settings s)
     AND EXISTS (SELECT 1 FROM outbox.destinations)
     AND NOT EXISTS (SELECT 1 FROM outbox.destinations d WHERE d.name = validate_message.destination) THEN
    RAISE EXCEPTION 'outbox.enqueue: destination "%" is unknown: no relay config names it (outbox.destinations)', left(destination, 255)
      USING ERRCODE = 'invalid_parameter_value',
            HINT = 'Check the name against outbox-relay destinations list; a new destination is '
                   'registered when a relay whose config has it starts, or with '
                   'outbox-relay destinations add NAME.';
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
