// The delivered archive (retention.archive_delivered), read back for `outbox-relay verify`.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace outbox::relay {

class Store;

struct ArchivedMessage {
  std::int64_t id = 0;
  std::string idempotency_key;
  std::optional<std::string> ordering_key;
  std::chrono::system_clock::time_point created_at{};
};

/// Every message of `destination` in outbox.delivered_archive delivered at or after `since`,
/// by id.
std::vector<ArchivedMessage> ReadArchive(Store& store, const std::string& destination,
                                         std::chrono::system_clock::time_point since);

}  // namespace outbox::relay
