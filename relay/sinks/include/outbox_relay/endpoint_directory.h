// The webhook service's view of outbox.endpoints (migrations 0008, 0009): what the service
// sink reads and writes to fan messages out. An interface without libpqxx: the store module
// implements it (relay/store/src/endpoint_directory.cc), and the program that runs the relay
// registers that implementation with SetEndpointDirectoryFactory before it makes sinks.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

namespace outbox::relay {

/// One endpoint as stored, with the secrets that sign now (newest first).
struct EndpointSpec {
  std::string id;
  /// Which endpoint of this id: its creation, in microseconds since the epoch. One deleted and
  /// added again with the id is another; what was owed to the first is not sent to it.
  std::int64_t incarnation = 0;
  std::string url;
  std::vector<std::string> event_types;  ///< Empty: every event type.
  std::map<std::string, std::string> headers;
  std::optional<int> max_in_flight;
  std::optional<int> rate_limit;
  /// Its own breaker settings, over the destination's (each key optional).
  std::optional<bool> breaker_enabled;
  std::optional<int> failure_threshold;
  std::optional<long long> cooldown_ms, max_cooldown_ms;
  std::optional<bool> adaptive_concurrency;
  bool enabled = true;
  std::vector<std::string> secrets;

  /// Whether a sink made for `other` would send exactly what one made for this does.
  bool SameSink(const EndpointSpec& other) const {
    return url == other.url && headers == other.headers && max_in_flight == other.max_in_flight &&
           rate_limit == other.rate_limit && breaker_enabled == other.breaker_enabled &&
           failure_threshold == other.failure_threshold && cooldown_ms == other.cooldown_ms &&
           max_cooldown_ms == other.max_cooldown_ms &&
           adaptive_concurrency == other.adaptive_concurrency && secrets == other.secrets;
  }
};

/// The endpoints of one destination at one registry version.
struct Directory {
  std::int64_t version = 0;
  std::vector<EndpointSpec> endpoints;
  /// When the next secret stops signing: reload then, even if nothing changed.
  std::optional<std::chrono::system_clock::time_point> next_expiry;
};

/// One attempt at an endpoint, for the delivery log and the endpoint's health.
struct AttemptRow {
  std::string endpoint_id;
  std::string delivery_id;
  std::chrono::system_clock::time_point at{};
  int status = 0;  ///< 0: no answer
  std::chrono::milliseconds took{0};
  std::string outcome;  ///< delivered, retry or permanent
  std::string error;
  std::string body;
};

/// An endpoint the relay disabled because it kept failing.
struct AutoDisabled {
  std::string endpoint_id;
  std::string failing_since;  ///< RFC 3339
};

/// One connection's worth of reads and writes. Not thread-safe: each thread owns its own
/// (Interrupt aside). Connects lazily; every call throws std::exception on failure, after which
/// the next call reconnects.
class EndpointDirectory {
 public:
  virtual ~EndpointDirectory() = default;

  /// From another thread, when the service stops and its owner's call has outlived the
  /// deadline (a statement waiting for a lock, a database that stopped answering): that call
  /// fails at once, and so does every later one.
  virtual void Interrupt() {}

  /// outbox.endpoint_registry.version: it moves with every change of an endpoint or secret.
  virtual std::int64_t Version() = 0;
  /// Every endpoint of the destination, enabled or not.
  virtual Directory Load() = 0;
  /// Those of `keys` (endpoint row ordering keys, "<endpoint id>:<key>") that still have a row
  /// in the queue: an earlier message of the key that the endpoint has not taken yet.
  virtual std::unordered_set<std::string> OwedKeys(const std::vector<std::string>& keys) = 0;
  /// Makes due now the rows of `endpoint_id` that a relay held as disabled (parked for
  /// `hold`) since the endpoint was last enabled (`margin` before it): those handed back
  /// before the relays saw it enabled. Rows waiting for a retry stay so (unless one falls due
  /// about `hold` after the enable), and so do rows blocked behind their key. An endpoint never
  /// enabled again by this version (enabled_at NULL): the holds of the last `margin`. Returns
  /// how many it woke.
  virtual std::int64_t WakeEndpoint(const std::string& endpoint_id, std::chrono::milliseconds hold,
                                    std::chrono::milliseconds margin) = 0;
  /// Writes `rows` to outbox.delivery_attempts (when `log`) and updates each endpoint's
  /// failing_since in outbox.endpoint_health.
  virtual void RecordAttempts(const std::vector<AttemptRow>& rows, bool log) = 0;
  /// Disables the destination's enabled endpoints failing for longer than `after`; when
  /// `events_destination` is not empty, writes an `endpoint.disabled` message to it for each,
  /// in the same transaction.
  virtual std::vector<AutoDisabled> DisableFailing(std::chrono::milliseconds after,
                                                   const std::string& events_destination) = 0;
  /// Deletes up to kCleanupBatch of the destination's delivery-log rows older than
  /// `retention`, oldest first; returns how many (kCleanupBatch: there may be more).
  virtual std::int64_t CleanupAttempts(std::chrono::milliseconds retention) = 0;
  static constexpr std::int64_t kCleanupBatch = 10'000;
};

/// Makes the directory of one destination on one database.
using EndpointDirectoryFactory = std::function<std::unique_ptr<EndpointDirectory>(
    const std::string& database_url, const std::string& destination)>;
/// Registers the implementation (the store's, PostgresEndpointDirectory); call once at start.
void SetEndpointDirectoryFactory(EndpointDirectoryFactory factory);
/// Throws std::logic_error when none was registered.
std::unique_ptr<EndpointDirectory> MakeEndpointDirectory(const std::string& database_url,
                                                         const std::string& destination);

}  // namespace outbox::relay
