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

#include "fields.h"
#include "sources.h"
#include "webhook_secret.h"

namespace outbox::relay {

using detail::ChildPath;
using detail::Fail;
using detail::Field;
using detail::Mapping;

namespace {

constexpr std::int64_t kMaxDurationMs =
    86'400'000;  // 24 h: longer is a mistake, and keeps time math far from overflow
constexpr std::int64_t kMaxBatchSize = 10'000;
constexpr std::int64_t kMaxInFlight = 1024;
constexpr std::size_t kMaxDestinationName =
    255;                                    // outbox.messages.destination allows 255 characters
constexpr std::size_t kMaxTopicName = 249;  // Kafka's limit
constexpr std::string_view kMsHint = " of milliseconds, e.g. 30000 for 30 s";

const char* const kExample = "see deploy/config/relay.example.yaml";

std::string Lowercase(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// Safe to show in errors only for values that are never secret (levels, addresses, numbers).
std::string Quote(std::string_view text) {
  constexpr std::size_t kMax = 80;
  std::string shown(text.substr(0, kMax));
  if (text.size() > kMax) shown += "...";
  return "`" + shown + "`";
}

bool HasSpaceOrControl(std::string_view text) {
  return std::any_of(text.begin(), text.end(), [](char c) {
    const auto u = static_cast<unsigned char>(c);
    return u <= 0x20 || u == 0x7F;
  });
}

// Characters, as PostgreSQL's length() counts them for UTF-8 text.
std::size_t Utf8Length(std::string_view text) {
  return static_cast<std::size_t>(std::count_if(text.begin(), text.end(), [](char c) {
    return (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  }));
}

std::vector<std::string> SplitOnWhitespace(std::string_view text) {
  std::vector<std::string> out;
  std::string current;
  for (char c : text) {
    if (std::isspace(static_cast<unsigned char>(c))) {
      if (!current.empty()) out.push_back(std::move(current));
      current.clear();
    } else {
      current += c;
    }
  }
  if (!current.empty()) out.push_back(std::move(current));
  return out;
}

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
};

struct StringSetting {
  std::string value;
  std::string origin;
  bool set = false;
};

void CheckIntRange(const IntSetting& s) {
  if (s.value < s.min || s.value > s.max) {
    Fail(s.origin, s.key,
         std::to_string(s.value) + " is out of range; set it between " + std::to_string(s.min) +
             " and " + std::to_string(s.max) + " (" + s.meaning + ")");
  }
}

std::string EnvOrigin(const char* name) { return std::string("environment variable ") + name; }

// An OUTBOX_* override; an empty variable counts as unset.
std::optional<std::string> Override(const EnvLookup& env, const char* name) {
  auto value = detail::Lookup(env, name);
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
    return RetryValue{detail::ReadIntegerIn(*f, min, max, hint, meaning), f->path, f->Origin(),
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
               detail::DescribeKind(f->node));
    }
    std::vector<Millis> delays;
    for (const auto& element : detail::ReadList(*f)) {
      delays.emplace_back(detail::ReadIntegerIn(element, 0, kMaxDurationMs, kMsHint,
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
// Kafka

struct OwnedProperty {
  std::string_view name;
  std::string_view why;
};

constexpr std::array<OwnedProperty, 8> kOwnedProducerProperties = {{
    {"bootstrap.servers", "the relay sets it from `brokers`; list the servers there instead"},
    {"metadata.broker.list", "the relay sets the servers from `brokers`; list them there instead"},
    {"enable.idempotence",
     "the relay always enables the idempotent producer so that its retries cannot duplicate or "
     "reorder messages; "
     "remove it"},
    {"acks",
     "the relay requires acks=all, so a message counts as delivered only once every in-sync "
     "replica has it; "
     "remove it"},
    {"request.required.acks",
     "the relay requires acks=all, so a message counts as delivered only once every in-sync "
     "replica has it; "
     "remove it"},
    {"dr_msg_cb",
     "the relay installs its own delivery report callback to mark messages delivered; remove it"},
    {"dr_cb",
     "the relay installs its own delivery report callback to mark messages delivered; remove it"},
    {"transactional.id",
     "the relay uses the idempotent producer, not Kafka transactions; remove it"},
}};

std::string ReadBrokers(const Field& field) {
  std::vector<std::string> parts;
  if (field.node.IsSequence()) {
    for (const auto& element : detail::ReadList(field))
      parts.push_back(detail::ReadNonEmptyString(element));
  } else {
    const std::string text = detail::ReadNonEmptyString(field);
    std::string current;
    for (char c : text + ",") {
      if (c == ',') {
        parts.push_back(current);
        current.clear();
      } else {
        current += c;
      }
    }
  }
  std::string joined;
  for (auto& part : parts) {
    const auto first = part.find_first_not_of(" \t");
    const auto last = part.find_last_not_of(" \t");
    part = first == std::string::npos ? "" : part.substr(first, last - first + 1);
    if (part.empty()) {
      Fail(field,
           "has an empty entry; write the bootstrap servers as `host:port` separated by commas, "
           "e.g. "
           "`kafka-1:9092,kafka-2:9092`");
    }
    if (HasSpaceOrControl(part)) {
      Fail(field, "entry " + Quote(part) +
                      " contains whitespace; write `host:port` entries separated by commas");
    }
    if (!joined.empty()) joined += ',';
    joined += part;
  }
  if (joined.empty()) {
    Fail(field,
         "lists no servers; write at least one bootstrap server as `host:port`, e.g. "
         "`kafka-1:9092`");
  }
  return joined;
}

void ValidateTopic(const Field& field, const std::string& topic) {
  if (topic == "." || topic == "..")
    Fail(field, "`.` and `..` are not valid Kafka topic names; choose another name");
  if (topic.size() > kMaxTopicName) {
    Fail(field, "is " + std::to_string(topic.size()) +
                    " characters long; Kafka topic names have at most 249");
  }
  for (char c : topic) {
    const bool ok = std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
    if (!ok) {
      Fail(field,
           Quote(topic) +
               " is not a valid Kafka topic name; use only letters, digits, `.`, `_` and `-`");
    }
  }
}

std::map<std::string, std::string> ReadProducer(const Field& field, const EnvLookup& env) {
  std::map<std::string, std::string> properties;
  std::map<std::string, std::string> written_as;  // property -> key that set it
  for (const auto& [key, value_field] : detail::Entries(field)) {
    enum class From { kValue, kEnv, kFile } from = From::kValue;
    std::string property = key;
    if (key.ends_with("_env")) {
      from = From::kEnv;
      property = key.substr(0, key.size() - 4);
    } else if (key.ends_with("_file")) {
      from = From::kFile;
      property = key.substr(0, key.size() - 5);
    }
    if (property.empty()) {
      Fail(value_field,
           "names no property; write `<librdkafka property>_env` or `<property>_file`, e.g. "
           "`sasl.password_env: KAFKA_PASSWORD`");
    }
    for (const auto& owned : kOwnedProducerProperties) {
      if (property == owned.name)
        Fail(value_field, "`" + property + "` cannot be set here: " + std::string(owned.why));
    }
    if (auto it = written_as.find(property); it != written_as.end()) {
      Fail(value_field, "sets `" + property + "` again (already set by `" + it->second +
                            "`); keep only one of `" + property + "`, `" + property +
                            "_env` and `" + property + "_file`");
    }
    written_as.emplace(property, key);

    std::string value;
    switch (from) {
      case From::kEnv:
        value = detail::ReadEnvReference(value_field, env);
        break;
      case From::kFile:
        value = detail::ReadFileReference(value_field);
        break;
      case From::kValue: {
        const YAML::Node& node = value_field.node;
        if (node.IsNull() || !node.IsDefined()) {
          Fail(value_field, "has no value; give the librdkafka property a value or remove the key");
        }
        if (!node.IsScalar()) {
          Fail(value_field, "expected a string, number or boolean, got " +
                                detail::DescribeKind(node) +
                                "; librdkafka properties take one value (join lists with commas)");
        }
        value = node.Scalar();
        if (node.Tag() == "?" && (value == "True" || value == "TRUE")) value = "true";
        if (node.Tag() == "?" && (value == "False" || value == "FALSE")) value = "false";
        break;
      }
    }
    properties.emplace(property, std::move(value));
  }
  return properties;
}

KafkaTarget ParseKafka(const Field& field, const EnvLookup& env) {
  Mapping m(field, {"brokers", "topic", "producer", "allowed_topics", "topic_prefix"});
  KafkaTarget kafka;
  auto brokers = m.Get("brokers");
  if (!brokers) {
    Fail(field,
         "missing required key `brokers`; list the bootstrap servers, e.g. `brokers: "
         "kafka-1:9092,kafka-2:9092`");
  }
  kafka.brokers = ReadBrokers(*brokers);
  auto topic = m.Get("topic");
  if (!topic)
    Fail(field,
         "missing required key `topic`; name the Kafka topic to produce to, e.g. `topic: orders`");
  kafka.topic = detail::ReadNonEmptyString(*topic);
  // A template ("orders.{event_type}") is checked by the Kafka sink's validation, which
  // check-config and run both call; a plain name here.
  if (kafka.topic.find('{') == std::string::npos) ValidateTopic(*topic, kafka.topic);
  if (auto f = m.Get("allowed_topics")) {
    for (const auto& element : detail::ReadList(*f)) {
      kafka.allowed_topics.push_back(detail::ReadNonEmptyString(element));
      ValidateTopic(element, kafka.allowed_topics.back());
    }
  }
  if (auto f = m.Get("topic_prefix")) kafka.topic_prefix = detail::ReadNonEmptyString(*f);
  if (auto producer = m.Get("producer")) kafka.producer = ReadProducer(*producer, env);
  return kafka;
}

// ---------------------------------------------------------------------------------------------
// Webhooks

// URLs may carry credentials (user:pass@, tokens in the path), so errors never show them.
void ValidateUrl(const Field& field, const std::string& url) {
  const std::string fix = "; write it as http://host[:port]/path or https://host[:port]/path";
  const auto scheme_end = url.find("://");
  if (scheme_end == std::string::npos) Fail(field, "is not an absolute URL" + fix);
  const std::string scheme = Lowercase(url.substr(0, scheme_end));
  if (scheme != "http" && scheme != "https") {
    const bool printable =
        scheme.size() <= 10 && std::all_of(scheme.begin(), scheme.end(), [](char c) {
          return std::isalnum(static_cast<unsigned char>(c)) || c == '+' || c == '-' || c == '.';
        });
    Fail(field, "uses the scheme " + (printable ? Quote(scheme) : std::string("given")) +
                    "; webhooks need http:// or https://" + fix);
  }
  if (HasSpaceOrControl(url))
    Fail(field, "contains whitespace or control characters; percent-encode them" + fix);
  const std::string rest = url.substr(scheme_end + 3);
  std::string authority = rest.substr(0, rest.find_first_of("/?#"));
  if (const auto at = authority.rfind('@'); at != std::string::npos)
    authority = authority.substr(at + 1);
  std::string host;
  std::string port;
  if (authority.starts_with('[')) {
    const auto close = authority.find(']');
    if (close == std::string::npos)
      Fail(field, "has an unterminated IPv6 address (missing `]`)" + fix);
    host = authority.substr(1, close - 1);
    const std::string after = authority.substr(close + 1);
    if (!after.empty()) {
      if (after[0] != ':')
        Fail(field, "has characters after the IPv6 address that are not a port" + fix);
      port = after.substr(1);
    }
  } else {
    const auto colon = authority.rfind(':');
    host = authority.substr(0, colon);
    if (colon != std::string::npos) port = authority.substr(colon + 1);
  }
  if (host.empty()) Fail(field, "has no host" + fix);
  if (!port.empty()) {
    auto number = detail::ParseInteger(port);
    if (!number || port[0] == '+' || port[0] == '-' || *number < 1 || *number > 65535) {
      Fail(field, "has an invalid port (it must be a number from 1 to 65535)" + fix);
    }
  }
}

bool IsHeaderNameChar(char c) {
  if (std::isalnum(static_cast<unsigned char>(c))) return true;
  return std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}

struct OwnedHeader {
  std::string_view name;  // lowercase
  std::string_view why;
};

// The webhook sink sets these itself (and skips configured ones), so refuse them up front.
constexpr std::array<OwnedHeader, 12> kOwnedHeaders = {{
    {"idempotency-key", "the relay sets it to the message's idempotency key"},
    {"content-type",
     "the relay sets it from the message (application/json or application/octet-stream)"},
    {"content-length", "the HTTP client sets it from the body"},
    {"host", "the HTTP client sets it from `url`"},
    {"connection", "the HTTP client manages connections"},
    {"keep-alive", "the HTTP client manages connections"},
    {"proxy-connection", "the HTTP client manages connections"},
    {"transfer-encoding", "the HTTP client sets it"},
    {"te", "the HTTP client sets it"},
    {"trailer", "the HTTP client sets it"},
    {"upgrade", "the HTTP client sets it"},
    {"expect", "the HTTP client sets it"},
}};

std::map<std::string, std::string> ReadHeaders(const Field& field) {
  std::map<std::string, std::string> headers;
  std::map<std::string, std::string> by_lowercase;
  for (const auto& [name, value_field] : detail::Entries(field)) {
    if (name.empty() || !std::all_of(name.begin(), name.end(), IsHeaderNameChar)) {
      Fail(value_field,
           "is not a valid HTTP header name; use letters, digits and `-`, e.g. `X-Team: billing`");
    }
    const std::string lower = Lowercase(name);
    if (lower.starts_with("webhook-")) {
      Fail(value_field,
           "cannot be set here: the relay signs every delivery with the Standard Webhooks headers "
           "(webhook-id, webhook-timestamp, webhook-signature) and reserves the `webhook-` prefix; "
           "remove it or choose another name");
    }
    for (const auto& owned : kOwnedHeaders) {
      if (lower == owned.name)
        Fail(value_field, "cannot be set here: " + std::string(owned.why) + "; remove it");
    }
    if (auto it = by_lowercase.find(lower); it != by_lowercase.end()) {
      Fail(value_field,
           "repeats header `" + it->second + "` (header names ignore case); keep only one");
    }
    by_lowercase.emplace(lower, name);
    const YAML::Node& node = value_field.node;
    if (node.IsNull() || !node.IsDefined())
      Fail(value_field, "has no value; give the header a value or remove it");
    const std::string value = detail::ReadString(value_field);
    if (std::any_of(value.begin(), value.end(), [](char c) {
          const auto u = static_cast<unsigned char>(c);
          return (u < 0x20 && c != '\t') || u == 0x7F;
        })) {
      Fail(value_field,
           "has a line break or another control character in its value; header values must be one "
           "line of text");
    }
    headers.emplace(name, value);
  }
  return headers;
}

// Appends the secrets in `text` (separated by whitespace) to `out`, validating each.
// `described` says where they came from without showing them.
void AddSecrets(const Field& field, const std::string& text, const std::string& described,
                std::vector<std::string>& out) {
  const std::vector<std::string> secrets = SplitOnWhitespace(text);
  if (secrets.empty()) {
    Fail(field,
         described + " contains no secret; provide a Standard Webhooks secret `whsec_<base64>`");
  }
  for (std::size_t i = 0; i < secrets.size(); ++i) {
    const std::string problem = detail::CheckWebhookSecret(secrets[i], nullptr);
    if (!problem.empty()) {
      const std::string which = secrets.size() == 1 ? "the secret"
                                                    : "secret " + std::to_string(i + 1) + " of " +
                                                          std::to_string(secrets.size());
      Fail(field, which + " " + described + " " + problem);
    }
    if (std::find(out.begin(), out.end(), secrets[i]) == out.end()) out.push_back(secrets[i]);
  }
}

BreakerSettings ParseBreaker(const Field& field) {
  Mapping m(field, {"enabled", "failure_threshold", "cooldown_ms", "max_cooldown_ms"});
  BreakerSettings breaker;
  if (auto f = m.Get("enabled")) breaker.enabled = detail::ReadBool(*f);
  if (auto f = m.Get("failure_threshold")) {
    breaker.failure_threshold = static_cast<int>(detail::ReadIntegerIn(
        *f, 1, 1'000'000, ", e.g. 10",
        "consecutive failed requests (connect errors, timeouts, 5xx) that open the breaker"));
  }
  if (auto f = m.Get("cooldown_ms")) {
    breaker.cooldown = Millis{detail::ReadIntegerIn(
        *f, 1, kMaxDurationMs, kMsHint, "how long the breaker stays open before one probe")};
  }
  if (auto f = m.Get("max_cooldown_ms")) {
    breaker.max_cooldown = Millis{detail::ReadIntegerIn(
        *f, 1, kMaxDurationMs, kMsHint,
        "the longest the breaker stays open between probes, and the longest Retry-After pause")};
  }
  if (breaker.cooldown > breaker.max_cooldown) {
    Fail(field, "cooldown_ms " + std::to_string(breaker.cooldown.count()) +
                    " is greater than max_cooldown_ms " +
                    std::to_string(breaker.max_cooldown.count()) +
                    "; lower cooldown_ms or raise max_cooldown_ms (defaults 5000 and 300000)");
  }
  return breaker;
}

// Every key of a `webhook:` section (also the hints for keys written one level too high).
constexpr std::array<std::string_view, 21> kWebhookKeys = {"url",
                                                           "rate_limit",
                                                           "endpoints",
                                                           "delivery_log",
                                                           "delivery_log_retention_ms",
                                                           "auto_disable_after_ms",
                                                           "operational_events",
                                                           "secret",
                                                           "secret_env",
                                                           "secret_file",
                                                           "previous_secrets",
                                                           "timeout_ms",
                                                           "connect_timeout_ms",
                                                           "max_in_flight",
                                                           "ca_file",
                                                           "verify_tls",
                                                           "headers",
                                                           "breaker",
                                                           "adaptive_concurrency",
                                                           "allow_private_networks",
                                                           "allowed_networks"};

WebhookTarget ParseWebhook(const Field& field, const EnvLookup& env) {
  Mapping m(field, std::vector<std::string_view>(kWebhookKeys.begin(), kWebhookKeys.end()));
  WebhookTarget webhook;

  auto url = m.Get("url");
  if (auto endpoints = m.Get("endpoints")) {
    const std::string where = detail::ReadNonEmptyString(*endpoints);
    if (where != "database") {
      Fail(*endpoints, Quote(where) +
                           " is not a source of endpoints; write `endpoints: database` to fan "
                           "each message out to the endpoints managed with `outbox-relay "
                           "endpoints`, or remove the key and set `url` and `secret`");
    }
    for (const char* key : {"url", "secret", "secret_env", "secret_file", "previous_secrets"}) {
      if (auto f = m.Get(key)) {
        Fail(*f, std::string("a destination with `endpoints: database` takes each endpoint's url "
                             "and secrets from outbox.endpoints (`outbox-relay endpoints add`); "
                             "remove `") +
                     key + "`");
      }
    }
    webhook.endpoints_from_database = true;
  } else if (!url)
    Fail(field,
         "missing required key `url`; set the endpoint, e.g. `url: "
         "https://billing.internal/hooks/outbox`");
  if (url) {
    webhook.url = detail::ReadNonEmptyString(*url);
    ValidateUrl(*url, webhook.url);
  }

  std::vector<Field> secret_keys;
  for (const char* key : {"secret", "secret_env", "secret_file"}) {
    if (auto f = m.Get(key)) secret_keys.push_back(*f);
  }
  if (secret_keys.empty() && !webhook.endpoints_from_database) {
    Fail(field,
         "missing secret; set exactly one of `secret`, `secret_env` (the name of an environment "
         "variable that "
         "holds it) or `secret_file` (a file that holds it) to a Standard Webhooks secret "
         "`whsec_<base64>`");
  }
  if (secret_keys.size() > 1) {
    Fail(secret_keys[1], "set only one of `secret`, `secret_env` and `secret_file` (found `" +
                             secret_keys[0].path.substr(secret_keys[0].path.rfind('.') + 1) +
                             "` too); remove the others");
  }
  const std::string secret_key =
      secret_keys.empty() ? "" : secret_keys[0].path.substr(secret_keys[0].path.rfind('.') + 1);
  if (secret_keys.empty()) {
    // endpoints: database; each endpoint's secrets come from outbox.endpoint_secrets
  } else if (const Field& secret = secret_keys[0]; secret_key == "secret") {
    AddSecrets(secret, detail::ReadNonEmptyString(secret), "(written in the config)",
               webhook.secrets);
  } else if (secret_key == "secret_env") {
    const std::string value = detail::ReadEnvReference(secret, env);
    AddSecrets(secret, value, "(from environment variable " + detail::ReadString(secret) + ")",
               webhook.secrets);
  } else {
    const std::string value = detail::ReadFileReference(secret);
    AddSecrets(secret, value, "(from file " + detail::ReadString(secret) + ")", webhook.secrets);
  }
  if (auto previous = m.Get("previous_secrets")) {
    for (const auto& element : detail::ReadList(*previous)) {
      AddSecrets(element, detail::ReadNonEmptyString(element), "(in previous_secrets)",
                 webhook.secrets);
    }
  }

  if (auto f = m.Get("timeout_ms")) {
    webhook.timeout = Millis{detail::ReadIntegerIn(
        *f, 1, kMaxDurationMs, kMsHint, "time limit of a whole request, in milliseconds")};
  }
  if (auto f = m.Get("connect_timeout_ms")) {
    webhook.connect_timeout = Millis{detail::ReadIntegerIn(
        *f, 1, kMaxDurationMs, kMsHint, "time limit to establish a connection, in milliseconds")};
  }
  if (auto f = m.Get("max_in_flight")) {
    webhook.max_in_flight = static_cast<int>(detail::ReadIntegerIn(
        *f, 1, kMaxInFlight, ", e.g. 32", "concurrent requests to this endpoint"));
  }
  if (auto f = m.Get("ca_file")) {
    const std::string path = detail::ReadNonEmptyString(*f);
    std::string error;
    if (!detail::ReadWholeFile(path, &error)) {
      Fail(*f,
           "cannot read " + path + ": " + error +
               "; point it at a readable PEM bundle, or remove the key to trust the system's CAs");
    }
    webhook.ca_file = path;
  }
  if (auto f = m.Get("verify_tls")) webhook.verify_tls = detail::ReadBool(*f);
  if (auto f = m.Get("headers")) webhook.headers = ReadHeaders(*f);
  if (auto f = m.Get("breaker")) webhook.breaker = ParseBreaker(*f);
  if (auto f = m.Get("adaptive_concurrency")) webhook.adaptive_concurrency = detail::ReadBool(*f);
  if (auto f = m.Get("rate_limit")) {
    webhook.rate_limit = static_cast<int>(detail::ReadIntegerIn(
        *f, 0, 1'000'000, ", e.g. 50, or 0 for no limit", "requests per second to this endpoint"));
  }
  if (auto f = m.Get("allow_private_networks")) {
    webhook.allow_private_networks = detail::ReadBool(*f);
  }
  if (auto f = m.Get("allowed_networks")) {
    for (const auto& element : detail::ReadList(*f)) {
      webhook.allowed_networks.push_back(detail::ReadNonEmptyString(element));
    }
  }
  for (const char* key : {"delivery_log", "delivery_log_retention_ms", "auto_disable_after_ms",
                          "operational_events"}) {
    if (auto f = m.Get(key); f && !webhook.endpoints_from_database) {
      Fail(*f, std::string("`") + key +
                   "` belongs to a webhook service; add `endpoints: database` or remove it");
    }
  }
  if (auto f = m.Get("delivery_log")) webhook.delivery_log = detail::ReadBool(*f);
  if (auto f = m.Get("delivery_log_retention_ms")) {
    webhook.delivery_log_retention = Millis{
        detail::ReadIntegerIn(*f, 1, kMaxDurationMs * 365, ", e.g. 604800000 (7 days)",
                              "how long the delivery log keeps an attempt, in milliseconds")};
  }
  if (auto f = m.Get("auto_disable_after_ms")) {
    webhook.auto_disable_after = Millis{detail::ReadIntegerIn(
        *f, 0, kMaxDurationMs * 365, ", e.g. 432000000 (5 days), or 0 for never",
        "how long an endpoint may keep failing before it is disabled, in milliseconds")};
  }
  if (auto f = m.Get("operational_events")) {
    webhook.operational_events = detail::ReadNonEmptyString(*f);
  }
  return webhook;
}

// ---------------------------------------------------------------------------------------------
// Destinations

constexpr std::array<std::string_view, 5> kKafkaKeys = {"brokers", "topic", "producer",
                                                        "allowed_topics", "topic_prefix"};

// Every delivery attempt must end inside its lease, with room to spare: otherwise the lease
// expires while the attempt still runs, a reaper hands the message out again (a duplicate, and
// an attempt counted twice) and the first settle is fenced. (Waiting in a sink's queue before
// the attempt starts is covered by the dispatcher renewing the leases of what is in flight.)
constexpr Millis kLeaseSpare{1'000};          // an attempt ends at least this long before its lease
constexpr Millis kDerivedLeaseSpare{10'000};  // what a derived lease_ms adds to the longest attempt

// The longest a single attempt can take, if the destination bounds it explicitly: a webhook's
// timeouts; a Kafka producer's message.timeout.ms (alias delivery.timeout.ms) when set.
std::optional<std::pair<Millis, std::string>> AttemptBound(const Destination& d) {
  const std::string path = "destinations." + d.name;
  if (const auto* w = std::get_if<WebhookTarget>(&d.target)) {
    return std::make_pair(w->timeout + w->connect_timeout,
                          path + ".webhook.timeout_ms + connect_timeout_ms");
  }
  const auto& producer = std::get<KafkaTarget>(d.target).producer;
  for (const char* key : {"message.timeout.ms", "delivery.timeout.ms"}) {
    if (auto it = producer.find(key); it != producer.end()) {
      try {
        return std::make_pair(Millis{std::stoll(it->second)}, path + ".kafka.producer." + key);
      } catch (const std::exception&) {
        return std::nullopt;  // librdkafka's own check names it (check-config, run)
      }
    }
  }
  return std::nullopt;
}

void ApplyLeaseBounds(RelayConfig& config, const std::string& lease_origin) {
  const bool lease_given = !lease_origin.empty();
  for (const auto& [name, d] : config.destinations) {
    const auto bound = AttemptBound(d);
    if (!bound) continue;
    if (!lease_given) {
      config.lease = std::max(config.lease, bound->first + kDerivedLeaseSpare);
    } else if (bound->first + kLeaseSpare > config.lease) {
      Fail(lease_origin, "lease_ms",
           std::to_string(config.lease.count()) +
               " ms is shorter than one delivery attempt may "
               "take: " +
               bound->second + " = " + std::to_string(bound->first.count()) +
               " ms, and a lease must outlast its attempt by at least " +
               std::to_string(kLeaseSpare.count()) + " ms; raise lease_ms to at least " +
               std::to_string((bound->first + kLeaseSpare).count()) + " or lower " + bound->second);
    }
  }
  // Kafka attempts without an explicit bound get one that fits: 2/3 of the lease, at most
  // librdkafka's usual 30 s.
  for (auto& [name, d] : config.destinations) {
    if (auto* k = std::get_if<KafkaTarget>(&d.target)) {
      k->attempt_timeout = Millis{std::min<long long>(30'000, config.lease.count() * 2 / 3)};
    }
  }
}

struct ParsedDestination {
  Destination destination;
  RetryLayer retry;
  std::string path;
};

ParsedDestination ParseDestination(const std::string& name, const Field& field,
                                   const EnvLookup& env) {
  if (name.empty()) {
    Fail(field,
         "a destination name must not be empty; use the name applications pass to outbox.enqueue, "
         "e.g. `orders`");
  }
  if (Utf8Length(name) > kMaxDestinationName) {
    Fail(field.Origin(), "destinations",
         "destination name is " + std::to_string(Utf8Length(name)) +
             " characters long; the limit is 255 (the same as outbox.messages.destination), use a "
             "shorter name");
  }
  if (field.node.IsNull() || !field.node.IsDefined()) {
    Fail(field, "is empty; give the destination a `kafka:` or `webhook:` section");
  }
  auto hint = [](const std::string& key, const Field&) -> std::string {
    if (std::find(kKafkaKeys.begin(), kKafkaKeys.end(), key) != kKafkaKeys.end()) {
      return "`" + key + "` belongs under `kafka:`.";
    }
    if (std::find(kWebhookKeys.begin(), kWebhookKeys.end(), key) != kWebhookKeys.end()) {
      return "`" + key + "` belongs under `webhook:`.";
    }
    if (key == "max_attempts" || key == "initial_backoff_ms" || key == "max_backoff_ms") {
      return "`" + key + "` belongs under `retry:`.";
    }
    return "";
  };
  Mapping m(field, {"kafka", "webhook", "retry", "batch_size"}, hint);
  ParsedDestination parsed;
  parsed.path = field.path;
  parsed.destination.name = name;
  auto kafka = m.Get("kafka");
  auto webhook = m.Get("webhook");
  if (kafka && webhook) {
    Fail(*webhook,
         "a destination has exactly one target, and this one also has `kafka`; keep one and move "
         "the other "
         "to a destination of its own");
  }
  if (!kafka && !webhook) {
    Fail(field,
         "has no target; add a `kafka:` section (brokers, topic) or a `webhook:` section (url, "
         "secret)");
  }
  if (kafka) {
    parsed.destination.target = ParseKafka(*kafka, env);
  } else {
    parsed.destination.target = ParseWebhook(*webhook, env);
  }
  if (auto retry = m.Get("retry")) parsed.retry = ParseRetry(*retry, true);
  if (auto f = m.Get("batch_size")) {
    parsed.destination.batch_size = static_cast<int>(detail::ReadIntegerIn(
        *f, 0, kMaxBatchSize, ", e.g. 100",
        "rows claimed per query for this destination; 0 uses the global batch_size"));
  }
  return parsed;
}

// ---------------------------------------------------------------------------------------------
// Globals

std::string TopLevelHint(const std::string& key, const Field& value) {
  if (key == "kafka" || key == "webhook") {
    return "Targets belong to a destination: `destinations: {<name>: {" + key + ": ...}}`.";
  }
  if (key == "retry" || key == "max_attempts" || key == "initial_backoff_ms" ||
      key == "max_backoff_ms") {
    return "Retry settings go under `defaults.retry` (for every destination) or "
           "`destinations.<name>.retry`.";
  }
  if (key == "level" || key == "format") return "It belongs under `log:`.";
  if (value.node.IsMap() && (value.node["kafka"] || value.node["webhook"])) {
    return "If `" + key + "` is a destination, indent it under `destinations:`.";
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
  auto number = detail::ParseInteger(port);
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

RelayConfig ParseConfig(const std::string& yaml_text, const std::string& source,
                        const EnvLookup& env) {
  std::vector<YAML::Node> documents;
  try {
    documents = YAML::LoadAll(yaml_text);
  } catch (const YAML::Exception& e) {
    Fail(detail::FormatOrigin(source, e.mark), "",
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
             detail::DescribeKind(root.node) + " (" + kExample + ")");
  }

  Mapping top(
      root,
      {"database_url", "database_url_env", "database_url_file", "batch_size", "lease_ms",
       "poll_interval_ms", "reap_interval_ms", "full_sweep_interval_ms", "shutdown_timeout_ms",
       "admin_listen", "log", "defaults", "destinations", "claim_mode", "partition_heartbeat_ms",
       "partition_lease_ms", "retention", "management_api"},
      TopLevelHint);

  const RelayConfig builtin;
  std::array<IntSetting, 8> ints = {{
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
  }};

  // 1. The file.
  for (auto& setting : ints) {
    if (auto f = top.Get(setting.key)) {
      setting.value = detail::ReadInteger(*f, setting.unit_hint);
      setting.origin = f->Origin();
    }
  }
  StringSetting admin_listen;
  if (auto f = top.Get("admin_listen")) admin_listen = {detail::ReadString(*f), f->Origin(), true};
  StringSetting claim_mode{"skip_locked", "", false};
  if (auto f = top.Get("claim_mode")) claim_mode = {detail::ReadString(*f), f->Origin(), true};
  StringSetting log_level{builtin.log_level, "", false};
  StringSetting log_format{ToString(builtin.log_format), "", false};
  RetentionPolicy retention;
  if (auto f = top.Get("retention")) {
    Mapping r(*f, {"archive_delivered", "archive_retention_hours", "dead_letter_retention_hours",
                   "cleanup_interval_ms"});
    if (auto v = r.Get("archive_delivered")) retention.archive_delivered = detail::ReadBool(*v);
    if (auto v = r.Get("archive_retention_hours")) {
      retention.archive_retention = std::chrono::hours(detail::ReadIntegerIn(
          *v, 1, 24 * 3650, ", e.g. 168 for a week", "hours delivered messages stay archived"));
    }
    if (auto v = r.Get("dead_letter_retention_hours")) {
      retention.dead_letter_retention = std::chrono::hours(detail::ReadIntegerIn(
          *v, 0, 24 * 3650, ", e.g. 720 for 30 days, or 0 to keep them until purged",
          "hours dead letters are kept"));
    }
    if (auto v = r.Get("cleanup_interval_ms")) {
      retention.cleanup_interval = Millis(detail::ReadIntegerIn(
          *v, 1000, kMaxDurationMs, kMsHint, "milliseconds between retention cleanups"));
    }
  }
  if (auto f = top.Get("log")) {
    Mapping log(*f, {"level", "format"});
    if (auto level = log.Get("level"))
      log_level = {detail::ReadString(*level), level->Origin(), true};
    if (auto format = log.Get("format"))
      log_format = {detail::ReadString(*format), format->Origin(), true};
  }

  std::vector<Field> database_url_keys;
  for (const char* key : {"database_url", "database_url_env", "database_url_file"}) {
    if (auto f = top.Get(key)) database_url_keys.push_back(*f);
  }
  if (database_url_keys.size() > 1) {
    Fail(database_url_keys[1],
         "set only one of `database_url`, `database_url_env` and `database_url_file` (found `" +
             database_url_keys[0].path + "` too); remove the others");
  }

  RetryLayer default_retry;
  if (auto f = top.Get("defaults")) {
    Mapping defaults(*f, {"retry"});
    if (auto retry = defaults.Get("retry")) default_retry = ParseRetry(*retry, false);
  }

  std::vector<ParsedDestination> destinations;
  std::optional<Field> destinations_field = top.Get("destinations");
  if (destinations_field) {
    for (const auto& [name, field] : detail::Entries(*destinations_field)) {
      destinations.push_back(ParseDestination(name, field, env));
    }
  }

  // 2. Environment overrides.
  for (auto& setting : ints) {
    if (setting.env == nullptr) continue;
    auto value = Override(env, setting.env);
    if (!value) continue;
    auto number = detail::ParseInteger(*value);
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

  StringSetting database_url;
  if (auto value = Override(env, "OUTBOX_DATABASE_URL")) {
    database_url = {*value, EnvOrigin("OUTBOX_DATABASE_URL"), true};
  } else if (!database_url_keys.empty()) {
    const Field& f = database_url_keys[0];
    if (f.path == "database_url") {
      database_url = {detail::ReadNonEmptyString(f), f.Origin(), true};
    } else if (f.path == "database_url_env") {
      database_url = {detail::ReadEnvReference(f, env), f.Origin(), true};
    } else {
      database_url = {detail::ReadFileReference(f), f.Origin(), true};
    }
  }

  // 3. Validation.
  RelayConfig config;
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
  config.database_url = database_url.value;

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
  if (config.partition_lease < 3 * config.partition_heartbeat) {
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
    config.management_api.listen = detail::ReadNonEmptyString(*listen);
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
        env_key ? detail::ReadEnvReference(*env_key, env) : detail::ReadFileReference(*file_key);
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
    if (auto close = detail::ClosestMatch(
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
         std::string("no destinations configured; add at least one under `destinations:`, each "
                     "with a `kafka:` or "
                     "`webhook:` section (") +
             kExample + ")");
  }
  for (auto& parsed : destinations) {
    Destination& destination = parsed.destination;
    destination.retry = ResolveRetry(parsed.retry, default_retry, parsed.path, source);
    if (destination.batch_size == 0) destination.batch_size = config.batch_size;
    const std::string name = destination.name;
    config.destinations.emplace(name, std::move(destination));
  }
  ApplyLeaseBounds(config, ints[1].origin.empty() ? std::string() : ints[1].origin);
  for (auto& [name, d] : config.destinations) {
    if (auto* w = std::get_if<WebhookTarget>(&d.target); w && w->endpoints_from_database) {
      w->database_url = config.database_url;
      if (!w->operational_events.empty() && !config.destinations.count(w->operational_events)) {
        Fail(source, "destinations." + name + ".webhook.operational_events",
             Quote(w->operational_events) +
                 " is not a destination of this config; name one that delivers the "
                 "endpoint.disabled events (a Kafka topic or a webhook), or remove the key");
      }
    }
  }
  return config;
}

RelayConfig LoadConfigFile(const std::string& path, const EnvLookup& env) {
  std::string error;
  auto text = detail::ReadWholeFile(path, &error);
  if (!text) {
    throw ConfigError(path + ": cannot read the config file: " + error +
                      "; check the path and that the relay's user may read it");
  }
  return ParseConfig(*text, path, env);
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
