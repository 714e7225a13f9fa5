-- retention_archive: delete one batch of archived deliveries older than the cutoff, oldest
-- first. SKIP LOCKED so two relays cleaning at once do not wait for each other.
--   $1 cutoff (timestamptz text, from retention_cutoff.sql)   $2 batch size
WITH doomed AS (
  SELECT a.id FROM outbox.delivered_archive a
  WHERE a.delivered_at < $1::timestamptz
  ORDER BY a.delivered_at
  LIMIT $2
  FOR UPDATE SKIP LOCKED
)
DELETE FROM outbox.delivered_archive a USING doomed d
WHERE a.id = d.id
