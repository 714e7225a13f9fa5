// Reads a destination's `kafka:` section (docs/configuration.md, "Kafka").
#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string_view>

#include "cloudevents_config.h"
#include "kafka_records.h"
#include "outbox_relay/config_fields.h"
#include "outbox_relay/config_sources.h"
#include "outbox_relay/kafka_target.h"
#include "topic_route.h"

namespace outbox::relay {

using cfg::Fail;
using cfg::Field;
using cfg::HasSpaceOrControl;
using cfg::Mapping;
using cfg::Quote;

namespace {

constexpr std::array<std::string_view, 10> kKeys = {"brokers",
                                                    "topic",
                                                    "producer",
                                                    "allowed_topics",
                                                    "key_header",
                                                    "format",
                                                    "cloudevents_source",
                                                    "topic_prefix",
                                                    "delivery",
                                                    "transactional_id_prefix"};

// librdkafka's aliases of producer properties (`kcat -X list`: "Alias for ..."), each with
// the property it sets. Both names set, the last one written won.
constexpr std::array<std::pair<std::string_view, std::string_view>, 6> kProducerAliases = {{
    {"delivery.timeout.ms", "message.timeout.ms"},
    {"linger.ms", "queue.buffering.max.ms"},
    {"retries", "message.send.max.retries"},
    {"compression.type", "compression.codec"},
    {"max.in.flight", "max.in.flight.requests.per.connection"},
    {"sasl.mechanism", "sasl.mechanisms"},
}};

// The property `property` sets in librdkafka: itself, or the one it is an alias for.
std::string_view AliasedProperty(std::string_view property) {
  for (const auto& [alias, aliased] : kProducerAliases) {
    if (property == alias) return aliased;
  }
  return property;
}

struct OwnedProperty {
  std::string_view name;
  std::string_view why;
};

constexpr std::array<OwnedProperty, 10> kOwnedProducerProperties = {{
    {"partitioner",
     "the relay partitions by the murmur2 hash of the record key, as the Java client does, so "
     "that one key's messages land in one partition (and the exactly-once recovery looks for a "
     "record where that hash puts it); remove it"},
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
     "the relay names its transactional producers itself (`delivery: exactly_once`, "
     "`transactional_id_prefix`); remove it"},
    {"transaction.timeout.ms",
     "the relay sets it from the lease, so a transaction ends inside the lease of its "
     "messages; raise `lease_ms` instead"},
}};

std::string ReadBrokers(const Field& field) {
  std::vector<std::string> parts;
  if (field.node.IsSequence()) {
    for (const auto& element : cfg::ReadList(field))
      parts.push_back(cfg::ReadNonEmptyString(element));
  } else {
    const std::string text = cfg::ReadNonEmptyString(field);
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
  const std::string problem = kafka_detail::TopicNameProblem(topic);
  if (!problem.empty()) Fail(field, problem);
}

// Digits, with a sign and a decimal fraction at most (linger.ms takes one), and no leading
// zero (which librdkafka reads as octal).
bool PlainNumber(const std::string& text) {
  const std::size_t start = !text.empty() && (text[0] == '-' || text[0] == '+') ? 1 : 0;
  const std::string_view number = std::string_view(text).substr(start);
  const std::size_t point = number.find('.');
  const std::string_view whole = number.substr(0, point);
  const std::string_view fraction =
      point == std::string_view::npos ? std::string_view() : number.substr(point + 1);
  const auto digits = [](std::string_view d) {
    return !d.empty() && std::all_of(d.begin(), d.end(), [](char c) {
      return std::isdigit(static_cast<unsigned char>(c)) != 0;
    });
  };
  if (!digits(whole) || (whole.size() > 1 && whole[0] == '0')) return false;
  return point == std::string_view::npos || digits(fraction);
}

// Whether librdkafka knows `name` as a global (not topic) property. conf_get answers for one
// with a default; one without (topic.blacklist) it knows only once set, so it is set to
// `value` on a scratch configuration of its own: a global property then reads back, while a
// `topic.` name librdkafka took as a topic property's does not (review).
bool IsGlobalProperty(const std::string& name, const std::string& value) {
  static const std::unique_ptr<rd_kafka_conf_t, decltype(&rd_kafka_conf_destroy)> scratch(
      rd_kafka_conf_new(), &rd_kafka_conf_destroy);
  std::size_t size = 0;
  if (rd_kafka_conf_get(scratch.get(), name.c_str(), nullptr, &size) == RD_KAFKA_CONF_OK) {
    return true;
  }
  const std::unique_ptr<rd_kafka_conf_t, decltype(&rd_kafka_conf_destroy)> set(
      rd_kafka_conf_new(), &rd_kafka_conf_destroy);
  char error[256];
  return rd_kafka_conf_set(set.get(), name.c_str(), value.c_str(), error, sizeof error) ==
             RD_KAFKA_CONF_OK &&
         rd_kafka_conf_get(set.get(), name.c_str(), nullptr, &size) == RD_KAFKA_CONF_OK;
}

std::map<std::string, std::string> ReadProducer(const Field& field, const EnvLookup& env) {
  std::map<std::string, std::string> properties;
  std::map<std::string, std::string> written_as;  // property -> key that set it
  // librdkafka's property (an alias's, AliasedProperty) -> the property name that set it.
  std::map<std::string, std::string, std::less<>> set_through;
  for (const auto& [key, value_field] : cfg::Entries(field)) {
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
    // Read when first needed: a refusal of the key itself (an owned property, one set twice)
    // comes before anything about its value or the variable or file it names.
    std::optional<std::string> read;
    const auto value_of = [&]() -> const std::string& {
      if (read) return *read;
      std::string value;
      switch (from) {
        case From::kEnv:
          value = cfg::ReadEnvReference(value_field, env);
          break;
        case From::kFile:
          value = cfg::ReadFileReference(value_field);
          break;
        case From::kValue: {
          const YAML::Node& node = value_field.node;
          if (node.IsNull() || !node.IsDefined()) {
            Fail(value_field,
                 "has no value; give the librdkafka property a value or remove the key");
          }
          if (!node.IsScalar()) {
            Fail(value_field,
                 "expected a string, number or boolean, got " + cfg::DescribeKind(node) +
                     "; librdkafka properties take one value (join lists with commas)");
          }
          value = node.Scalar();
          if (node.Tag() == "?" && (value == "True" || value == "TRUE")) value = "true";
          if (node.Tag() == "?" && (value == "False" || value == "FALSE")) value = "false";
          break;
        }
      }
      read = std::move(value);
      return *read;
    };
    // librdkafka sets a `topic.` property it does not know by that name on the default topic
    // config without the prefix: the same property, checked and stored under its own name. A
    // global property whose name begins so (topic.metadata.refresh.interval.ms) keeps it.
    if (property.starts_with("topic.") && property.size() > 6 &&
        !IsGlobalProperty(property, value_of())) {
      property.erase(0, 6);
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
    if (const auto [it, fresh] = set_through.emplace(AliasedProperty(property), property); !fresh) {
      Fail(value_field, "sets `" + property + "`, the same librdkafka property as `" + it->second +
                            "` (one property under two names: the last one written would win); "
                            "keep one of them");
    }
    std::string value = value_of();

    if ((property == "message.timeout.ms" || property == "delivery.timeout.ms") &&
        kafka_detail::LibrdkafkaInteger(value) == 0) {
      Fail(value_field,
           "`" + property +
               "` = 0 means \"no limit\" to librdkafka: a delivery attempt would never end, and "
               "every "
               "attempt must end inside its lease (lease_ms); set a bound at least 1000 ms "
               "under lease_ms, e.g. `" +
               property +
               ": 20000`, or remove the key (an attempt then gets 2/3 of lease_ms, at most 30000)");
    }
    // librdkafka reads an integer's leading digits in base 0 and drops the rest: "30s" is 30,
    // "010" 8, "1e3" 1, all taken without a word. A duration is written in plain digits.
    if (property.ends_with(".ms") && !PlainNumber(value)) {
      const auto read = kafka_detail::LibrdkafkaInteger(value);
      Fail(value_field, (from == From::kValue ? "\"" + value + "\"" : std::string("its value")) +
                            " is not a whole number of milliseconds" +
                            (read ? " (librdkafka would read it as " + std::to_string(*read) + ")"
                                  : std::string()) +
                            "; write the milliseconds in digits, e.g. `" + property + ": 30000`");
    }
    properties.emplace(property, std::move(value));
  }
  return properties;
}

void ParseKafka(const Field& field, const EnvLookup& env, Destination& destination) {
  Mapping m(field, std::vector<std::string_view>(kKeys.begin(), kKeys.end()));
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
  kafka.topic = cfg::ReadNonEmptyString(*topic);
  // A template ("orders.{event_type}") is checked by the Kafka sink's validation, which
  // check-config and run both call; a plain name here.
  if (kafka.topic.find('{') == std::string::npos) ValidateTopic(*topic, kafka.topic);
  if (auto f = m.Get("allowed_topics")) {
    for (const auto& element : cfg::ReadList(*f)) {
      kafka.allowed_topics.push_back(cfg::ReadNonEmptyString(element));
      ValidateTopic(element, kafka.allowed_topics.back());
    }
  }
  if (auto f = m.Get("topic_prefix")) kafka.topic_prefix = cfg::ReadNonEmptyString(*f);
  if (auto f = m.Get("key_header")) {
    kafka.key_header = cfg::ReadNonEmptyString(*f);
    if (HasSpaceOrControl(kafka.key_header)) {
      Fail(*f,
           "is not a header name; name the message header whose value becomes the record "
           "key, e.g. `key_header: tenant`");
    }
  }
  ReadCloudEventsFormat(m, "the relay's headers", "ce_*", kafka.cloudevents,
                        kafka.cloudevents_source);
  if (auto producer = m.Get("producer")) kafka.producer = ReadProducer(*producer, env);
  if (auto f = m.Get("delivery")) {
    kafka.exactly_once =
        cfg::ReadChoice(*f, {"at_least_once", "exactly_once"},
                        "what a read_committed consumer may see twice") == "exactly_once";
  }
  if (auto f = m.Get("transactional_id_prefix")) {
    if (!kafka.exactly_once) {
      Fail(*f,
           "is used only with `delivery: exactly_once` (it names the transactional producers); "
           "add `delivery: exactly_once`, or remove it");
    }
    kafka.transactional_id_prefix = cfg::ReadNonEmptyString(*f);
    if (HasSpaceOrControl(kafka.transactional_id_prefix)) {
      Fail(*f,
           "contains whitespace; the transactional ids are \"<prefix>.<destination>.<bucket>\", "
           "e.g. `transactional_id_prefix: billing-relay`");
    }
  }
  destination.target = std::move(kafka);
}

// The longest one attempt may take, when the producer bounds it: message.timeout.ms (alias
// delivery.timeout.ms).
std::optional<AttemptBound> KafkaAttemptBound(const Destination& d) {
  const auto& producer = d.target.Get<KafkaTarget>().producer;
  for (const char* key : {"message.timeout.ms", "delivery.timeout.ms"}) {
    if (auto it = producer.find(key); it != producer.end()) {
      const auto ms = kafka_detail::LibrdkafkaInteger(it->second);
      if (!ms) return std::nullopt;  // librdkafka's own check names it (check-config, run)
      return AttemptBound{Millis{*ms}, "destinations." + d.name + ".kafka.producer." + key};
    }
  }
  return std::nullopt;
}

// Kafka attempts without an explicit bound get one that fits the lease: 2/3 of it, at most
// librdkafka's usual 30 s.
void CompleteKafka(Destination& d, const RelayConfig& config, const std::string& source) {
  auto& kafka = d.target.Get<KafkaTarget>();
  kafka.attempt_timeout = Millis{std::min<long long>(30'000, config.lease.count() * 2 / 3)};
  if (kafka.exactly_once && config.claim_mode != ClaimMode::kPartitioned) {
    // A transactional producer per bucket fences the bucket's previous owner; with
    // skip_locked no relay owns the rows it claims (docs/adr/0002-exactly-once-kafka.md).
    Fail(source, "destinations." + d.name + ".kafka.delivery",
         "exactly_once needs `claim_mode: partitioned` (each bucket has one owner, whose "
         "transactional producer fences the previous one); set `claim_mode: partitioned` or "
         "use `delivery: at_least_once`");
  }
  if (kafka.exactly_once && config.bucket_leases) {
    // Its recovery reads back what a bucket's producer committed for rows leased by the
    // previous owner; under bucket leases those are every row of the bucket (ADR 0003, 7).
    Fail(source, "destinations." + d.name + ".kafka.delivery",
         "exactly_once does not take `bucket_leases` yet; remove `bucket_leases`, or use "
         "`delivery: at_least_once`");
  }
  if (kafka.exactly_once && config.claim_connections > 1) {
    // A bucket's transactional producer writes one claim's batch per transaction; a second
    // claim loop would add its rows to the transaction of the first.
    Fail(source, "destinations." + d.name + ".kafka.delivery",
         "exactly_once needs `claim_connections: 1` (each bucket's transactional producer takes "
         "one claim at a time), not " +
             std::to_string(config.claim_connections) +
             "; set `claim_connections: 1`, add relays to scale out, or use `delivery: "
             "at_least_once`");
  }
}

}  // namespace

const TargetKind& KafkaTargetKind() {
  static const TargetKind kind{
      .key = KafkaTarget::kKind,
      .essentials = "brokers, topic",
      .keys = {kKeys.begin(), kKeys.end()},
      .parse = ParseKafka,
      .attempt_bound = KafkaAttemptBound,
      .complete = CompleteKafka,
  };
  return kind;
}

}  // namespace outbox::relay
