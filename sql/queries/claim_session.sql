-- claim_session: planner settings of a connection that runs claim.sql or
-- claim_partitioned.sql, applied once per connection before its first claim, so every plan
-- of those statements (custom or cached generic) is made under them. (The settler's and the
-- maintenance loop's connections take part of them: queue_session.sql.) They keep a claim's
-- cost O(batch) whatever the statistics say (docs/adr/0001-claim-path.md, "Plan
-- stability"): a queue table last analyzed while empty and then given a burst gets row
-- estimates of 1-5, and the planner then preferred a bitmap scan that fetched every row past
-- the cursor and sorted them to keep a batch. Without bitmap scans, sequential scans and
-- sorts, the only plan left without a penalty walks messages_fresh_idx (or
-- messages_fresh_bucket_idx, messages_parked_idx) in index order and stops at the LIMIT, and
-- probes everything else by primary key or messages_key_order_idx. A sort that no plan can
-- avoid (the final ORDER BY of at most a batch) still runs: the setting only adds a cost.
SET enable_bitmapscan = off;
SET enable_seqscan = off;
SET enable_sort = off;
-- Each disabled node adds 1e10 to a plan's cost estimate, far above jit_above_cost: left on,
-- JIT would compile every claim (measured: ~540 ms of a 600 ms claim of one row).
SET jit = off;
-- Plans made once per connection and kept (generic), not planned again for every claim: the
-- settings above leave one plan shape whatever the parameters, so planning per claim only
-- cost time (measured: ~0.8 ms of Postgres CPU per claim, 1.6 us per message at 500 a claim;
-- PostgreSQL's own choice, `auto`, kept planning every time). Generic plans are held to the
-- same O(batch) bound as custom ones by tests/store/claim_plan_pgtest.cc.
SET plan_cache_mode = force_generic_plan
