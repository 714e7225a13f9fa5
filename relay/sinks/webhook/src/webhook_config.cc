// Reads a destination's `webhook:` section (docs/configuration.md, "Webhooks").
#include <openssl/err.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <memory>
#include <stdexcept>
#include <string_view>

#include "cloudevents_config.h"
#include "outbox_relay/config_fields.h"
#include "outbox_relay/config_sources.h"
#include "outbox_relay/webhook_target.h"
#include "outbox_relay/webhook_url.h"
#include "webhook_internal.h"
#include "webhook_secret.h"

namespace outbox::relay {

bool webhook_detail::HoldsCertificates(const std::string& path) {
  std::unique_ptr<X509_STORE, decltype(&X509_STORE_free)> store(X509_STORE_new(), &X509_STORE_free);
  const bool loaded = store && X509_STORE_load_file(store.get(), path.c_str()) == 1;
  ERR_clear_error();
  return loaded;
}

using cfg::Fail;
using cfg::Field;
using cfg::HasSpaceOrControl;
using cfg::kMaxDurationMs;
using cfg::kMsHint;
using cfg::Lowercase;
using cfg::Mapping;
using cfg::Quote;

namespace {

constexpr std::int64_t kMaxInFlight = 1024;

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
    auto number = cfg::ParseInteger(port);
    if (!number || port[0] == '+' || port[0] == '-' || *number < 1 || *number > 65535) {
      Fail(field, "has an invalid port (it must be a number from 1 to 65535)" + fix);
    }
  }
  // Whatever else the sink's parser refuses (an empty port, an IPv6 address without brackets,
  // credentials), refused here by key rather than later by destination.
  try {
    ParseWebhookUrl(url);
  } catch (const std::invalid_argument& e) {
    std::string why = e.what();
    if (why.starts_with("webhook url ")) why.erase(0, std::string("webhook url ").size());
    Fail(field, why + fix);
  }
}

