-- 0041: one rule tells an endpoint's own dead letters from those of a deleted endpoint of its id
-- (one added again is another endpoint: its URL, its secret, its event types), for everything
-- that reads them: `dlq replay` (dlq_replay.sql), the endpoint's dead-letter count
-- (`endpoints show`, GET /v1/endpoints), and the endpoint's dead letters and their recovery
-- (GET /v1/endpoints/{id}/dead-letters, POST /v1/endpoints/{id}/recover, `endpoints recover`).
-- The rule was written out in each reader, and copies drift.
-- A dead letter of endpoint E is E's own when it died after E was created, and not as the copy
-- a settle found owed to a deleted endpoint (reason 'endpoint ID was deleted', which a settle
-- may write after the id was added again).
-- One SQL expression, IMMUTABLE: the planner inlines it where it is called.
CREATE OR REPLACE FUNCTION outbox.dead_letter_is_endpoints_own(
    dead_at timestamptz, reason text, endpoint_id text, endpoint_created_at timestamptz)
  RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE AS
$$ SELECT dead_at >= endpoint_created_at
          AND reason IS DISTINCT FROM 'endpoint ' || endpoint_id || ' was deleted' $$;

REVOKE ALL ON FUNCTION outbox.dead_letter_is_endpoints_own(timestamptz, text, text, timestamptz)
  FROM PUBLIC;
GRANT EXECUTE ON FUNCTION outbox.dead_letter_is_endpoints_own(timestamptz, text, text, timestamptz)
  TO outbox_relay, outbox_reader;

-- An endpoint's dead letters, the last to die first (endpoint_dead_letters.sql), a page at a
-- time. Builds over the dead letters while writes to them wait: where they number millions,
-- build it first, outside a transaction, and the migration finds it (CREATE INDEX
-- CONCURRENTLY IF NOT EXISTS dead_letters_endpoint_dead_at_idx ON outbox.dead_letters
-- (endpoint_id, dead_at, id) WHERE endpoint_id IS NOT NULL;). A concurrent build that failed
-- leaves it INVALID: drop it and build it again (docs/operations.md).
CREATE INDEX IF NOT EXISTS dead_letters_endpoint_dead_at_idx
  ON outbox.dead_letters (endpoint_id, dead_at, id) WHERE endpoint_id IS NOT NULL;
