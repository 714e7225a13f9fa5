// `outbox-relay verify`: reconciles what the outbox delivered (outbox.delivered_archive) with
// what a sink's target holds (read back by the sink's kind, read_back.h), and reports gaps,
// duplicates and per-key order inversions per stream (a Kafka partition).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "outbox_relay/archive.h"
#include "outbox_relay/read_back.h"

namespace outbox::relay {

struct VerifyReport {
  /// A message the archive says was delivered, found nowhere in the target.
  struct Gap {
    std::int64_t id = 0;
    std::string idempotency_key;
    std::optional<std::string> ordering_key;
  };
  /// A message found more than once (by idempotency key).
  struct Duplicate {
    std::string idempotency_key;
    std::vector<std::int64_t> outbox_ids;  ///< Of each occurrence (a replay may renumber).
    std::vector<std::pair<std::string, std::int64_t>> at;  ///< (stream, position) of each.
  };
  /// In one stream, a message of a key first seen after a later message of the same key.
  struct Inversion {
    std::string stream;
    std::string ordering_key;
    std::int64_t earlier_id = 0;  ///< The message that should have come first...
    std::int64_t earlier_position = 0;
    std::int64_t later_id = 0;  ///< ...and the one found before it.
    std::int64_t later_position = 0;
  };
  struct StreamSummary {
    std::int64_t records = 0;
    std::int64_t duplicates = 0;  ///< Occurrences after the first.
    std::int64_t inversions = 0;
  };

  std::int64_t archived = 0;      ///< Delivered messages in the window.
  std::int64_t records = 0;       ///< Records read from the target.
  std::int64_t foreign = 0;       ///< Records without an outbox-id header: not the relay's.
  /// Relay records that are no archived message: of messages outside the window, or whose id
  /// is an archived message's but whose idempotency key is not (an id handed out again).
  std::int64_t not_archived = 0;
  std::vector<Gap> gaps;
  std::vector<Duplicate> duplicates;
  std::vector<Inversion> inversions;
  std::map<std::string, StreamSummary> streams;
  std::vector<std::string> missing;  ///< ReadBackResult::missing: not in the target at all.

  bool clean() const { return gaps.empty() && duplicates.empty() && inversions.empty(); }
};

/// Compares `archived` (the delivered messages in the window) with `read` (what the target
/// holds from the start of the window on). A record of a message outside the window (written
/// before it, or not archived) counts in not_archived and is still checked for duplicates.
/// Per-key order is the order of outbox ids (the relay delivers a key's messages by id).
VerifyReport Reconcile(const std::vector<ArchivedMessage>& archived, const ReadBackResult& read);

}  // namespace outbox::relay
