-- status_targets: each live relay's view of its targets' health (heartbeat within $1 seconds),
-- one row per relay and destination, for relays that report one (webhook and Kafka destinations).
--   $1 seconds after which a silent relay counts as gone
SELECT t.key AS destination, h.instance_id::text AS instance_id, h.description,
       t.value AS health
FROM outbox.relay_heartbeats h CROSS JOIN LATERAL jsonb_each(h.targets) AS t
WHERE h.heartbeat_at > clock_timestamp() - make_interval(secs => $1::float8)
ORDER BY t.key, h.description, h.instance_id
