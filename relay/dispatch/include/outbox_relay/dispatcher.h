// The dispatcher: claim -> deliver -> settle, one claim loop per destination.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "outbox_relay/clock.h"
#include "outbox_relay/config.h"
#include "outbox_relay/queue_store.h"
#include "outbox_relay/sink.h"

namespace outbox::relay {
struct RelayMetrics;
}

namespace outbox::relay {

/// The dispatcher's counters, summed over destinations: a snapshot of its RelayMetrics (the
/// one record of what it did; the metric of each field in brackets).
struct DispatcherStats {
  std::int64_t claims = 0;        ///< Claim statements run (outbox_claims_total).
  std::int64_t empty_claims = 0;  ///< Claims that leased nothing (outbox_empty_polls_total).
  std::int64_t claimed = 0;       ///< Messages leased (outbox_messages_claimed_total).
  /// Fresh messages only the periodic full sweep found (outbox_sweep_found_total).
  std::int64_t sweep_found = 0;
  std::int64_t delivered = 0;  ///< Settled as delivered (outbox_delivered_total).
  /// Set for a later retry, by a settle or by the reaper (outbox_retried_total).
  std::int64_t retried = 0;
  std::int64_t dead = 0;       ///< Moved to the dead letters (outbox_dead_lettered_total).
  std::int64_t released = 0;   ///< Handed back, no attempt counted (outbox_released_total).
  std::int64_t fenced = 0;     ///< Settles refused: the lease had moved on.
  std::int64_t reaped = 0;     ///< Expired leases returned to the queue by the reaper.
  std::int64_t db_errors = 0;  ///< Database errors survived (outbox_db_errors_total).
};

/// What a dispatcher runs on besides its config and sinks. Defaults: the PostgreSQL store of
/// config.database_url, the real clock, metrics of its own (read through stats()) and no
/// queue status.
struct DispatcherEnv {
  /// Makes the store of each of the dispatcher's threads (claim loops, settler, listener,
  /// maintenance, coordinator); empty: PostgresStores(config.database_url).
  StoreFactory stores;
  /// Must outlive the dispatcher; null: RealClock().
  const Clock* clock = nullptr;
  /// Optional, must outlive the dispatcher: receives every claim, delivery and settle event,
  /// and the queue status every `status_interval`. Null: the dispatcher records into metrics
  /// of its own and reads no queue status.
  RelayMetrics* metrics = nullptr;
  Millis status_interval{5000};
  /// outbox.settings.max_payload_bytes, the largest payload writers may queue: what a claim
  /// loop's first claim expects each payload to be, under max_in_flight_bytes. 0: unknown
  /// (1 MiB, the setting's default).
  std::int64_t max_payload_bytes = 0;
};

/// claim_connections auto: the claim loops each destination gets, from what its sink asks for
/// as if it were the relay's only destination (a webhook sink: up to one loop per 4 CPUs).
/// Every destination gets one; the loops past the first go a round at a time in name order
/// while the relay's claim connections in all stay within the larger of its destination count
/// and the most any destination asks for (20 webhook destinations on 16 CPUs would otherwise
/// open 80 connections to the application's database in a backlog).
std::map<std::string, int> ShareAutoClaimLoops(const std::map<std::string, int>& asked);

/// Owns one sink per destination and the threads that feed them. Start() once, Stop() once
/// (or let the destructor stop it). Thread-safe: Stop() and stats() may be called from any
/// thread.
class Dispatcher {
 public:
  /// `metrics` (optional, must outlive the dispatcher) receives every claim, delivery and
  /// settle event, and the queue status every `status_interval`.
  Dispatcher(RelayConfig config, std::map<std::string, SinkPtr> sinks,
             RelayMetrics* metrics = nullptr, Millis status_interval = Millis(5000));
  Dispatcher(RelayConfig config, std::map<std::string, SinkPtr> sinks, DispatcherEnv env);
  ~Dispatcher();
  Dispatcher(const Dispatcher&) = delete;
  Dispatcher& operator=(const Dispatcher&) = delete;

  void Start();
  /// How many claim loops `destination` runs (claim_connections, or what its sink asks for
  /// under `auto`); 0 before Start or for a destination it does not serve.
  int ClaimLoops(const std::string& destination) const;
  /// Graceful: stop claiming, let sinks finish in-flight work within the configured
  /// shutdown_timeout, hand back the rest, settle everything, join all threads.
  /// Returns true if everything was settled.
  bool Stop();

  /// What the dispatcher's metrics counted so far.
  DispatcherStats stats() const;
  /// True once every sink is ready and the last database call succeeded.
  bool Ready() const;
  /// Why not Ready(), naming the database or the destination and its sink's reason; empty
  /// when ready. What /readyz answers with its 503.
  std::string WhyNotReady() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace outbox::relay
