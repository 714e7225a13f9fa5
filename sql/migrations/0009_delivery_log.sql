-- 0009: the webhook service's delivery log and endpoint health (docs/webhooks.md, "Delivery
-- log" and "Automatic disabling").

-- Every attempt at an endpoint: when, the HTTP status (NULL: no answer), how long it took, the
-- start of the response body. Written in batches by the relay; `outbox-relay attempts` reads
-- it; rows older than the destination's delivery_log_retention_ms are deleted.
CREATE TABLE outbox.delivery_attempts (
  id            bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  destination   text        NOT NULL,
  endpoint_id   text        NOT NULL,
  -- The webhook-id sent: outbox.endpoint_delivery_id(message idempotency key, endpoint_id).
  delivery_id   uuid        NOT NULL,
  attempted_at  timestamptz NOT NULL,
  status        integer,
  outcome       text        NOT NULL CHECK (outcome IN ('delivered', 'retry', 'permanent')),
  latency_ms    integer     NOT NULL,
  error         text,
  response_body text
);
CREATE INDEX delivery_attempts_endpoint_idx ON outbox.delivery_attempts (endpoint_id, id);
CREATE INDEX delivery_attempts_delivery_idx ON outbox.delivery_attempts (delivery_id);
CREATE INDEX delivery_attempts_at_idx ON outbox.delivery_attempts (attempted_at);

-- Whether each endpoint is failing, and since when: set by the first failed attempt after a
-- success, cleared by a success. An endpoint failing longer than its destination's
-- auto_disable_after_ms is disabled automatically. Apart from outbox.endpoints so that these
-- frequent writes do not move the registry version (which makes every relay reload).
CREATE TABLE outbox.endpoint_health (
  endpoint_id     text        PRIMARY KEY REFERENCES outbox.endpoints (id) ON DELETE CASCADE,
  failing_since   timestamptz,
  last_success_at timestamptz,
  last_failure_at timestamptz
);
ALTER TABLE outbox.endpoints ADD COLUMN auto_disabled_at timestamptz;
-- Requests per second the endpoint is sent at most (a burst of one second's worth); NULL: the
-- destination's webhook rate_limit (0 or absent: none).
ALTER TABLE outbox.endpoints ADD COLUMN rate_limit integer
  CONSTRAINT endpoints_rate_limit_check CHECK (rate_limit BETWEEN 1 AND 1000000);
-- The endpoint's own circuit breaker and adaptive concurrency settings, over the destination's:
-- {"enabled", "failure_threshold", "cooldown_ms", "max_cooldown_ms"} (each optional), and
-- adaptive_concurrency; NULL: the destination's.
ALTER TABLE outbox.endpoints ADD COLUMN breaker jsonb NOT NULL DEFAULT '{}'::jsonb
  CONSTRAINT endpoints_breaker_check CHECK (jsonb_typeof(breaker) = 'object');
ALTER TABLE outbox.endpoints ADD COLUMN adaptive_concurrency boolean;

-- Standard Webhooks' asymmetric signatures: an endpoint may sign with ed25519 ("whsk_" private
-- keys, "v1a," signatures) instead of HMAC; receivers verify with the public key ("whpk_"),
-- which `endpoints show` and the API may print at any time.
ALTER TABLE outbox.endpoint_secrets
  DROP CONSTRAINT endpoint_secrets_format_check,
  ADD CONSTRAINT endpoint_secrets_format_check
    CHECK (secret ~ '^(whsec|whsk)_[A-Za-z0-9+/]+={0,2}$'),
  ADD COLUMN public_key text,
  ADD CONSTRAINT endpoint_secrets_public_key_check
    CHECK ((secret LIKE 'whsk\_%') = (public_key IS NOT NULL));

REVOKE ALL ON outbox.delivery_attempts, outbox.endpoint_health FROM PUBLIC;
GRANT SELECT, INSERT, DELETE ON outbox.delivery_attempts TO outbox_relay;
GRANT SELECT, INSERT, UPDATE, DELETE ON outbox.endpoint_health TO outbox_relay;
