// What both Kafka sinks share (kafka_records.h).
#include "kafka_records.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <iterator>
#include <map>
#include <stdexcept>
#include <string_view>
#include <utility>
#include <vector>

#include "outbox_relay/cloudevents.h"
#include "outbox_relay/kafka_sink.h"

namespace outbox::relay::kafka_detail {
namespace {

// The longest transaction timeout an explicit message.timeout.ms can set (ProducerConf).
constexpr long long kMaxTransactionTimeoutMs = 120'000;

// Producer defaults; every one can be overridden through KafkaTarget::producer.
const std::vector<std::pair<std::string, std::string>>& Defaults() {
  static const std::vector<std::pair<std::string, std::string>> defaults = {
      {"linger.ms", "5"},
      {"queue.buffering.max.messages", "100000"},
      // Same key -> partition mapping as the Java client, so records of one key land on the
      // partition other (Java) producers of the topic would pick.
      {"partitioner", "murmur2_random"},
      {"client.id", "outbox-relay"},
      // Over librdkafka's 1,000,000: what the database accepts by default must not be
      // refused by the producer (kafka_sink.h).
      {"message.max.bytes", std::to_string(kDefaultProducerMessageMaxBytes)},
  };
  return defaults;
}

[[noreturn]] void Invalid(const std::string& destination, const std::string& what) {
  throw std::invalid_argument("kafka destination \"" + destination + "\": " + what);
}

/// `name` in any case is `lower`.
bool EqualsIgnoringCase(std::string_view name, std::string_view lower) {
  return std::equal(name.begin(), name.end(), lower.begin(), lower.end(), [](char a, char b) {
    return std::tolower(static_cast<unsigned char>(a)) == b;
  });
}

/// A header the relay sets on every record: a message's own of that name (in any case) is
/// left out. Consumers dedupe on idempotency-key; verify and the exactly-once recovery read
/// outbox-id and idempotency-key, and with two of a name the last (the message's) won.
bool IsRelayHeader(const std::string& name) {
  static constexpr std::string_view kOwn[] = {"idempotency-key", "outbox-id", "event-type",
                                              "created-at"};
  return std::any_of(std::begin(kOwn), std::end(kOwn),
                     [&](std::string_view own) { return EqualsIgnoringCase(name, own); });
}

/// In CloudEvents mode, the ce_ attributes and the content type are the relay's, in any case:
/// the binding's SDKs read header names lowercased, and the last of a name wins.
bool IsCloudEventsHeader(const std::string& name) {
  return (name.size() >= 3 && EqualsIgnoringCase(std::string_view(name).substr(0, 3), "ce_")) ||
         EqualsIgnoringCase(name, "content-type");
}

void AddHeader(rd_kafka_headers_t* headers, const std::string& name, const std::string& value) {
  rd_kafka_header_add(headers, name.data(), static_cast<ssize_t>(name.size()), value.data(),
                      static_cast<ssize_t>(value.size()));
}

}  // namespace

ConfPtr ProducerConf(const std::string& destination, const KafkaTarget& target,
                     const std::string* transactional_id) {
  std::map<std::string, std::string> props;
  for (const auto& [key, value] : Defaults()) props[key] = value;
  if (!target.producer.count("message.timeout.ms") &&
      !target.producer.count("delivery.timeout.ms")) {
    props["message.timeout.ms"] = std::to_string(target.attempt_timeout.count());
  }
  props["bootstrap.servers"] = target.brokers;
  for (const auto& [key, value] : target.producer) props[key] = value;
  if (props["bootstrap.servers"].empty())
    Invalid(destination, "bootstrap.servers (brokers) is empty");
  if (props.count("transactional.id") || props.count("transaction.timeout.ms")) {
    Invalid(destination,
            "producer properties \"transactional.id\" and \"transaction.timeout.ms\" are the "
            "relay's: set `delivery: exactly_once` (and `transactional_id_prefix`) instead");
  }
  if (auto it = props.find("enable.idempotence"); it != props.end() && it->second != "true") {
    Invalid(destination,
            "producer property \"enable.idempotence\" must stay true: the relay relies on the "
            "idempotent producer for ordering and no duplicates across retries");
  }
  props["enable.idempotence"] = "true";
  if (!props.count("acks") && !props.count("request.required.acks")) props["acks"] = "all";
  if (transactional_id != nullptr) {
    props["transactional.id"] = *transactional_id;
    // A transaction the relay does not end (it died) is aborted by the coordinator before the
    // messages' leases run out: the attempt timeout is 2/3 of the lease at most.
    long long timeout = std::max<long long>(1000, target.attempt_timeout.count());
    // librdkafka refuses a message timeout past the transaction's; an explicit one already
    // fits the lease (config), so the transaction still ends before its messages' leases.
    for (const char* key : {"message.timeout.ms", "delivery.timeout.ms"}) {
      if (auto it = props.find(key); it != props.end()) {
        const long long ms = LibrdkafkaInteger(it->second).value_or(0);
        // At most 2 minutes: brokers refuse a transaction longer than their
        // transaction.max.timeout.ms (15 minutes by default: every init_transactions failed),
        // and one left open by a relay that died must end well inside the recovery's 5
        // minutes of clock slack (kafka_transactional_sink.cc).
        if (ms > kMaxTransactionTimeoutMs) {
          Invalid(destination,
                  "producer property \"" + std::string(key) + "\" is " + std::to_string(ms) +
                      "; with `delivery: exactly_once` it sets the transaction timeout, which "
                      "must be at most " +
                      std::to_string(kMaxTransactionTimeoutMs) +
                      " ms (a transaction left open by a relay that died has to end well inside "
                      "the recovery's 5 minutes of clock slack; brokers refuse transactions "
                      "over transaction.max.timeout.ms, 15 minutes by default): lower it, or "
                      "remove it (an attempt then gets 2/3 of lease_ms, at most 30000)");
        }
        timeout = std::max(timeout, ms);
      }
    }
    props["transaction.timeout.ms"] = std::to_string(timeout);
    // librdkafka lowers socket.timeout.ms to fit when it is not set, and refuses it set past
    // the transaction timeout naming transaction.timeout.ms, which is not one's to set.
    if (auto it = props.find("socket.timeout.ms"); it != props.end()) {
      if (const auto ms = LibrdkafkaInteger(it->second); ms && *ms > timeout + 100) {
        Invalid(destination, "producer property \"socket.timeout.ms\" is " + std::to_string(*ms) +
                                 "; with `delivery: exactly_once` it must be at most " +
                                 std::to_string(timeout + 100) + " (the transaction timeout, " +
                                 std::to_string(timeout) +
                                 " ms: 2/3 of lease_ms, at most 30 s, or an explicit "
                                 "message.timeout.ms): lower it, or leave it unset");
      }
    }
  }

  ConfPtr conf(rd_kafka_conf_new());
  char errstr[512];
  for (const auto& [key, value] : props) {
    if (rd_kafka_conf_set(conf.get(), key.c_str(), value.c_str(), errstr, sizeof errstr) !=
        RD_KAFKA_CONF_OK) {
      Invalid(destination, std::string("invalid producer property \"") + key + "\": " + errstr);
    }
  }
  return conf;
}

std::optional<long long> LibrdkafkaInteger(const std::string& value) {
  const char* begin = value.c_str();
  char* end = nullptr;
  errno = 0;
  const long n = std::strtol(begin, &end, 0);
  if (end == begin || errno != 0) return std::nullopt;
  return static_cast<int>(n);  // as librdkafka does: "-4294967296" is 0 to it
}

Outcome ShutdownOutcome(MessageId id) {
  Outcome out;
  out.id = id;
  out.kind = OutcomeKind::kRetry;
  out.reason = "shutdown";
  out.reason_class = Reason::kShutdown;
  return out;
}

void RunCompletion(const std::string& destination, Sink::Completion& done, Outcome out) {
  try {
    if (done) done(std::move(out));
  } catch (const std::exception& e) {
    spdlog::error("kafka destination \"{}\": completion threw: {}", destination, e.what());
  } catch (...) {
    spdlog::error("kafka destination \"{}\": completion threw", destination);
  }
}

rd_kafka_headers_t* BuildHeaders(const Message& msg, const KafkaTarget& target) {
  rd_kafka_headers_t* headers =
      rd_kafka_headers_new(4 + msg.headers.size() + (target.cloudevents ? 7 : 0));
  AddHeader(headers, "idempotency-key", msg.idempotency_key);
  AddHeader(headers, "outbox-id", std::to_string(Raw(msg.id)));
  if (!msg.event_type.empty()) AddHeader(headers, "event-type", msg.event_type);
  AddHeader(headers, "created-at", FormatRfc3339(msg.created_at));
  if (target.cloudevents) {
    for (const auto& [attribute, value] : CloudEventAttributes(msg, target.cloudevents_source)) {
      AddHeader(headers, "ce_" + attribute, value);
    }
    AddHeader(headers, "content-type",
              msg.payload_is_json ? "application/json" : "application/octet-stream");
  }
  for (const auto& [name, value] : msg.headers) {
    if (target.cloudevents && IsCloudEventsHeader(name)) continue;
    if (IsRelayHeader(name)) {
      spdlog::debug("kafka: message {}: header {} left out: the relay sets it", Raw(msg.id), name);
      continue;
    }
    AddHeader(headers, name, value);
  }
  return headers;
}

const std::string* RecordKey(const Message& msg, const KafkaTarget& target) {
  if (!target.key_header.empty()) {
    for (const auto& [name, value] : msg.headers) {
      // An empty value is no value, as in topic routing (topic_route.cc).
      if (name == target.key_header && !value.empty()) return &value;
    }
  }
  return msg.ordering_key ? &*msg.ordering_key : nullptr;
}

rd_kafka_error_t* ProduceRecord(rd_kafka_t* rk, const Message& msg, const KafkaTarget& target,
                                rd_kafka_headers_t* headers, void* opaque,
                                const std::string& topic) {
  rd_kafka_vu_t vu[6];
  std::size_t n = 0;
  vu[n].vtype = RD_KAFKA_VTYPE_TOPIC;
  vu[n++].u.cstr = topic.c_str();
  if (const std::string* key = RecordKey(msg, target)) {
    vu[n].vtype = RD_KAFKA_VTYPE_KEY;
    vu[n].u.mem.ptr = const_cast<char*>(key->data());
    vu[n++].u.mem.size = key->size();
  }
  vu[n].vtype = RD_KAFKA_VTYPE_VALUE;
  vu[n].u.mem.ptr = const_cast<char*>(msg.payload.data());
  vu[n++].u.mem.size = msg.payload.size();
  vu[n].vtype = RD_KAFKA_VTYPE_MSGFLAGS;
  vu[n++].u.i = RD_KAFKA_MSG_F_COPY;
  // VTYPE_HEADERS (not VTYPE_HEADER): on failure the list stays ours, without double free.
  vu[n].vtype = RD_KAFKA_VTYPE_HEADERS;
  vu[n++].u.headers = headers;
  vu[n].vtype = RD_KAFKA_VTYPE_OPAQUE;
  vu[n++].u.ptr = opaque;
  return rd_kafka_produceva(rk, vu, n);
}

}  // namespace outbox::relay::kafka_detail
