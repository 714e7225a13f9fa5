-- retention_cutoff: the instant before which retention deletes, computed once per cleanup
-- run on the server's clock, so a run removes exactly the rows that were older than the
-- retention when it started (and terminates even while rows keep ageing).
-- Written as ISO 8601 in UTC, which reads back the same whatever the session's DateStyle and
-- TimeZone: a plain ::text follows them, and 'Postgres' style with Asia/Shanghai printed
-- "... CST", read back as US Central time (a one-hour retention deleted minutes-old rows).
--   $1 retention in seconds
SELECT to_char((clock_timestamp() - make_interval(secs => $1::float8)) AT TIME ZONE 'UTC',
               'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') AS cutoff
