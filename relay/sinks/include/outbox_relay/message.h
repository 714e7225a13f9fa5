// A claimed outbox message as the relay hands it to a sink.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace outbox::relay {

/// The lease renewals of one dispatcher, as its sinks see them (shared by every message it
/// claims). Each renewal that extended the lease of every message then in a sink publishes
/// when it took its list (steady clock); a message handed to the sink before that moment holds
/// its claim until then plus the lease, whatever its own claim said.
class LeaseRenewals {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  explicit LeaseRenewals(std::chrono::milliseconds lease) : lease_(lease) {}
  /// Every lease held at `as_of` was renewed (by a statement that started after it).
  void Renewed(TimePoint as_of) {
    const auto ns = as_of.time_since_epoch().count();
    auto seen = as_of_ns_.load();
    while (seen < ns && !as_of_ns_.compare_exchange_weak(seen, ns)) {
    }
  }
  /// When the last such renewal took its list; nullopt before the first.
  std::optional<TimePoint> RenewedAsOf() const {
    const auto ns = as_of_ns_.load();
    if (ns == kNever) return std::nullopt;
    return TimePoint(TimePoint::duration(ns));
  }
  std::chrono::milliseconds lease() const { return lease_; }

 private:
  static constexpr TimePoint::rep kNever = std::numeric_limits<TimePoint::rep>::min();
  const std::chrono::milliseconds lease_;
  std::atomic<TimePoint::rep> as_of_ns_{kNever};
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
  /// dispatcher: the claim's start plus lease_ms). A sink that fences other relays when it
  /// starts (exactly-once Kafka) does not send a message whose claim ran out before it was
  /// ready: another relay may have taken it over and sent it.
  std::optional<std::chrono::steady_clock::time_point> claim_expires = std::nullopt;
  /// When the dispatcher handed the message to its sink (taken with the renewals' lists, so a
  /// renewal published as of a later time covered it), and those renewals; unset for a
  /// message no dispatcher claimed. Read through ClaimRunsOut.
  std::chrono::steady_clock::time_point held_since{};
  std::shared_ptr<const LeaseRenewals> renewals;
};

/// When this relay's claim of `msg` runs out: its claim's expiry, or later when the dispatcher
/// has renewed every lease in its sinks since the message was handed over. nullopt: unknown
/// (a message no dispatcher claimed). A sink sends nothing past it: another relay's reaper may
/// have taken the message back, and it may be on its way from there.
inline std::optional<std::chrono::steady_clock::time_point> ClaimRunsOut(const Message& msg) {
  if (!msg.claim_expires) return std::nullopt;
  auto runs_out = *msg.claim_expires;
  if (msg.renewals) {
    if (const auto as_of = msg.renewals->RenewedAsOf(); as_of && *as_of > msg.held_since) {
      runs_out = std::max(runs_out, *as_of + msg.renewals->lease());
    }
  }
  return runs_out;
}

}  // namespace outbox::relay
