// The dispatcher's fixed timings and sizes, named in one place. Everything an operator tunes
// is in RelayConfig (docs/configuration.md); these are the internals around it.
#pragma once

#include <chrono>
#include <cstddef>

namespace outbox::relay::tuning {

using Millis = std::chrono::milliseconds;

/// Claim loop: while its sink is full, how often it looks for room again (a completion
/// wakes it earlier).
inline constexpr Millis kRoomPoll{50};
/// Claim loop: keys a claim parked behind an earlier message are rechecked this often, for
/// this long, in case the earlier message's settle committed while the claim ran.
inline constexpr Millis kBlockedKeyRecheckEvery{50};
inline constexpr Millis kBlockedKeyRecheckFor{1'000};
/// Claim loop, bucket leases: a claim that brought only rows the relay already holds (its
/// cursor held back by a transaction in progress) is tried again after this, or a wake-up.
inline constexpr Millis kAllHeldPause{50};
/// Settler: a settle statement that ran at least this long may have raced a claim past those
/// rechecks (its own wake of a key's next message read a snapshot from before the claim that
/// parked that message committed, and it committed after the claim's last recheck): once it
/// has committed, the settler wakes the keys it settled (wake_keys.sql).
inline constexpr Millis kSlowSettle{kBlockedKeyRecheckFor / 2};
/// Leases a renewal passed over (rows another transaction held) are tried again this soon,
/// not lease / 3 later.
inline constexpr Millis kRenewPassedOverRetry{1'000};
/// Claim loop, max_in_flight_bytes: the largest payload a loop expects in its first claim when
/// the dispatcher was not told outbox.settings.max_payload_bytes (DispatcherEnv), that
/// setting's default. A claim asks for at most what fits the destination's bytes left at that
/// size; after each claim the estimate is the larger of that claim's largest payload and half
/// the last estimate.
inline constexpr std::int64_t kFirstPayloadEstimate = 1024 * 1024;
/// Settler: outcomes written per statement, at most.
inline constexpr std::size_t kSettleBatchMax = 2'000;
// Group settling: with fewer outcomes than kSettleBatchTarget queued, the settler waits up to
// kSettleLinger for more before writing them. One settle statement of 10 rows costs Postgres
// nearly what one of 100 does; a webhook drain settles one completion at a time otherwise.
inline constexpr std::size_t kSettleBatchTarget = 100;
inline constexpr Millis kSettleLinger{3};
/// Settler: fan-outs a settle deferred (a key lock held by another transaction, see
/// SettleCounts::deferred) are written again this much later.
inline constexpr Millis kDeferredSettleRetry{5'000};
/// Listener: one wait for a notification, at most (then it checks for stop).
inline constexpr Millis kListenWait{200};
/// Maintenance: blocked rows the orphan sweep reads per destination per reap (a page; the next
/// reap goes on from its end). Measured at ~20-35 us a row on 2 cores: a page is ~0.1-0.2 s of
/// one backend every reap_interval_ms, and a pass over a million blocked rows ~17 minutes
/// (behind the claim loops' own rechecks, which wake nearly every such row within a second).
inline constexpr int kOrphanSweepPage = 5'000;
/// The reaper's scan of the whole queue for leases without a lease record (reap_full.sql): by
/// whichever relay reaps first once no relay has begun one for this many of its
/// reap_interval_ms (5 minutes at the default 5 s; migration 0034).
inline constexpr int kQueueScanEveryReaps = 60;
/// Status gauges: the next read of the queue's status comes at least this many times what the
/// last one took after it (a pass over the queue: a tenth of one backend at most).
inline constexpr int kStatusCostFactor = 10;
/// Maintenance: how often it looks at its schedule.
inline constexpr Millis kMaintenanceTick{100};
/// Maintenance and the listener: how often each reads which destinations operators paused (a
/// pause or resume takes effect within this, plus a claim already running).
inline constexpr Millis kPauseRefresh{500};
/// Claim loop: while its destination is paused, how often it looks again (a resume read by
/// maintenance wakes it earlier).
inline constexpr Millis kPausedPoll{1'000};
/// Maintenance: rows per retention batch.
inline constexpr int kCleanupBatch = 1'000;
/// Maintenance: rows one retention cleanup deletes per turn of the loop (of each table). A
/// backlog is worked off turn after turn, with renewals and the reaper in between: a million
/// rows in one call held them up for seconds (~7 ms per 1,000 rows on a quiet disk).
inline constexpr std::int64_t kCleanupRowsPerTurn = 20'000;
/// Heartbeat of this relay in outbox.relay_heartbeats, and after how long without one a relay
/// no longer counts as serving its destinations (StatusOptions::relay_heartbeat_expiry agrees).
inline constexpr Millis kRelayHeartbeat{5'000};
inline constexpr Millis kRelayHeartbeatExpiry{30'000};
/// Reconnect backoff after database errors: the first pause, doubling up to the last.
inline constexpr Millis kReconnectFirst{100};
inline constexpr Millis kReconnectMax{5'000};
/// Stop(): every sink gets at least this to finish, and the settler at least this to write
/// what they completed, even when shutdown_timeout is spent.
inline constexpr Millis kMinSinkShutdown{100};
inline constexpr Millis kMinSettleAtStop{2'000};
/// Stop: how long a thread stuck in a statement (the coordinator's, the settler's, the
/// maintenance loop's) is waited for, once its part of the shutdown is due, before its
/// statement is cut (QueueStore::Interrupt). The claim loops get what is left of the deadline.
inline constexpr Millis kStuckStatementGrace{1'000};

}  // namespace outbox::relay::tuning
