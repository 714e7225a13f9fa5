-- Fragment of settle_delivered.sql and settle_owned_delivered.sql, spliced in where they say
-- `-- @include deliveries_settled.sql`: the statement's final SELECT, settle.sql's columns for
-- a batch of plain deliveries, given `delivered` (the rows deleted), `input` (id: every id
-- asked for), `matched` (all_inputs: every one was deleted) and the key wakes of
-- settle_wakes_and_leases.sql (`woken`, `woke_elsewhere`). Not a statement on its own.
SELECT (SELECT count(*) FROM delivered) AS delivered, 0::bigint AS dead,
       0::bigint AS endpoint_dead, 0::bigint AS retried, 0::bigint AS released,
       (SELECT count(*) FROM woken) AS woken, 0::bigint AS archived, 0::bigint AS spawned,
       (SELECT count(*) FROM woke_elsewhere) AS woke_others,
       -- As in settle.sql: the snapshot still holds the rows this statement deletes.
       CASE WHEN (SELECT all_inputs FROM matched) THEN 0
            ELSE (SELECT count(*) FROM input i
                   WHERE NOT EXISTS (SELECT 1 FROM outbox.messages m WHERE m.id = i.id)) END
         AS gone,
       CASE WHEN NOT (SELECT all_inputs FROM matched) THEN
         (SELECT coalesce(jsonb_agg(d.id), '[]'::jsonb) FROM delivered d)::text
       END AS written,
       NULL::text AS deferred
