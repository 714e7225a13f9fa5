-- wake_orphans: one page of the safety net behind the claim loops' rechecks of blocked keys
-- (wake_keys.sql): a row parked at 'infinity' whose key has no earlier message left (its
-- predecessor settled between a claim's snapshot and its park, and the recheck did not run: the
-- relay stopped) is woken. A key is the ordering key within its endpoint (claim_settle_scan.sql).
--   $1 destination   $2 the page starts after this id   $3 blocked rows in the page
-- Returns woken, scanned (the page's rows: fewer than $3 at the end of the sweep), last_id and
-- top, the highest id in the queue now: a pass ends there (see maintenance.cc).
--
-- A page, not the destination's whole blocked backlog: in one statement this read every
-- blocked row and, through min(), every row of each blocked key (~5 s for a million blocked
-- rows, every reap_interval_ms, on the thread that renews the leases of messages in flight).
-- The page walks messages_parked_idx in id order from $2 (the row comparison, not
-- `destination = $1`, so that only that index gives the order: the primary key, from $2, would
-- read every row past it); each key's first row in the page is probed once, its key's head read
-- with ORDER BY ... LIMIT 1 (one index entry), and the orphans are updated by primary key.
WITH page AS MATERIALIZED (
  SELECT id, ordering_key, endpoint_id
  FROM outbox.messages
  WHERE parked AND (destination, deliver_after, id) > ($1, 'infinity'::timestamptz, $2)
    AND destination <= $1
  ORDER BY destination, deliver_after, id
  LIMIT $3
), firsts AS (
  SELECT DISTINCT ON (ordering_key, endpoint_id) id, ordering_key, endpoint_id
  FROM page
  ORDER BY ordering_key, endpoint_id, id
), woken AS (
  UPDATE outbox.messages m
  SET deliver_after = clock_timestamp()
  WHERE m.id = ANY (ARRAY(
          SELECT f.id
          FROM firsts f
          CROSS JOIN LATERAL (
            SELECT n.id FROM outbox.messages n
            WHERE n.destination = $1 AND n.ordering_key = f.ordering_key
              AND n.endpoint_id IS NOT DISTINCT FROM f.endpoint_id
            ORDER BY n.id LIMIT 1) head
          WHERE head.id = f.id))
    AND m.parked AND m.deliver_after = 'infinity' AND m.lease_owner IS NULL
  RETURNING m.id
)
SELECT (SELECT count(*) FROM woken) AS woken, (SELECT count(*) FROM page) AS scanned,
       coalesce((SELECT max(id) FROM page), 0) AS last_id,
       coalesce((SELECT max(id) FROM outbox.messages), 0) AS top
