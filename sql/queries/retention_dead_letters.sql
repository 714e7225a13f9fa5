-- retention_dead_letters: delete one batch of dead letters that died before the cutoff,
-- oldest first (dead_letters_dead_at_idx). SKIP LOCKED so a concurrent `dlq replay` or
-- another cleaner is never waited for.
--   $1 cutoff (timestamptz text, from retention_cutoff.sql)   $2 batch size
WITH doomed AS (
  SELECT d.id FROM outbox.dead_letters d
  WHERE d.dead_at < $1::timestamptz
  ORDER BY d.dead_at
  LIMIT $2
  FOR UPDATE SKIP LOCKED
)
DELETE FROM outbox.dead_letters d USING doomed x
WHERE d.id = x.id
