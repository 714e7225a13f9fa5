-- Fragment of claim_owned.sql and claim_owned_hold.sql, spliced in where they say
-- `-- @include owned_buckets.sql`: the CTE `owned` (bucket), the buckets of $6 that relay $5
-- owns at the epochs of $7 (an owner or epoch since changed: not there). Not a statement on its
-- own.
owned AS MATERIALIZED (
  SELECT o.bucket
  FROM outbox.bucket_owners o
  JOIN unnest($6::integer[], $7::bigint[]) AS mine(bucket, epoch)
    ON o.bucket = mine.bucket AND o.epoch = mine.epoch
  WHERE o.owner = $5::uuid
)
