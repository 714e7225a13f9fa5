-- registered_destinations: outbox.destinations (migration 0010) with the guard's setting,
-- for `outbox-relay destinations list`.
SELECT d.name, d.registered_by,
       to_char(d.registered_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"') AS registered_at,
       s.refuse_unknown_destinations AS guard
FROM outbox.settings s LEFT JOIN outbox.destinations d ON true
ORDER BY d.name