std::map<std::string, std::string> ReadHeaders(const Field& field) {
  std::map<std::string, std::string> headers;
  std::map<std::string, std::string> by_lowercase;
  for (const auto& [name, value_field] : cfg::Entries(field)) {
    if (!IsHttpToken(name)) {
      Fail(value_field,
           "is not a valid HTTP header name; use letters, digits and `-`, e.g. `X-Team: billing`");
    }
    const std::string lower = Lowercase(name);
    if (const std::string why = OwnedWebhookHeader(name); !why.empty()) {
      Fail(value_field, "cannot be set here: " + why + "; remove it" +
                            (lower.starts_with("webhook-") ? " or choose another name" : ""));
    }
    if (auto it = by_lowercase.find(lower); it != by_lowercase.end()) {
      Fail(value_field,
           "repeats header `" + it->second + "` (header names ignore case); keep only one");
    }
    by_lowercase.emplace(lower, name);
    const YAML::Node& node = value_field.node;
    if (node.IsNull() || !node.IsDefined())
      Fail(value_field, "has no value; give the header a value or remove it");
    const std::string value = cfg::ReadString(value_field);
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
    std::string key;
    std::string problem = webhook_detail::CheckWebhookSecret(secrets[i], &key);
    if (problem.empty()) problem = HmacKeyLengthProblem(key.size());
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
  if (auto f = m.Get("enabled")) breaker.enabled = cfg::ReadBool(*f);
  if (auto f = m.Get("failure_threshold")) {
    breaker.failure_threshold = static_cast<int>(cfg::ReadIntegerIn(
        *f, 1, 1'000'000, ", e.g. 10",
        "consecutive failed requests (connect errors, timeouts, 5xx) that open the breaker"));
  }
  if (auto f = m.Get("cooldown_ms")) {
    breaker.cooldown = Millis{cfg::ReadIntegerIn(
        *f, 1, kMaxDurationMs, kMsHint, "how long the breaker stays open before one probe")};
  }
  if (auto f = m.Get("max_cooldown_ms")) {
    breaker.max_cooldown = Millis{cfg::ReadIntegerIn(
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
constexpr std::array<std::string_view, 23> kWebhookKeys = {"url",
                                                           "format",
                                                           "cloudevents_source",
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

void ParseWebhook(const Field& field, const EnvLookup& env, Destination& destination) {
  Mapping m(field, std::vector<std::string_view>(kWebhookKeys.begin(), kWebhookKeys.end()));
  WebhookTarget webhook;

  auto url = m.Get("url");
  if (auto endpoints = m.Get("endpoints")) {
    const std::string where = cfg::ReadNonEmptyString(*endpoints);
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
    webhook.url = cfg::ReadNonEmptyString(*url);
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
    AddSecrets(secret, cfg::ReadNonEmptyString(secret), "(written in the config)", webhook.secrets);
  } else if (secret_key == "secret_env") {
    const std::string value = cfg::ReadEnvReference(secret, env);
    AddSecrets(secret, value, "(from environment variable " + cfg::ReadString(secret) + ")",
               webhook.secrets);
  } else {
    const std::string value = cfg::ReadFileReference(secret);
    AddSecrets(secret, value, "(from file " + cfg::ReadString(secret) + ")", webhook.secrets);
  }
  if (auto previous = m.Get("previous_secrets")) {
    for (const auto& element : cfg::ReadList(*previous)) {
      AddSecrets(element, cfg::ReadNonEmptyString(element), "(in previous_secrets)",
                 webhook.secrets);
    }
  }

  if (auto f = m.Get("timeout_ms")) {
    webhook.timeout = Millis{cfg::ReadIntegerIn(*f, 1, kMaxDurationMs, kMsHint,
                                                "time limit of a whole request, in milliseconds")};
  }
  if (auto f = m.Get("connect_timeout_ms")) {
    webhook.connect_timeout = Millis{cfg::ReadIntegerIn(
        *f, 1, kMaxDurationMs, kMsHint, "time limit to establish a connection, in milliseconds")};
  }
  if (auto f = m.Get("max_in_flight")) {
    webhook.max_in_flight = static_cast<int>(cfg::ReadIntegerIn(
        *f, 1, kMaxInFlight, ", e.g. 32", "concurrent requests to this endpoint"));
  }
  if (auto f = m.Get("ca_file")) {
    const std::string path = cfg::ReadNonEmptyString(*f);
    std::string error;
    if (!cfg::ReadWholeFile(path, &error)) {
      Fail(*f,
           "cannot read " + path + ": " + error +
               "; point it at a readable PEM bundle, or remove the key to trust the system's CAs");
    }
    if (!webhook_detail::HoldsCertificates(path)) {
      Fail(*f, path +
                   " holds no certificate OpenSSL can read; point it at a PEM bundle of the CA "
                   "certificates to trust (-----BEGIN CERTIFICATE----- blocks), or remove the key "
                   "to trust the system's CAs");
    }
    webhook.ca_file = path;
  }
  if (auto f = m.Get("verify_tls")) webhook.verify_tls = cfg::ReadBool(*f);
  if (auto f = m.Get("headers")) webhook.headers = ReadHeaders(*f);
  if (auto f = m.Get("breaker")) webhook.breaker = ParseBreaker(*f);
  ReadCloudEventsFormat(m, "the Standard Webhooks headers", "ce-*", webhook.cloudevents,
                        webhook.cloudevents_source);
  if (webhook.cloudevents) {
    for (const auto& [name, value] : webhook.headers) {
      if (Lowercase(name).starts_with("ce-")) {
        Fail(*m.Get("headers"), "sets `" + name +
                                    "`, which `format: cloudevents` sets from each message; "
                                    "remove it (ce-source comes from `cloudevents_source`)");
      }
    }
  }
  if (auto f = m.Get("adaptive_concurrency")) webhook.adaptive_concurrency = cfg::ReadBool(*f);
  if (auto f = m.Get("rate_limit")) {
    webhook.rate_limit = static_cast<int>(cfg::ReadIntegerIn(
        *f, 0, 1'000'000, ", e.g. 50, or 0 for no limit", "requests per second to this endpoint"));
  }
  if (auto f = m.Get("allow_private_networks")) {
    webhook.allow_private_networks = cfg::ReadBool(*f);
  }
  if (auto f = m.Get("allowed_networks")) {
    for (const auto& element : cfg::ReadList(*f)) {
      webhook.allowed_networks.push_back(cfg::ReadNonEmptyString(element));
    }
  }
  for (const char* key : {"delivery_log", "delivery_log_retention_ms", "auto_disable_after_ms",
                          "operational_events"}) {
    if (auto f = m.Get(key); f && !webhook.endpoints_from_database) {
      Fail(*f, std::string("`") + key +
                   "` belongs to a webhook service; add `endpoints: database` or remove it");
    }
  }
  if (auto f = m.Get("delivery_log")) webhook.delivery_log = cfg::ReadBool(*f);
  if (auto f = m.Get("delivery_log_retention_ms")) {
    webhook.delivery_log_retention =
        Millis{cfg::ReadIntegerIn(*f, 1, kMaxDurationMs * 365, ", e.g. 604800000 (7 days)",
                                  "how long the delivery log keeps an attempt, in milliseconds")};
  }
  if (auto f = m.Get("auto_disable_after_ms")) {
    webhook.auto_disable_after = Millis{cfg::ReadIntegerIn(
        *f, 0, kMaxDurationMs * 365, ", e.g. 432000000 (5 days), or 0 for never",
        "how long an endpoint may keep failing before it is disabled, in milliseconds")};
  }
  if (auto f = m.Get("operational_events")) {
    webhook.operational_events = cfg::ReadNonEmptyString(*f);
  }
  destination.target = std::move(webhook);
}

std::optional<AttemptBound> WebhookAttemptBound(const Destination& d) {
  const auto& w = d.target.Get<WebhookTarget>();
  return AttemptBound{w.timeout + w.connect_timeout,
                      "destinations." + d.name + ".webhook.timeout_ms + connect_timeout_ms"};
}

// A webhook service reads its endpoints where the relay keeps its queue, and may report
// disabled endpoints to another destination of the config.
void CompleteWebhook(Destination& d, const RelayConfig& config, const std::string& source) {
  auto& w = d.target.Get<WebhookTarget>();
  if (!w.endpoints_from_database) return;
  if (config.bucket_leases) {
    // A fan-out's settle writes its endpoints' rows under locks that Store::SettleOwned does
    // not take (docs/adr/0003-bucket-leases.md).
    Fail(source, "destinations." + d.name + ".webhook.endpoints",
         "a webhook service does not take `bucket_leases` yet; remove `bucket_leases`, or serve "
         "this destination from a relay without it");
  }
  w.database_url = config.database_url;
  if (!w.operational_events.empty() && !config.destinations.count(w.operational_events)) {
    Fail(source, "destinations." + d.name + ".webhook.operational_events",
         Quote(w.operational_events) +
             " is not a destination of this config; name one that delivers the "
             "endpoint.disabled events (a Kafka topic or a webhook), or remove the key");
  }
}

}  // namespace

const TargetKind& WebhookTargetKind() {
  static const TargetKind kind{
      .key = WebhookTarget::kKind,
      .essentials = "url, secret",
      .keys = {kWebhookKeys.begin(), kWebhookKeys.end()},
      .parse = ParseWebhook,
      .attempt_bound = WebhookAttemptBound,
      .complete = CompleteWebhook,
  };
  return kind;
}

}  // namespace outbox::relay
