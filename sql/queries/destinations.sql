-- destinations: the distinct destinations in the queue, by skipping through the two lane
-- indexes (a loose index scan) instead of reading the table.
WITH RECURSIVE fresh(d) AS (
  (SELECT destination FROM outbox.messages WHERE NOT parked ORDER BY destination LIMIT 1)
  UNION ALL
  SELECT (SELECT m.destination FROM outbox.messages m
          WHERE NOT m.parked AND m.destination > fresh.d ORDER BY m.destination LIMIT 1)
  FROM fresh WHERE fresh.d IS NOT NULL
), slow(d) AS (
  (SELECT destination FROM outbox.messages WHERE parked ORDER BY destination LIMIT 1)
  UNION ALL
  SELECT (SELECT m.destination FROM outbox.messages m
          WHERE m.parked AND m.destination > slow.d ORDER BY m.destination LIMIT 1)
  FROM slow WHERE slow.d IS NOT NULL
)
SELECT d FROM fresh WHERE d IS NOT NULL
UNION
SELECT d FROM slow WHERE d IS NOT NULL
