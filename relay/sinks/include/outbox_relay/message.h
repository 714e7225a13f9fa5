// A claimed outbox message as the relay hands it to a sink.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace outbox::relay {

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
};

}  // namespace outbox::relay
