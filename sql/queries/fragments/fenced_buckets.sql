-- Fragment of settle_owned_delivered.sql and settle_owned_adopt.sql, spliced in where they
-- say `-- @include fenced_buckets.sql`: the CTE `fence` (bucket), the buckets of $2 that relay
-- $4 still owns at the epochs of $3, their rows in outbox.bucket_owners taken FOR SHARE until
-- the transaction ends, so a move of one of them (outbox.coordinate updates its row) waits for
-- the settle under way. Not a statement on its own.
fence AS MATERIALIZED (
  SELECT o.bucket
  FROM outbox.bucket_owners o
  JOIN unnest($2::integer[], $3::bigint[]) AS mine(bucket, epoch)
    ON o.bucket = mine.bucket AND o.epoch = mine.epoch
  WHERE o.owner = $4::uuid
  FOR SHARE OF o
)
