-- 0028: the partitioned claim's slow lane (rows parked for a retry, now due) reads each owned
-- bucket's due rows in this index, as its fresh lane reads messages_fresh_bucket_idx. Through
-- messages_parked_idx (destination, deliver_after, id) it read every due row of the
-- destination and kept those of its own buckets: with other relays' endpoints failing, tens
-- of thousands of rows a claim (tests/store/claim_plan_pgtest.cc). messages_parked_idx stays
-- for the skip_locked claim, which reads the whole destination's due rows in order.
--
-- A parked row (a retry, a message scheduled for later, one blocked behind its key) now
-- writes one more index entry. Building the index blocks writes to the queue meanwhile; on a
-- queue of many millions of parked rows, build it beforehand (outside a transaction) and this
-- migration finds it:
--   CREATE INDEX CONCURRENTLY IF NOT EXISTS messages_parked_bucket_idx
--     ON outbox.messages (destination, bucket, deliver_after, id) WHERE parked;
CREATE INDEX IF NOT EXISTS messages_parked_bucket_idx
  ON outbox.messages (destination, bucket, deliver_after, id) WHERE parked;
-- A CREATE INDEX CONCURRENTLY that failed or was cancelled leaves the index invalid, and
-- IF NOT EXISTS would take it as it is: the planner never uses an invalid index, and each
-- bucket's slow scan would read the destination's whole due range.
DO $$
BEGIN
  IF EXISTS (SELECT 1 FROM pg_index i
             WHERE i.indexrelid = 'outbox.messages_parked_bucket_idx'::regclass
               AND NOT i.indisvalid) THEN
    RAISE EXCEPTION 'outbox.messages_parked_bucket_idx is invalid (a CREATE INDEX CONCURRENTLY '
                    'that failed or was cancelled)'
      USING HINT = 'DROP INDEX CONCURRENTLY outbox.messages_parked_bucket_idx; then build it '
                   'again as the comment of migration 0028 shows, or let this migration build it';
  END IF;
END
$$;
