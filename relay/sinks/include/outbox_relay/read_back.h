// Reading back what a sink delivered, for `outbox-relay verify` (docs/operations.md, "Verify
// a destination"): each kind of sink that can (Kafka) returns the records its target holds;
// the verifier compares them with the delivered archive.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace outbox::relay {

/// One record found in the target.
struct ReadBackRecord {
  std::string stream;                     ///< Where order holds: "<topic>/<partition>" for Kafka.
  std::int64_t position;                  ///< Its place in the stream (the offset), ascending.
  std::optional<std::int64_t> outbox_id;  ///< The outbox-id header; none: not the relay's.
  std::string idempotency_key;            ///< The idempotency-key header.
  std::optional<std::string> key;         ///< The record key, as sent.
};

struct ReadBackOptions {
  /// Read records written at or after this time (the whole target when epoch).
  std::chrono::system_clock::time_point since{};
  std::chrono::milliseconds timeout{30'000};  ///< For the whole read.
  /// Read these instead of what the destination's config names (a topic template).
  std::vector<std::string> streams;
};

struct ReadBackResult {
  std::vector<ReadBackRecord> records;
  std::vector<std::string> streams_read;  ///< Every stream read, even when empty.
  /// What the destination may send to but the target does not have (a topic template's
  /// allowed topic nothing was routed to, on a broker that does not create topics): nothing
  /// was delivered there, nothing was read.
  std::vector<std::string> missing;
};

}  // namespace outbox::relay
