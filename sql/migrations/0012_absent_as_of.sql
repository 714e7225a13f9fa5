-- 0012: exactly-once recovery reads Kafka from the last time a message was known not to be
-- there, not from its creation. `absent_as_of` is written by the settle of an exactly-once
-- attempt that found the message absent from its topic (or had no earlier attempt), with every
-- earlier producer of its bucket fenced, and then produced nothing or aborted its transaction:
-- as of that time the message is not in Kafka and nothing older can add it, so a later
-- recovery (after an attempt whose end is unknown) need only read records from then on. Before,
-- a message retried through a long outage made every recovery read its topic from the
-- message's creation, hours or days of records (docs/delivery-semantics.md). NULL: not known
-- (rows written before this, at-least-once destinations): recovery starts at creation.
ALTER TABLE outbox.messages ADD COLUMN absent_as_of timestamptz;
