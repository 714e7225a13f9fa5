// A claimed outbox message as the relay hands it to a sink.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace outbox::relay {

/// Until when a relay's claim of one message holds, as its dispatcher keeps it: the claim's
/// start plus the lease, moved on by each renewal that extended that message's lease (and by
/// a claim of it again while this copy is still in the sink). Shared by the dispatcher and the
/// message's copies in the sinks; only moves forward.
class ClaimCover {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  /// kRowLease: the message's own lease, renewed so that it covers a whole attempt (a sink
  /// starts no attempt it would not cover to its end). kBucket (bucket leases): its bucket's
  /// ownership, renewed by the relay's heartbeats a few seconds at a time, and handed over only
  /// once what the relay read from the bucket is settled: an attempt needs only that it holds
  /// when it starts.
  enum class Kind { kRowLease, kBucket };
  explicit ClaimCover(TimePoint until, Kind kind = Kind::kRowLease)
      : until_ns_(until.time_since_epoch().count()), kind_(kind) {}
  Kind kind() const { return kind_; }
  void ExtendTo(TimePoint until) {
    const auto ns = until.time_since_epoch().count();
    auto seen = until_ns_.load(std::memory_order_relaxed);
    while (seen < ns && !until_ns_.compare_exchange_weak(seen, ns)) {
    }
  }
  TimePoint Until() const { return TimePoint(TimePoint::duration(until_ns_.load())); }

 private:
  std::atomic<TimePoint::rep> until_ns_;
  const Kind kind_;
};

/// Row id of a message in outbox.messages (and of its dead letter).
enum class MessageId : std::int64_t {};

inline std::int64_t Raw(MessageId id) { return static_cast<std::int64_t>(id); }

/// One message, owned by value. Sinks receive it read-only.
struct Message {
  MessageId id{};
  std::string destination;
  std::optional<std::string> ordering_key;  ///< Kafka key; also the unit of ordering.
  std::string idempotency_key;              ///< uuid text, stable across redeliveries.
  std::string event_type;                   ///< May be empty.
  std::vector<std::pair<std::string, std::string>> headers;  ///< The message's own headers.
  std::string payload;  ///< Bytes exactly as written (JSON text for JSON payloads).
  bool payload_is_json = true;
  int attempts = 0;  ///< Failed attempts before this one.
  std::chrono::system_clock::time_point created_at{};
  /// Known not to be in the target as of this time (Outcome::absent_as_of, written by an
  /// earlier attempt's settle); unset when not known.
  std::optional<std::chrono::system_clock::time_point> absent_as_of = std::nullopt;
  /// The row's bucket (outbox.partitioning): the unit of ownership in claim_mode partitioned,
  /// and of fencing for Kafka's exactly-once delivery.
  int bucket = 0;
  /// Set on a row owed to one endpoint of a webhook service (migration 0008): deliver it to
  /// that endpoint only. Its ordering_key is then "<endpoint_id>:<the message's key>".
  std::optional<std::string> endpoint_id;
  /// When this relay's claim of the message runs out unless its lease is renewed (set by the
  /// dispatcher: the claim's start plus lease_ms). The webhook and exactly-once Kafka sinks
  /// send nothing whose claim ran out (ClaimRunsOut, renewals included): another relay may
  /// have taken it over and sent it.
  std::optional<std::chrono::steady_clock::time_point> claim_expires = std::nullopt;
  /// Until when the claim holds, renewals included (set by the dispatcher with claim_expires;
  /// read through ClaimRunsOut).
  std::shared_ptr<const ClaimCover> claim_cover;
};

/// When this relay's claim of `msg` runs out: its claim's expiry, or later when the dispatcher
/// renewed its lease since. nullopt: unknown (a message no dispatcher claimed). A sink sends
/// nothing past it: another relay's reaper may have taken the message back, and it may be on
/// its way from there.
inline std::optional<std::chrono::steady_clock::time_point> ClaimRunsOut(const Message& msg) {
  if (!msg.claim_expires) return std::nullopt;
  if (!msg.claim_cover) return msg.claim_expires;
  return std::max(*msg.claim_expires, msg.claim_cover->Until());
}

}  // namespace outbox::relay
