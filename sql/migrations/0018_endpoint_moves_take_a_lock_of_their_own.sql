-- 0018: the lock an endpoint's move takes, and a settle tries.
-- * A settle writing what a fan-out leaves an endpoint (a row for a retry, a dead letter) puts
--   it into the destination the endpoint is in now, and must not do so while the endpoint
--   moves to another destination (`endpoints update --destination`, which sweeps the
--   endpoint's rows and dead letters along): written after the sweep read the queue, they were
--   stranded in the old destination. The settle held the endpoint's registry row FOR SHARE
--   for this, but overlapping settles of several relays kept a row share-locked without a
--   break, and a waiting UPDATE of the endpoint (the move, `endpoints disable`, the service's
--   own automatic disable) could wait behind them indefinitely, writing a row lock (and
--   multixacts) into outbox.endpoints at every settle besides.
-- * Now a move takes this advisory lock, exclusively, before it changes the endpoint; a settle
--   tries it shared before the statement that reads where the endpoint is, and puts the
--   fan-out aside when it is held (written again a few seconds later). PostgreSQL's lock
--   manager fails a new shared try while an exclusive request waits, so a move is never
--   starved, and nothing is written for the lock. An archive replay to an endpoint
--   (`endpoints replay`) takes it shared as well, waiting.
CREATE FUNCTION outbox.endpoint_lock_key(endpoint_id text) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT hashtextextended('endpoint' || chr(31) || endpoint_id, 7079)
$$;

REVOKE ALL ON FUNCTION outbox.endpoint_lock_key(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION outbox.endpoint_lock_key(text) TO outbox_relay;
