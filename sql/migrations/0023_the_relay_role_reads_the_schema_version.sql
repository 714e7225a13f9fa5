-- 0023: a relay whose login has only the outbox_relay role (docs/roles.md) can start. `run`
-- reads the schema version from outbox.schema_migrations before anything else (a relay older
-- or newer than the schema stops there), and nothing granted that table to the role: such a
-- relay stopped with "permission denied for table schema_migrations" (review; reproduced in
-- tests/process/relay_process_pgtest.cc). The migrator creates the table before the first
-- migration runs, so it exists here.
GRANT SELECT ON outbox.schema_migrations TO outbox_relay;
