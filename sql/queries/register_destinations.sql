-- register_destinations: the destinations of a starting relay's config, for the write-time
-- guard (migration 0010); a name already known keeps its first registration.
--   $1 JSON array of names   $2 who registers them ("relay host:pid")
INSERT INTO outbox.destinations (name, registered_by)
SELECT n, $2 FROM jsonb_array_elements_text($1::jsonb) AS n
ON CONFLICT (name) DO NOTHING
