-- dlq_purge: delete dead letters for good.
--   $1 ids as an array literal ('{1,2}') or '' for any   $2 only those dead for longer than
--   this interval ('7 days') or '' for any age   $3 destination or '' for all
DELETE FROM outbox.dead_letters
WHERE (NULLIF($1, '') IS NULL OR id = ANY(NULLIF($1, '')::bigint[]))
  AND (NULLIF($2, '') IS NULL OR dead_at < clock_timestamp() - NULLIF($2, '')::interval)
  AND (NULLIF($3, '') IS NULL OR destination = $3)
RETURNING id
