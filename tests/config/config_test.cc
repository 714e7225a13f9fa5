// Unit tests of the relay configuration: parsing, environment overrides, validation messages.
// No I/O except temporary files for *_file keys, ca_file and LoadConfigFile.
#include "outbox_relay/config.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <map>
#include <string>
#include <vector>

#include "outbox_relay/config_fields.h"
#include "outbox_relay/kafka_target.h"
#include "outbox_relay/sink_registry.h"
#include "outbox_relay/webhook_target.h"
#include "outbox_test/http_receiver.h"

namespace outbox::relay {
namespace {

using namespace std::chrono_literals;

// Valid Standard Webhooks secrets (the first is the spec's example).
const std::string kSecretA = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const std::string kSecretB =
    "whsec_c2Vjb25kLXNlY3JldC1rZXktMjRieXRl";  // "second-secret-key-24byte"
const std::string kSecretC =
    "whsec_dGhpcmQgc2VjcmV0IGtleSEhIDI0Ynl0";  // "third secret key!! 24byt"

EnvLookup MapEnv(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

const EnvLookup kNoEnv = MapEnv({});

::testing::AssertionResult Contains(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "expected to find [" << part << "] in [" << text << "]";
}

::testing::AssertionResult Lacks(const std::string& text, const std::string& part) {
  if (text.find(part) == std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "[" << part << "] must not appear in [" << text << "]";
}

// Parses `yaml` expecting a ConfigError; returns its message.
std::string ErrorOf(const std::string& yaml, const EnvLookup& env = kNoEnv,
                    const std::string& source = "cfg.yaml") {
  try {
    ParseConfig(yaml, source, env);
  } catch (const ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a ConfigError for:\n" << yaml;
  return "";
}

const std::string kDb = "database_url: postgresql://relay@db:5432/app\n";

// A valid config with one Kafka destination "orders"; `extra` is appended at the top level.
std::string Minimal(const std::string& extra = "") {
  return kDb +
         "destinations:\n"
         "  orders:\n"
         "    kafka:\n"
         "      brokers: k1:9092\n"
         "      topic: orders\n" +
         extra;
}

// A config whose only destination is `body`, indented under `destinations.<name>` (4 spaces).
std::string WithDestination(const std::string& name, const std::string& body,
                            const std::string& top = "") {
  return kDb + top + "destinations:\n  " + name + ":\n" + body;
}

// A webhook destination "hooks" with the given lines under `webhook:` (6 spaces of indentation).
std::string WithWebhook(const std::string& webhook_lines) {
  return WithDestination("hooks",
                         "    webhook:\n      url: https://hooks.example/outbox\n" + webhook_lines);
}

std::string WithKafka(const std::string& kafka_lines) {
  return WithDestination("orders", "    kafka:\n" + kafka_lines);
}

class TempDir {
 public:
  TempDir() {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "outbox-config-test-XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  std::string Write(const std::string& name, const std::string& content) const {
    const auto file = path_ / name;
    std::ofstream out(file, std::ios::binary);
    out << content;
    return file.string();
  }
  std::string Path(const std::string& name) const { return (path_ / name).string(); }
  std::string Root() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

// ---------------------------------------------------------------------------------------------
// Valid configs

// The loader knows no kind of target: a kind it is given reads its own section, and the
// error for a destination without one names only the kinds the loader was given.
struct QueueTarget {
  static constexpr std::string_view kKind = "queue";
  std::string name;
  Millis attempt_timeout{0};
};

const TargetKind& QueueKind() {
  static const TargetKind kind{
      .key = QueueTarget::kKind,
      .essentials = "name",
      .keys = {"name"},
      .parse =
          [](const cfg::Field& section, const EnvLookup&, Destination& d) {
            cfg::Mapping m(section, {"name"});
            auto name = m.Get("name");
            if (!name) cfg::Fail(section, "missing `name`");
            d.target = QueueTarget{cfg::ReadNonEmptyString(*name)};
          },
      .attempt_bound = [](const Destination&) -> std::optional<AttemptBound> {
        return AttemptBound{Millis{45'000}, "the queue's own bound"};
      },
      .complete =
          [](Destination& d, const RelayConfig& config, const std::string&) {
            d.target.Get<QueueTarget>().attempt_timeout = config.lease / 2;
          },
  };
  return kind;
}

TEST(TargetKinds, TheLoaderReadsAKindItDoesNotKnowThroughItsTargetKind) {
  const TargetKinds kinds = {&QueueKind()};
  const RelayConfig config = ParseConfig(
      kDb + "destinations:\n  jobs:\n    queue:\n      name: nightly\n", "cfg.yaml", kNoEnv, kinds);
  const Destination& jobs = config.destinations.at("jobs");
  EXPECT_EQ(jobs.target.kind(), "queue");
  EXPECT_EQ(jobs.target.Get<QueueTarget>().name, "nightly");
  EXPECT_EQ(jobs.target.As<KafkaTarget>(), nullptr);
  EXPECT_THROW(jobs.target.Get<WebhookTarget>(), std::logic_error);
  // The lease was derived from the kind's attempt bound, then the kind completed itself.
  EXPECT_EQ(config.lease, Millis{55'000});
  EXPECT_EQ(jobs.target.Get<QueueTarget>().attempt_timeout, Millis{27'500});

  auto error = [&](const std::string& yaml) {
    try {
      ParseConfig(yaml, "cfg.yaml", kNoEnv, kinds);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_TRUE(Contains(error(kDb + "destinations:\n  jobs:\n    retry: {max_attempts: 2}\n"),
                       "has no target; add a `queue:` section (name)"));
  EXPECT_TRUE(Contains(error(kDb + "destinations:\n  jobs:\n    name: nightly\n"),
                       "`name` belongs under `queue:`"));
  EXPECT_TRUE(Contains(error(kDb + "destinations:\n  jobs:\n    kafka: {brokers: k:9092}\n"),
                       "unknown key `kafka`"));
  // With every built-in kind, the same text is a Kafka destination.
  EXPECT_EQ(ParseConfig(Minimal(), "cfg.yaml", kNoEnv).destinations.at("orders").target.kind(),
            "kafka");
}

TEST(ParseConfig, MinimalConfigGetsEveryDefault) {
  const RelayConfig config = ParseConfig(Minimal(), "cfg.yaml", kNoEnv);
  const RelayConfig defaults;
  EXPECT_EQ(config.database_url, "postgresql://relay@db:5432/app");
  EXPECT_EQ(config.batch_size, defaults.batch_size);
  EXPECT_EQ(config.lease, defaults.lease);
  EXPECT_EQ(config.poll_interval, defaults.poll_interval);
  EXPECT_EQ(config.reap_interval, defaults.reap_interval);
  EXPECT_EQ(config.full_sweep_interval, defaults.full_sweep_interval);
  EXPECT_EQ(config.shutdown_timeout, defaults.shutdown_timeout);
  EXPECT_EQ(config.admin_listen, "");
  EXPECT_EQ(config.log_level, "info");
  EXPECT_EQ(config.log_format, LogFormat::kText);
  ASSERT_EQ(config.destinations.size(), 1u);
  const Destination& orders = config.destinations.at("orders");
  EXPECT_EQ(orders.name, "orders");
  EXPECT_EQ(orders.batch_size, 500) << "0 resolves to the global batch_size";
  EXPECT_EQ(orders.retry.max_attempts, 8) << "the built-in schedule: 7 retries";
  EXPECT_EQ(orders.retry.schedule, DefaultRetryPolicy().schedule);
  EXPECT_EQ(orders.retry.max_backoff, 10h) << "its longest delay caps Retry-After";
  const auto& kafka = orders.target.Get<KafkaTarget>();
  EXPECT_EQ(kafka.brokers, "k1:9092");
  EXPECT_EQ(kafka.topic, "orders");
  EXPECT_TRUE(kafka.producer.empty());
}

TEST(ParseConfig, FullConfigParsesEveryField) {
  TempDir dir;
  const std::string ca = outbox::testing::MakeTestPki().ca_cert_path;
  const std::string key_password = dir.Write("key-password", "s3cret-key-pass\n");
  const std::string yaml =
      "database_url: postgresql://relay@db:5432/app?sslmode=require\n"
      "batch_size: 250\n"
      "lease_ms: 45000\n"
      "poll_interval_ms: 2000\n"
      "reap_interval_ms: 7000\n"
      "full_sweep_interval_ms: 60000\n"
      "shutdown_timeout_ms: 15000\n"
      "admin_listen: 127.0.0.1:9191\n"
      "log:\n"
      "  level: debug\n"
      "  format: json\n"
      "defaults:\n"
      "  retry:\n"
      "    max_attempts: 5\n"
      "    initial_backoff_ms: 200\n"
      "    max_backoff_ms: 20000\n"
      "destinations:\n"
      "  orders:\n"
      "    kafka:\n"
      "      brokers: [k1:9092, k2:9092]\n"
      "      topic: orders.v1\n"
      "      producer:\n"
      "        compression.type: zstd\n"
      "        linger.ms: 5\n"
      "        enable.ssl.certificate.verification: true\n"
      "        sasl.password_env: KAFKA_PASSWORD\n"
      "        ssl.key.password_file: " +
      key_password +
      "\n"
      "    retry:\n"
      "      max_attempts: 20\n"
      "    batch_size: 1000\n"
      "  billing-hooks:\n"
      "    webhook:\n"
      "      url: https://billing.example:8443/hooks/outbox\n"
      "      secret_env: BILLING_SECRET\n"
      "      previous_secrets: [" +
      kSecretC +
      "]\n"
      "      timeout_ms: 8000\n"
      "      connect_timeout_ms: 2000\n"
      "      max_in_flight: 64\n"
      "      ca_file: " +
      ca +
      "\n"
      "      verify_tls: false\n"
      "      headers:\n"
      "        X-Source: outbox-relay\n"
      "        X-Team: billing\n"
      "    retry:\n"
      "      initial_backoff_ms: 1000\n"
      "      max_backoff_ms: 60000\n";
  const RelayConfig config = ParseConfig(
      yaml, "full.yaml",
      MapEnv({{"KAFKA_PASSWORD", "kafka-pw"}, {"BILLING_SECRET", kSecretA + " " + kSecretB}}));

  EXPECT_EQ(config.database_url, "postgresql://relay@db:5432/app?sslmode=require");
  EXPECT_EQ(config.batch_size, 250);
  EXPECT_EQ(config.lease, 45000ms);
  EXPECT_EQ(config.poll_interval, 2000ms);
  EXPECT_EQ(config.reap_interval, 7000ms);
  EXPECT_EQ(config.full_sweep_interval, 60000ms);
  EXPECT_EQ(config.shutdown_timeout, 15000ms);
  EXPECT_EQ(config.admin_listen, "127.0.0.1:9191");
  EXPECT_EQ(config.log_level, "debug");
  EXPECT_EQ(config.log_format, LogFormat::kJson);
  ASSERT_EQ(config.destinations.size(), 2u);

  const Destination& orders = config.destinations.at("orders");
  EXPECT_EQ(orders.name, "orders");
  EXPECT_EQ(orders.batch_size, 1000);
  EXPECT_EQ(orders.retry.max_attempts, 20);
  EXPECT_EQ(orders.retry.initial_backoff, 200ms) << "from defaults.retry";
  EXPECT_EQ(orders.retry.max_backoff, 20000ms) << "from defaults.retry";
  ASSERT_TRUE((orders.target.As<KafkaTarget>() != nullptr));
  const auto& kafka = orders.target.Get<KafkaTarget>();
  EXPECT_EQ(kafka.brokers, "k1:9092,k2:9092");
  EXPECT_EQ(kafka.topic, "orders.v1");
  const std::map<std::string, std::string> producer = {
      {"compression.type", "zstd"},
      {"linger.ms", "5"},
      {"enable.ssl.certificate.verification", "true"},
      {"sasl.password", "kafka-pw"},
      {"ssl.key.password", "s3cret-key-pass"},
  };
  EXPECT_EQ(kafka.producer, producer);

  const Destination& hooks = config.destinations.at("billing-hooks");
  EXPECT_EQ(hooks.name, "billing-hooks");
  EXPECT_EQ(hooks.batch_size, 250) << "absent: the global batch_size";
  EXPECT_EQ(hooks.retry.max_attempts, 5);
  EXPECT_EQ(hooks.retry.initial_backoff, 1000ms);
  EXPECT_EQ(hooks.retry.max_backoff, 60000ms);
  ASSERT_TRUE((hooks.target.As<WebhookTarget>() != nullptr));
  const auto& webhook = hooks.target.Get<WebhookTarget>();
  EXPECT_EQ(webhook.url, "https://billing.example:8443/hooks/outbox");
  EXPECT_EQ(webhook.secrets, (std::vector<std::string>{kSecretA, kSecretB, kSecretC}));
  EXPECT_EQ(webhook.timeout, 8000ms);
  EXPECT_EQ(webhook.connect_timeout, 2000ms);
  EXPECT_EQ(webhook.max_in_flight, 64);
  EXPECT_EQ(webhook.ca_file, ca);
  EXPECT_FALSE(webhook.verify_tls);
  EXPECT_EQ(webhook.headers, (std::map<std::string, std::string>{{"X-Source", "outbox-relay"},
                                                                 {"X-Team", "billing"}}));
}

TEST(ParseConfig, WebhookDefaults) {
  const RelayConfig config =
      ParseConfig(WithWebhook("      secret: " + kSecretA + "\n"), "cfg.yaml", kNoEnv);
  const auto& webhook = config.destinations.at("hooks").target.Get<WebhookTarget>();
  const WebhookTarget defaults;
  EXPECT_EQ(webhook.secrets, std::vector<std::string>{kSecretA});
  EXPECT_EQ(webhook.timeout, defaults.timeout);
  EXPECT_EQ(webhook.connect_timeout, defaults.connect_timeout);
  EXPECT_EQ(webhook.max_in_flight, defaults.max_in_flight);
  EXPECT_FALSE(webhook.ca_file.has_value());
  EXPECT_TRUE(webhook.verify_tls);
  EXPECT_TRUE(webhook.headers.empty());
}

TEST(ParseConfig, RetryFallsBackPerKeyFromDestinationToDefaultsToBuiltIn) {
  const std::string yaml = kDb +
                           "defaults:\n"
                           "  retry:\n"
                           "    initial_backoff_ms: 50\n"
                           "destinations:\n"
                           "  a:\n"
                           "    kafka: {brokers: k:9092, topic: a}\n"
                           "    retry: {max_attempts: 3}\n"
                           "  b:\n"
                           "    kafka: {brokers: k:9092, topic: b}\n";
  const RelayConfig config = ParseConfig(yaml, "cfg.yaml", kNoEnv);
  const RetryPolicy& a = config.destinations.at("a").retry;
  EXPECT_EQ(a.max_attempts, 3);
  EXPECT_EQ(a.initial_backoff, 50ms);
  EXPECT_EQ(a.max_backoff, RetryPolicy{}.max_backoff);
  const RetryPolicy& b = config.destinations.at("b").retry;
  EXPECT_EQ(b.max_attempts, RetryPolicy{}.max_attempts);
  EXPECT_EQ(b.initial_backoff, 50ms);
  EXPECT_EQ(b.max_backoff, RetryPolicy{}.max_backoff);
}

TEST(ParseConfig, WebhookBreakerAndAdaptiveConcurrency) {
  const RelayConfig defaults =
      ParseConfig(WithWebhook("      secret: " + kSecretA + "\n"), "cfg.yaml", kNoEnv);
  const auto& d = defaults.destinations.at("hooks").target.Get<WebhookTarget>();
  EXPECT_TRUE(d.breaker.enabled);
  EXPECT_EQ(d.breaker.failure_threshold, 10);
  EXPECT_EQ(d.breaker.cooldown, 5000ms);
  EXPECT_EQ(d.breaker.max_cooldown, 300000ms);
  EXPECT_TRUE(d.adaptive_concurrency);

  const RelayConfig set = ParseConfig(
      WithWebhook("      secret: " + kSecretA +
                  "\n      breaker: {enabled: false, failure_threshold: 3, cooldown_ms: 100, "
                  "max_cooldown_ms: 800}\n      adaptive_concurrency: off\n"),
      "cfg.yaml", kNoEnv);
  const auto& w = set.destinations.at("hooks").target.Get<WebhookTarget>();
  EXPECT_FALSE(w.breaker.enabled);
  EXPECT_EQ(w.breaker.failure_threshold, 3);
  EXPECT_EQ(w.breaker.cooldown, 100ms);
  EXPECT_EQ(w.breaker.max_cooldown, 800ms);
  EXPECT_FALSE(w.adaptive_concurrency);

  std::string message = ErrorOf(WithWebhook(
      "      secret: " + kSecretA + "\n      breaker: {cooldown_ms: 9000, max_cooldown_ms: 10}\n"));
  EXPECT_TRUE(Contains(message,
                       "destinations.hooks.webhook.breaker: cooldown_ms 9000 is greater "
                       "than max_cooldown_ms 10; lower cooldown_ms or raise "
                       "max_cooldown_ms"))
      << message;
  message = ErrorOf(
      WithWebhook("      secret: " + kSecretA + "\n      breaker: {failure_treshold: 3}\n"));
  EXPECT_TRUE(Contains(message, "failure_threshold")) << "suggests the known key: " << message;
  message = ErrorOf(
      WithWebhook("      secret: " + kSecretA + "\n      breaker: {failure_threshold: 0}\n"));
  EXPECT_TRUE(Contains(message,
                       "destinations.hooks.webhook.breaker.failure_threshold: 0 is out "
                       "of range"))
      << message;
}

TEST(ParseConfig, KafkaTopicTemplatesAndTheirAllowList) {
  const RelayConfig config =
      ParseConfig(WithKafka("      brokers: k:9092\n      topic: \"orders.{event_type}\"\n"
                            "      allowed_topics: [orders.paid, orders.shipped]\n"
                            "      topic_prefix: orders.\n"),
                  "cfg.yaml", kNoEnv);
  const auto& k = config.destinations.at("orders").target.Get<KafkaTarget>();
  EXPECT_EQ(k.topic, "orders.{event_type}") << "a template is checked by the Kafka sink";
  EXPECT_EQ(k.allowed_topics, (std::vector<std::string>{"orders.paid", "orders.shipped"}));
  EXPECT_EQ(k.topic_prefix, "orders.");
  const std::string message = ErrorOf(
      WithKafka("      brokers: k:9092\n      topic: t\n      allowed_topics: [\"a b\"]\n"));
  EXPECT_TRUE(Contains(message, "destinations.orders.kafka.allowed_topics[0]")) << message;
  EXPECT_TRUE(Contains(message, "is not a valid Kafka topic name")) << message;
}

TEST(ParseConfig, RecordKeyHeaderAndCloudEventsFormat) {
  const RelayConfig plain =
      ParseConfig(WithKafka("      brokers: k:9092\n      topic: orders\n"), "cfg.yaml", kNoEnv);
  const auto& p = plain.destinations.at("orders").target.Get<KafkaTarget>();
  EXPECT_EQ(p.key_header, "");
  EXPECT_FALSE(p.cloudevents);
  const RelayConfig ce = ParseConfig(
      WithKafka("      brokers: k:9092\n      topic: orders\n      key_header: tenant\n"
                "      format: cloudevents\n      cloudevents_source: //shop.example/outbox\n"),
      "cfg.yaml", kNoEnv);
  const auto& k = ce.destinations.at("orders").target.Get<KafkaTarget>();
  EXPECT_EQ(k.key_header, "tenant");
  EXPECT_TRUE(k.cloudevents);
  EXPECT_EQ(k.cloudevents_source, "//shop.example/outbox");
  const RelayConfig hook =
      ParseConfig(WithWebhook("      secret: " + kSecretA + "\n      format: cloudevents\n"),
                  "cfg.yaml", kNoEnv);
  EXPECT_TRUE(hook.destinations.at("hooks").target.Get<WebhookTarget>().cloudevents);

  EXPECT_TRUE(Contains(
      ErrorOf(WithKafka("      brokers: k:9092\n      topic: orders\n      format: cloudevent\n")),
      "destinations.orders.kafka.format: `cloudevent` is not allowed here (did you mean "
      "`cloudevents`?); use one of `plain`, `cloudevents`"));
  EXPECT_TRUE(Contains(ErrorOf(WithKafka("      brokers: k:9092\n      topic: orders\n"
                                         "      cloudevents_source: //x\n")),
                       "cloudevents_source: needs `format: cloudevents`"));
  EXPECT_TRUE(Contains(ErrorOf(WithKafka("      brokers: k:9092\n      topic: orders\n"
                                         "      key_header: \"two words\"\n")),
                       "key_header: is not a header name"));
  EXPECT_TRUE(Contains(ErrorOf(WithWebhook("      secret: " + kSecretA +
                                           "\n      format: cloudevents\n"
                                           "      headers: {ce-source: mine}\n")),
                       "sets `ce-source`, which `format: cloudevents` sets from each message"));
}

TEST(ParseConfig, ExactlyOnceKafkaNeedsPartitionedClaims) {
  const std::string kafka =
      "      brokers: k:9092\n      topic: orders\n      delivery: exactly_once\n";
  const RelayConfig config = ParseConfig(
      "claim_mode: partitioned\n" + WithKafka(kafka + "      transactional_id_prefix: billing\n"),
      "cfg.yaml", kNoEnv);
  const auto& k = config.destinations.at("orders").target.Get<KafkaTarget>();
  EXPECT_TRUE(k.exactly_once);
  EXPECT_EQ(k.transactional_id_prefix, "billing");
  const RelayConfig plain_config =
      ParseConfig(WithKafka("      brokers: k:9092\n      topic: orders\n"), "cfg.yaml", kNoEnv);
  const auto& plain = plain_config.destinations.at("orders").target.Get<KafkaTarget>();
  EXPECT_FALSE(plain.exactly_once) << "at least once by default";
  EXPECT_EQ(plain.transactional_id_prefix, "outbox-relay");

  // skip_locked: no relay owns the rows it claims, so nothing could fence a stalled relay.
  const std::string message = ErrorOf(WithKafka(kafka));
  EXPECT_TRUE(Contains(message,
                       "destinations.orders.kafka.delivery: exactly_once needs "
                       "`claim_mode: partitioned`"))
      << message;
  EXPECT_TRUE(Contains(message, "or use `delivery: at_least_once`")) << message;
  EXPECT_TRUE(Contains(
      ErrorOf("claim_mode: partitioned\n" + WithKafka("      brokers: k:9092\n      topic: orders\n"
                                                      "      delivery: exactly-once\n")),
      "did you mean `exactly_once`?"));
  EXPECT_TRUE(Contains(ErrorOf("claim_mode: partitioned\n" +
                               WithKafka(kafka + "      transactional_id_prefix: \"a b\"\n")),
                       "transactional_id_prefix: contains whitespace"));
  // Read and ignored without `delivery: exactly_once`: a config that forgot `delivery` looked
  // transactional (review).
  for (const std::string delivery : {"", "      delivery: at_least_once\n"}) {
    const std::string e = ErrorOf(WithKafka("      brokers: k:9092\n      topic: orders\n" +
                                            delivery + "      transactional_id_prefix: billing\n"));
    EXPECT_TRUE(Contains(e, "transactional_id_prefix: is used only with `delivery: exactly_once`"))
        << e;
  }
}

TEST(ParseConfig, WebhookPrivateNetworkKeys) {
  const RelayConfig defaults =
      ParseConfig(WithWebhook("      secret: " + kSecretA + "\n"), "cfg.yaml", kNoEnv);
  const auto& d = defaults.destinations.at("hooks").target.Get<WebhookTarget>();
  EXPECT_FALSE(d.allow_private_networks) << "the SSRF guard is on by default";
  EXPECT_TRUE(d.allowed_networks.empty());
  const RelayConfig set = ParseConfig(
      WithWebhook("      secret: " + kSecretA +
                  "\n      allow_private_networks: true\n      allowed_networks: [10.0.0.0/8, "
                  "\"fd00::/8\"]\n"),
      "cfg.yaml", kNoEnv);
  const auto& w = set.destinations.at("hooks").target.Get<WebhookTarget>();
  EXPECT_TRUE(w.allow_private_networks);
  EXPECT_EQ(w.allowed_networks, (std::vector<std::string>{"10.0.0.0/8", "fd00::/8"}));
  const std::string message =
      ErrorOf(WithWebhook("      secret: " + kSecretA + "\n      allowed_networks: {a: 1}\n"));
  EXPECT_TRUE(Contains(message, "destinations.hooks.webhook.allowed_networks: expected a list"))
      << message;
}

TEST(ParseConfig, AWebhookServiceTakesItsEndpointsFromTheDatabase) {
  const RelayConfig config = ParseConfig(
      WithDestination("svc", "    webhook:\n      endpoints: database\n      max_in_flight: 8\n"),
      "cfg.yaml", kNoEnv);
  const auto& w = config.destinations.at("svc").target.Get<WebhookTarget>();
  EXPECT_TRUE(w.endpoints_from_database);
  EXPECT_TRUE(w.url.empty());
  EXPECT_TRUE(w.secrets.empty());
  EXPECT_EQ(w.max_in_flight, 8);
  EXPECT_EQ(w.database_url, config.database_url) << "where the service reads its endpoints";

  std::string message =
      ErrorOf(WithWebhook("      secret: " + kSecretA + "\n      endpoints: database\n"));
  EXPECT_TRUE(Contains(message, "destinations.hooks.webhook.url")) << message;
  EXPECT_TRUE(Contains(message, "takes each endpoint's url and secrets from outbox.endpoints"))
      << message;
  message = ErrorOf(WithDestination(
      "svc", "    webhook:\n      endpoints: database\n      secret: " + kSecretA + "\n"));
  EXPECT_TRUE(Contains(message, "remove `secret`")) << message;
  message = ErrorOf(WithDestination("svc", "    webhook:\n      endpoints: yaml\n"));
  EXPECT_TRUE(Contains(message, "`yaml` is not a source of endpoints")) << message;
  EXPECT_TRUE(Contains(message, "endpoints: database")) << message;
}

TEST(ParseConfig, WebhookServiceOptionsAndTheManagementApi) {
  const std::string service =
      "    webhook:\n      endpoints: database\n      delivery_log: false\n"
      "      delivery_log_retention_ms: 3600000\n      auto_disable_after_ms: 0\n"
      "      operational_events: orders\n"
      "  orders:\n    kafka:\n      brokers: k:9092\n      topic: t\n";
  const RelayConfig config =
      ParseConfig(WithDestination("svc", service) +
                      "management_api: {listen: \"127.0.0.1:8081\", token_env: API_TOKEN}\n",
                  "cfg.yaml", MapEnv({{"API_TOKEN", "0123456789abcdef-token\n"}}));
  const auto& w = config.destinations.at("svc").target.Get<WebhookTarget>();
  EXPECT_FALSE(w.delivery_log);
  EXPECT_EQ(w.delivery_log_retention, 3600000ms);
  EXPECT_EQ(w.auto_disable_after, 0ms);
  EXPECT_EQ(w.operational_events, "orders");
  EXPECT_EQ(config.management_api.listen, "127.0.0.1:8081");
  EXPECT_EQ(config.management_api.token, "0123456789abcdef-token") << "trailing newline trimmed";
  const RelayConfig defaults = ParseConfig(
      WithDestination("svc", "    webhook:\n      endpoints: database\n"), "cfg.yaml", kNoEnv);
  const auto& d = defaults.destinations.at("svc").target.Get<WebhookTarget>();
  EXPECT_TRUE(d.delivery_log);
  EXPECT_EQ(d.delivery_log_retention, std::chrono::hours(24 * 7));
  EXPECT_EQ(d.auto_disable_after, std::chrono::hours(24 * 5));
  EXPECT_TRUE(defaults.management_api.listen.empty()) << "off unless configured";

  std::string message =
      ErrorOf(WithWebhook("      secret: " + kSecretA + "\n      auto_disable_after_ms: 1000\n"));
  EXPECT_TRUE(Contains(message, "`auto_disable_after_ms` belongs to a webhook service")) << message;
  message = ErrorOf(WithDestination(
      "svc", "    webhook:\n      endpoints: database\n      operational_events: nowhere\n"));
  EXPECT_TRUE(Contains(message, "`nowhere` is not a destination of this config")) << message;
  message = ErrorOf(WithKafka("      brokers: k:9092\n      topic: t\n") +
                        "management_api: {listen: \"127.0.0.1:8081\", token_env: API_TOKEN}\n",
                    MapEnv({{"API_TOKEN", "short"}}));
  EXPECT_TRUE(Contains(message, "the management API token is 5 characters long")) << message;
  message = ErrorOf(WithKafka("      brokers: k:9092\n      topic: t\n") +
                    "management_api: {listen: \"127.0.0.1:8081\"}\n");
  EXPECT_TRUE(Contains(message, "set exactly one of `token_env`")) << message;
  message = ErrorOf(WithKafka("      brokers: k:9092\n      topic: t\n") +
                    "management_api: {token_env: API_TOKEN}\n");
  EXPECT_TRUE(Contains(message, "missing `listen`")) << message;
  message = ErrorOf(WithKafka("      brokers: k:9092\n      topic: t\n") +
                        "management_api: {listen: nowhere, token_env: API_TOKEN}\n",
                    MapEnv({{"API_TOKEN", "0123456789abcdef"}}));
  EXPECT_TRUE(Contains(message, "management_api.listen")) << message;
}

TEST(ParseConfig, TheBuiltInRetryIsAScheduleOfAboutADay) {
  const RetryPolicy p = DefaultRetryPolicy();
  EXPECT_EQ(p.schedule, (std::vector<Millis>{5s, 5min, 30min, 2h, 5h, 10h, 10h}));
  EXPECT_EQ(p.max_attempts, 8);
}

TEST(ParseConfig, RetryScheduleTakesItsShapeFromTheMostSpecificLevel) {
  const std::string yaml = kDb +
                           "defaults:\n"
                           "  retry: {schedule_ms: [1000, 60000], max_attempts: 5}\n"
                           "destinations:\n"
                           "  a:\n"
                           "    kafka: {brokers: k:9092, topic: a}\n"
                           "  b:\n"
                           "    kafka: {brokers: k:9092, topic: b}\n"
                           "    retry: {max_backoff_ms: 4000}\n"
                           "  c:\n"
                           "    kafka: {brokers: k:9092, topic: c}\n"
                           "    retry: {schedule_ms: [10, 20, 30]}\n";
  const RelayConfig config = ParseConfig(yaml, "cfg.yaml", kNoEnv);
  const RetryPolicy& a = config.destinations.at("a").retry;
  EXPECT_EQ(a.schedule, (std::vector<Millis>{1000ms, 60000ms})) << "from defaults.retry";
  EXPECT_EQ(a.max_attempts, 5) << "max_attempts falls back on its own";
  EXPECT_EQ(a.max_backoff, 60000ms) << "a schedule's longest delay";
  const RetryPolicy& b = config.destinations.at("b").retry;
  EXPECT_TRUE(b.schedule.empty()) << "a backoff key at the destination makes it exponential";
  EXPECT_EQ(b.max_backoff, 4000ms);
  EXPECT_EQ(b.initial_backoff, RetryPolicy{}.initial_backoff);
  EXPECT_EQ(b.max_attempts, 5);
  const RetryPolicy& c = config.destinations.at("c").retry;
  EXPECT_EQ(c.schedule, (std::vector<Millis>{10ms, 20ms, 30ms}));
  EXPECT_EQ(c.max_attempts, 5) << "defaults.retry.max_attempts, not the schedule's length + 1";

  const RelayConfig own = ParseConfig(
      Minimal("defaults: {retry: {schedule_ms: [100, 200, 300]}}\n"), "cfg.yaml", kNoEnv);
  EXPECT_EQ(own.destinations.at("orders").retry.max_attempts, 4) << "one more than the delays";
}

TEST(ParseConfig, BadRetrySchedulesNameTheKeyAndTheFix) {
  std::string message = ErrorOf(Minimal("defaults: {retry: {schedule_ms: []}}\n"));
  EXPECT_TRUE(Contains(message, "defaults.retry.schedule_ms: is empty; list at least one delay"))
      << message;
  message = ErrorOf(Minimal("defaults: {retry: {schedule_ms: 5000}}\n"));
  EXPECT_TRUE(Contains(message, "defaults.retry.schedule_ms: must be a list of delays")) << message;
  message = ErrorOf(Minimal("defaults: {retry: {schedule_ms: [5000, soon]}}\n"));
  EXPECT_TRUE(Contains(message, "defaults.retry.schedule_ms[1]")) << message;
  message = ErrorOf(Minimal("defaults: {retry: {schedule_ms: [-1]}}\n"));
  EXPECT_TRUE(Contains(message, "-1 is out of range")) << message;
  message = ErrorOf(Minimal("defaults: {retry: {schedule_ms: [5000], max_backoff_ms: 9000}}\n"));
  EXPECT_TRUE(Contains(message, "cannot be combined with initial_backoff_ms or max_backoff_ms"))
      << message;
}

TEST(ParseConfig, ZeroBackoffIsAllowedForImmediateRetries) {
  const RelayConfig config =
      ParseConfig(Minimal("defaults: {retry: {initial_backoff_ms: 0, max_backoff_ms: 0}}\n"),
                  "cfg.yaml", kNoEnv);
  EXPECT_EQ(config.destinations.at("orders").retry.initial_backoff, 0ms);
  EXPECT_EQ(config.destinations.at("orders").retry.max_backoff, 0ms);
}

TEST(ParseConfig, DestinationBatchSizeZeroMeansGlobal) {
  const RelayConfig config = ParseConfig(
      WithDestination("orders", "    kafka: {brokers: k:9092, topic: o}\n    batch_size: 0\n",
                      "batch_size: 42\n"),
      "cfg.yaml", kNoEnv);
  EXPECT_EQ(config.destinations.at("orders").batch_size, 42);
}

// max_in_flight_bytes: the relay's (64 MiB unless set; the environment wins over the file; 0
// for no limit), which a destination's own replaces; what no byte count can be is refused
// naming the key and the range.
TEST(ParseConfig, MaxInFlightBytes) {
  const RelayConfig defaults = ParseConfig(Minimal(), "cfg.yaml", kNoEnv);
  EXPECT_EQ(defaults.max_in_flight_bytes, 64 * 1024 * 1024);
  EXPECT_EQ(defaults.destinations.at("orders").max_in_flight_bytes, 64 * 1024 * 1024)
      << "absent: the relay's";
  const std::string two =
      "destinations:\n"
      "  orders:\n"
      "    kafka: {brokers: k:9092, topic: o}\n"
      "    max_in_flight_bytes: 1048576\n"
      "  audit:\n"
      "    kafka: {brokers: k:9092, topic: a}\n"
      "    max_in_flight_bytes: 0\n";
  const RelayConfig set =
      ParseConfig(kDb + "max_in_flight_bytes: 8388608\n" + two, "cfg.yaml", kNoEnv);
  EXPECT_EQ(set.max_in_flight_bytes, 8388608);
  EXPECT_EQ(set.destinations.at("orders").max_in_flight_bytes, 1048576) << "its own wins";
  EXPECT_EQ(set.destinations.at("audit").max_in_flight_bytes, 8388608) << "0: the relay's";
  const RelayConfig from_env = ParseConfig(kDb + "max_in_flight_bytes: 8388608\n" + two, "cfg.yaml",
                                           MapEnv({{"OUTBOX_MAX_IN_FLIGHT_BYTES", "0"}}));
  EXPECT_EQ(from_env.max_in_flight_bytes, 0) << "the environment overrides the file";
  EXPECT_EQ(from_env.destinations.at("audit").max_in_flight_bytes, 0) << "no limit";
  for (const char* bad : {"-1", "1099511627777"}) {
    const auto message = ErrorOf(Minimal(std::string("max_in_flight_bytes: ") + bad + "\n"));
    EXPECT_TRUE(Contains(message, "max_in_flight_bytes")) << message;
    EXPECT_TRUE(Contains(message, "between 0 and 1099511627776")) << message;
  }
  const auto message = ErrorOf(WithDestination(
      "orders", "    kafka: {brokers: k:9092, topic: o}\n    max_in_flight_bytes: lots\n"));
  EXPECT_TRUE(Contains(message, "destinations.orders.max_in_flight_bytes")) << message;
}

TEST(ParseConfig, AdminListenAcceptsHostPortAndBracketedIpv6) {
  for (const std::string address :
       {"0.0.0.0:9090", "localhost:1", "[::1]:65535", "admin.internal:8080"}) {
    const RelayConfig config =
        ParseConfig(Minimal("admin_listen: \"" + address + "\"\n"), "cfg.yaml", kNoEnv);
    EXPECT_EQ(config.admin_listen, address);
  }
  EXPECT_EQ(ParseConfig(Minimal("admin_listen: \"\"\n"), "cfg.yaml", kNoEnv).admin_listen, "")
      << "empty = off";
}

TEST(ParseConfig, AcceptsConninfoStyleDatabaseUrl) {
  const std::string yaml =
      "database_url: host=db dbname=app user=relay\n"
      "destinations: {orders: {kafka: {brokers: k:9092, topic: o}}}\n";
  EXPECT_EQ(ParseConfig(yaml, "cfg.yaml", kNoEnv).database_url, "host=db dbname=app user=relay");
}

TEST(ParseConfig, KafkaBrokersStringIsNormalized) {
  const RelayConfig config = ParseConfig(
      WithKafka("      brokers: \" k1:9092 , k2:9092\"\n      topic: o\n"), "cfg.yaml", kNoEnv);
  EXPECT_EQ(config.destinations.at("orders").target.Get<KafkaTarget>().brokers, "k1:9092,k2:9092");
}

TEST(ParseConfig, ProducerValuesAreStringifiedAsWritten) {
  const RelayConfig config =
      ParseConfig(WithKafka("      brokers: k:9092\n      topic: o\n      producer:\n"
                            "        linger.ms: 5\n"
                            "        batch.num.messages: 10000\n"
                            "        enable.ssl.certificate.verification: False\n"
                            "        socket.keepalive.enable: TRUE\n"
                            "        client.id: \"true\"\n"
                            "        sticky.partitioning.linger.ms: 0.5\n"),
                  "cfg.yaml", kNoEnv);
  const auto& producer = config.destinations.at("orders").target.Get<KafkaTarget>().producer;
  EXPECT_EQ(producer.at("linger.ms"), "5");
  EXPECT_EQ(producer.at("batch.num.messages"), "10000");
  EXPECT_EQ(producer.at("enable.ssl.certificate.verification"), "false");
  EXPECT_EQ(producer.at("socket.keepalive.enable"), "true");
  EXPECT_EQ(producer.at("client.id"), "true");
  EXPECT_EQ(producer.at("sticky.partitioning.linger.ms"), "0.5");
}

// A property whose own name begins with `topic.` (topic.metadata.refresh.interval.ms and the
// other topic.metadata.* settings) is librdkafka's global property of that name: librdkafka
// strips the prefix only from a name it does not know. The relay stripped it always, and
// refused the config naming a property nobody wrote (review).
TEST(ParseConfig, AGlobalPropertyWhoseNameBeginsWithTopicKeepsItsName) {
  const RelayConfig config =
      ParseConfig(WithKafka("      brokers: k:9092\n      topic: o\n      producer:\n"
                            "        topic.metadata.refresh.interval.ms: 60000\n"
                            "        topic.blacklist: \"^_.*\"\n"
                            "        topic.message.timeout.ms: 20000\n"),
                  "cfg.yaml", kNoEnv);
  const auto& producer = config.destinations.at("orders").target.Get<KafkaTarget>().producer;
  EXPECT_EQ(producer.count("topic.metadata.refresh.interval.ms"), 1u);
  // One whose default is unset: librdkafka's conf_get knows it only once it is set, and the
  // relay took it for a topic property `blacklist`, which does not exist (review).
  EXPECT_EQ(producer.count("topic.blacklist"), 1u);
  EXPECT_EQ(producer.count("metadata.refresh.interval.ms"), 0u);
  EXPECT_EQ(producer.count("message.timeout.ms"), 1u) << "a topic property, without the prefix";
}

TEST(ParseConfig, ProducerFileValueKeepsInnerNewlinesAndDropsTrailingOnes) {
  TempDir dir;
  const std::string pem =
      dir.Write("key.pem", "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\r\n\n");
  const RelayConfig config = ParseConfig(
      WithKafka(
          "      brokers: k:9092\n      topic: o\n      producer:\n        ssl.key.pem_file: " +
          pem + "\n"),
      "cfg.yaml", kNoEnv);
  EXPECT_EQ(config.destinations.at("orders").target.Get<KafkaTarget>().producer.at("ssl.key.pem"),
            "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----");
}

TEST(ParseConfig, MergeKeysShareSettingsBetweenDestinations) {
  const std::string yaml = kDb +
                           "destinations:\n"
                           "  a:\n"
                           "    kafka:\n"
                           "      brokers: k:9092\n"
                           "      topic: a\n"
                           "      producer: &common\n"
                           "        compression.type: zstd\n"
                           "        linger.ms: 5\n"
                           "  b:\n"
                           "    kafka:\n"
                           "      brokers: k:9092\n"
                           "      topic: b\n"
                           "      producer:\n"
                           "        <<: *common\n"
                           "        linger.ms: 20\n";
  const RelayConfig config = ParseConfig(yaml, "cfg.yaml", kNoEnv);
  const auto& b = config.destinations.at("b").target.Get<KafkaTarget>().producer;
  EXPECT_EQ(
      b, (std::map<std::string, std::string>{{"compression.type", "zstd"}, {"linger.ms", "20"}}));
}

TEST(ParseConfig, DestinationNameLimitCountsCharactersNotBytes) {
  std::string name;
  for (int i = 0; i < 255; ++i) name += "\xC3\xA9";  // "é": 2 bytes, 1 character
  const RelayConfig config =
      ParseConfig(WithDestination("\"" + name + "\"", "    kafka: {brokers: k:9092, topic: o}\n"),
                  "cfg.yaml", kNoEnv);
  EXPECT_EQ(config.destinations.count(name), 1u);
}

TEST(ParseConfig, EmptyEnvLookupIsAnEmptyEnvironment) {
  EXPECT_EQ(ParseConfig(Minimal(), "cfg.yaml", EnvLookup{}).batch_size, 500);
}

// ---------------------------------------------------------------------------------------------
// Environment

TEST(EnvOverrides, WinOverTheFile) {
  const std::string yaml = Minimal(
      "batch_size: 100\nlease_ms: 5000\npoll_interval_ms: 100\nadmin_listen: 127.0.0.1:1\n"
      "log: {level: info, format: text}\n");
  const RelayConfig config =
      ParseConfig(yaml, "cfg.yaml",
                  MapEnv({{"OUTBOX_DATABASE_URL", "postgresql://other@db2/app"},
                          {"OUTBOX_BATCH_SIZE", "700"},
                          {"OUTBOX_LEASE_MS", "60000"},
                          {"OUTBOX_POLL_INTERVAL_MS", "250"},
                          {"OUTBOX_ADMIN_LISTEN", "0.0.0.0:9999"},
                          {"OUTBOX_LOG_LEVEL", "warn"},
                          {"OUTBOX_LOG_FORMAT", "json"}}));
  EXPECT_EQ(config.database_url, "postgresql://other@db2/app");
  EXPECT_EQ(config.batch_size, 700);
  EXPECT_EQ(config.lease, 60000ms);
  EXPECT_EQ(config.poll_interval, 250ms);
  EXPECT_EQ(config.admin_listen, "0.0.0.0:9999");
  EXPECT_EQ(config.log_level, "warn");
  EXPECT_EQ(config.log_format, LogFormat::kJson);
  EXPECT_EQ(config.destinations.at("orders").batch_size, 700)
      << "destinations inherit the overridden batch_size";
}

TEST(EnvOverrides, EmptyVariablesCountAsUnset) {
  const RelayConfig config =
      ParseConfig(Minimal("batch_size: 100\n"), "cfg.yaml",
                  MapEnv({{"OUTBOX_BATCH_SIZE", ""}, {"OUTBOX_DATABASE_URL", ""}}));
  EXPECT_EQ(config.batch_size, 100);
  EXPECT_EQ(config.database_url, "postgresql://relay@db:5432/app");
}

TEST(EnvOverrides, DatabaseUrlFromEnvAloneIsEnough) {
  const std::string yaml = "destinations: {orders: {kafka: {brokers: k:9092, topic: o}}}\n";
  const RelayConfig config = ParseConfig(
      yaml, "cfg.yaml", MapEnv({{"OUTBOX_DATABASE_URL", "postgresql://relay:pw@db/app"}}));
  EXPECT_EQ(config.database_url, "postgresql://relay:pw@db/app");
}

// A value from the environment keeps no trailing newline, as one read from a file does not:
// a Kubernetes Secret made with `echo url | base64` ends in one, and libpq took the database
// "app\n", which does not exist, while check-config said ok (found in review).
TEST(EnvOverrides, ATrailingNewlineIsNotPartOfTheValue) {
  const std::string yaml =
      "destinations: {orders: {kafka: {brokers: k:9092, topic: o, producer: "
      "{sasl.password_env: KAFKA_PASSWORD}}}}\n";
  const RelayConfig config =
      ParseConfig(yaml, "cfg.yaml",
                  MapEnv({{"OUTBOX_DATABASE_URL", "postgresql://relay:pw@db/app\n"},
                          {"KAFKA_PASSWORD", "s3cret\r\n"}}));
  EXPECT_EQ(config.database_url, "postgresql://relay:pw@db/app");
  EXPECT_EQ(config.destinations.at("orders").target.Get<KafkaTarget>().producer.at("sasl.password"),
            "s3cret");
}

TEST(EnvOverrides, BadOverrideNamesTheVariableAndTheKey) {
  const std::string message = ErrorOf(Minimal(), MapEnv({{"OUTBOX_BATCH_SIZE", "lots"}}));
  EXPECT_TRUE(Contains(message, "environment variable OUTBOX_BATCH_SIZE"));
  EXPECT_TRUE(Contains(message, "batch_size"));
  EXPECT_TRUE(Contains(message, "expected an integer"));
  EXPECT_TRUE(Contains(message, "`lots`"));
}

TEST(EnvOverrides, OverriddenValuesAreValidatedWithTheirOrigin) {
  std::string message = ErrorOf(Minimal(), MapEnv({{"OUTBOX_LEASE_MS", "10"}}));
  EXPECT_TRUE(
      Contains(message, "environment variable OUTBOX_LEASE_MS: lease_ms: 10 is out of range"));
  EXPECT_TRUE(Contains(message, "between 1000 and"));

  message = ErrorOf(Minimal(), MapEnv({{"OUTBOX_LOG_LEVEL", "loud"}}));
  EXPECT_TRUE(Contains(message, "environment variable OUTBOX_LOG_LEVEL: log.level"));
  EXPECT_TRUE(Contains(message, "trace, debug, info, warn, error"));

  message = ErrorOf(Minimal(), MapEnv({{"OUTBOX_LOG_FORMAT", "xml"}}));
  EXPECT_TRUE(Contains(message, "environment variable OUTBOX_LOG_FORMAT: log.format"));

  message = ErrorOf(Minimal(), MapEnv({{"OUTBOX_ADMIN_LISTEN", "9090"}}));
  EXPECT_TRUE(Contains(message, "environment variable OUTBOX_ADMIN_LISTEN: admin_listen"));
  EXPECT_TRUE(Contains(message, "has no port"));
}

TEST(EnvOverrides, OverrideRescuesAnInvalidFileValue) {
  // Range checks run after the overrides, so the value in force is the one checked.
  const RelayConfig config =
      ParseConfig(Minimal("lease_ms: 10\n"), "cfg.yaml", MapEnv({{"OUTBOX_LEASE_MS", "2000"}}));
  EXPECT_EQ(config.lease, 2000ms);
}

TEST(DatabaseUrl, FromEnvReference) {
  const std::string yaml =
      "database_url_env: APP_DB\ndestinations: {orders: {kafka: {brokers: k:9092, topic: o}}}\n";
  EXPECT_EQ(ParseConfig(yaml, "cfg.yaml", MapEnv({{"APP_DB", "postgresql://a@b/c"}})).database_url,
            "postgresql://a@b/c");
  const std::string message = ErrorOf(yaml);
  EXPECT_TRUE(
      Contains(message, "cfg.yaml:1:1: database_url_env: environment variable APP_DB is not set"));
  EXPECT_TRUE(Contains(message, "export APP_DB"));
}

TEST(DatabaseUrl, FromFileReference) {
  TempDir dir;
  const std::string file = dir.Write("db-url", "postgresql://relay:pw@db/app\n");
  const std::string yaml = "database_url_file: " + file +
                           "\ndestinations: {orders: {kafka: {brokers: k:9092, topic: o}}}\n";
  EXPECT_EQ(ParseConfig(yaml, "cfg.yaml", kNoEnv).database_url, "postgresql://relay:pw@db/app");

  const std::string missing = dir.Path("nope");
  const std::string message =
      ErrorOf("database_url_file: " + missing +
              "\ndestinations: {orders: {kafka: {brokers: k:9092, topic: o}}}\n");
  EXPECT_TRUE(Contains(
      message, "database_url_file: cannot read file " + missing + ": No such file or directory"));
}

// An operator command (pause, dlq, status, migrate, endpoints) with --config needs only the
// database: it read the whole file, and failed on a destination's secret its environment did
// not have (the migration job had to be given the webhook secret to migrate).
TEST(DatabaseUrl, OperatorCommandsReadOnlyTheDatabaseFromTheConfigFile) {
  TempDir dir;
  const std::string file = dir.Write(
      "relay.yaml",
      "database_url_env: APP_DB\n"
      "destinations:\n"
      "  orders: {kafka: {brokers: k:9092, topic: o, producer: {sasl.password_env: KAFKA_PW}}}\n");
  const auto env = MapEnv({{"APP_DB", "postgresql://relay@db/app"}});
  EXPECT_THROW(LoadConfigFile(file, env), ConfigError) << "the relay itself needs KAFKA_PW";
  EXPECT_EQ(LoadDatabaseUrl(file, env), "postgresql://relay@db/app");
  EXPECT_EQ(LoadDatabaseUrl(file, MapEnv({{"OUTBOX_DATABASE_URL", "postgresql://x@y/z"}})),
            "postgresql://x@y/z");
  std::string unset;
  try {
    LoadDatabaseUrl(file, kNoEnv);
  } catch (const ConfigError& e) {
    unset = e.what();
  }
  EXPECT_TRUE(Contains(unset, "APP_DB")) << unset;
  const std::string typo = dir.Write("typo.yaml", "databse_url: postgresql://relay@db/app\n");
  EXPECT_THROW(LoadDatabaseUrl(typo, kNoEnv), ConfigError) << "unknown keys are still refused";
}

TEST(DatabaseUrl, OutboxDatabaseUrlBeatsReferencesInTheFile) {
  const std::string yaml =
      "database_url_env: UNSET_VAR\ndestinations: {orders: {kafka: {brokers: k:9092, topic: o}}}\n";
  const RelayConfig config =
      ParseConfig(yaml, "cfg.yaml", MapEnv({{"OUTBOX_DATABASE_URL", "postgresql://x@y/z"}}));
  EXPECT_EQ(config.database_url, "postgresql://x@y/z");
}

TEST(DatabaseUrl, MissingSaysHowToSetIt) {
  const std::string message =
      ErrorOf("destinations: {orders: {kafka: {brokers: k:9092, topic: o}}}\n");
  EXPECT_TRUE(Contains(message, "database_url"));
  EXPECT_TRUE(Contains(message, "set database_url in the config or OUTBOX_DATABASE_URL"));
}

TEST(DatabaseUrl, OnlyOneSourceMayBeSet) {
  const std::string message = ErrorOf(Minimal("database_url_env: APP_DB\n"));
  EXPECT_TRUE(
      Contains(message, "database_url_env: set only one of `database_url`, `database_url_env`"));
}

TEST(DatabaseUrl, NonsenseIsRefusedWithoutEchoingIt) {
  const std::string url = "mysql://root:hunter2@db/app";
  const std::string message = ErrorOf(
      "database_url: " + url + "\ndestinations: {o: {kafka: {brokers: k:9092, topic: o}}}\n");
  EXPECT_TRUE(Contains(
      message, "cfg.yaml:1:1: database_url: does not look like a PostgreSQL connection string"));
  EXPECT_TRUE(Contains(message, "postgresql://"));
  EXPECT_TRUE(Lacks(message, "hunter2"));
}

// A URL libpq cannot parse (a raw '%' in the password, typically) passed check-config, and
// `run`, `status` and `dlq` then printed libpq's error, which quotes the token: the password.
TEST(DatabaseUrl, OneLibpqCannotParseIsRefusedWithoutEchoingIt) {
  const std::string message = ErrorOf(
      "database_url: postgresql://app:Sup3rS%ZZecret@127.0.0.1:1/app\n"
      "destinations: {o: {kafka: {brokers: k:9092, topic: o}}}\n");
  EXPECT_TRUE(Contains(message, "cfg.yaml:1:1: database_url: is not a valid connection string"))
      << message;
  EXPECT_TRUE(Contains(message, "%25")) << message;
  EXPECT_TRUE(Lacks(message, "Sup3rS")) << message;
  const std::string pairs = ErrorOf(
      "database_url: \"host=db password='hunter2\"\n"
      "destinations: {o: {kafka: {brokers: k:9092, topic: o}}}\n");
  EXPECT_TRUE(Contains(pairs, "database_url: is not a valid connection string")) << pairs;
  EXPECT_TRUE(Lacks(pairs, "hunter2")) << pairs;
}

TEST(ProcessEnv, ReadsTheProcessEnvironment) {
  ASSERT_EQ(setenv("OUTBOX_CONFIG_TEST_VAR", "value-1", 1), 0);
  ASSERT_EQ(unsetenv("OUTBOX_CONFIG_TEST_UNSET"), 0);
  const EnvLookup env = ProcessEnv();
  EXPECT_EQ(env("OUTBOX_CONFIG_TEST_VAR"), "value-1");
  EXPECT_EQ(env("OUTBOX_CONFIG_TEST_UNSET"), std::nullopt);
  unsetenv("OUTBOX_CONFIG_TEST_VAR");
}

// ---------------------------------------------------------------------------------------------
// Unknown keys

TEST(UnknownKeys, NameTheFullPathAndSuggestTheClosestKey) {
  const std::string message = ErrorOf(WithKafka("      brokers: k:9092\n      topc: orders\n"));
  EXPECT_TRUE(
      Contains(message, "cfg.yaml:6:7: destinations.orders.kafka.topc: unknown key `topc`"));
  EXPECT_TRUE(Contains(message, "did you mean `topic`?"));
  EXPECT_TRUE(Contains(message, "brokers, topic, producer"));
}

TEST(UnknownKeys, AtEveryLevel) {
  struct Case {
    std::string yaml;
    std::string path;
    std::string suggestion;
  };
  const std::vector<Case> cases = {
      {Minimal("batchsize: 10\n"), "batchsize", "batch_size"},
      {Minimal("lease: 10\n"), "lease", "lease_ms"},
      {Minimal("log: {levle: info}\n"), "log.levle", "level"},
      {Minimal("defaults: {retry: {max_attempt: 3}}\n"), "defaults.retry.max_attempt",
       "max_attempts"},
      {Minimal("defaults: {retyr: {}}\n"), "defaults.retyr", "retry"},
      {WithDestination("o", "    kafak: {brokers: k:9092, topic: o}\n"), "destinations.o.kafak",
       "kafka"},
      {WithDestination("o",
                       "    kafka: {brokers: k:9092, topic: o}\n    retry: {max_backof_ms: 1}\n"),
       "destinations.o.retry.max_backof_ms", "max_backoff_ms"},
      {WithWebhook("      secrets: " + kSecretA + "\n"), "destinations.hooks.webhook.secrets",
       "secret"},
      {WithWebhook("      secret: " + kSecretA + "\n      verify_ssl: false\n"),
       "destinations.hooks.webhook.verify_ssl", "verify_tls"},
  };
  for (const auto& c : cases) {
    const std::string message = ErrorOf(c.yaml);
    EXPECT_TRUE(Contains(message, c.path + ": unknown key")) << c.yaml;
    EXPECT_TRUE(Contains(message, "did you mean `" + c.suggestion + "`?")) << c.yaml;
  }
}

TEST(UnknownKeys, ListAllowedKeysWhenNothingIsClose) {
  const std::string message = ErrorOf(Minimal("zzzzzzzz: 1\n"));
  EXPECT_TRUE(Contains(message, "unknown key `zzzzzzzz`."));
  EXPECT_TRUE(Lacks(message, "did you mean"));
  EXPECT_TRUE(Contains(message, "Keys allowed in the top level: database_url,"));
}

TEST(UnknownKeys, MisplacedKeysSayWhereTheyBelong) {
  std::string message =
      ErrorOf(WithDestination("o", "    kafka: {brokers: k:9092}\n    topic: o\n"));
  EXPECT_TRUE(Contains(message, "destinations.o.topic: unknown key"));
  EXPECT_TRUE(Contains(message, "`topic` belongs under `kafka:`"));

  message = ErrorOf(WithDestination("o", "    webhook: {url: https://h/x}\n    secret_env: S\n"));
  EXPECT_TRUE(Contains(message, "`secret_env` belongs under `webhook:`"));

  message = ErrorOf(Minimal("retry: {max_attempts: 3}\n"));
  EXPECT_TRUE(Contains(message, "defaults.retry"));

  message = ErrorOf(kDb + "payments:\n  kafka: {brokers: k:9092, topic: p}\n");
  EXPECT_TRUE(Contains(message, "payments: unknown key"));
  EXPECT_TRUE(Contains(message, "indent it under `destinations:`"));
}

// ---------------------------------------------------------------------------------------------
// Wrong types

TEST(WrongTypes, NameKeyExpectedTypeAndPosition) {
  const std::string message = ErrorOf(
      kDb + "batch_size: abc\n" + "destinations: {o: {kafka: {brokers: k:9092, topic: o}}}\n",
      kNoEnv, "/etc/outbox/relay.yaml");
  EXPECT_TRUE(
      Contains(message, "/etc/outbox/relay.yaml:2:1: batch_size: expected an integer, got `abc`"));
  EXPECT_TRUE(Contains(message, "set it to a whole number"));
}

TEST(WrongTypes, ManyKinds) {
  struct Case {
    std::string yaml;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {Minimal("lease_ms: 30s\n"),
       "lease_ms: expected an integer, got `30s`; set it to a whole number of milliseconds"},
      {Minimal("lease_ms: 1.5\n"), "lease_ms: expected an integer, got `1.5`"},
      {Minimal("batch_size: 99999999999999999999999\n"),
       "batch_size: the integer `99999999999999999999999` is too large"},
      {Minimal("batch_size: [1]\n"), "batch_size: expected an integer, got a list"},
      {Minimal("poll_interval_ms:\n"), "poll_interval_ms: expected an integer, got an empty value"},
      {Minimal("log: json\n"), "log: expected a mapping"},
      {Minimal("log: {level: [info]}\n"), "log.level: expected a single text value, got a list"},
      {Minimal("defaults: {retry: {max_attempts: many}}\n"),
       "defaults.retry.max_attempts: expected an integer"},
      {WithWebhook("      secret: " + kSecretA + "\n      verify_tls: maybe\n"),
       "destinations.hooks.webhook.verify_tls: expected true or false, got `maybe`"},
      {WithWebhook("      secret: " + kSecretA + "\n      headers: [a, b]\n"),
       "destinations.hooks.webhook.headers: expected a mapping"},
      {WithWebhook("      secret: " + kSecretA + "\n      previous_secrets: " + kSecretB + "\n"),
       "destinations.hooks.webhook.previous_secrets: expected a list"},
      {WithKafka("      brokers: {a: 1}\n      topic: o\n"),
       "destinations.orders.kafka.brokers: expected a single text value"},
      {WithKafka("      brokers: k:9092\n      topic: o\n      producer: zstd\n"),
       "destinations.orders.kafka.producer: expected a mapping"},
      {WithKafka(
           "      brokers: k:9092\n      topic: o\n      producer:\n        linger.ms: [1, 2]\n"),
       "destinations.orders.kafka.producer.linger.ms: expected a string, number or boolean, got a "
       "list"},
      {WithKafka("      brokers: k:9092\n      topic: o\n      producer:\n        linger.ms:\n"),
       "destinations.orders.kafka.producer.linger.ms: has no value"},
      {kDb + "destinations: [orders]\n", "destinations: expected a mapping"},
      {kDb + "destinations:\n  orders: kafka\n", "destinations.orders: expected a mapping"},
  };
  for (const auto& c : cases) EXPECT_TRUE(Contains(ErrorOf(c.yaml), c.expected)) << c.yaml;
}

// ---------------------------------------------------------------------------------------------
// Invalid values

TEST(InvalidValues, GlobalRanges) {
  struct Case {
    std::string extra;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {"batch_size: 0\n",
       "cfg.yaml:7:1: batch_size: 0 is out of range; set it between 1 and 10000"},
      {"batch_size: -5\n", "batch_size: -5 is out of range"},
      {"batch_size: 10001\n", "batch_size: 10001 is out of range; set it between 1 and 10000"},
      {"lease_ms: 999\n", "lease_ms: 999 is out of range; set it between 1000 and 86400000"},
      {"poll_interval_ms: 0\n", "poll_interval_ms: 0 is out of range"},
      {"reap_interval_ms: 0\n", "reap_interval_ms: 0 is out of range"},
      {"full_sweep_interval_ms: 0\n", "full_sweep_interval_ms: 0 is out of range"},
      {"shutdown_timeout_ms: -1\n",
       "shutdown_timeout_ms: -1 is out of range; set it between 0 and"},
      {"log: {level: verbose}\n",
       "log.level: `verbose` is not a log level; use one of trace, debug, info, warn, error"},
      {"log: {level: warning}\n", "did you mean `warn`?"},
      {"log: {format: xml}\n", "log.format: `xml` is not a log format; use `text`"},
      {"admin_listen: localhost\n",
       "admin_listen: `localhost` is not host:port: it has no port; write e.g. `0.0.0.0:9090`"},
      {"admin_listen: \":9090\"\n", "admin_listen: `:9090` is not host:port: it has no host"},
      {"admin_listen: host:http\n", "has an invalid port"},
      {"admin_listen: host:70000\n", "has an invalid port"},
      {"admin_listen: \"::1:9090\"\n", "without brackets"},
      {"defaults: {retry: {max_attempts: 0}}\n",
       "defaults.retry.max_attempts: 0 is out of range; set it between 1 and"},
      {"defaults: {retry: {initial_backoff_ms: -1}}\n",
       "defaults.retry.initial_backoff_ms: -1 is out of range"},
  };
  for (const auto& c : cases)
    EXPECT_TRUE(Contains(ErrorOf(Minimal(c.extra)), c.expected)) << c.extra;
}

TEST(InvalidValues, InitialBackoffAboveMaxBackoffNamesBothSources) {
  std::string message = ErrorOf(WithDestination(
      "o", "    kafka: {brokers: k:9092, topic: o}\n    retry:\n      initial_backoff_ms: 60000\n",
      "defaults: {retry: {max_backoff_ms: 30000}}\n"));
  EXPECT_TRUE(Contains(
      message,
      "destinations.o.retry: initial_backoff_ms 60000 (destinations.o.retry.initial_backoff_ms)"));
  EXPECT_TRUE(Contains(message, "max_backoff_ms 30000 (defaults.retry.max_backoff_ms)"));
  EXPECT_TRUE(Contains(message, "lower initial_backoff_ms or raise max_backoff_ms"));
  EXPECT_TRUE(Contains(message, "cfg.yaml:7:7"));

  message = ErrorOf(Minimal("defaults: {retry: {max_backoff_ms: 100}}\n"));
  EXPECT_TRUE(Contains(message, "defaults.retry: initial_backoff_ms 500 (built-in default)"));
}

TEST(InvalidValues, Destinations) {
  struct Case {
    std::string yaml;
    std::string expected;
  };
  const std::string too_long(256, 'd');
  const std::vector<Case> cases = {
      {kDb, "destinations: no destinations configured; add at least one under `destinations:`"},
      {kDb + "destinations: {}\n", "no destinations configured"},
      {kDb + "destinations:\n  orders:\n",
       "destinations.orders: is empty; give the destination a `kafka:` or `webhook:`"},
      {WithDestination("o", "    retry: {max_attempts: 2}\n"),
       "destinations.o: has no target; add a `kafka:` section"},
      {WithDestination(
           "o", "    kafka: {brokers: k:9092, topic: o}\n    webhook: {url: https://h/x, secret: " +
                    kSecretA + "}\n"),
       "destinations.o.webhook: a destination has exactly one target"},
      {WithDestination("\"\"", "    kafka: {brokers: k:9092, topic: o}\n"),
       "a destination name must not be empty"},
      {WithDestination(too_long, "    kafka: {brokers: k:9092, topic: o}\n"),
       "destination name is 256 characters long; the limit is 255"},
      {WithDestination("o", "    kafka: {brokers: k:9092, topic: o}\n    batch_size: -1\n"),
       "destinations.o.batch_size: -1 is out of range; set it between 0 and 10000"},
      {WithDestination("o", "    kafka: {brokers: k:9092, topic: o}\n    batch_size: 10001\n"),
       "destinations.o.batch_size: 10001 is out of range"},
  };
  for (const auto& c : cases) EXPECT_TRUE(Contains(ErrorOf(c.yaml), c.expected)) << c.yaml;
}

TEST(InvalidValues, Kafka) {
  struct Case {
    std::string kafka_lines;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {"      topic: o\n",
       "destinations.orders.kafka: missing required key `brokers`; list the bootstrap servers"},
      {"      brokers: k:9092\n", "destinations.orders.kafka: missing required key `topic`"},
      {"      brokers: \"\"\n      topic: o\n", "destinations.orders.kafka.brokers: is empty"},
      {"      brokers: k1:9092,,k2:9092\n      topic: o\n", "brokers: has an empty entry"},
      {"      brokers: [k1:9092, \"a b\"]\n      topic: o\n",
       "brokers: entry `a b` contains whitespace"},
      {"      brokers: []\n      topic: o\n", "brokers: lists no servers"},
      {"      brokers: k:9092\n      topic: \"orders v1\"\n",
       "topic: `orders v1` is not a valid Kafka topic name"},
      {"      brokers: k:9092\n      topic: ..\n", "`.` and `..` are not valid Kafka topic names"},
      {"      brokers: k:9092\n      topic: " + std::string(250, 't') + "\n",
       "Kafka topic names have at most 249"},
  };
  for (const auto& c : cases)
    EXPECT_TRUE(Contains(ErrorOf(WithKafka(c.kafka_lines)), c.expected)) << c.kafka_lines;
}

TEST(InvalidValues, RelayOwnedProducerPropertiesAreRefusedWithTheReason) {
  struct Case {
    std::string line;
    std::string key;
    std::string reason;
  };
  const std::vector<Case> cases = {
      {"enable.idempotence: false", "enable.idempotence", "always enables the idempotent producer"},
      {"acks: 1", "acks", "requires acks=all"},
      {"request.required.acks: 1", "request.required.acks", "requires acks=all"},
      {"bootstrap.servers: x:9092", "bootstrap.servers", "from `brokers`"},
      {"metadata.broker.list: x:9092", "metadata.broker.list", "from `brokers`"},
      {"dr_msg_cb: x", "dr_msg_cb", "its own delivery report callback"},
      {"transactional.id: x", "transactional.id", "`delivery: exactly_once`"},
      {"transaction.timeout.ms: 9000", "transaction.timeout.ms", "raise `lease_ms` instead"},
      {"acks_env: ACKS", "acks_env", "requires acks=all"},
  };
  for (const auto& c : cases) {
    const std::string message = ErrorOf(WithKafka(
        "      brokers: k:9092\n      topic: o\n      producer:\n        " + c.line + "\n"));
    EXPECT_TRUE(Contains(message, "destinations.orders.kafka.producer." + c.key + ": `")) << c.line;
    EXPECT_TRUE(Contains(message, "cannot be set here")) << c.line;
    EXPECT_TRUE(Contains(message, c.reason)) << c.line;
  }
}

TEST(InvalidValues, ProducerEnvAndFileReferences) {
  const std::string head = "      brokers: k:9092\n      topic: o\n      producer:\n";
  std::string message = ErrorOf(WithKafka(head + "        sasl.password_env: KAFKA_PASSWORD\n"));
  EXPECT_TRUE(
      Contains(message,
               "cfg.yaml:8:9: destinations.orders.kafka.producer.sasl.password_env: environment "
               "variable KAFKA_PASSWORD is not set; export KAFKA_PASSWORD"));

  message = ErrorOf(WithKafka(head + "        sasl.password_env: KAFKA_PASSWORD\n"),
                    MapEnv({{"KAFKA_PASSWORD", ""}}));
  EXPECT_TRUE(Contains(message, "environment variable KAFKA_PASSWORD is set but empty"));

  TempDir dir;
  const std::string missing = dir.Path("missing-password");
  message = ErrorOf(WithKafka(head + "        sasl.password_file: " + missing + "\n"));
  EXPECT_TRUE(Contains(message, "producer.sasl.password_file: cannot read file " + missing +
                                    ": No such file or directory"));

  message = ErrorOf(WithKafka(head + "        sasl.password_file: " + dir.Root() + "\n"));
  EXPECT_TRUE(Contains(message, "Is a directory"));

  message = ErrorOf(WithKafka(head + "        sasl.password: a\n        sasl.password_env: P\n"),
                    MapEnv({{"P", "b"}}));
  EXPECT_TRUE(Contains(
      message, "sasl.password_env: sets `sasl.password` again (already set by `sasl.password`)"));

  message = ErrorOf(WithKafka(head + "        _env: P\n"));
  EXPECT_TRUE(Contains(message, "producer._env: names no property"));
}

TEST(InvalidValues, Webhook) {
  TempDir dir;
  const std::string s = "      secret: " + kSecretA + "\n";
  struct Case {
    std::string yaml;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {WithDestination("hooks", "    webhook:\n" + s),
       "destinations.hooks.webhook: missing required key `url`"},
      {WithDestination("hooks", "    webhook:\n      url: ftp://h/x\n" + s),
       "destinations.hooks.webhook.url: uses the scheme `ftp`; webhooks need http:// or https://"},
      {WithDestination("hooks", "    webhook:\n      url: hooks.example/x\n" + s),
       "url: is not an absolute URL"},
      {WithDestination("hooks", "    webhook:\n      url: https:///x\n" + s), "url: has no host"},
      {WithDestination("hooks", "    webhook:\n      url: https://h:99999/x\n" + s),
       "url: has an invalid port"},
      {WithDestination("hooks", "    webhook:\n      url: \"https://h/a b\"\n" + s),
       "url: contains whitespace"},
      // What the sink's URL parser refuses is refused here, naming the key (these passed, and
      // check-config then named only the destination).
      {WithDestination("hooks", "    webhook:\n      url: http://hooks.internal:/in\n" + s),
       "destinations.hooks.webhook.url: has an empty port"},
      {WithDestination("hooks", "    webhook:\n      url: http://fe80::1/x\n" + s),
       "destinations.hooks.webhook.url: has a bad port"},
      {WithDestination("hooks", "    webhook:\n      url: https://user:pw@h/x\n" + s),
       "destinations.hooks.webhook.url: must not contain credentials (use headers)"},
      {WithWebhook(""),
       "destinations.hooks.webhook: missing secret; set exactly one of `secret`, `secret_env`"},
      {WithWebhook(s + "      secret_env: S\n"),
       "webhook.secret_env: set only one of `secret`, `secret_env` and `secret_file`"},
      {WithWebhook(s + "      max_in_flight: 0\n"),
       "webhook.max_in_flight: 0 is out of range; set it between 1 and 1024"},
      {WithWebhook(s + "      max_in_flight: 1025\n"),
       "webhook.max_in_flight: 1025 is out of range"},
      {WithWebhook(s + "      timeout_ms: 0\n"), "webhook.timeout_ms: 0 is out of range"},
      {WithWebhook(s + "      connect_timeout_ms: 0\n"),
       "webhook.connect_timeout_ms: 0 is out of range"},
      {WithWebhook(s + "      ca_file: " + dir.Path("no-ca.pem") + "\n"),
       "webhook.ca_file: cannot read " + dir.Path("no-ca.pem") +
           ": No such file or directory; point it at a readable PEM"},
      // Readable, but nothing the TLS client can trust: every delivery failed verification.
      {WithWebhook(s + "      ca_file: " +
                   dir.Write("fake-ca.pem",
                             "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n") +
                   "\n"),
       "fake-ca.pem holds no certificate OpenSSL can read; point it at a PEM bundle"},
      {WithWebhook(s + "      headers:\n        webhook-signature: x\n"),
       "webhook.headers.webhook-signature: cannot be set here: the relay signs every delivery"},
      {WithWebhook(s + "      headers:\n        Webhook-Custom: x\n"),
       "reserves the `webhook-` prefix"},
      {WithWebhook(s + "      headers:\n        Idempotency-Key: x\n"),
       "headers.Idempotency-Key: cannot be set here: the relay sets it"},
      {WithWebhook(s + "      headers:\n        Connection: close\n"),
       "headers.Connection: cannot be set here"},
      {WithWebhook(s + "      headers:\n        X-A: \"a\\u0001b\"\n"),
       "headers.X-A: has a line break or another control"},
      {WithWebhook(s + "      headers:\n        Content-Type: text/plain\n"),
       "headers.Content-Type: cannot be set here"},
      {WithWebhook(s + "      headers:\n        \"X Bad\": x\n"),
       "headers.X Bad: is not a valid HTTP header name"},
      {WithWebhook(s + "      headers:\n        X-A: \"a\\r\\nX-Injected: 1\"\n"),
       "headers.X-A: has a line break"},
      {WithWebhook(s + "      headers:\n        X-A: a\n        x-a: b\n"),
       "headers.x-a: repeats header `X-A`"},
      {WithWebhook(s + "      headers:\n        X-A:\n"), "headers.X-A: has no value"},
  };
  for (const auto& c : cases) EXPECT_TRUE(Contains(ErrorOf(c.yaml), c.expected)) << c.yaml;
}

// ---------------------------------------------------------------------------------------------
// Webhook secrets

TEST(WebhookSecrets, SeveralInOneValuePlusPreviousSecretsInOrderWithoutDuplicates) {
  const RelayConfig config = ParseConfig(
      WithWebhook("      secret_env: HOOK_SECRETS\n      previous_secrets:\n        - " + kSecretC +
                  "\n        - " + kSecretA + "\n"),
      "cfg.yaml", MapEnv({{"HOOK_SECRETS", "  " + kSecretA + "   " + kSecretB + "\n"}}));
  EXPECT_EQ(config.destinations.at("hooks").target.Get<WebhookTarget>().secrets,
            (std::vector<std::string>{kSecretA, kSecretB, kSecretC}));
}

TEST(WebhookSecrets, FromFile) {
  TempDir dir;
  const std::string file = dir.Write("hook-secret", kSecretB + "\n");
  const RelayConfig config =
      ParseConfig(WithWebhook("      secret_file: " + file + "\n"), "cfg.yaml", kNoEnv);
  EXPECT_EQ(config.destinations.at("hooks").target.Get<WebhookTarget>().secrets,
            std::vector<std::string>{kSecretB});

  const std::string empty = dir.Write("empty-secret", "\n");
  EXPECT_TRUE(Contains(ErrorOf(WithWebhook("      secret_file: " + empty + "\n")),
                       "webhook.secret_file: file " + empty + " is empty"));
}

TEST(WebhookSecrets, UnsetVariableIsNamed) {
  const std::string message = ErrorOf(WithWebhook("      secret_env: BILLING_WEBHOOK_SECRET\n"));
  EXPECT_TRUE(Contains(message,
                       "destinations.hooks.webhook.secret_env: environment variable "
                       "BILLING_WEBHOOK_SECRET is not set"));
}

TEST(WebhookSecrets, InvalidSecretsAreNamedButNeverShown) {
  struct Case {
    std::string secret;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {"MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "does not start with `whsec_`"},
      {"whsec_", "has nothing after `whsec_`"},
      {"whsec_not*base64*at*all", "is not valid base64"},
      {"whsec_abcde", "is not valid base64"},  // 5 characters cannot be base64
      {"whsec_YWJj=", "is not valid base64"},  // bad padding
      {"whsec_=", "is not valid base64"},
      // Standard Webhooks keys are 24 to 64 random bytes; a 16-byte (or a 1-byte) key was
      // accepted and weakened every signature (review).
      {"whsec_c2l4dGVlbiBieXRlIGtleQ==",
       "is a key of 16 bytes; Standard Webhooks keys are 24 to 64 bytes"},
      {"whsec_AA==", "is a key of 1 byte; Standard Webhooks keys are 24 to 64 bytes"},
      {"whsec_"
       "eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHg=",
       "is a key of 65 bytes; Standard Webhooks keys are 24 to 64 bytes"},
  };
  for (const auto& c : cases) {
    const std::string inline_message = ErrorOf(WithWebhook("      secret: \"" + c.secret + "\"\n"));
    EXPECT_TRUE(Contains(
        inline_message,
        "destinations.hooks.webhook.secret: the secret (written in the config) " + c.expected))
        << c.secret;
    EXPECT_TRUE(Contains(inline_message, "openssl rand -base64 32"));

    const std::string env_message = ErrorOf(WithWebhook("      secret_env: HOOK_SECRET\n"),
                                            MapEnv({{"HOOK_SECRET", kSecretA + " " + c.secret}}));
    EXPECT_TRUE(Contains(
        env_message,
        "webhook.secret_env: secret 2 of 2 (from environment variable HOOK_SECRET) " + c.expected))
        << c.secret;

    if (c.secret.size() > std::string("whsec_").size() + 1) {
      const std::string body = c.secret.substr(6);
      EXPECT_TRUE(Lacks(inline_message, body));
      EXPECT_TRUE(Lacks(env_message, body));
      EXPECT_TRUE(Lacks(env_message, kSecretA.substr(6)));
    }
  }
}

TEST(WebhookSecrets, PreviousSecretsAreValidatedByPosition) {
  const std::string message =
      ErrorOf(WithWebhook("      secret: " + kSecretA + "\n      previous_secrets: [" + kSecretB +
                          ", whsec_bad!secret]\n"));
  EXPECT_TRUE(Contains(message,
                       "destinations.hooks.webhook.previous_secrets[1]: the secret (in "
                       "previous_secrets) is not valid base64"));
  EXPECT_TRUE(Lacks(message, "bad!secret"));
}

TEST(WebhookSecrets, NoErrorEverEchoesSecretMaterial) {
  // Every way a config that holds secrets can be wrong; none of the messages may show them.
  const std::string secret_body = kSecretA.substr(6);
  const std::string password = "Pa55word-do-not-leak";
  const auto env = MapEnv({{"HOOK_SECRET", kSecretA}, {"KAFKA_PASSWORD", password}});
  const std::vector<std::string> yamls = {
      WithWebhook("      secret: " + kSecretA + "\n      secret_env: HOOK_SECRET\n"),
      WithWebhook("      secret: [" + kSecretA + "]\n"),
      WithWebhook("      secret: {" + kSecretA + ": 1}\n"),
      WithWebhook("      secret_env: " + kSecretA + "\n"),  // the secret pasted into *_env
      WithWebhook("      secret_env: \"" + password + " x\"\n"),
      WithWebhook("      secret: " + kSecretA + "\n      max_in_flight: -3\n"),
      WithWebhook("      secret: " + kSecretA + "\n      headers: {Authorization: \"Bearer " +
                  password + "\", Host: h}\n"),
      WithWebhook("      secret: " + kSecretA + "\n      headers: {X-Token: \"" + password +
                  "\\n\"}\n"),
      WithWebhook("      secret: " + kSecretA + "\n      previous_secrets: [" + password + "]\n"),
      WithWebhook("      secret: \"" + password + "\"\n"),
      WithWebhook("      secret: \"" + kSecretA + " " + password + "\"\n"),
      WithDestination("hooks", "    webhook:\n      url: \"https://user:" + password +
                                   "@h:0/x\"\n      secret: x\n"),
      WithDestination("hooks",
                      "    webhook:\n      url: \"" + password + "://h/x\"\n      secret: x\n"),
      WithKafka("      brokers: k:9092\n      topic: o\n      producer:\n        sasl.password: " +
                password + "\n        sasl.password_env: KAFKA_PASSWORD\n"),
      WithKafka("      brokers: k:9092\n      topic: o\n      producer:\n        acks_env: "
                "KAFKA_PASSWORD\n"),
      WithKafka("      brokers: k:9092\n      topic: o\n      producer:\n        sasl.password: [" +
                password + "]\n"),
      WithKafka(
          "      brokers: k:9092\n      topic: o\n      producer:\n        sasl.password_env: \"" +
          password + "\"\n"),
      "database_url: \"postgresql://relay:" + password +
          "@db/app\"\nbatch_size: 0\n"
          "destinations: {o: {kafka: {brokers: k:9092, topic: o}}}\n",
      "database_url: \"mysql://relay:" + password +
          "@db/app\"\ndestinations: {o: {kafka: {brokers: k:9092, topic: o}}}\n",
      "database_url: \"" + password +
          "\"\ndatabase_url_env: X\ndestinations: {o: {kafka: {brokers: k:9092, topic: o}}}\n",
  };
  for (const auto& yaml : yamls) {
    const std::string message = ErrorOf(yaml, env);
    EXPECT_FALSE(message.empty()) << yaml;
    EXPECT_TRUE(Lacks(message, secret_body)) << yaml;
    EXPECT_TRUE(Lacks(message, password)) << yaml;
  }
  // A secret pasted into a *_env key that happens to be a valid variable name (letters, digits,
  // _): "environment variable Xk9mP2qR7vL4 is not set" printed it twice (found in review).
  for (const std::string& pasted :
       {std::string("Xk9mP2qR7vL4"), std::string("e3b0c44298fc1c149afbf4c8996fb92427ae41e4")}) {
    for (const std::string& yaml :
         {WithWebhook("      secret_env: " + pasted + "\n"),
          WithKafka("      brokers: k:9092\n      topic: o\n      producer:\n"
                    "        sasl.password_env: " +
                    pasted + "\n")}) {
      const std::string message = ErrorOf(yaml, MapEnv({}));
      EXPECT_FALSE(message.empty()) << yaml;
      EXPECT_TRUE(Lacks(message, pasted)) << message;
      EXPECT_NE(message.find("is not set"), std::string::npos) << message;
    }
  }
  // A conventional name is still named.
  EXPECT_NE(ErrorOf(WithWebhook("      secret_env: HOOK_SECRET\n"), MapEnv({}))
                .find("environment variable HOOK_SECRET is not set"),
            std::string::npos);
}

TEST(WebhookSecretKey, DecodesTheBase64AfterThePrefix) {
  EXPECT_EQ(WebhookSecretKey(kSecretB), "second-secret-key-24byte");
  EXPECT_EQ(WebhookSecretKey(kSecretC), "third secret key!! 24byt");
  // Decoding takes any length: an endpoint stored before keys had to be 24 to 64 bytes still
  // signs (the config and the management API refuse such keys when they are given).
  EXPECT_EQ(WebhookSecretKey("whsec_eA=="), "x");
  EXPECT_EQ(WebhookSecretKey("whsec_eA"), "x") << "padding is optional";
  EXPECT_EQ(WebhookSecretKey(kSecretA).size(), 24u);
}

TEST(WebhookSecretKey, ThrowsWithoutEchoingTheSecret) {
  try {
    WebhookSecretKey("whsec_sup3r$ecret");
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_TRUE(Contains(e.what(), "not valid base64"));
    EXPECT_TRUE(Lacks(e.what(), "sup3r$ecret"));
  }
  EXPECT_THROW(WebhookSecretKey("plain"), ConfigError);
}

// ---------------------------------------------------------------------------------------------
// YAML-level problems

TEST(Yaml, SyntaxErrorHasLineAndColumn) {
  const std::string message = ErrorOf(kDb + "destinations: [orders\nbatch_size: 1\n");
  EXPECT_TRUE(Contains(message, "cfg.yaml:3:"));
  EXPECT_TRUE(Contains(message, "invalid YAML"));
  EXPECT_TRUE(Contains(message, "fix the syntax"));
}

TEST(Yaml, BadIndentationIsASyntaxError) {
  const std::string message = ErrorOf("database_url: postgresql://a@b/c\n  batch_size: 1\n");
  EXPECT_TRUE(Contains(message, "cfg.yaml:2:"));
  EXPECT_TRUE(Contains(message, "invalid YAML"));
}

TEST(Yaml, EmptyAndNonMappingDocuments) {
  EXPECT_TRUE(
      Contains(ErrorOf(""), "cfg.yaml: the config is empty; it needs at least `database_url`"));
  EXPECT_TRUE(Contains(ErrorOf("# nothing but a comment\n"), "the config is empty"));
  EXPECT_TRUE(
      Contains(ErrorOf("- a\n- b\n"), "the config must be a mapping of `key: value` lines"));
  EXPECT_TRUE(Contains(ErrorOf("just text\n"), "the config must be a mapping"));
}

TEST(Yaml, SeveralDocumentsAreRefused) {
  EXPECT_TRUE(Contains(ErrorOf(Minimal() + "---\n" + Minimal()), "contains 2 YAML documents"));
}

TEST(Yaml, DuplicateKeysAreRefused) {
  const std::string message = ErrorOf(Minimal("batch_size: 1\nbatch_size: 2\n"));
  EXPECT_TRUE(
      Contains(message, "cfg.yaml:8:1: batch_size: duplicate key (first set at cfg.yaml:7:1)"));

  EXPECT_TRUE(Contains(ErrorOf(kDb + "destinations:\n  o: {kafka: {brokers: k:9092, topic: o}}\n"
                                     "  o: {kafka: {brokers: k:9092, topic: p}}\n"),
                       "destinations.o: duplicate key"));
}

TEST(Yaml, ComplexKeysAreRefused) {
  EXPECT_TRUE(Contains(ErrorOf(Minimal("? [a, b]\n: 1\n")), "keys must be plain names"));
}

TEST(Yaml, UnknownKeysInsideMergedMappingsAreCaught) {
  const std::string yaml = kDb +
                           "defaults:\n"
                           "  retry: &r\n"
                           "    max_attempts: 3\n"
                           "destinations:\n"
                           "  o:\n"
                           "    kafka: {brokers: k:9092, topic: o}\n"
                           "    retry:\n"
                           "      <<: *r\n"
                           "      max_backof_ms: 5\n";
  EXPECT_TRUE(Contains(ErrorOf(yaml), "destinations.o.retry.max_backof_ms: unknown key"));
}

// ---------------------------------------------------------------------------------------------
// Files

TEST(LoadConfigFile, ReadsAndNamesTheFileInErrors) {
  TempDir dir;
  const std::string good = dir.Write("relay.yaml", Minimal("batch_size: 77\n"));
  EXPECT_EQ(LoadConfigFile(good, kNoEnv).batch_size, 77);

  const std::string bad = dir.Write("bad.yaml", Minimal("batch_size: many\n"));
  try {
    LoadConfigFile(bad, kNoEnv);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_TRUE(Contains(e.what(), bad + ":7:1: batch_size: expected an integer"));
  }

  const std::string broken = dir.Write("broken.yaml", "a: [\n");
  try {
    LoadConfigFile(broken, kNoEnv);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_TRUE(Contains(e.what(), broken + ":2:"));
    EXPECT_TRUE(Contains(e.what(), "invalid YAML"));
  }
}

TEST(LoadConfigFile, UnreadableFileNamesPathAndErrno) {
  TempDir dir;
  const std::string missing = dir.Path("absent.yaml");
  try {
    LoadConfigFile(missing, kNoEnv);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_TRUE(
        Contains(e.what(), missing + ": cannot read the config file: No such file or directory"));
  }
  try {
    LoadConfigFile(dir.Root(), kNoEnv);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_TRUE(Contains(e.what(), dir.Root() + ": cannot read the config file: Is a directory"));
  }
}

// ---------------------------------------------------------------------------------------------
// deploy/config/relay.example.yaml

const std::string kExamplePath =
    std::string(OUTBOX_SOURCE_DIR) + "/deploy/config/relay.example.yaml";

TEST(ExampleConfig, LoadsWithTheVariablesItNames) {
  const RelayConfig config =
      LoadConfigFile(kExamplePath, MapEnv({{"KAFKA_PASSWORD", "kafka-secret"},
                                           {"BILLING_WEBHOOK_SECRET", kSecretA + " " + kSecretB}}));
  EXPECT_EQ(config.database_url,
            "postgresql://outbox_relay@db.internal:5432/app?sslmode=verify-full");
  EXPECT_EQ(config.admin_listen, "") << "the example shows the documented default: no admin server";
  EXPECT_EQ(config.log_format, LogFormat::kJson);
  ASSERT_EQ(config.destinations.size(), 3u);
  const auto& service = config.destinations.at("customer-events").target.Get<WebhookTarget>();
  EXPECT_TRUE(service.endpoints_from_database);
  EXPECT_EQ(service.max_in_flight, 8);

  const Destination& orders = config.destinations.at("orders");
  const auto& kafka = orders.target.Get<KafkaTarget>();
  EXPECT_EQ(kafka.topic, "orders.v1");
  EXPECT_EQ(kafka.producer.at("sasl.password"), "kafka-secret");
  EXPECT_EQ(orders.retry.max_attempts, 20);
  EXPECT_EQ(orders.retry.initial_backoff, 1000ms);
  EXPECT_EQ(orders.retry.max_backoff, 300000ms);
  EXPECT_EQ(orders.batch_size, 1000);

  const Destination& hooks = config.destinations.at("billing-hooks");
  const auto& webhook = hooks.target.Get<WebhookTarget>();
  EXPECT_EQ(webhook.url, "https://billing.internal/hooks/outbox");
  EXPECT_EQ(webhook.secrets, (std::vector<std::string>{kSecretA, kSecretB}));
  EXPECT_EQ(hooks.retry.max_attempts, 30);
  EXPECT_EQ(hooks.retry.initial_backoff, 500ms);
  EXPECT_EQ(hooks.retry.max_backoff, 60000ms);
  EXPECT_TRUE(webhook.breaker.enabled);
  EXPECT_EQ(webhook.breaker.failure_threshold, 10);
  EXPECT_TRUE(webhook.adaptive_concurrency);
  EXPECT_FALSE(webhook.allow_private_networks);
  EXPECT_TRUE(webhook.allowed_networks.empty());
  EXPECT_EQ(hooks.batch_size, config.batch_size);
}

TEST(ExampleConfig, NamesTheMissingVariable) {
  const std::string message = ErrorOf(
      [] {
        std::ifstream in(kExamplePath);
        return std::string(std::istreambuf_iterator<char>(in), {});
      }(),
      MapEnv({{"KAFKA_PASSWORD", "kafka-secret"}}), kExamplePath);
  EXPECT_TRUE(Contains(message,
                       "destinations.billing-hooks.webhook.secret_env: environment variable "
                       "BILLING_WEBHOOK_SECRET is not set"));
}

TEST(ExampleConfig, DocumentsEveryKey) {
  std::ifstream in(kExamplePath);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_FALSE(text.empty());
  for (const char* key : {"database_url:",
                          "database_url_env:",
                          "database_url_file:",
                          "batch_size:",
                          "claim_connections:",
                          "max_in_flight_bytes:",
                          "lease_ms:",
                          "poll_interval_ms:",
                          "reap_interval_ms:",
                          "full_sweep_interval_ms:",
                          "shutdown_timeout_ms:",
                          "admin_listen:",
                          "log:",
                          "level:",
                          "format:",
                          "defaults:",
                          "retry:",
                          "max_attempts:",
                          "initial_backoff_ms:",
                          "max_backoff_ms:",
                          "destinations:",
                          "kafka:",
                          "brokers:",
                          "topic:",
                          "producer:",
                          "webhook:",
                          "url:",
                          "secret:",
                          "secret_env:",
                          "secret_file:",
                          "previous_secrets:",
                          "timeout_ms:",
                          "connect_timeout_ms:",
                          "max_in_flight:",
                          "ca_file:",
                          "verify_tls:",
                          "headers:",
                          "OUTBOX_DATABASE_URL",
                          "OUTBOX_BATCH_SIZE",
                          "OUTBOX_CLAIM_CONNECTIONS",
                          "OUTBOX_MAX_IN_FLIGHT_BYTES",
                          "OUTBOX_LEASE_MS",
                          "OUTBOX_POLL_INTERVAL_MS",
                          "OUTBOX_ADMIN_LISTEN",
                          "OUTBOX_LOG_LEVEL",
                          "OUTBOX_LOG_FORMAT"}) {
    EXPECT_TRUE(Contains(text, key));
  }
}

TEST(LogFormatToString, Names) {
  EXPECT_STREQ(ToString(LogFormat::kText), "text");
  EXPECT_STREQ(ToString(LogFormat::kJson), "json");
}

}  // namespace
}  // namespace outbox::relay

namespace outbox::relay {
namespace {

TEST(ParseConfig, ClaimConnections) {
  // `auto` (0), the default: each destination's sink says how many (Sink::ClaimLoops).
  EXPECT_EQ(ParseConfig(Minimal(), "cfg.yaml", kNoEnv).claim_connections, 0) << "auto by default";
  EXPECT_EQ(ParseConfig(Minimal("claim_connections: auto\n"), "cfg.yaml", kNoEnv).claim_connections,
            0);
  EXPECT_EQ(ParseConfig(Minimal("claim_connections: 3\n"), "cfg.yaml",
                        MapEnv({{"OUTBOX_CLAIM_CONNECTIONS", "auto"}}))
                .claim_connections,
            0)
      << "the environment overrides the file with the word too";
  EXPECT_EQ(ParseConfig(Minimal("claim_connections: auto\n"), "cfg.yaml",
                        MapEnv({{"OUTBOX_CLAIM_CONNECTIONS", "1"}}))
                .claim_connections,
            1);
  for (const char* bad : {"automatic", "AUTO", "two"}) {
    const auto message = ErrorOf(Minimal(std::string("claim_connections: ") + bad + "\n"));
    EXPECT_TRUE(Contains(message, "claim_connections")) << message;
    EXPECT_TRUE(Contains(message, "or `auto`")) << message;
  }
  EXPECT_EQ(ParseConfig(Minimal("claim_connections: 4\n"), "cfg.yaml", kNoEnv).claim_connections,
            4);
  EXPECT_EQ(ParseConfig(Minimal("claim_connections: 4\n"), "cfg.yaml",
                        MapEnv({{"OUTBOX_CLAIM_CONNECTIONS", "2"}}))
                .claim_connections,
            2)
      << "the environment overrides the file";
  for (const char* bad : {"0", "17", "-1"}) {
    const auto message = ErrorOf(Minimal(std::string("claim_connections: ") + bad + "\n"));
    EXPECT_TRUE(Contains(message, "claim_connections")) << message;
    EXPECT_TRUE(Contains(message, "between 1 and 16")) << message;
  }
  // Exactly once: a bucket's rows go through one transactional producer, one transaction at a
  // time; claims side by side would interleave their batches in it.
  const std::string exactly_once = ErrorOf(
      "claim_mode: partitioned\nclaim_connections: 2\n" +
      WithKafka("      brokers: k:9092\n      topic: orders\n      delivery: exactly_once\n"));
  EXPECT_TRUE(Contains(exactly_once,
                       "destinations.orders.kafka.delivery: exactly_once needs "
                       "`claim_connections: 1`"))
      << exactly_once;
}

// Bucket leases (docs/adr/0003-bucket-leases.md): partitioned claims only, one claim loop, and
// not (yet) for exactly-once Kafka or a webhook service's fan-outs.
TEST(ParseConfig, BucketLeasesNeedPartitionedClaimsAndOneClaimLoop) {
  const std::string kafka = "      brokers: k:9092\n      topic: orders\n";
  EXPECT_FALSE(ParseConfig(Minimal(), "cfg.yaml", kNoEnv).bucket_leases);
  EXPECT_TRUE(ParseConfig("claim_mode: partitioned\nbucket_leases: true\n" + WithKafka(kafka),
                          "cfg.yaml", kNoEnv)
                  .bucket_leases);
  EXPECT_EQ(ParseConfig("claim_mode: partitioned\nbucket_leases: true\nclaim_connections: 1\n" +
                            WithKafka(kafka),
                        "cfg.yaml", kNoEnv)
                .claim_connections,
            1);
  auto message = ErrorOf("bucket_leases: true\n" + WithKafka(kafka));
  EXPECT_TRUE(Contains(message, "bucket_leases: needs `claim_mode: partitioned`")) << message;
  message = ErrorOf("claim_mode: partitioned\nbucket_leases: true\nclaim_connections: 2\n" +
                    WithKafka(kafka));
  EXPECT_TRUE(Contains(message, "bucket_leases: takes one claim loop per destination")) << message;
  EXPECT_TRUE(Contains(message, "set `claim_connections: 1`")) << message;
  message = ErrorOf("claim_mode: partitioned\nbucket_leases: true\n" +
                    WithKafka(kafka + "      delivery: exactly_once\n"));
  EXPECT_TRUE(Contains(message, "destinations.orders.kafka.delivery: exactly_once does not take "
                                "`bucket_leases`"))
      << message;
  message = ErrorOf("claim_mode: partitioned\nbucket_leases: true\n" +
                    WithDestination("svc", "    webhook:\n      endpoints: database\n"));
  EXPECT_TRUE(Contains(message, "destinations.svc.webhook.endpoints: a webhook service does not "
                                "take `bucket_leases`"))
      << message;
  message = ErrorOf("claim_mode: partitioned\nbucket_leases: yes please\n" + WithKafka(kafka));
  EXPECT_TRUE(Contains(message, "bucket_leases")) << message;
}

TEST(ParseConfig, ClaimModeAndPartitionTimings) {
  EXPECT_EQ(ParseConfig(Minimal(), "cfg.yaml", kNoEnv).claim_mode, ClaimMode::kSkipLocked);
  const auto cfg = ParseConfig(
      Minimal("claim_mode: partitioned\npartition_heartbeat_ms: 200\npartition_lease_ms: 900\n"),
      "cfg.yaml", kNoEnv);
  EXPECT_EQ(cfg.claim_mode, ClaimMode::kPartitioned);
  EXPECT_EQ(cfg.partition_heartbeat, 200ms);
  EXPECT_EQ(cfg.partition_lease, 900ms);
  EXPECT_EQ(
      ParseConfig(Minimal(), "cfg.yaml", MapEnv({{"OUTBOX_CLAIM_MODE", "partitioned"}})).claim_mode,
      ClaimMode::kPartitioned);
  const auto bad_mode = ErrorOf(Minimal("claim_mode: sharded\n"));
  EXPECT_TRUE(Contains(bad_mode, "claim_mode"));
  EXPECT_TRUE(Contains(bad_mode, "use `skip_locked`"));
  const auto short_lease =
      ErrorOf(Minimal("partition_heartbeat_ms: 1000\npartition_lease_ms: 2000\n"));
  EXPECT_TRUE(Contains(short_lease, "partition_lease_ms"));
  EXPECT_TRUE(Contains(short_lease, "at least 3 x partition_heartbeat_ms (3000)"));
  // Only the heartbeat written: the error is about it, where it was written (it named
  // partition_lease_ms, which the file does not have).
  const auto slow_heartbeat = ErrorOf(Minimal("partition_heartbeat_ms: 2000\n"));
  EXPECT_TRUE(Contains(slow_heartbeat, "partition_heartbeat_ms: must be at most"))
      << slow_heartbeat;
  EXPECT_TRUE(Contains(slow_heartbeat, "partition_lease_ms, 5000 by default")) << slow_heartbeat;
  EXPECT_FALSE(Contains(slow_heartbeat, "partition_lease_ms: must")) << slow_heartbeat;
}

}  // namespace
}  // namespace outbox::relay

namespace outbox::relay {
namespace {

TEST(ParseConfig, RetentionSection) {
  const auto defaults = ParseConfig(Minimal(), "cfg.yaml", kNoEnv).retention;
  EXPECT_FALSE(defaults.archive_delivered);
  EXPECT_EQ(defaults.archive_retention, std::chrono::hours(168));
  EXPECT_EQ(defaults.dead_letter_retention, std::chrono::hours(0));
  const auto r =
      ParseConfig(Minimal("retention:\n  archive_delivered: true\n  archive_retention_hours: 24\n"
                          "  dead_letter_retention_hours: 720\n  cleanup_interval_ms: 5000\n"),
                  "cfg.yaml", kNoEnv)
          .retention;
  EXPECT_TRUE(r.archive_delivered);
  EXPECT_EQ(r.archive_retention, std::chrono::hours(24));
  EXPECT_TRUE(r.archive_retention_set);
  EXPECT_FALSE(defaults.archive_retention_set) << "unset: the archive is left alone";
  EXPECT_EQ(r.dead_letter_retention, std::chrono::hours(720));
  EXPECT_EQ(r.cleanup_interval, 5000ms);
  EXPECT_TRUE(
      Contains(ErrorOf(Minimal("retention:\n  archive_days: 3\n")), "retention.archive_days"));
  EXPECT_TRUE(Contains(ErrorOf(Minimal("retention:\n  archive_retention_hours: 0\n")),
                       "retention.archive_retention_hours"));
}

}  // namespace
}  // namespace outbox::relay

// --- lease_ms against the longest delivery attempt ---------------------------------------

namespace outbox::relay {
namespace {

const std::string kHook =
    "    webhook:\n"
    "      url: https://example.com/hook\n"
    "      secret: whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\n";

TEST(LeaseBounds, ALeaseShorterThanAWebhookAttemptIsRefusedNamingBothKeys) {
  const std::string message =
      ErrorOf(WithDestination("hooks", kHook + "      timeout_ms: 10000\n", "lease_ms: 8000\n"));
  EXPECT_TRUE(Contains(message, "lease_ms")) << message;
  EXPECT_TRUE(
      Contains(message, "destinations.hooks.webhook.timeout_ms + connect_timeout_ms = 15000 ms"))
      << message;
  EXPECT_TRUE(Contains(message, "raise lease_ms to at least 16000")) << message;
}

TEST(LeaseBounds, ALeaseShorterThanAKafkaMessageTimeoutIsRefusedNamingBothKeys) {
  const std::string message = ErrorOf(kDb + "lease_ms: 30000\n" +
                                      "destinations:\n"
                                      "  orders:\n"
                                      "    kafka:\n"
                                      "      brokers: k1:9092\n"
                                      "      topic: orders\n"
                                      "      producer:\n"
                                      "        message.timeout.ms: 30000\n");
  EXPECT_TRUE(Contains(message, "lease_ms")) << message;
  EXPECT_TRUE(Contains(message, "destinations.orders.kafka.producer.message.timeout.ms"))
      << message;
}

TEST(LeaseBounds, WithoutLeaseMsTheLeaseOutlastsTheLongestAttemptAndKafkaFitsInside) {
  const RelayConfig slow = ParseConfig(
      WithDestination("hooks", kHook + "      timeout_ms: 60000\n"), "cfg.yaml", kNoEnv);
  EXPECT_EQ(slow.lease, std::chrono::milliseconds(60000 + 5000 + 10000));

  const RelayConfig plain = ParseConfig(Minimal(), "cfg.yaml", kNoEnv);
  EXPECT_EQ(plain.lease, std::chrono::milliseconds(30000));
  EXPECT_EQ(plain.destinations.at("orders").target.Get<KafkaTarget>().attempt_timeout,
            std::chrono::milliseconds(20000))
      << "2/3 of the lease: a Kafka attempt ends inside its lease";
  const RelayConfig short_lease = ParseConfig(Minimal("lease_ms: 3000\n"), "cfg.yaml", kNoEnv);
  EXPECT_EQ(short_lease.destinations.at("orders").target.Get<KafkaTarget>().attempt_timeout,
            std::chrono::milliseconds(2000));
}

// A webhook request is written only if it ends inside its claim (a worker hands back what its
// lease cannot cover), so leases are renewed often enough that the claim of what is in flight
// always covers one whole attempt and a second for the renewal: every lease_ms / 3 where that
// leaves enough (the default), else sooner, at most every 500 ms. At lease_ms / 3 a lease of 16000
// for attempts of 15000 fell to 10.7 s of cover between renewals, under one attempt (review).
TEST(LeaseBounds, LeasesAreRenewedSoThatTheyCoverAWholeAttempt) {
  const RelayConfig defaults = ParseConfig(WithDestination("hooks", kHook), "cfg.yaml", kNoEnv);
  EXPECT_EQ(defaults.renew_every, std::chrono::milliseconds(10000)) << "lease_ms / 3";
  const RelayConfig tight = ParseConfig(
      WithDestination("hooks", kHook + "      timeout_ms: 10000\n", "lease_ms: 16000\n"),
      "cfg.yaml", kNoEnv);
  EXPECT_EQ(tight.renew_every, std::chrono::milliseconds(500));
  const RelayConfig slow = ParseConfig(
      WithDestination("hooks", kHook + "      timeout_ms: 60000\n"), "cfg.yaml", kNoEnv);
  EXPECT_EQ(slow.lease, std::chrono::milliseconds(75000));
  EXPECT_EQ(slow.renew_every, std::chrono::milliseconds(75000 - 65000 - 1000))
      << "a lease less the longest attempt and a second";
  const RelayConfig kafka = ParseConfig(Minimal(), "cfg.yaml", kNoEnv);
  EXPECT_EQ(kafka.renew_every, std::chrono::milliseconds(10000));
}

}  // namespace
}  // namespace outbox::relay

// --- an attempt without an end ----------------------------------------------------------

namespace outbox::relay {
namespace {

// librdkafka reads message.timeout.ms (alias delivery.timeout.ms) 0 as "no limit": an attempt
// that never ends cannot end inside its lease.
// librdkafka sends a `topic.` property to the topic config without the prefix, and reads an
// integer with strtol cast to int: `topic.message.timeout.ms: 0` and "-4294967296" were "no
// limit" to it but passed the relay's checks, and `topic.partitioner` slipped past its own
// (review). A partitioner other than the relay's spreads one key over partitions.
TEST(KafkaProducer, PropertiesAreCheckedAsLibrdkafkaReadsThem) {
  auto error_of = [](const std::string& property) {
    return ErrorOf(kDb +
                   "destinations:\n"
                   "  orders:\n"
                   "    kafka:\n"
                   "      brokers: k1:9092\n"
                   "      topic: orders\n"
                   "      producer:\n"
                   "        " +
                   property + "\n");
  };
  for (const char* zero : {"topic.message.timeout.ms: 0", "message.timeout.ms: \"-4294967296\"",
                           "topic.delivery.timeout.ms: 0"}) {
    const std::string e = error_of(zero);
    EXPECT_TRUE(Contains(e, "no limit")) << zero << ": " << e;
  }
  for (const char* partitioner : {"partitioner: random", "topic.partitioner: random"}) {
    const std::string e = error_of(partitioner);
    EXPECT_TRUE(Contains(e, "cannot be set here")) << partitioner << ": " << e;
    EXPECT_TRUE(Contains(e, "partition")) << e;
  }
  EXPECT_TRUE(Contains(error_of("topic.acks: 1"), "`acks` cannot be set here"));
  // librdkafka reads a number's leading digits in base 0 and drops the rest: "30s" was 30 ms,
  // "010" 8 and "1e3" 1, each accepted without a word (found in review).
  for (const char* property :
       {"message.timeout.ms: 30s", "socket.timeout.ms: 60s", "linger.ms: \"010\"",
        "topic.message.timeout.ms: 1e3", "linger.ms: 0x10"}) {
    const std::string e = error_of(property);
    EXPECT_TRUE(Contains(e, "is not a whole number of milliseconds")) << property << ": " << e;
    EXPECT_TRUE(Contains(e, "destinations.orders.kafka.producer.")) << e;
  }
  EXPECT_TRUE(
      Contains(error_of("linger.ms: 5\n        topic.linger.ms: 6"), "sets `linger.ms` again"));
  // librdkafka reads an alias as the property it names: both set, the last one written won,
  // and a check of one of them (the lease's, of message.timeout.ms) missed the other
  // (review: delivery.timeout.ms 110000 with message.timeout.ms 20000 made a 110 s
  // transaction timeout).
  for (const auto& [first, second] : std::vector<std::pair<std::string, std::string>>{
           {"message.timeout.ms: 20000", "delivery.timeout.ms: 110000"},
           {"linger.ms: 5", "queue.buffering.max.ms: 6"},
           {"retries: 3", "message.send.max.retries: 4"},
           {"compression.type: lz4", "compression.codec: zstd"}}) {
    const std::string e = error_of(first + "\n        " + second);
    const std::string named = second.substr(0, second.find(':'));
    EXPECT_TRUE(Contains(e, "sets `" + named + "`, the same librdkafka property as `")) << e;
    EXPECT_TRUE(Contains(e, "keep one of them")) << e;
  }
}

TEST(LeaseBounds, AKafkaMessageTimeoutOfZeroIsRefusedNamingTheKeyAndTheFix) {
  for (const char* key : {"message.timeout.ms", "delivery.timeout.ms"}) {
    for (const char* lease : {"", "lease_ms: 30000\n"}) {
      // librdkafka reads each of these as 0.
      for (const char* zero : {"0", "00", "0x0", "\"0\""}) {
        SCOPED_TRACE(std::string(key) + ": " + zero + " " + lease);
        const std::string message = ErrorOf(kDb + lease +
                                            "destinations:\n"
                                            "  orders:\n"
                                            "    kafka:\n"
                                            "      brokers: k1:9092\n"
                                            "      topic: orders\n"
                                            "      producer:\n"
                                            "        " +
                                            key + ": " + zero + "\n");
        EXPECT_TRUE(Contains(message, "destinations.orders.kafka.producer." + std::string(key)))
            << message;
        EXPECT_TRUE(Contains(message, "no limit")) << message;
        EXPECT_TRUE(Contains(message, "lease_ms")) << message;
        EXPECT_TRUE(Contains(message, "remove the key")) << message;
      }
    }
  }
  // Hex is read by librdkafka (0x7FFFFFFF is 24 days, not 0), and refused here with what it
  // would read: a duration is written in digits.
  const std::string hex = ErrorOf(kDb + "lease_ms: 30000\n" +
                                  "destinations:\n"
                                  "  orders:\n"
                                  "    kafka:\n"
                                  "      brokers: k1:9092\n"
                                  "      topic: orders\n"
                                  "      producer:\n"
                                  "        message.timeout.ms: 0x7FFFFFFF\n");
  EXPECT_TRUE(Contains(hex,
                       "\"0x7FFFFFFF\" is not a whole number of milliseconds (librdkafka "
                       "would read it as 2147483647)"))
      << hex;
  // From the environment too.
  const std::string from_env = ErrorOf(kDb +
                                           "destinations:\n"
                                           "  orders:\n"
                                           "    kafka:\n"
                                           "      brokers: k1:9092\n"
                                           "      topic: orders\n"
                                           "      producer:\n"
                                           "        message.timeout.ms_env: KAFKA_TIMEOUT\n",
                                       MapEnv({{"KAFKA_TIMEOUT", "0"}}));
  EXPECT_TRUE(Contains(from_env, "message.timeout.ms")) << from_env;
  EXPECT_TRUE(Contains(from_env, "no limit")) << from_env;
  // A bound is still taken.
  EXPECT_NO_THROW(ParseConfig(kDb + "destinations:\n"
                                    "  orders:\n"
                                    "    kafka:\n"
                                    "      brokers: k1:9092\n"
                                    "      topic: orders\n"
                                    "      producer:\n"
                                    "        message.timeout.ms: 10\n",
                              "cfg.yaml", kNoEnv));
}

// lease_ms is at most 86400000: an attempt that cannot end a second inside that is refused
// naming what to lower, whether lease_ms is given or derived.
TEST(LeaseBounds, AnAttemptLongerThanTheLongestLeaseIsRefusedNamingWhatToLower) {
  const std::string hook = kHook +
                           "      timeout_ms: 86400000\n"
                           "      connect_timeout_ms: 86400000\n";
  for (const char* lease : {"", "lease_ms: 86400000\n"}) {
    const std::string message = ErrorOf(WithDestination("hooks", hook, lease));
    EXPECT_TRUE(Contains(message,
                         "destinations.hooks.webhook.timeout_ms + connect_timeout_ms = "
                         "172800000 ms"))
        << message;
    EXPECT_TRUE(Contains(message, "at most 86400000")) << message;
    EXPECT_TRUE(Contains(message,
                         "lower destinations.hooks.webhook.timeout_ms + "
                         "connect_timeout_ms to at most 86399000 ms"))
        << message;
    EXPECT_FALSE(Contains(message, "raise lease_ms")) << message;
  }
  // Just inside: a derived lease stops at the maximum.
  const RelayConfig longest =
      ParseConfig(WithDestination("hooks", kHook + "      timeout_ms: 86000000\n"
                                                   "      connect_timeout_ms: 399000\n"),
                  "cfg.yaml", kNoEnv);
  EXPECT_EQ(longest.lease, std::chrono::milliseconds(86'400'000));
}

}  // namespace
}  // namespace outbox::relay
