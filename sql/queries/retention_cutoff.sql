-- retention_cutoff: the instant before which retention deletes, computed once per cleanup
-- run on the server's clock, so a run removes exactly the rows that were older than the
-- retention when it started (and terminates even while rows keep ageing).
--   $1 retention in seconds
SELECT (clock_timestamp() - make_interval(secs => $1::float8))::text AS cutoff
