-- queue_scan_turn: take this relay's turn at the scan of the whole queue for leases without a
-- lease record (reap_full.sql) when no relay has begun one for $1 milliseconds (migration
-- 0034). Returns one row when the turn is this relay's: it then runs the scan. A relay that
-- took the turn and whose scan failed leaves the next turn to the next interval, as a scan
-- that failed did before. Two relays asking at once: the second one's update waits for the
-- first's, reads the time it wrote and takes nothing.
UPDATE outbox.queue_scans
SET last_scan_at = clock_timestamp()
WHERE last_scan_at < clock_timestamp() - make_interval(secs => $1::bigint / 1000.0)
RETURNING last_scan_at
