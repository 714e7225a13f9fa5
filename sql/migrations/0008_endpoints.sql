-- 0008: the webhook service (docs/webhooks.md, "Webhook service"): endpoints stored in
-- Postgres, each subscribed to one destination with an optional event-type filter, managed at
-- run time (`outbox-relay endpoints ...`). A destination configured with `endpoints: database`
-- fans each message out to its matching endpoints.
--
-- Fan-out costs one claim per message, not one per endpoint: the relay sends the claimed
-- message to every matching endpoint at once, and only what an endpoint did not take (a
-- failure, an open breaker, a disabled endpoint, an earlier delivery of the key still owed)
-- becomes a row of its own in outbox.messages, with `endpoint_id` set. Such a row has its own
-- attempts, retries, dead letter and per-key order: its ordering key is
-- `<endpoint id>:<ordering key>`, so one endpoint's backlog never holds back another's.

CREATE TABLE outbox.endpoints (
  id              text        PRIMARY KEY DEFAULT 'ep_' || replace(gen_random_uuid()::text, '-', ''),
  destination     text        NOT NULL,
  url             text        NOT NULL,
  description     text        NOT NULL DEFAULT '',
  metadata        jsonb       NOT NULL DEFAULT '{}'::jsonb,
  -- Event types this endpoint receives; empty: every event type.
  event_types     text[]      NOT NULL DEFAULT '{}',
  -- Static headers on every request to it, a JSON object of strings.
  headers         jsonb       NOT NULL DEFAULT '{}'::jsonb,
  -- Concurrent requests to it; NULL: the destination's webhook max_in_flight.
  max_in_flight   integer,
  enabled         boolean     NOT NULL DEFAULT true,
  disabled_reason text,
  created_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
  updated_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
  -- The id is part of the ordering keys of the endpoint's own rows: keep it short and plain.
  CONSTRAINT endpoints_id_check CHECK (id ~ '^[A-Za-z0-9_.-]{1,64}$'),
  CONSTRAINT endpoints_destination_check CHECK (destination <> '' AND length(destination) <= 255),
  CONSTRAINT endpoints_url_check CHECK (url ~* '^https?://[^/?#]+'),
  CONSTRAINT endpoints_metadata_check CHECK (jsonb_typeof(metadata) = 'object'),
  CONSTRAINT endpoints_headers_check CHECK (jsonb_typeof(headers) = 'object'),
  CONSTRAINT endpoints_max_in_flight_check CHECK (max_in_flight BETWEEN 1 AND 1024)
);
CREATE INDEX endpoints_destination_idx ON outbox.endpoints (destination, id);

-- Signing secrets, apart from the endpoints so that a role may read endpoints without them.
-- Every secret not expired signs each delivery: after a rotation the old one keeps signing
-- until its expires_at (the overlap), so receivers can switch at their own pace.
CREATE TABLE outbox.endpoint_secrets (
  endpoint_id text        NOT NULL REFERENCES outbox.endpoints (id) ON DELETE CASCADE,
  secret      text        NOT NULL,
  created_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
  expires_at  timestamptz,  -- NULL: the current secret
  PRIMARY KEY (endpoint_id, created_at),
  CONSTRAINT endpoint_secrets_format_check CHECK (secret ~ '^whsec_[A-Za-z0-9+/]+={0,2}$')
);

-- Bumped by every change of an endpoint or a secret: relays poll it (a one-row read, four
-- times a second) and reload the registry when it moved, so a change reaches every relay
-- within a second without a restart.
CREATE TABLE outbox.endpoint_registry (
  only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
  version  bigint  NOT NULL DEFAULT 0
);
INSERT INTO outbox.endpoint_registry DEFAULT VALUES;

CREATE FUNCTION outbox.endpoint_registry_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  UPDATE outbox.endpoint_registry SET version = version + 1;
  RETURN NULL;
END
$$;
CREATE TRIGGER endpoints_registry_changed
  AFTER INSERT OR UPDATE OR DELETE ON outbox.endpoints
  FOR EACH STATEMENT EXECUTE FUNCTION outbox.endpoint_registry_changed();
CREATE TRIGGER endpoint_secrets_registry_changed
  AFTER INSERT OR UPDATE OR DELETE ON outbox.endpoint_secrets
  FOR EACH STATEMENT EXECUTE FUNCTION outbox.endpoint_registry_changed();

-- An endpoint's own rows. NULL for the messages applications write.
ALTER TABLE outbox.messages ADD COLUMN endpoint_id text;
ALTER TABLE outbox.dead_letters ADD COLUMN endpoint_id text;
ALTER TABLE outbox.delivered_archive ADD COLUMN endpoint_id text;

-- "Does this endpoint still owe an earlier message of this key?", asked for every keyed
-- message a fan-out sends. Partial: it holds only endpoint rows, so while every endpoint takes
-- what it is sent it is empty and each probe costs next to nothing.
CREATE INDEX messages_endpoint_key_idx ON outbox.messages (destination, ordering_key)
  WHERE endpoint_id IS NOT NULL;
-- An endpoint's rows, for `endpoints enable` (wake what waited while it was disabled) and
-- `endpoints show` (its backlog).
CREATE INDEX messages_endpoint_idx ON outbox.messages (endpoint_id) WHERE endpoint_id IS NOT NULL;
CREATE INDEX dead_letters_endpoint_idx ON outbox.dead_letters (endpoint_id, id)
  WHERE endpoint_id IS NOT NULL;

-- The webhook-id (and idempotency key) of a message's delivery to one endpoint: stable across
-- retries and relays, distinct per endpoint. The relay computes the same in C++.
CREATE FUNCTION outbox.endpoint_delivery_id(message uuid, endpoint text) RETURNS uuid
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT md5(message::text || '/' || endpoint)::uuid
$$;

-- The writer role sees none of this; secrets stay with the relay's role.
REVOKE ALL ON outbox.endpoints, outbox.endpoint_secrets, outbox.endpoint_registry FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox.endpoint_delivery_id(uuid, text) FROM PUBLIC;
GRANT SELECT, INSERT, UPDATE, DELETE ON outbox.endpoints, outbox.endpoint_secrets TO outbox_relay;
GRANT SELECT, UPDATE ON outbox.endpoint_registry TO outbox_relay;
GRANT EXECUTE ON FUNCTION outbox.endpoint_delivery_id(uuid, text) TO outbox_relay;
