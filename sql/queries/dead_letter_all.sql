-- dead_letter_all: move up to 5000 unleased messages of a destination to the dead letters;
-- `outbox-relay dlq bury` repeats it until none is left up to the id it started at, so that
-- writers still writing to the destination cannot keep it going forever (an operator's
-- decision for a destination no relay will serve; a relay never does this on its own).
--   $1 destination   $2 reason   $3 the highest id to move   $4 the last id the previous
--   batch moved (0 at first): each batch goes on from there along the primary key, so every
--   row is read once. Started over from the lowest id, each batch read again what the earlier
--   ones passed over (other destinations' rows, leased ones): 575k rows read to bury 20k
--   behind 50k of another destination (claim_plan_pgtest.cc). Returns the ids moved.
WITH moved AS (
  DELETE FROM outbox.messages m
  WHERE m.id = ANY (ARRAY(SELECT id FROM outbox.messages
                          WHERE id > $4::bigint AND id <= $3::bigint
                            AND destination = $1 AND lease_owner IS NULL
                          ORDER BY id LIMIT 5000 FOR UPDATE SKIP LOCKED))
  RETURNING m.*
)
INSERT INTO outbox.dead_letters (id, destination, ordering_key, idempotency_key, event_type,
                                 headers, payload, payload_bytes, attempts, reason,
                                 last_error, created_at, endpoint_id)
-- endpoint_id too: an endpoint row replayed without it is a new message to the webhook
-- service, fanned out again to every endpoint.
SELECT id, destination, ordering_key, idempotency_key, event_type, headers, payload,
       payload_bytes, attempts, $2, last_error, created_at, endpoint_id
FROM moved
RETURNING id
