-- queue_session: planner settings of the settler's and the maintenance loop's connections,
-- applied once per connection before its first statement on the queue's rows (settle,
-- renew_leases, reap, wake_orphans, wake_keys, release_lost_claims). With the defaults, a relay
-- started on an empty queue planned those statements for an empty table, where a scan of it
-- cost nothing, and kept the plans (reap has no parameters; PostgreSQL keeps a generic plan of
-- the others once five custom plans cost alike): after a burst each of them read the whole
-- backlog until the table was analyzed again (docs/adr/0001-claim-path.md, "Plan stability").
-- Each probes the queue by primary key or an index from arrays of ids, so without sequential
-- and bitmap scans that probe is the plan left. Unlike claim_session.sql, sorts and
-- PostgreSQL's plan caching stay as they are: with them the settle took ~1 ms more per batch
-- in the benchmark.
SET enable_bitmapscan = off;
SET enable_seqscan = off;
-- Each disabled node adds 1e10 to a plan's estimated cost, far above jit_above_cost.
SET jit = off
