// The config schema: YAML -> RelayConfig, environment overrides, validation.
// docs/configuration.md and deploy/config/relay.example.yaml describe every key read here.
#include "outbox_relay/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdint>
#include <limits>
#include <set>
#include <string_view>
#include <utility>

#include "outbox_relay/config_fields.h"
#include "outbox_relay/config_sources.h"
#include "outbox_relay/connection_string.h"

namespace outbox::relay {

using cfg::ChildPath;
using cfg::Fail;
using cfg::Field;
using cfg::HasSpaceOrControl;
using cfg::kMaxDurationMs;
using cfg::kMsHint;
using cfg::Mapping;
using cfg::Quote;

std::size_t Utf8Length(std::string_view text) {
  return static_cast<std::size_t>(std::count_if(text.begin(), text.end(), [](char c) {
    return (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  }));
}

namespace {

constexpr std::int64_t kMaxBatchSize = 10'000;
constexpr std::int64_t kMaxInFlightBytes = std::int64_t{1} << 40;  // 1 TiB: "no limit" is 0

const char* const kExample = "see deploy/config/relay.example.yaml";

// ---------------------------------------------------------------------------------------------
// Values whose origin must be remembered until validation (they may come from the environment).

struct IntSetting {
  const char* key;
  const char* env;  // override variable, or nullptr
  std::int64_t min;
  std::int64_t max;
  std::string_view unit_hint;
  const char* meaning;
  std::int64_t value;
  std::string origin;  // "" while the built-in default is in force
  /// A word the key also takes for 0 (claim_connections: "auto"), or nullptr.
  const char* word = nullptr;
  bool by_word = false;  // value is the word's 0, not a number written
};

struct StringSetting {
  std::string value;
  std::string origin;
  bool set = false;
};

void CheckIntRange(const IntSetting& s) {
  if (s.by_word) return;
  if (s.value < s.min || s.value > s.max) {
    Fail(s.origin, s.key,
         std::to_string(s.value) + " is out of range; set it between " + std::to_string(s.min) +
             " and " + std::to_string(s.max) + " (" + s.meaning + ")");
  }
}

std::string EnvOrigin(const char* name) { return std::string("environment variable ") + name; }

// An OUTBOX_* override; an empty variable counts as unset. Trailing newlines are no part of
// it, as of a value read from a file (a Secret made with `echo ... | base64` ends in one).
std::optional<std::string> Override(const EnvLookup& env, const char* name) {
  auto value = cfg::Lookup(env, name);
  if (value) value = cfg::TrimTrailingNewlines(std::move(*value));
  if (!value || value->empty()) return std::nullopt;
  return value;
}

// ---------------------------------------------------------------------------------------------
// Retry policies: destination -> defaults.retry -> RetryPolicy{}.

struct RetryValue {
  std::int64_t value = 0;
  std::string from;    // "destinations.orders.retry.max_backoff_ms" or "built-in default"
  std::string origin;  // file position, "" for the built-in default
  bool destination_level = false;
};

struct RetryLayer {
  std::optional<RetryValue> max_attempts;
  std::optional<RetryValue> initial_backoff_ms;
  std::optional<RetryValue> max_backoff_ms;
  std::optional<std::vector<Millis>> schedule;  // schedule_ms
  // The shape this layer chose, when it set any shape key.
  bool sets_exponential() const { return initial_backoff_ms || max_backoff_ms; }
};

RetryLayer ParseRetry(const Field& field, bool destination_level) {
  Mapping m(field, {"max_attempts", "initial_backoff_ms", "max_backoff_ms", "schedule_ms"});
  RetryLayer layer;
  auto read = [&](std::string_view key, std::int64_t min, std::int64_t max, std::string_view hint,
                  const char* meaning) -> std::optional<RetryValue> {
    auto f = m.Get(key);
    if (!f) return std::nullopt;
    return RetryValue{cfg::ReadIntegerIn(*f, min, max, hint, meaning), f->path, f->Origin(),
                      destination_level};
  };
  layer.max_attempts = read("max_attempts", 1, std::numeric_limits<int>::max(), ", e.g. 12",
                            "attempts before a message is dead-lettered; 1 means no retry");
  layer.initial_backoff_ms = read("initial_backoff_ms", 0, kMaxDurationMs, kMsHint,
                                  "upper bound of the first retry's random delay, in milliseconds");
  layer.max_backoff_ms = read("max_backoff_ms", 0, kMaxDurationMs, kMsHint,
                              "no retry waits longer than this, in milliseconds");
  if (auto f = m.Get("schedule_ms")) {
    if (!f->node.IsSequence()) {
      Fail(*f,
           "must be a list of delays in milliseconds, one per retry, e.g. "
           "[5000, 300000, 1800000]; found " +
               cfg::DescribeKind(f->node));
    }
    std::vector<Millis> delays;
    for (const auto& element : cfg::ReadList(*f)) {
      delays.emplace_back(cfg::ReadIntegerIn(element, 0, kMaxDurationMs, kMsHint,
                                             "the delay before one retry, in milliseconds"));
    }
    if (delays.empty()) {
      Fail(*f,
           "is empty; list at least one delay (e.g. [5000, 300000]), or set max_attempts: 1 "
           "for no retry");
    }
    if (layer.sets_exponential()) {
      Fail(*f,
           "cannot be combined with initial_backoff_ms or max_backoff_ms in the same "
           "`retry:`; keep schedule_ms (each retry's delay) or the two backoff keys "
           "(exponential backoff), not both");
    }
    layer.schedule = std::move(delays);
  }
  return layer;
}

// The shape comes from the most specific layer that sets a shape key (schedule_ms, or
// initial/max_backoff_ms); without one it is DefaultRetryPolicy()'s schedule. max_attempts
// is resolved on its own: destination, defaults, then the shape's own default (a schedule:
// one attempt more than its delays).
RetryPolicy ResolveRetry(const RetryLayer& destination, const RetryLayer& defaults,
                         const std::string& destination_path, const std::string& source) {
  auto pick = [](const std::optional<RetryValue>& a, const std::optional<RetryValue>& b,
                 std::int64_t fallback) {
    if (a) return *a;
    if (b) return *b;
    return RetryValue{fallback, "built-in default", "", false};
  };
  const RetryLayer* shape = nullptr;
  if (destination.schedule || destination.sets_exponential()) {
    shape = &destination;
  } else if (defaults.schedule || defaults.sets_exponential()) {
    shape = &defaults;
  }
  RetryPolicy policy;
  if (shape == nullptr || shape->schedule) {
    policy.schedule = shape ? *shape->schedule : DefaultRetryPolicy().schedule;
    policy.initial_backoff = policy.schedule.front();
    policy.max_backoff = *std::max_element(policy.schedule.begin(), policy.schedule.end());
    policy.max_attempts =
        static_cast<int>(pick(destination.max_attempts, defaults.max_attempts,
                              static_cast<std::int64_t>(policy.schedule.size()) + 1)
                             .value);
    return policy;
  }
  // Exponential: a layer that sets one backoff key takes the other from the layer below, or
  // from the exponential defaults of RetryPolicy{}.
  const RetryPolicy builtin;
  const RetryValue attempts =
      pick(destination.max_attempts, defaults.max_attempts, builtin.max_attempts);
  const RetryValue initial = pick(destination.initial_backoff_ms, defaults.initial_backoff_ms,
                                  builtin.initial_backoff.count());
  const RetryValue max =
      pick(destination.max_backoff_ms, defaults.max_backoff_ms, builtin.max_backoff.count());
  if (initial.value > max.value) {
    const bool at_destination = initial.destination_level || max.destination_level;
    const std::string path =
        at_destination ? ChildPath(destination_path, "retry") : "defaults.retry";
    std::string origin = !initial.origin.empty() && (initial.destination_level || !at_destination)
                             ? initial.origin
                             : max.origin;
    if (origin.empty()) origin = source;
    Fail(origin, path,
         "initial_backoff_ms " + std::to_string(initial.value) + " (" + initial.from +
             ") is greater than max_backoff_ms " + std::to_string(max.value) + " (" + max.from +
             "); lower initial_backoff_ms or raise max_backoff_ms so that initial_backoff_ms <= "
             "max_backoff_ms");
  }
  policy.max_attempts = static_cast<int>(attempts.value);
  policy.initial_backoff = Millis{initial.value};
  policy.max_backoff = Millis{max.value};
  return policy;
}

// ---------------------------------------------------------------------------------------------
// Destinations

// Every delivery attempt must end inside its lease, with room to spare: otherwise the lease
// expires while the attempt still runs, a reaper hands the message out again (a duplicate, and
// an attempt counted twice) and the first settle is fenced. (Waiting in a sink's queue before
// the attempt starts is covered by the dispatcher renewing the leases of what is in flight.)
constexpr Millis kLeaseSpare{1'000};          // an attempt ends at least this long before its lease
constexpr Millis kDerivedLeaseSpare{10'000};  // what a derived lease_ms adds to the longest attempt

const TargetKind& KindOf(const Destination& d, const TargetKinds& kinds) {
  for (const auto* kind : kinds) {
    if (kind->key == d.target.kind()) return *kind;
  }
  throw std::logic_error("destination " + d.name + " has a target of an unknown kind");
}

// "a `kafka:` or `webhook:` section"; with the essentials: "a `kafka:` section (brokers,
// topic) or a `webhook:` section (url, secret)".
std::string SectionChoice(const TargetKinds& kinds, bool with_essentials) {
  std::string out = "a ";
  for (std::size_t i = 0; i < kinds.size(); ++i) {
    if (i > 0) out += i + 1 == kinds.size() ? (with_essentials ? " or a " : " or ") : ", ";
    out += "`" + std::string(kinds[i]->key) + ":`";
    if (with_essentials) out += " section (" + std::string(kinds[i]->essentials) + ")";
  }
  if (!with_essentials) out += " section";
  return out;
}

}  // namespace

// Renewals keep a whole attempt inside the lease of what is in flight (a webhook worker writes
// no request that would outlast its claim), with a second for the renewal itself and the
// maintenance thread's turn: every lease / 3 where that leaves enough, else sooner, at most
// every 500 ms (the shortest lease the config allows, the longest attempt and a second, is
// then covered with half a second to spare).
Millis RenewEvery(Millis lease, Millis longest_attempt) {
  constexpr Millis kRenewalAllowance{1'000};
  constexpr Millis kSoonest{500};
  const Millis room = lease - longest_attempt - kRenewalAllowance;
  return std::min(lease / 3, std::max(kSoonest, room));
}

namespace {

void ApplyLeaseBounds(RelayConfig& config, const std::string& lease_origin,
                      const TargetKinds& kinds, const std::string& source) {
  const bool lease_given = !lease_origin.empty();
  constexpr Millis kLongestLease{kMaxDurationMs};
  Millis longest_attempt{0};
  for (const auto& [name, d] : config.destinations) {
    const TargetKind& kind = KindOf(d, kinds);
    const auto bound = kind.attempt_bound ? kind.attempt_bound(d) : std::nullopt;
    if (!bound) continue;
    longest_attempt = std::max(longest_attempt, bound->longest);
    const std::string attempt = bound->set_by + " = " + std::to_string(bound->longest.count()) +
                                " ms, and a lease must outlast its attempt by at least " +
                                std::to_string(kLeaseSpare.count()) + " ms";
    if (bound->longest + kLeaseSpare > kLongestLease) {
      // No lease can hold it (lease_ms is at most kMaxDurationMs): the fix is the attempt's.
      const std::string longest_fit = std::to_string((kLongestLease - kLeaseSpare).count());
      if (!lease_given) {
        Fail(source, "",
             "one delivery attempt may take longer than any lease: " + attempt +
                 ", while lease_ms is at most " + std::to_string(kMaxDurationMs) + "; lower " +
                 bound->set_by + " to at most " + longest_fit + " ms");
      }
      Fail(lease_origin, "lease_ms",
           std::to_string(config.lease.count()) +
               " ms is shorter than one delivery attempt may take: " + attempt +
               ", while lease_ms is at most " + std::to_string(kMaxDurationMs) + "; lower " +
               bound->set_by + " to at most " +
               std::to_string((config.lease - kLeaseSpare).count()) + " ms" +
               (config.lease < kLongestLease ? " (or " + longest_fit + " ms with lease_ms: " +
                                                   std::to_string(kMaxDurationMs) + ")"
                                             : std::string()));
    }
    if (!lease_given) {
      config.lease =
          std::max(config.lease, std::min(kLongestLease, bound->longest + kDerivedLeaseSpare));
    } else if (bound->longest + kLeaseSpare > config.lease) {
      Fail(lease_origin, "lease_ms",
           std::to_string(config.lease.count()) +
               " ms is shorter than one delivery attempt may take: " + attempt +
               "; raise lease_ms to at least " +
               std::to_string((bound->longest + kLeaseSpare).count()) + " or lower " +
               bound->set_by);
    }
  }
  config.renew_every = RenewEvery(config.lease, longest_attempt);
}

struct ParsedDestination {
  Destination destination;
  RetryLayer retry;
  std::string path;
};

ParsedDestination ParseDestination(const std::string& name, const Field& field,
                                   const EnvLookup& env, const TargetKinds& kinds) {
  if (name.empty()) {
    Fail(field,
         "a destination name must not be empty; use the name applications pass to outbox.enqueue, "
         "e.g. `orders`");
  }
  if (Utf8Length(name) > kMaxDestinationChars) {
    Fail(field.Origin(), "destinations",
         "destination name is " + std::to_string(Utf8Length(name)) +
             " characters long; the limit is 255 (the same as outbox.messages.destination), use a "
             "shorter name");
  }
  if (field.node.IsNull() || !field.node.IsDefined()) {
    Fail(field, "is empty; give the destination " + SectionChoice(kinds, false));
  }
  auto hint = [&kinds](const std::string& key, const Field&) -> std::string {
    for (const auto* kind : kinds) {
      if (std::find(kind->keys.begin(), kind->keys.end(), key) != kind->keys.end()) {
        return "`" + key + "` belongs under `" + std::string(kind->key) + ":`.";
      }
    }
    if (key == "max_attempts" || key == "initial_backoff_ms" || key == "max_backoff_ms") {
      return "`" + key + "` belongs under `retry:`.";
    }
    return "";
  };
  std::vector<std::string_view> known;
  for (const auto* kind : kinds) known.push_back(kind->key);
  known.insert(known.end(), {"retry", "batch_size", "max_in_flight_bytes"});
  Mapping m(field, known, hint);
  ParsedDestination parsed;
  parsed.path = field.path;
  parsed.destination.name = name;
  const TargetKind* chosen = nullptr;
  std::optional<Field> section;
  for (const auto* kind : kinds) {
    auto f = m.Get(kind->key);
    if (!f) continue;
    if (chosen) {
      Fail(*f, "a destination has exactly one target, and this one also has `" +
                   std::string(chosen->key) +
                   "`; keep one and move the other to a destination of its own");
    }
    chosen = kind;
    section = f;
  }
  if (!chosen) Fail(field, "has no target; add " + SectionChoice(kinds, true));
  chosen->parse(*section, env, parsed.destination);
  if (auto retry = m.Get("retry")) parsed.retry = ParseRetry(*retry, true);
  if (auto f = m.Get("batch_size")) {
    parsed.destination.batch_size = static_cast<int>(cfg::ReadIntegerIn(
        *f, 0, kMaxBatchSize, ", e.g. 100",
        "rows claimed per query for this destination; 0 uses the global batch_size"));
  }
  if (auto f = m.Get("max_in_flight_bytes")) {
    parsed.destination.max_in_flight_bytes = cfg::ReadIntegerIn(
        *f, 0, kMaxInFlightBytes, ", e.g. 16777216 (16 MiB)",
        "bytes of payloads this destination's sink may hold at once; 0 uses the global "
        "max_in_flight_bytes");
  }
  return parsed;
}

// ---------------------------------------------------------------------------------------------
// Globals

std::string TopLevelHint(const std::string& key, const Field& value, const TargetKinds& kinds) {
  for (const auto* kind : kinds) {
    if (key == kind->key) {
      return "Targets belong to a destination: `destinations: {<name>: {" + key + ": ...}}`.";
    }
  }
  if (key == "retry" || key == "max_attempts" || key == "initial_backoff_ms" ||
      key == "max_backoff_ms") {
    return "Retry settings go under `defaults.retry` (for every destination) or "
           "`destinations.<name>.retry`.";
  }
  if (key == "level" || key == "format") return "It belongs under `log:`.";
  for (const auto* kind : kinds) {
    if (value.node.IsMap() && value.node[std::string(kind->key)]) {
      return "If `" + key + "` is a destination, indent it under `destinations:`.";
    }
  }
  return "";
}

std::optional<std::string> AdminListenProblem(const std::string& address) {
  if (HasSpaceOrControl(address)) return "contains whitespace";
  std::string host;
  std::string port;
  if (address.starts_with('[')) {
    const auto close = address.find(']');
    if (close == std::string::npos) return "has an unterminated IPv6 address (missing `]`)";
    host = address.substr(1, close - 1);
    if (close + 1 >= address.size() || address[close + 1] != ':') return "has no port";
    port = address.substr(close + 2);
  } else {
    const auto colon = address.rfind(':');
    if (colon == std::string::npos) return "has no port";
    host = address.substr(0, colon);
    port = address.substr(colon + 1);
    if (host.find(':') != std::string::npos)
      return "has an IPv6 address without brackets (write `[::1]:9090`)";
  }
  if (host.empty())
    return "has no host (use 0.0.0.0 for every interface, 127.0.0.1 for local only)";
  auto number = cfg::ParseInteger(port);
  if (port.empty() || !number || port[0] == '+' || port[0] == '-' || *number < 1 ||
      *number > 65535) {
    return "has an invalid port (it must be a number from 1 to 65535)";
  }
  return std::nullopt;
}

bool LooksLikePostgresConnectionString(const std::string& url) {
  return url.starts_with("postgresql://") || url.starts_with("postgres://") ||
         url.find('=') != std::string::npos;
}

constexpr std::array<std::string_view, 5> kLogLevels = {"trace", "debug", "info", "warn", "error"};

}  // namespace

const char* ToString(LogFormat format) {
  switch (format) {
    case LogFormat::kText:
      return "text";
    case LogFormat::kJson:
      return "json";
  }
  return "text";
}

/// The config text's one YAML document, a mapping. Throws ConfigError.
const std::vector<std::string_view> kTopLevelKeys = {"database_url",
                                                     "database_url_env",
                                                     "database_url_file",
                                                     "batch_size",
                                                     "max_in_flight_bytes",
                                                     "claim_connections",
                                                     "lease_ms",
                                                     "poll_interval_ms",
                                                     "reap_interval_ms",
                                                     "full_sweep_interval_ms",
                                                     "shutdown_timeout_ms",
                                                     "admin_listen",
                                                     "log",
                                                     "defaults",
                                                     "destinations",
                                                     "claim_mode",
                                                     "partition_heartbeat_ms",
                                                     "partition_lease_ms",
                                                     "bucket_leases",
                                                     "retention",
                                                     "management_api"};

static Field LoadRoot(const std::string& yaml_text, const std::string& source) {
  std::vector<YAML::Node> documents;
  try {
    documents = YAML::LoadAll(yaml_text);
  } catch (const YAML::Exception& e) {
    Fail(cfg::FormatOrigin(source, e.mark), "",
         "invalid YAML: " + e.msg +
             "; fix the syntax at this line and column (indentation, quotes, brackets, `key: "
             "value`)");
  }
  if (documents.size() > 1) {
    Fail(source, "",
         "contains " + std::to_string(documents.size()) +
             " YAML documents (separated by `---`); the relay reads exactly one, so merge or "
             "remove the others");
  }
  const Field root{"", source, YAML::Mark::null_mark(),
                   documents.empty() ? YAML::Node() : documents[0]};
  if (root.node.IsNull() || !root.node.IsDefined()) {
    Fail(source, "",
         std::string("the config is empty; it needs at least `database_url` and one entry under "
                     "`destinations` (") +
             kExample + ")");
  }
  if (!root.node.IsMap()) {
    Fail(source, "",
         "the config must be a mapping of `key: value` lines (database_url, destinations, ...), "
         "not " +
             cfg::DescribeKind(root.node) + " (" + kExample + ")");
  }

  return root;
}

/// The top-level keys naming the database (at most one of them may be set).
static std::vector<Field> DatabaseUrlKeys(const Mapping& top) {
  std::vector<Field> database_url_keys;
  for (const char* key : {"database_url", "database_url_env", "database_url_file"}) {
    if (auto f = top.Get(key)) database_url_keys.push_back(*f);
  }
  if (database_url_keys.size() > 1) {
    Fail(database_url_keys[1],
         "set only one of `database_url`, `database_url_env` and `database_url_file` (found `" +
             database_url_keys[0].path + "` too); remove the others");
  }
  return database_url_keys;
}

/// The database: OUTBOX_DATABASE_URL, else the key of `keys` (its value, variable or file),
/// checked. Throws ConfigError.
static std::string ResolveDatabaseUrl(const std::vector<Field>& database_url_keys,
                                      const EnvLookup& env, const std::string& source) {
  StringSetting database_url;
  if (auto value = Override(env, "OUTBOX_DATABASE_URL")) {
    database_url = {*value, EnvOrigin("OUTBOX_DATABASE_URL"), true};
  } else if (!database_url_keys.empty()) {
    const Field& f = database_url_keys[0];
    if (f.path == "database_url") {
      database_url = {cfg::ReadNonEmptyString(f), f.Origin(), true};
    } else if (f.path == "database_url_env") {
      database_url = {cfg::ReadEnvReference(f, env), f.Origin(), true};
    } else {
      database_url = {cfg::ReadFileReference(f), f.Origin(), true};
    }
  }
  if (!database_url.set) {
    Fail(source, "database_url",
         "is not set; set database_url in the config or OUTBOX_DATABASE_URL in the environment (or "
         "use "
         "database_url_env / database_url_file to read it from another variable or a file)");
  }
  if (!LooksLikePostgresConnectionString(database_url.value)) {
    Fail(database_url.origin, "database_url",
         "does not look like a PostgreSQL connection string; write a URI such as "
         "postgresql://outbox_relay@db.internal:5432/app or key=value pairs such as "
         "`host=db.internal dbname=app`");
  }
  if (const auto problem = ConnectionStringProblem(database_url.value); !problem.empty()) {
    Fail(database_url.origin, "database_url", "is not a valid connection string: " + problem);
  }
  return database_url.value;
}

RelayConfig ParseConfig(const std::string& yaml_text, const std::string& source,
                        const EnvLookup& env, const TargetKinds& kinds) {
  const Field root = LoadRoot(yaml_text, source);
  Mapping top(root, kTopLevelKeys, [&kinds](const std::string& key, const Field& value) {
    return TopLevelHint(key, value, kinds);
  });

  const RelayConfig builtin;
  std::array<IntSetting, 10> ints = {{
      {"batch_size", "OUTBOX_BATCH_SIZE", 1, kMaxBatchSize, ", e.g. 500", "rows claimed per query",
       builtin.batch_size, ""},
      {"lease_ms", "OUTBOX_LEASE_MS", 1000, kMaxDurationMs, kMsHint,
       "milliseconds a claimed message is held before the reaper may take it back; at least 1000",
       builtin.lease.count(), ""},
      {"poll_interval_ms", "OUTBOX_POLL_INTERVAL_MS", 1, kMaxDurationMs, kMsHint,
       "milliseconds between polls when no notification arrives", builtin.poll_interval.count(),
       ""},
      {"reap_interval_ms", nullptr, 1, kMaxDurationMs, kMsHint,
       "milliseconds between scans for expired leases", builtin.reap_interval.count(), ""},
      {"full_sweep_interval_ms", nullptr, 1, kMaxDurationMs, kMsHint,
       "milliseconds between rescans of the fresh lane from its start",
       builtin.full_sweep_interval.count(), ""},
      {"shutdown_timeout_ms", nullptr, 0, kMaxDurationMs, kMsHint,
       "milliseconds to finish in-flight deliveries after SIGTERM",
       builtin.shutdown_timeout.count(), ""},
      {"partition_heartbeat_ms", nullptr, 50, kMaxDurationMs, kMsHint,
       "milliseconds between heartbeats in claim_mode partitioned",
       builtin.partition_heartbeat.count(), ""},
      {"partition_lease_ms", nullptr, 150, kMaxDurationMs, kMsHint,
       "milliseconds without a heartbeat after which a relay is dead and loses its buckets",
       builtin.partition_lease.count(), ""},
      {"claim_connections", "OUTBOX_CLAIM_CONNECTIONS", 1, kMaxClaimConnections,
       ", e.g. 2, or `auto`",
       "claim loops per destination, each on a database connection of its own; more than 1 pays "
       "off only with a backlog bigger than one connection drains; `auto` lets each "
       "destination's sink choose (a webhook: one per 8 of its max_in_flight, at most 4 and one "
       "per 4 CPUs of the relay)",
       builtin.claim_connections, "", "auto", /*by_word=*/builtin.claim_connections == 0},
      {"max_in_flight_bytes", "OUTBOX_MAX_IN_FLIGHT_BYTES", 0, kMaxInFlightBytes,
       ", e.g. 67108864 (64 MiB)",
       "bytes of payloads each destination's sink may hold at once, its claims stopping there; "
       "0 for no limit",
       builtin.max_in_flight_bytes, ""},
  }};

  // 1. The file.
  for (auto& setting : ints) {
    if (auto f = top.Get(setting.key)) {
      setting.by_word =
          setting.word != nullptr && f->node.IsScalar() && f->node.Scalar() == setting.word;
      setting.value = setting.by_word ? 0 : cfg::ReadInteger(*f, setting.unit_hint);
      setting.origin = f->Origin();
    }
  }
  StringSetting admin_listen;
  if (auto f = top.Get("admin_listen")) admin_listen = {cfg::ReadString(*f), f->Origin(), true};
  StringSetting claim_mode{"skip_locked", "", false};
  if (auto f = top.Get("claim_mode")) claim_mode = {cfg::ReadString(*f), f->Origin(), true};
  std::optional<Field> bucket_leases = top.Get("bucket_leases");
  StringSetting log_level{builtin.log_level, "", false};
  StringSetting log_format{ToString(builtin.log_format), "", false};
  RetentionPolicy retention;
  if (auto f = top.Get("retention")) {
    Mapping r(*f, {"archive_delivered", "archive_retention_hours", "dead_letter_retention_hours",
                   "cleanup_interval_ms"});
    if (auto v = r.Get("archive_delivered")) retention.archive_delivered = cfg::ReadBool(*v);
    if (auto v = r.Get("archive_retention_hours")) {
      retention.archive_retention_set = true;
      retention.archive_retention = std::chrono::hours(cfg::ReadIntegerIn(
          *v, 1, 24 * 3650, ", e.g. 168 for a week", "hours delivered messages stay archived"));
    }
    if (auto v = r.Get("dead_letter_retention_hours")) {
      retention.dead_letter_retention = std::chrono::hours(cfg::ReadIntegerIn(
          *v, 0, 24 * 3650, ", e.g. 720 for 30 days, or 0 to keep them until purged",
          "hours dead letters are kept"));
    }
    if (auto v = r.Get("cleanup_interval_ms")) {
      retention.cleanup_interval = Millis(cfg::ReadIntegerIn(
          *v, 1000, kMaxDurationMs, kMsHint, "milliseconds between retention cleanups"));
    }
  }
  if (auto f = top.Get("log")) {
    Mapping log(*f, {"level", "format"});
    if (auto level = log.Get("level")) log_level = {cfg::ReadString(*level), level->Origin(), true};
    if (auto format = log.Get("format"))
      log_format = {cfg::ReadString(*format), format->Origin(), true};
  }

  const auto database_url_keys = DatabaseUrlKeys(top);

  RetryLayer default_retry;
  if (auto f = top.Get("defaults")) {
    Mapping defaults(*f, {"retry"});
    if (auto retry = defaults.Get("retry")) default_retry = ParseRetry(*retry, false);
  }

  std::vector<ParsedDestination> destinations;
  std::optional<Field> destinations_field = top.Get("destinations");
  if (destinations_field) {
    for (const auto& [name, field] : cfg::Entries(*destinations_field)) {
      destinations.push_back(ParseDestination(name, field, env, kinds));
    }
  }

  // 2. Environment overrides.
  for (auto& setting : ints) {
    if (setting.env == nullptr) continue;
    auto value = Override(env, setting.env);
    if (!value) continue;
    setting.by_word = setting.word != nullptr && *value == setting.word;
    if (setting.by_word) {
      setting.value = 0;
      setting.origin = EnvOrigin(setting.env);
      continue;
    }
    auto number = cfg::ParseInteger(*value);
    if (!number) {
      Fail(EnvOrigin(setting.env), setting.key,
           "expected an integer, got " + Quote(*value) + "; set " + setting.env +
               " to a whole number" + std::string(setting.unit_hint) +
               ", or unset it to use the config file");
    }
    setting.value = *number;
    setting.origin = EnvOrigin(setting.env);
  }
  if (auto value = Override(env, "OUTBOX_CLAIM_MODE"))
    claim_mode = {*value, EnvOrigin("OUTBOX_CLAIM_MODE"), true};
  if (auto value = Override(env, "OUTBOX_ADMIN_LISTEN"))
    admin_listen = {*value, EnvOrigin("OUTBOX_ADMIN_LISTEN"), true};
  if (auto value = Override(env, "OUTBOX_LOG_LEVEL"))
    log_level = {*value, EnvOrigin("OUTBOX_LOG_LEVEL"), true};
  if (auto value = Override(env, "OUTBOX_LOG_FORMAT"))
    log_format = {*value, EnvOrigin("OUTBOX_LOG_FORMAT"), true};

  // 3. Validation.
  RelayConfig config;
  config.database_url = ResolveDatabaseUrl(database_url_keys, env, source);

  for (const auto& setting : ints) CheckIntRange(setting);
  config.batch_size = static_cast<int>(ints[0].value);
  config.lease = Millis{ints[1].value};
  config.poll_interval = Millis{ints[2].value};
  config.reap_interval = Millis{ints[3].value};
  config.full_sweep_interval = Millis{ints[4].value};
  config.shutdown_timeout = Millis{ints[5].value};
  config.retention = retention;
  config.partition_heartbeat = Millis{ints[6].value};
  config.partition_lease = Millis{ints[7].value};
  config.claim_connections = static_cast<int>(ints[8].value);
  config.max_in_flight_bytes = ints[9].value;
  if (config.partition_lease < 3 * config.partition_heartbeat) {
    if (ints[7].origin.empty() && !ints[6].origin.empty()) {
      // Only the heartbeat was written: the error is about it, where it was written.
      Fail(ints[6].origin, "partition_heartbeat_ms",
           "must be at most a third of partition_lease_ms, " +
               std::to_string(config.partition_lease.count()) +
               " by default, so one late heartbeat does not move a live relay's buckets; lower "
               "it, or raise partition_lease_ms to at least " +
               std::to_string(3 * config.partition_heartbeat.count()));
    }
    Fail(ints[7].origin.empty() ? source : ints[7].origin, "partition_lease_ms",
         "must be at least 3 x partition_heartbeat_ms (" +
             std::to_string(3 * config.partition_heartbeat.count()) +
             "), so one late heartbeat does not move a live relay's buckets; raise it or lower the "
             "heartbeat");
  }
  if (claim_mode.value == "skip_locked") {
    config.claim_mode = ClaimMode::kSkipLocked;
  } else if (claim_mode.value == "partitioned") {
    config.claim_mode = ClaimMode::kPartitioned;
  } else {
    Fail(claim_mode.origin.empty() ? source : claim_mode.origin, "claim_mode",
         Quote(claim_mode.value) +
             " is not a claim mode; use `skip_locked` (default: every relay claims from the "
             "whole queue) or `partitioned` (each relay claims only from the buckets it owns)");
  }
  if (bucket_leases) {
    config.bucket_leases = cfg::ReadBool(*bucket_leases);
    if (config.bucket_leases && config.claim_mode != ClaimMode::kPartitioned) {
      Fail(*bucket_leases,
           "needs `claim_mode: partitioned` (a bucket's one owner is what leases its rows); set "
           "`claim_mode: partitioned`, or remove `bucket_leases`");
    }
    if (config.bucket_leases && config.claim_connections > 1) {
      // The claim parks and holds rows in a second statement after reading them: two loops
      // could both take a due retry before either held it (docs/adr/0003-bucket-leases.md).
      Fail(*bucket_leases,
           "takes one claim loop per destination, not claim_connections " +
               std::to_string(config.claim_connections) +
               "; set `claim_connections: 1` (or `auto`) and add relays to scale out, or remove "
               "`bucket_leases`");
    }
  }

  if (!admin_listen.value.empty()) {
    if (auto problem = AdminListenProblem(admin_listen.value)) {
      Fail(admin_listen.origin, "admin_listen",
           Quote(admin_listen.value) + " is not host:port: it " + *problem +
               "; write e.g. `0.0.0.0:9090`, or leave it empty to turn the admin server off");
    }
  }
  config.admin_listen = admin_listen.value;

  if (auto f = top.Get("management_api")) {
    Mapping api(*f, {"listen", "token_env", "token_file"});
    auto listen = api.Get("listen");
    if (!listen) {
      Fail(*f, "missing `listen`; write e.g. `listen: 127.0.0.1:8081` (or remove management_api)");
    }
    config.management_api.listen = cfg::ReadNonEmptyString(*listen);
    // Port 0: any free port, which the relay logs (tests).
    const std::string& l = config.management_api.listen;
    const bool any_port = l.size() > 2 && l.ends_with(":0");
    if (auto problem = AdminListenProblem(any_port ? l.substr(0, l.size() - 1) + "1" : l)) {
      Fail(*listen, Quote(config.management_api.listen) + " is not host:port: it " + *problem +
                        "; write e.g. `127.0.0.1:8081`");
    }
    auto env_key = api.Get("token_env");
    auto file_key = api.Get("token_file");
    if (!env_key == !file_key) {
      Fail(*f,
           "set exactly one of `token_env` (the name of an environment variable that holds the "
           "bearer token) and `token_file` (a file that holds it)");
    }
    const Field& token_field = env_key ? *env_key : *file_key;
    std::string token =
        env_key ? cfg::ReadEnvReference(*env_key, env) : cfg::ReadFileReference(*file_key);
    while (!token.empty() &&
           (token.back() == '\n' || token.back() == '\r' || token.back() == ' ')) {
      token.pop_back();
    }
    if (token.size() < 16) {
      Fail(token_field,
           "the management API token is " + std::to_string(token.size()) +
               " characters long; use at least 16 random ones, e.g. `openssl rand -hex 24`");
    }
    config.management_api.token = token;
  }

  if (std::find(kLogLevels.begin(), kLogLevels.end(), log_level.value) == kLogLevels.end()) {
    std::string message = Quote(log_level.value) + " is not a log level";
    if (auto close = cfg::ClosestMatch(
            log_level.value, std::vector<std::string>(kLogLevels.begin(), kLogLevels.end()))) {
      message += " (did you mean `" + *close + "`?)";
    }
    Fail(log_level.origin, "log.level", message + "; use one of trace, debug, info, warn, error");
  }
  config.log_level = log_level.value;

  if (log_format.value == "text") {
    config.log_format = LogFormat::kText;
  } else if (log_format.value == "json") {
    config.log_format = LogFormat::kJson;
  } else {
    Fail(log_format.origin, "log.format",
         Quote(log_format.value) +
             " is not a log format; use `text` (for people) or `json` (for log collectors)");
  }

  if (destinations.empty()) {
    Fail(destinations_field ? destinations_field->Origin() : source, "destinations",
         "no destinations configured; add at least one under `destinations:`, each with " +
             SectionChoice(kinds, false) + " (" + kExample + ")");
  }
  for (auto& parsed : destinations) {
    Destination& destination = parsed.destination;
    destination.retry = ResolveRetry(parsed.retry, default_retry, parsed.path, source);
    if (destination.batch_size == 0) destination.batch_size = config.batch_size;
    if (destination.max_in_flight_bytes == 0) {
      destination.max_in_flight_bytes = config.max_in_flight_bytes;
    }
    const std::string name = destination.name;
    config.destinations.emplace(name, std::move(destination));
  }
  ApplyLeaseBounds(config, ints[1].origin.empty() ? std::string() : ints[1].origin, kinds, source);
  for (auto& [name, d] : config.destinations) {
    const TargetKind& kind = KindOf(d, kinds);
    if (kind.complete) kind.complete(d, config, source);
  }
  return config;
}

RelayConfig LoadConfigFile(const std::string& path, const EnvLookup& env,
                           const TargetKinds& kinds) {
  std::string error;
  auto text = cfg::ReadWholeFile(path, &error);
  if (!text) {
    throw ConfigError(path + ": cannot read the config file: " + error +
                      "; check the path and that the relay's user may read it");
  }
  return ParseConfig(*text, path, env, kinds);
}

std::string LoadDatabaseUrl(const std::string& path, const EnvLookup& env) {
  std::string error;
  auto text = cfg::ReadWholeFile(path, &error);
  if (!text) {
    throw ConfigError(path + ": cannot read the config file: " + error +
                      "; check the path and that the relay's user may read it");
  }
  const Field root = LoadRoot(*text, path);
  const Mapping top(root, kTopLevelKeys);
  return ResolveDatabaseUrl(DatabaseUrlKeys(top), env, path);
}

RetryPolicy DefaultRetryPolicy() {
  using namespace std::chrono_literals;
  RetryPolicy policy;
  policy.schedule = {5s, 5min, 30min, 2h, 5h, 10h, 10h};
  policy.max_attempts = static_cast<int>(policy.schedule.size()) + 1;
  policy.initial_backoff = policy.schedule.front();
  policy.max_backoff = 10h;
  return policy;
}

}  // namespace outbox::relay
