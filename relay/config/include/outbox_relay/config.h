// Relay configuration: a plain struct with a default on every field, loaded from YAML
// with environment overrides and validated before anything starts.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

namespace outbox::relay {

using Millis = std::chrono::milliseconds;

/// When to try a failed message again, and how often. Two shapes:
///  - exponential (schedule empty): retry n waits a random delay in
///    [0, min(max_backoff, initial_backoff * 2^(n-1))) (full jitter);
///  - a schedule: retry n waits schedule[n-1] (the last entry repeating), scaled by a random
///    factor in [0.9, 1.1); initial_backoff is unused and max_backoff is the longest entry.
/// A value-initialized RetryPolicy is exponential; what a destination gets when its config
/// says nothing is DefaultRetryPolicy(), a schedule of about a day.
struct RetryPolicy {
  int max_attempts = 12;        ///< Attempts before dead-lettering (>= 1).
  Millis initial_backoff{500};  ///< Cap of the first retry's random delay.
  /// No delay is longer than this; a schedule's is its longest entry, which the jitter may
  /// stretch by up to 10%. Also caps a Retry-After.
  Millis max_backoff{300'000};
  std::vector<Millis> schedule;  ///< Delay before each retry, in order; empty: exponential.
};

/// The built-in retry policy: 8 attempts, retried after 5 s, 5 min, 30 min, 2 h, 5 h, 10 h and
/// 10 h (each +-10%), so an endpoint may be down for about 27 hours before its messages reach
/// the dead letters (the schedule Svix uses).
RetryPolicy DefaultRetryPolicy();

struct KafkaTarget {
  std::string brokers;  ///< bootstrap.servers, comma separated.
  /// The topic, or a template over message fields: "orders.{event_type}", with {event_type},
  /// {destination}, {key} and {header.NAME} (docs/configuration.md, "Kafka").
  std::string topic;
  /// A template may only produce to these topics...
  std::vector<std::string> allowed_topics;
  /// ...or to topics starting with this prefix.
  std::string topic_prefix;
  /// librdkafka properties passed through as they are (compression.type, linger.ms,
  /// security.protocol, sasl.*, ssl.*, ...). Secrets resolved from *_env / *_file keys.
  std::map<std::string, std::string> producer;
  /// message.timeout.ms when `producer` sets none: how long one attempt may take. The config
  /// derives it from lease_ms (2/3 of it, at most 30 s) so an attempt ends inside its lease.
  Millis attempt_timeout{30'000};
};

/// The circuit breaker of a webhook endpoint (docs/webhooks.md, "Endpoint outages").
struct BreakerSettings {
  bool enabled = true;
  int failure_threshold = 10;    ///< Consecutive failures (connect, timeout, 5xx) that open it.
  Millis cooldown{5'000};        ///< Open this long before one probe request...
  Millis max_cooldown{300'000};  ///< ...doubling after each failed probe, up to this; also the
                                 ///< longest pause a Retry-After can ask for.
};

struct WebhookTarget {
  std::string url;  ///< http:// or https://, with path.
  /// Standard Webhooks secrets, each "whsec_<base64>". Every one signs each delivery, so a
  /// receiver that knows either the new or the old secret verifies during rotation.
  std::vector<std::string> secrets;
  Millis timeout{10'000};  ///< Whole request.
  Millis connect_timeout{5'000};
  int max_in_flight = 32;              ///< Concurrent requests to this endpoint.
  std::optional<std::string> ca_file;  ///< PEM bundle to trust instead of the system one.
  bool verify_tls = true;
  std::map<std::string, std::string> headers;  ///< Extra static headers on every request.
  BreakerSettings breaker;
  /// The SSRF guard (docs/webhooks.md, "Private networks"): by default the relay refuses to
  /// connect to loopback, private, link-local, CGNAT, unique-local, multicast and reserved
  /// addresses. true: this destination may connect to any of them.
  bool allow_private_networks = false;
  /// Networks this destination may connect to although they are private ("10.20.0.0/16",
  /// "fd00:1::/64", or one address).
  std::vector<std::string> allowed_networks;
  /// 429, 503 and timeouts halve the concurrent requests, successes raise them back up to
  /// max_in_flight. Off: always max_in_flight.
  bool adaptive_concurrency = true;
  /// Requests per second this endpoint is sent at most (a burst of one second's worth); 0: no
  /// limit. With `endpoints: database`, each endpoint's own rate_limit replaces it.
  int rate_limit = 0;
  /// `endpoints: database`: a webhook service. The destination has no url or secret of its
  /// own; each message fans out to the endpoints in outbox.endpoints subscribed to it
  /// (docs/webhooks.md, "Webhook service"), and every other setting here is the default of
  /// each endpoint (max_in_flight is per endpoint).
  bool endpoints_from_database = false;
  /// The relay's database_url, where endpoints_from_database reads the endpoints (set by the
  /// config loader).
  std::string database_url;
  /// endpoints_from_database: record every attempt in outbox.delivery_attempts...
  bool delivery_log = true;
  Millis delivery_log_retention{7LL * 24 * 3600 * 1000};  ///< ...and keep it this long.
  /// endpoints_from_database: disable an endpoint failing for this long (0: never).
  Millis auto_disable_after{5LL * 24 * 3600 * 1000};
  /// endpoints_from_database: the destination that receives an `endpoint.disabled` message
  /// when an endpoint is disabled automatically; empty: none.
  std::string operational_events;
};

struct Destination {
  std::string name;  ///< As written in outbox.messages.destination.
  std::variant<KafkaTarget, WebhookTarget> target;
  RetryPolicy retry;
  int batch_size = 0;  ///< Claim batch size; 0 means RelayConfig::batch_size.
};

enum class LogFormat { kText, kJson };

/// What leaves the queue where, and for how long it is kept (docs/operations.md).
struct RetentionPolicy {
  bool archive_delivered = false;  ///< Copy delivered messages to outbox.delivered_archive.
  std::chrono::hours archive_retention{168};    ///< Archive rows older than this are deleted.
  std::chrono::hours dead_letter_retention{0};  ///< 0: keep dead letters until purged.
  Millis cleanup_interval{60'000};              ///< How often the batched cleanup runs.
};

/// How relays share the queue (docs/scaling.md).
enum class ClaimMode {
  kSkipLocked,   ///< Every relay claims from the whole queue; SKIP LOCKED keeps them apart.
  kPartitioned,  ///< Fixed logical buckets, each owned by one live relay (outbox.coordinate).
};

struct RelayConfig {
  std::string database_url;                         ///< Required (or OUTBOX_DATABASE_URL).
  std::map<std::string, Destination> destinations;  ///< At least one.
  int batch_size = 500;                             ///< Rows per claim.
  Millis lease{30'000};         ///< How long a claim is held before the reaper may take it back.
  Millis poll_interval{1'000};  ///< Fallback poll when no notification arrives.
  Millis reap_interval{5'000};
  Millis full_sweep_interval{30'000};  ///< Rescan the fresh lane from the start this often.
  Millis shutdown_timeout{10'000};     ///< SIGTERM: finish in-flight work within this.
  std::string admin_listen;  ///< "host:port" for /metrics, /healthz, /readyz; empty = off.
  /// The webhook service's management HTTP API (docs/webhooks.md, "Management API").
  struct ManagementApi {
    std::string listen;  ///< "host:port"; empty = off.
    std::string token;   ///< Bearer token (from token_env or token_file), 16+ characters.
  } management_api;
  ClaimMode claim_mode = ClaimMode::kSkipLocked;
  Millis partition_heartbeat{1'000};  ///< Heartbeat period in claim_mode partitioned.
  Millis partition_lease{5'000};      ///< No heartbeat for this long: dead, buckets move.
  RetentionPolicy retention;
  std::string log_level = "info";  ///< trace, debug, info, warn, error.
  LogFormat log_format = LogFormat::kText;
};

/// Thrown for invalid configuration. what() names the key (e.g. "destinations.orders.kafka.topic")
/// and says how to fix it.
class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Reads an environment variable; injectable for tests.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;
EnvLookup ProcessEnv();

/// Parses YAML text. `source` names it in errors (a path, or "<string>").
RelayConfig ParseConfig(const std::string& yaml_text, const std::string& source,
                        const EnvLookup& env);

/// Reads and parses a file. Throws ConfigError when it cannot be read or is invalid.
RelayConfig LoadConfigFile(const std::string& path, const EnvLookup& env);

/// "text" or "json", as written in the config.
const char* ToString(LogFormat format);

/// The HMAC key of a Standard Webhooks secret: the bytes that "whsec_<base64>" encodes.
/// Every secret in a loaded WebhookTarget decodes; throws ConfigError (without echoing the
/// secret) for one that does not.
std::string WebhookSecretKey(const std::string& secret);

}  // namespace outbox::relay
