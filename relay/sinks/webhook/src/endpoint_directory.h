// The webhook service's view of outbox.endpoints (migration 0008): what the relay reads to
// fan messages out. Not public: only the service sink uses it.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

namespace outbox::relay::webhook_detail {

/// One endpoint as stored, with the secrets that sign now (newest first).
struct EndpointSpec {
  std::string id;
  std::string url;
  std::vector<std::string> event_types;  ///< Empty: every event type.
  std::map<std::string, std::string> headers;
  std::optional<int> max_in_flight;
  bool enabled = true;
  std::vector<std::string> secrets;

  /// Whether a sink made for `other` would send exactly what one made for this does.
  bool SameSink(const EndpointSpec& other) const {
    return url == other.url && headers == other.headers && max_in_flight == other.max_in_flight &&
           secrets == other.secrets;
  }
};

/// The endpoints of one destination at one registry version.
struct Directory {
  std::int64_t version = 0;
  std::vector<EndpointSpec> endpoints;
  /// When the next secret stops signing: reload then, even if nothing changed.
  std::optional<std::chrono::system_clock::time_point> next_expiry;
};

/// One connection's worth of reads. Not thread-safe: each thread owns its own. Connects
/// lazily; every call throws std::exception on failure, after which the next call reconnects.
class EndpointDirectory {
 public:
  EndpointDirectory(std::string database_url, std::string destination);
  ~EndpointDirectory();
  EndpointDirectory(const EndpointDirectory&) = delete;
  EndpointDirectory& operator=(const EndpointDirectory&) = delete;

  /// outbox.endpoint_registry.version: it moves with every change of an endpoint or secret.
  std::int64_t Version();
  /// Every endpoint of the destination, enabled or not.
  Directory Load();
  /// Those of `keys` (endpoint row ordering keys, "<endpoint id>:<key>") that still have a row
  /// in the queue: an earlier message of the key that the endpoint has not taken yet.
  std::unordered_set<std::string> OwedKeys(const std::vector<std::string>& keys);
  /// Makes the rows waiting for `endpoint_id` (held while it was disabled, or for a retry)
  /// due now; rows blocked behind an earlier row of their key stay so. Returns how many.
  std::int64_t WakeEndpoint(const std::string& endpoint_id);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace outbox::relay::webhook_detail
