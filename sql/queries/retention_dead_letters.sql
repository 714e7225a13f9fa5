-- retention_dead_letters: delete one batch of one destination's dead letters that died
-- before the cutoff, oldest first (dead_letters_destination_dead_at_idx). A relay cleans its
-- own destinations: others in the database keep their own relays' retention. No FOR UPDATE:
-- row locks would need the UPDATE privilege, which the relay role does not have on the dead
-- letters. A dead letter replayed or purged meanwhile is simply gone.
--   $1 cutoff (timestamptz text, from retention_cutoff.sql)   $2 batch size   $3 destination
-- The batch's ids as an array, deleted by primary key: as `id IN (subquery)` the planner
-- hash-joined a scan of every dead letter to each batch (retention_pgtest.cc).
DELETE FROM outbox.dead_letters d
WHERE d.id = ANY (ARRAY(SELECT o.id FROM outbox.dead_letters o
                        WHERE o.destination = $3 AND o.dead_at < $1::timestamptz
                        ORDER BY o.dead_at
                        LIMIT $2))
