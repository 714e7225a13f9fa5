// Relay configuration: a plain struct with a default on every field, loaded from YAML
// with environment overrides and validated before anything starts.
#pragma once

#include <any>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace outbox::relay {

using Millis = std::chrono::milliseconds;

/// The longest destination name, in characters (outbox.messages.destination, length()).
inline constexpr std::size_t kMaxDestinationChars = 255;
/// Characters of UTF-8 text, as PostgreSQL's length() counts them (bytes that do not
/// continue a character).
std::size_t Utf8Length(std::string_view text);

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

namespace cfg {
struct Field;  // outbox_relay/config_fields.h
}

/// A destination's target: what the section of its kind (`kafka:`, `webhook:`) held, as that
/// kind reads it (KafkaTarget in outbox_relay/kafka_target.h, WebhookTarget in
/// outbox_relay/webhook_target.h). The config knows no kind: each is a TargetKind, defined
/// with its sink (relay/sinks/<kind>). A settings type T has `static constexpr
/// std::string_view kKind`.
class DestinationTarget {
 public:
  DestinationTarget() = default;
  template <class T>
  requires requires { T::kKind; }
  DestinationTarget(T settings)  // NOLINT(google-explicit-constructor): `d.target = kafka;`
      : kind_(T::kKind), settings_(std::move(settings)) {}

  /// The kind's key ("kafka", "webhook"); empty when none is set.
  const std::string& kind() const { return kind_; }

  /// The settings when they are of kind T, else null.
  template <class T>
  const T* As() const {
    return kind_ == T::kKind ? std::any_cast<T>(&settings_) : nullptr;
  }
  template <class T>
  T* As() {
    return kind_ == T::kKind ? std::any_cast<T>(&settings_) : nullptr;
  }
  /// The settings of kind T; throws std::logic_error when they are of another kind.
  template <class T>
  const T& Get() const {
    if (const T* t = As<T>()) return *t;
    throw std::logic_error("destination target is `" + kind_ + "`, not `" + std::string(T::kKind) +
                           "`");
  }
  template <class T>
  T& Get() {
    if (T* t = As<T>()) return *t;
    throw std::logic_error("destination target is `" + kind_ + "`, not `" + std::string(T::kKind) +
                           "`");
  }

 private:
  std::string kind_;
  std::any settings_;
};

struct Destination {
  std::string name;  ///< As written in outbox.messages.destination.
  DestinationTarget target;
  RetryPolicy retry;
  int batch_size = 0;  ///< Claim batch size; 0 means RelayConfig::batch_size.
  /// Bytes of payloads its sink may hold at once (claims stop there); 0 means
  /// RelayConfig::max_in_flight_bytes.
  std::int64_t max_in_flight_bytes = 0;
};

enum class LogFormat { kText, kJson };

