-- status_relays: how many live relays serve each destination (heartbeat within $1 seconds).
-- A destination with queued messages and none is unserved: nothing delivers it.
--   $1 seconds after which a silent relay counts as gone
SELECT d.destination, count(*) AS relays
FROM outbox.relay_heartbeats h CROSS JOIN LATERAL unnest(h.destinations) AS d(destination)
WHERE h.heartbeat_at > clock_timestamp() - make_interval(secs => $1::float8)
GROUP BY d.destination
