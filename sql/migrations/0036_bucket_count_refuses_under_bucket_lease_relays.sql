-- 0036: outbox.set_bucket_count refuses to run under a live bucket-lease relay, as under an
-- exactly-once one (0017).
-- * A relay with `bucket_leases: true` (0035, docs/adr/0003-bucket-leases.md) holds its
--   buckets' rows in memory, with nothing written in them, and gives a bucket up before
--   another relay takes it. set_bucket_count moves every queued row to another bucket and
--   frees every bucket at once: another relay could claim what one had in hand and deliver it
--   a second time, out of its key's order. It now raises an error (55000) naming the live
--   bucket-lease relays, unless called with force => true (then a warning names them).
-- * A forced change ends the handovers under way with the owners it clears.
-- * The body is 0017's otherwise; the signature and its grants are unchanged.
-- Written to run again over itself (OR REPLACE).

CREATE OR REPLACE FUNCTION outbox.set_bucket_count(new_count integer, force boolean DEFAULT false)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
  held_since timestamptz;
  fencing text;
  holding text;
BEGIN
  -- Checked before the locks, so a refusal does not first wait for every writer of the queue
  -- (and hold new ones back meanwhile), and again under them, where no relay joins.
  FOR pass IN 1..2 LOOP
    IF pass = 2 THEN
      PERFORM pg_advisory_xact_lock(7079, 2);
      PERFORM pg_advisory_xact_lock(7079, 1);
    END IF;
    SELECT string_agg(format('%s (%s)', r.description, r.instance_id), ', '
                      ORDER BY r.description)
      INTO fencing
    FROM outbox.relay_instances r
    WHERE r.exactly_once
      AND r.heartbeat_at >= clock_timestamp() - coalesce(r.dead_after, interval '10 seconds');
    IF fencing IS NOT NULL AND NOT force THEN
      RAISE EXCEPTION 'outbox.set_bucket_count(%): live relays deliver exactly once: %',
                      new_count, fencing
        USING DETAIL = 'Changing the bucket count moves queued messages between buckets, and '
                       'so between the Kafka transactional ids these relays fence each other '
                       'by: a message in flight could be produced twice, and a read_committed '
                       'consumer would see both.',
              HINT = format('Stop those relays and run it again, or accept duplicates with '
                            'SELECT outbox.set_bucket_count(%s, force => true).', new_count);
    END IF;
    SELECT string_agg(format('%s (%s)', r.description, r.instance_id), ', '
                      ORDER BY r.description)
      INTO holding
    FROM outbox.relay_instances r
    WHERE r.bucket_leases
      AND r.heartbeat_at >= clock_timestamp() - coalesce(r.dead_after, interval '10 seconds');
    IF holding IS NOT NULL AND NOT force THEN
      RAISE EXCEPTION 'outbox.set_bucket_count(%): live relays hold their buckets by bucket leases: %',
                      new_count, holding
        USING ERRCODE = 'object_not_in_prerequisite_state',
              DETAIL = 'Changing the bucket count moves every queued message to another bucket '
                       'and frees every bucket at once, without the handover: a message such a '
                       'relay holds in memory could be claimed and delivered by another relay, '
                       'twice and out of its key''s order.',
              HINT = format('Stop those relays (or run them without bucket_leases) and run it '
                            'again, or accept duplicates with '
                            'SELECT outbox.set_bucket_count(%s, force => true).', new_count);
    END IF;
  END LOOP;
  IF holding IS NOT NULL THEN
    RAISE WARNING 'outbox.set_bucket_count(%) forced under bucket-lease relays: %', new_count,
                  holding;
  END IF;
  IF fencing IS NOT NULL THEN
    RAISE WARNING 'outbox.set_bucket_count(%) forced under exactly-once relays: %', new_count,
                  fencing;
  END IF;
  held_since := clock_timestamp();
  UPDATE outbox.partitioning SET bucket_count = new_count;
  UPDATE outbox.messages m
  SET bucket = CASE WHEN m.ordering_key IS NULL THEN floor(random() * new_count)
                    ELSE (hashtextextended(m.destination || chr(31) || m.ordering_key, 0) & 32767) % new_count END;
  UPDATE outbox.bucket_owners SET owner = NULL, epoch = epoch + 1, handing_to = NULL,
                                 handing_since = NULL;
  DELETE FROM outbox.bucket_owners WHERE bucket >= new_count;
  -- Heartbeats could not be written while this held the lock: that time is not held against
  -- the relays.
  UPDATE outbox.relay_instances SET heartbeat_at = heartbeat_at + (clock_timestamp() - held_since);
  PERFORM pg_notify('outbox_messages', 'rebalance');
END
$$;
