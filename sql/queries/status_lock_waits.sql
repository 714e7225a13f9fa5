-- status_lock_waits: sessions waiting for a lock on the queue table. With SKIP LOCKED the
-- relay should never wait; consistent waiters mean something contends on the queue's rows
-- (another statement updating them without SKIP LOCKED, DDL, a manual VACUUM FULL).
-- Two sources, counted once per session:
--   * pg_locks: any lock requested on outbox.messages and not granted (visible to all roles);
--   * pg_stat_activity: sessions in a 'Lock' wait (e.g. on a row's transaction) whose query
--     names outbox.messages (other roles' sessions only with pg_read_all_stats / pg_monitor).
-- Advisory-lock waits are left out: writers of one ordering key queue behind each other in
-- outbox.insert_message by design.
SELECT count(*) AS lock_waiters,
       coalesce(max(w.waiting_seconds), 0)::float8 AS longest_wait_seconds
FROM (
  SELECT pid, max(waiting_seconds) AS waiting_seconds
  FROM (
    SELECT l.pid, greatest(0, extract(epoch FROM clock_timestamp() - coalesce(l.waitstart, clock_timestamp()))) AS waiting_seconds
    FROM pg_locks l
    WHERE NOT l.granted AND l.relation = 'outbox.messages'::regclass
      AND l.pid <> pg_backend_pid()
    UNION ALL
    SELECT a.pid, greatest(0, extract(epoch FROM clock_timestamp() - coalesce(a.state_change, clock_timestamp())))
    FROM pg_stat_activity a
    WHERE a.wait_event_type = 'Lock' AND a.wait_event <> 'advisory'
      AND a.query ~* 'outbox\.messages' AND a.pid <> pg_backend_pid()
  ) u
  GROUP BY pid
) w
