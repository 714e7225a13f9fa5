-- 0020: a writer whose transaction ends in two-phase commit (PREPARE TRANSACTION: XA, JTA,
-- some transaction managers) can write messages. PostgreSQL refuses to prepare a transaction
-- that ran NOTIFY, and every insert into outbox.messages woke the relays with pg_notify
-- (0013), so such a transaction could not commit at all once it had enqueued (review). The
-- writer now says so in its transaction:
--   SET LOCAL outbox.notify = 'off';
-- and the trigger sends no wake-up for its rows; the relays find them at their next poll
-- (poll_interval_ms) instead of at once. Any other value, or none, wakes them as before.
CREATE OR REPLACE FUNCTION outbox.notify_relay() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  IF coalesce(current_setting('outbox.notify', true), '') <> 'off'
     AND EXISTS (SELECT 1 FROM inserted_rows) THEN
    PERFORM pg_notify('outbox_messages', '');
  END IF;
  RETURN NULL;
END
$$;
