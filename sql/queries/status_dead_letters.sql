-- status_dead_letters: dead letters per destination, and when the newest arrived.
SELECT destination, count(*) AS dead_letters,
       extract(epoch FROM max(dead_at))::float8 AS newest_dead_at_epoch
FROM outbox.dead_letters
GROUP BY destination
ORDER BY destination
