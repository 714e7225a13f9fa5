-- 0037: every relay says in its heartbeat whether it holds its rows by bucket leases, and the
-- heartbeat of a relay whose lease mode differs from a live relay's serving one of its
-- destinations is refused.
-- * outbox.coordinate (0035) refuses a partitioned relay whose bucket_leases differs from a
--   live one's, but a `claim_mode: skip_locked` relay never calls it: one serving the
--   destinations of bucket-lease relays leased rows they hold in memory, with nothing written
--   in them, and they read rows it had leased (messages in flight twice).
-- * relay_heartbeats.bucket_leases (older relays' upserts leave it false, which is what they
--   do), and outbox.relay_heartbeat, which the relay now calls instead of its own upsert: under
--   a lock of its own (so two relays starting together cannot both miss each other), it raises
--   error 55000 naming the other relay, the destination they share and the fix, and writes
--   nothing; otherwise it upserts the row as relay_heartbeat.sql did. A relay whose heartbeat
--   is refused claims nothing until one is accepted.
-- * Live: a heartbeat within `live_within` (30 s, the relays' and `outbox-relay status`'s
--   expiry). Relays older than this migration are seen (as row-lease relays) but do not look.
-- Written to run again over itself (IF NOT EXISTS, OR REPLACE).

ALTER TABLE outbox.relay_heartbeats
  ADD COLUMN IF NOT EXISTS bucket_leases boolean NOT NULL DEFAULT false;

CREATE OR REPLACE FUNCTION outbox.relay_heartbeat(instance uuid, destinations text[],
                                                  description text, targets jsonb,
                                                  bucket_leases boolean DEFAULT false,
                                                  live_within interval DEFAULT interval '30 seconds')
RETURNS void
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
  other record;
BEGIN
  PERFORM pg_advisory_xact_lock(7079, 3);
  SELECT h.instance_id, h.description, d.destination INTO other
  FROM outbox.relay_heartbeats h
  CROSS JOIN LATERAL unnest(h.destinations) AS d(destination)
  WHERE h.instance_id <> instance
    AND h.bucket_leases <> relay_heartbeat.bucket_leases
    AND h.heartbeat_at >= clock_timestamp() - relay_heartbeat.live_within
    AND d.destination = ANY (relay_heartbeat.destinations)
  ORDER BY d.destination, h.instance_id
  LIMIT 1;
  IF FOUND THEN
    RAISE EXCEPTION 'outbox.relay_heartbeat: relay % (%) holds the rows of % by %, this one by %',
      other.instance_id, other.description, other.destination,
      CASE WHEN relay_heartbeat.bucket_leases THEN 'row leases' ELSE 'bucket leases' END,
      CASE WHEN relay_heartbeat.bucket_leases THEN 'bucket leases' ELSE 'row leases' END
      USING ERRCODE = 'object_not_in_prerequisite_state',
            HINT = 'the relays of a destination must agree on how they hold its rows (a '
                   'skip_locked or row-lease relay would lease rows a bucket-lease relay holds '
                   'in memory): give them all the same claim_mode and bucket_leases, or stop the '
                   'others before starting this one; this relay claims nothing meanwhile '
                   '(docs/scaling.md)';
  END IF;
  DELETE FROM outbox.relay_heartbeats h
  WHERE h.heartbeat_at < clock_timestamp() - interval '1 day' AND h.instance_id <> instance;
  INSERT INTO outbox.relay_heartbeats AS h
    (instance_id, destinations, description, heartbeat_at, targets, bucket_leases)
  VALUES (instance, relay_heartbeat.destinations, relay_heartbeat.description, clock_timestamp(),
          relay_heartbeat.targets, relay_heartbeat.bucket_leases)
  ON CONFLICT (instance_id) DO UPDATE
  SET destinations = excluded.destinations, description = excluded.description,
      heartbeat_at = excluded.heartbeat_at, targets = excluded.targets,
      bucket_leases = excluded.bucket_leases;
END
$$;

REVOKE ALL ON FUNCTION outbox.relay_heartbeat(uuid, text[], text, jsonb, boolean, interval)
  FROM PUBLIC;
GRANT EXECUTE ON FUNCTION outbox.relay_heartbeat(uuid, text[], text, jsonb, boolean, interval)
  TO outbox_relay;
