-- retention_archive: delete one batch of archived deliveries older than the cutoff, oldest
-- first. No FOR UPDATE: row locks would need the UPDATE privilege, which the relay role does
-- not have on the archive. Two cleaners racing for the same rows just find them gone.
--   $1 cutoff (timestamptz text, from retention_cutoff.sql)   $2 batch size
DELETE FROM outbox.delivered_archive a
WHERE a.id IN (SELECT o.id FROM outbox.delivered_archive o
               WHERE o.delivered_at < $1::timestamptz
               ORDER BY o.delivered_at
               LIMIT $2)
