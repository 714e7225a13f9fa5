-- 0030: privileges the relay role lacked for what the webhook service writes (review).
-- * A fan-out's copy that an endpoint refused for good becomes a dead letter with an id of its
--   own, from the queue's sequence (settle.sql: nextval): SELECT on the sequence was not
--   enough, and the settle failed whole with permission denied, its messages sent to every
--   endpoint again when their leases ran out.
-- * An endpoint moved to another destination takes its dead letters along (UPDATE of their
--   destination).
GRANT USAGE ON SEQUENCE outbox.messages_id_seq TO outbox_relay;
GRANT UPDATE (destination) ON outbox.dead_letters TO outbox_relay;
