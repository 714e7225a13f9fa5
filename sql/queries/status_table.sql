-- status_table: health of the queue table itself (seed of the degradation signals in
-- docs/operations.md): live and dead tuples as counted by the statistics system, when it
-- was last vacuumed, and its size. Readable by any role. Also the server's clock.
SELECT extract(epoch FROM now())::float8 AS now_epoch,
       coalesce(s.n_live_tup, 0) AS n_live_tup,
       coalesce(s.n_dead_tup, 0) AS n_dead_tup,
       extract(epoch FROM s.last_vacuum)::float8 AS last_vacuum_epoch,
       extract(epoch FROM s.last_autovacuum)::float8 AS last_autovacuum_epoch,
       coalesce(s.vacuum_count, 0) AS vacuum_count,
       coalesce(s.autovacuum_count, 0) AS autovacuum_count,
       pg_total_relation_size('outbox.messages'::regclass) AS total_bytes
FROM (SELECT 1) one
LEFT JOIN pg_stat_user_tables s ON s.relid = 'outbox.messages'::regclass
