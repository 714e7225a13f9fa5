-- status_oldest_xact: the oldest transaction that holds back the xmin horizon, which stops
-- both vacuum and the relay's fresh-lane cursor (docs/adr/0001-claim-path.md). Candidates:
-- sessions with an xid or a snapshot (other roles' sessions are only visible with
-- pg_read_all_stats / pg_monitor), and prepared transactions (visible to all).
-- Also, from our own snapshot (needs no privilege): xmax - xmin, the transaction ids between
-- the oldest still running and the newest finished one (+1). It grows while a transaction
-- stays open and others keep committing.
WITH candidates AS (
  SELECT 'session'::text AS kind, a.pid, a.usename::text AS usename,
         a.application_name, a.state, NULL::text AS gid,
         extract(epoch FROM now() - a.xact_start)::float8 AS age_seconds,
         coalesce(age(a.backend_xmin), age(a.backend_xid))::bigint AS xmin_age_xids
  FROM pg_stat_activity a
  WHERE a.pid <> pg_backend_pid()
    AND a.xact_start IS NOT NULL
    AND (a.backend_xid IS NOT NULL OR a.backend_xmin IS NOT NULL)
    AND a.backend_type <> 'autovacuum worker'
  UNION ALL
  SELECT 'prepared'::text, NULL::integer, p.owner::text, NULL::text, NULL::text, p.gid,
         extract(epoch FROM now() - p.prepared)::float8, age(p.transaction)::bigint
  FROM pg_prepared_xacts p
)
SELECT (pg_snapshot_xmax(pg_current_snapshot())::text::bigint
        - pg_snapshot_xmin(pg_current_snapshot())::text::bigint) AS xmin_lag_xids,
       c.kind, c.pid, c.usename, c.application_name, c.state, c.gid, c.age_seconds,
       c.xmin_age_xids
FROM (SELECT 1) one
LEFT JOIN LATERAL (SELECT * FROM candidates ORDER BY age_seconds DESC LIMIT 1) c ON true
