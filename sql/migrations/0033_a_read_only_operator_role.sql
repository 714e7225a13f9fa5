-- 0033: outbox_reader, a read-only role for operators, dashboards and incident review.
-- outbox_relay is the relay's own role: it reads every endpoint's signing secrets, rewrites the
-- archive that `verify` compares against and takes buckets over, so giving it to whoever
-- should only look was giving them all of that. outbox_reader reads what `status`,
-- `dlq list` / `dlq show`, `attempts` and `verify` read, and changes nothing:
-- * the queue, the dead letters and the delivered archive (payloads included: they are what an
--   operator reviews after an incident);
-- * the relays' heartbeats, bucket ownership, lease records, paused destinations, registered
--   destinations, settings and the schema version;
-- * the webhook service's delivery log, endpoint health and replays, and of each endpoint
--   every column but `url` and `headers`, which may carry credentials (a token in the query,
--   an Authorization header). Not outbox.endpoint_secrets.
-- Cluster-wide and NOLOGIN, like the other two: grant it to login roles (docs/roles.md).
DO $$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'outbox_reader') THEN
    CREATE ROLE outbox_reader NOLOGIN;
  END IF;
END
$$;

GRANT USAGE ON SCHEMA outbox TO outbox_reader;
GRANT SELECT ON outbox.messages, outbox.dead_letters, outbox.delivered_archive,
                outbox.relay_heartbeats, outbox.relay_instances, outbox.bucket_owners,
                outbox.leases, outbox.paused_destinations, outbox.destinations,
                outbox.settings, outbox.partitioning, outbox.schema_migrations,
                outbox.delivery_attempts, outbox.endpoint_health, outbox.endpoint_replays,
                outbox.endpoint_registry
  TO outbox_reader;
GRANT SELECT (id, destination, description, metadata, event_types, max_in_flight, enabled,
              disabled_reason, created_at, updated_at, auto_disabled_at, rate_limit, breaker,
              adaptive_concurrency, enabled_at)
  ON outbox.endpoints TO outbox_reader;
-- `attempts --message` finds an endpoint's copies of a message by their delivery ids.
GRANT EXECUTE ON FUNCTION outbox.endpoint_delivery_id(uuid, text) TO outbox_reader;
