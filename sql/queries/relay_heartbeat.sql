-- relay_heartbeat: this relay is alive and serves these destinations (any claim mode), holding
-- their rows by bucket leases or not; refused (55000) beside a live relay of the other lease
-- mode serving one of them (migration 0037). Rows of relays silent for a day are removed on
-- the way.
--   $1 instance id (uuid)   $2 destinations ('{orders,hooks}')   $3 description
--   $4 targets: jsonb, destination -> its target's health (0006)   $5 bucket leases (boolean)
SELECT outbox.relay_heartbeat($1::uuid, $2::text[], $3, $4::jsonb, $5::boolean)