/// What leaves the queue where, and for how long it is kept (docs/operations.md).
struct RetentionPolicy {
  bool archive_delivered = false;  ///< Copy delivered messages to outbox.delivered_archive.
  std::chrono::hours archive_retention{168};  ///< Archive rows older than this are deleted.
  /// archive_retention_hours was written: the archive is cleaned even with archive_delivered
  /// off (rows archived while it was on). Unset and off, the archive is left alone.
  bool archive_retention_set = false;
  std::chrono::hours dead_letter_retention{0};  ///< 0: keep dead letters until purged.
  Millis cleanup_interval{60'000};              ///< How often the batched cleanup runs.
};

/// How relays share the queue (docs/scaling.md).
enum class ClaimMode {
  kSkipLocked,   ///< Every relay claims from the whole queue; SKIP LOCKED keeps them apart.
  kPartitioned,  ///< Fixed logical buckets, each owned by one live relay (outbox.coordinate).
};

/// The most claim loops a destination may have (RelayConfig::claim_connections).
inline constexpr int kMaxClaimConnections = 16;

struct RelayConfig {
  std::string database_url;                         ///< Required (or OUTBOX_DATABASE_URL).
  std::map<std::string, Destination> destinations;  ///< At least one.
  int batch_size = 500;                             ///< Rows per claim.
  /// Bytes of payloads each destination's sink may hold at once: its claims stop there, so a
  /// backlog of large payloads cannot grow the relay past its memory (docs/configuration.md).
  /// 0: no limit. A destination's own max_in_flight_bytes wins.
  std::int64_t max_in_flight_bytes = 64 * 1024 * 1024;
  /// Claim loops per destination, each on a database connection of its own, claiming side by
  /// side (docs/scaling.md, "One relay, several claim connections"). 0 (`auto`, the default):
  /// each destination's sink says how many keep it fed (Sink::ClaimLoops).
  int claim_connections = 0;
  Millis lease{30'000};         ///< How long a claim is held before the reaper may take it back.
  /// How often the leases of what the relay holds are renewed: lease / 3, or sooner where a
  /// destination's longest attempt leaves less (RenewEvery). 0: lease / 3.
  Millis renew_every{0};
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
  /// claim_mode partitioned only: a bucket's ownership at its epoch leases its rows; claims
  /// read and write no per-row lease (docs/adr/0003-bucket-leases.md, docs/scaling.md).
  bool bucket_leases = false;
  RetentionPolicy retention;
  std::string log_level = "info";  ///< trace, debug, info, warn, error.
  LogFormat log_format = LogFormat::kText;
};

/// How often a relay renews the leases of what it holds, for `lease` and the longest delivery
/// attempt of its destinations: lease / 3, or sooner (at most every 500 ms) so that a whole
/// attempt and a second stay covered between renewals (a webhook worker starts no request that its
/// claim would not cover to its end). ParseConfig sets RelayConfig::renew_every with it.
Millis RenewEvery(Millis lease, Millis longest_attempt);

/// Thrown for invalid configuration. what() names the key (e.g. "destinations.orders.kafka.topic")
/// and says how to fix it.
class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Reads an environment variable; injectable for tests.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;
EnvLookup ProcessEnv();

/// The longest one delivery attempt may take, and the keys that set it
/// ("destinations.hooks.webhook.timeout_ms + connect_timeout_ms"). A lease must outlast it.
struct AttemptBound {
  Millis longest;
  std::string set_by;
};

/// A kind of target: the key of its section in a destination and how to read it. Each kind of
/// sink defines its own next to its factory (relay/sinks/<kind>); the loader is given the list
/// (sink_registry.h) and names no kind itself.
struct TargetKind {
  std::string_view key;  ///< The section: "kafka".
  /// What the section needs at least, for the error of a destination without a target:
  /// "brokers, topic".
  std::string_view essentials;
  /// Every key the section takes, so that one written a level too high is pointed to it.
  std::vector<std::string_view> keys;
  /// Reads the section into `destination.target`; throws ConfigError naming the key.
  void (*parse)(const cfg::Field& section, const EnvLookup& env, Destination& destination);
  /// The longest one attempt may take when the section bounds it (null: never bounded).
  std::optional<AttemptBound> (*attempt_bound)(const Destination& destination);
  /// Runs once everything is read and the lease is settled: settings derived from the rest of
  /// the config, checks across destinations. Throws ConfigError; `source` names the config.
  /// Null: nothing to do.
  void (*complete)(Destination& destination, const RelayConfig& config, const std::string& source);
};
using TargetKinds = std::vector<const TargetKind*>;

/// Parses YAML text. `source` names it in errors (a path, or "<string>"); `kinds` are the
/// targets a destination may have (sink_registry.h has the overload with every built-in kind).
RelayConfig ParseConfig(const std::string& yaml_text, const std::string& source,
                        const EnvLookup& env, const TargetKinds& kinds);

/// Reads and parses a file. Throws ConfigError when it cannot be read or is invalid.
RelayConfig LoadConfigFile(const std::string& path, const EnvLookup& env, const TargetKinds& kinds);

/// Only the database of the config file at `path`: OUTBOX_DATABASE_URL, else its
/// database_url (or database_url_env / database_url_file), checked as LoadConfigFile checks
/// it. The rest is not read, so an operator command (pause, dlq, status, migrate, endpoints)
/// does not need every destination's secrets in its environment. Throws ConfigError.
std::string LoadDatabaseUrl(const std::string& path, const EnvLookup& env);

/// "text" or "json", as written in the config.
const char* ToString(LogFormat format);

}  // namespace outbox::relay
