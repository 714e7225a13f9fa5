-- retention_archive: delete one batch of one destination's archived deliveries older than the
-- cutoff, oldest first (delivered_archive_destination_idx). A relay cleans its own
-- destinations: others in the database keep their own relays' retention. No FOR UPDATE: row
-- locks would need the UPDATE privilege, which the relay role does not have on the archive.
-- Two cleaners racing for the same rows just find them gone.
--   $1 cutoff (timestamptz text, from retention_cutoff.sql)   $2 batch size   $3 destination
-- The batch's ids as an array, deleted by primary key: as `id IN (subquery)` the planner
-- hash-joined a scan of the whole archive to each batch (retention_pgtest.cc).
DELETE FROM outbox.delivered_archive a
WHERE a.id = ANY (ARRAY(SELECT o.id FROM outbox.delivered_archive o
                        WHERE o.destination = $3 AND o.delivered_at < $1::timestamptz
                        ORDER BY o.delivered_at
                        LIMIT $2))
