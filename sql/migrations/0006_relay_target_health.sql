-- 0006: what each relay knows of its targets' health, sent with its heartbeat: per
-- destination, the webhook circuit breaker (closed, open, half_open), consecutive failures,
-- the concurrency adaptive concurrency allows, and a Retry-After pause. `outbox-relay status`
-- shows it (docs/webhooks.md, "Endpoint outages"). Each relay keeps its own breaker.
ALTER TABLE outbox.relay_heartbeats ADD COLUMN targets jsonb NOT NULL DEFAULT '{}'::jsonb;
