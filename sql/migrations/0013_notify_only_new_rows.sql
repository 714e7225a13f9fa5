-- 0013: wake the relays only when an INSERT into outbox.messages inserted something. A
-- statement-level trigger fires once per statement whatever it inserted, and the relay's own
-- settle statement holds an INSERT (the rows a fanned-out message still owes its endpoints)
-- that inserts nothing almost always: every settle of every relay woke every relay, which
-- claimed in vain (measured: an empty claim after each delivered message under live traffic).
-- An INSERT ... ON CONFLICT DO NOTHING that met only conflicts woke them too. The trigger now
-- looks at the statement's inserted rows (a transition table) and stays quiet when there are
-- none.
CREATE OR REPLACE FUNCTION outbox.notify_relay() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  IF EXISTS (SELECT 1 FROM inserted_rows) THEN
    PERFORM pg_notify('outbox_messages', '');
  END IF;
  RETURN NULL;
END
$$;
DROP TRIGGER messages_notify_relay ON outbox.messages;
CREATE TRIGGER messages_notify_relay
  AFTER INSERT ON outbox.messages
  REFERENCING NEW TABLE AS inserted_rows
  FOR EACH STATEMENT EXECUTE FUNCTION outbox.notify_relay();
