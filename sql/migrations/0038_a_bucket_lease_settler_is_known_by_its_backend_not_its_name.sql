-- 0038: the settles of bucket-lease relays are known by the backend that registered, not by
-- the connection's name.
-- * claim_owned.sql passes over the transactions of bucket-lease settles (they write no queue
--   rows, and counted they held the fresh-lane cursor back at every other claim: ADR 0003).
--   It found them by application_name 'outbox-relay bucket-lease settler', which any session
--   may set: a producer's transaction so named was passed over too, and the cursor could pass
--   the rows it then committed (the full sweep found them, up to full_sweep_interval_ms late).
-- * outbox.bucket_lease_settlers lists the settlers' backends by (pid, backend_start), which
--   no session chooses; each settler connection registers itself with
--   outbox.register_bucket_lease_settler(), which also forgets backends that have ended. Only
--   the relay role may register (outbox_relay: EXECUTE, and the table's rows).
-- * A backend's backend_start reads NULL to a role that is neither its own nor a member of
--   pg_read_all_stats: relays of one fleet running as different login roles see each other's
--   settles as any transaction (the cursor is held back by them, as before 0035's fix).
-- Written to run again over itself (IF NOT EXISTS, OR REPLACE).

CREATE TABLE IF NOT EXISTS outbox.bucket_lease_settlers (
  pid           integer PRIMARY KEY,
  backend_start timestamptz NOT NULL,
  registered_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
REVOKE ALL ON outbox.bucket_lease_settlers FROM PUBLIC;
GRANT SELECT, INSERT, UPDATE, DELETE ON outbox.bucket_lease_settlers TO outbox_relay;
GRANT SELECT ON outbox.bucket_lease_settlers TO outbox_reader;

CREATE OR REPLACE FUNCTION outbox.register_bucket_lease_settler()
RETURNS void
LANGUAGE sql AS $$
  -- Backends that ended (or were replaced under the same pid); one another role's, whose start
  -- this role cannot read, is kept.
  DELETE FROM outbox.bucket_lease_settlers s
  WHERE NOT EXISTS (SELECT 1 FROM pg_stat_get_activity(s.pid) a
                    WHERE a.backend_start IS NULL OR a.backend_start = s.backend_start);
  INSERT INTO outbox.bucket_lease_settlers AS s (pid, backend_start)
  SELECT a.pid, a.backend_start FROM pg_stat_get_activity(pg_backend_pid()) a
  ON CONFLICT (pid) DO UPDATE SET backend_start = excluded.backend_start,
                                  registered_at = clock_timestamp();
$$;
REVOKE ALL ON FUNCTION outbox.register_bucket_lease_settler() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION outbox.register_bucket_lease_settler() TO outbox_relay;
