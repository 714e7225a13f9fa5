// What a sink knows of its target's health (Sink::Health): carried in the relay's heartbeat
// and shown by `outbox-relay status` and the metrics.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace outbox::relay {

/// A target's health as its sink sees it (Sink::Health).
struct TargetHealth {
  /// "webhook": the breaker, concurrency and service fields apply. "kafka": `delivery` and
  /// the transaction counts do. (Heartbeats of relays older than this field are webhooks'.)
  std::string kind = "webhook";
  /// Kafka: the destination's `kafka.delivery` as this relay runs it, "at_least_once" or
  /// "exactly_once". Every relay of a destination must agree for exactly once to hold.
  std::string delivery;
  /// Kafka, exactly once, since the relay started: transactions committed and failed, and
  /// messages claimed again that recovery found already in Kafka.
  std::int64_t transactions_committed = 0;
  std::int64_t transactions_failed = 0;
  std::int64_t recovered = 0;
  /// Kafka, exactly once: the relay's transactional_id_prefix. Fencing holds only between
  /// equal transactional ids: every relay of the destination must use the same one.
  std::string transactional_id_prefix;
  std::string breaker = "closed";  ///< "closed", "open" or "half_open" (a probe is due or out).
  int consecutive_failures = 0;
  int concurrency_limit = 0;  ///< Concurrent requests allowed now (adaptive concurrency)...
  int max_concurrency = 0;    ///< ...of at most this many.
  std::chrono::milliseconds probe_in{0};    ///< Open: until one probe request may go.
  std::chrono::milliseconds paused_for{0};  ///< Left of a pause the target asked for (Retry-After).
  std::int64_t times_opened = 0;            ///< Since the relay started.
  std::int64_t times_paused = 0;
  /// A webhook service (`endpoints: database`): its endpoints, those disabled, those whose
  /// breaker is open, and how many this relay disabled automatically since it started. The
  /// fields above then sum (or, for the breaker, summarise: open only when every enabled
  /// endpoint's is) over its endpoints.
  bool service = false;
  int endpoints = 0;
  int endpoints_disabled = 0;
  int endpoints_open = 0;
  std::int64_t endpoints_auto_disabled = 0;
};

}  // namespace outbox::relay
