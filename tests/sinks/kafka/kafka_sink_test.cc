// The Kafka sink against librdkafka's mock cluster (the real protocol on loopback).
#include "outbox_relay/kafka_sink.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "outbox_test/kafka_mock.h"
#include "outbox_test/wait.h"

namespace outbox::relay {
namespace {

using namespace std::chrono_literals;
using outbox::testing::ConsumedRecord;
using outbox::testing::KafkaMockCluster;
using outbox::testing::WaitFor;

constexpr auto kWait = 20s;  // generous bound for conditions that normally hold in ms

// Collects completions; counts calls per id so "exactly once" can be checked.
class Recorder {
 public:
  Sink::Completion Callback() {
    return [this](Outcome out) {
      std::lock_guard lock(mu_);
      ++calls_[Raw(out.id)];
      outcomes_.push_back(std::move(out));
    };
  }
  std::size_t size() const {
    std::lock_guard lock(mu_);
    return outcomes_.size();
  }
  bool WaitCount(std::size_t n, std::chrono::milliseconds timeout = kWait) const {
    return WaitFor([&] { return size() >= n; }, timeout);
  }
  std::vector<Outcome> outcomes() const {
    std::lock_guard lock(mu_);
    return outcomes_;
  }
  std::map<std::int64_t, int> calls() const {
    std::lock_guard lock(mu_);
    return calls_;
  }

 private:
  mutable std::mutex mu_;
  std::vector<Outcome> outcomes_;
  std::map<std::int64_t, int> calls_;
};

std::chrono::system_clock::time_point BaseTime() {
  using namespace std::chrono;
  return sys_days{year{2024} / 5 / 6} + 7h + 8min + 9s;  // 2024-05-06T07:08:09.000Z
}

Message MakeMessage(std::int64_t id, std::optional<std::string> key = std::nullopt,
                    std::string payload = {}) {
  Message msg;
  msg.id = MessageId{id};
  msg.destination = "orders";
  msg.ordering_key = std::move(key);
  char uuid[40];
  std::snprintf(uuid, sizeof uuid, "00000000-0000-4000-8000-%012lld", static_cast<long long>(id));
  msg.idempotency_key = uuid;
  msg.event_type = "order.created";
  msg.payload = payload.empty() ? "{\"n\":" + std::to_string(id) + "}" : std::move(payload);
  msg.created_at = BaseTime() + std::chrono::milliseconds(id % 1000);
  return msg;
}

class KafkaSinkTest : public ::testing::Test {
 protected:
  static constexpr const char* kTopic = "orders.events";

  void SetUp() override {
    cluster_ = std::make_unique<KafkaMockCluster>(3);
    cluster_->CreateTopic(kTopic, 3, 3);
  }

  KafkaTarget Target(std::map<std::string, std::string> extra = {}) const {
    KafkaTarget target;
    target.brokers = cluster_->bootstraps();
    target.topic = kTopic;
    // Reconnect quickly once the mock brokers come back up.
    target.producer["reconnect.backoff.ms"] = "20";
    target.producer["reconnect.backoff.max.ms"] = "200";
    for (auto& [k, v] : extra) target.producer[k] = v;
    return target;
  }

  // Delivers one message and returns its outcome (waits for the completion).
  static Outcome SubmitAndWait(Sink& sink, Message msg, std::chrono::milliseconds timeout = kWait) {
    Recorder rec;
    sink.Submit(std::move(msg), rec.Callback());
    EXPECT_TRUE(rec.WaitCount(1, timeout));
    auto outcomes = rec.outcomes();
    return outcomes.empty() ? Outcome{} : outcomes.front();
  }

  std::unique_ptr<KafkaMockCluster> cluster_;
};

TEST_F(KafkaSinkTest, DeliversKeyValueAndHeadersExactlyOnce) {
  Recorder rec;
  auto sink = MakeKafkaSink("orders", Target());
  constexpr int kCount = 200;
  for (int i = 1; i <= kCount; ++i) {
    Message msg =
        MakeMessage(i, i % 2 == 0 ? std::optional<std::string>("customer-" + std::to_string(i % 7))
                                  : std::nullopt);
    if (i % 5 == 0) msg.event_type.clear();
    msg.headers = {{"trace-id", "trace-" + std::to_string(i)}, {"tenant", "acme"}};
    sink->Submit(std::move(msg), rec.Callback());
  }
  ASSERT_TRUE(rec.WaitCount(kCount));
  ASSERT_TRUE(WaitFor([&] { return sink->InFlight() == 0; }, kWait));
  for (const Outcome& out : rec.outcomes()) {
    EXPECT_EQ(out.kind, OutcomeKind::kDelivered) << Raw(out.id) << ": " << out.reason;
  }
  const auto health = sink->Health();  // what `outbox-relay status` shows for this relay
  ASSERT_TRUE(health.has_value());
  EXPECT_EQ(health->kind, "kafka");
  EXPECT_EQ(health->delivery, "at_least_once");
  const auto calls = rec.calls();
  ASSERT_EQ(calls.size(), static_cast<std::size_t>(kCount));
  for (const auto& [id, n] : calls) EXPECT_EQ(n, 1) << "completion count of " << id;
  EXPECT_TRUE(sink->Ready());
  EXPECT_EQ(static_cast<KafkaSink&>(*sink).QueueLength(), 0u);

  const std::vector<ConsumedRecord> records = cluster_->ConsumeAll(kTopic, kCount, kWait);
  ASSERT_EQ(records.size(), static_cast<std::size_t>(kCount));  // and no duplicates
  std::map<std::int64_t, const ConsumedRecord*> by_id;
  std::map<std::string, std::set<int>> partitions_of_key;
  for (const ConsumedRecord& r : records) {
    ASSERT_TRUE(r.headers.count("outbox-id"));
    const std::int64_t id = std::stoll(r.headers.at("outbox-id"));
    EXPECT_TRUE(by_id.emplace(id, &r).second) << "duplicate record for id " << id;
    if (r.key) partitions_of_key[*r.key].insert(r.partition);
  }
  for (int i = 1; i <= kCount; ++i) {
    ASSERT_TRUE(by_id.count(i)) << "missing id " << i;
    const ConsumedRecord& r = *by_id.at(i);
    const Message expected = MakeMessage(i);
    if (i % 2 == 0) {
      ASSERT_TRUE(r.key.has_value()) << i;
      EXPECT_EQ(*r.key, "customer-" + std::to_string(i % 7));
    } else {
      EXPECT_FALSE(r.key.has_value()) << "id " << i << " should have a NULL key";
    }
    EXPECT_EQ(r.value, expected.payload);
    EXPECT_EQ(r.headers.at("idempotency-key"), expected.idempotency_key);
    char created_at[40];
    std::snprintf(created_at, sizeof created_at, "2024-05-06T07:08:09.%03dZ", i);
    EXPECT_EQ(r.headers.at("created-at"), created_at);
    if (i % 5 == 0) {
      EXPECT_FALSE(r.headers.count("event-type")) << "empty event type must not be sent";
    } else {
      EXPECT_EQ(r.headers.at("event-type"), "order.created");
    }
    EXPECT_EQ(r.headers.at("trace-id"), "trace-" + std::to_string(i));
    EXPECT_EQ(r.headers.at("tenant"), "acme");
    EXPECT_EQ(r.headers.size(), i % 5 == 0 ? 5u : 6u);
  }
  for (const auto& [key, parts] : partitions_of_key) {
    EXPECT_EQ(parts.size(), 1u) << "records of key " << key << " spread over partitions";
  }
}

// format: cloudevents adds the CloudEvents binary-mode attributes as ce_* headers (Kafka
// protocol binding) and a content-type; key_header takes the record key from a message header.
TEST_F(KafkaSinkTest, CloudEventsBinaryModeAndARecordKeyFromAHeader) {
  const std::string topic = "ce.orders";
  cluster_->CreateTopic(topic, 4, 1);
  KafkaTarget t = Target();
  t.topic = topic;
  t.cloudevents = true;
  t.cloudevents_source = "//shop.example.com/outbox";
  t.key_header = "tenant";
  auto sink = MakeKafkaSink("orders", t);

  Message typed = MakeMessage(1, "order-1");
  typed.headers = {{"tenant", "acme"},
                   {"traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}};
  Message untyped = MakeMessage(2, "order-2");
  untyped.event_type.clear();
  untyped.headers = {{"ce_type", "spoofed"}, {"content-type", "text/plain"}};
  Message bytes = MakeMessage(3, std::nullopt, std::string("\x01\x02", 2));
  bytes.payload_is_json = false;
  // Header names are case-insensitive to CloudEvents' Kafka binding (its SDKs lowercase them,
  // the last one winning): "CE_type" and "Content-Type" overrode the relay's. An empty tenant
  // is no tenant, as in topic routing: the key was "", every such message in one partition.
  Message cased = MakeMessage(4, "order-4");
  cased.headers = {{"tenant", ""}, {"CE_type", "spoofed"}, {"Content-Type", "text/plain"}};
  for (Message* m : {&typed, &untyped, &bytes, &cased}) {
    EXPECT_EQ(SubmitAndWait(*sink, *m).kind, OutcomeKind::kDelivered);
  }
  const auto records = cluster_->ConsumeAll(topic, 4, kWait);
  ASSERT_EQ(records.size(), 4u);
  std::map<std::string, const ConsumedRecord*> by_id;
  for (const auto& r : records) by_id[r.headers.at("outbox-id")] = &r;

  const ConsumedRecord& a = *by_id.at("1");
  ASSERT_TRUE(a.key.has_value());
  EXPECT_EQ(*a.key, "acme") << "the key comes from the tenant header";
  EXPECT_EQ(a.headers.at("ce_specversion"), "1.0");
  EXPECT_EQ(a.headers.at("ce_id"), typed.idempotency_key);
  EXPECT_EQ(a.headers.at("ce_source"), "//shop.example.com/outbox");
  EXPECT_EQ(a.headers.at("ce_type"), "order.created");
  EXPECT_EQ(a.headers.at("ce_time"), "2024-05-06T07:08:09.001Z");
  EXPECT_EQ(a.headers.at("ce_subject"), "order-1");
  EXPECT_EQ(a.headers.at("content-type"), "application/json");
  EXPECT_EQ(a.headers.at("traceparent"), typed.headers[1].second) << "trace context kept";
  EXPECT_EQ(a.headers.at("idempotency-key"), typed.idempotency_key) << "the relay's own stay";

  const ConsumedRecord& b = *by_id.at("2");
  ASSERT_TRUE(b.key.has_value());
  EXPECT_EQ(*b.key, "order-2") << "no tenant header: the ordering key";
  EXPECT_EQ(b.headers.at("ce_type"), "orders") << "no event type: the destination";
  EXPECT_EQ(b.headers.at("content-type"), "application/json")
      << "a message's own ce_ and content-type headers cannot override the relay's";

  const ConsumedRecord& c = *by_id.at("3");
  EXPECT_FALSE(c.key.has_value());
  EXPECT_FALSE(c.headers.count("ce_subject")) << "no ordering key, no subject";
  EXPECT_EQ(c.headers.at("content-type"), "application/octet-stream");

  const ConsumedRecord& d = *by_id.at("4");
  ASSERT_TRUE(d.key.has_value());
  EXPECT_EQ(*d.key, "order-4") << "an empty tenant header: the ordering key";
  EXPECT_FALSE(d.headers.count("CE_type"));
  EXPECT_FALSE(d.headers.count("Content-Type"));
  EXPECT_EQ(d.headers.at("ce_type"), "order.created");
  EXPECT_EQ(c.value, std::string("\x01\x02", 2));
}

// A message's own header named like one the relay sets cannot override it: consumers dedupe on
// idempotency-key, verify and the exactly-once recovery read outbox-id and idempotency-key
// (the last header of a name wins), and a writer's header came after the relay's (review).
TEST_F(KafkaSinkTest, AMessagesHeadersCannotOverrideTheRelaysOwn) {
  auto sink = MakeKafkaSink("orders", Target());
  Message m = MakeMessage(1, "order-1");
  m.headers = {{"idempotency-key", "123e4567-e89b-12d3-a456-426614174999"},
               {"outbox-id", "77"},
               {"Idempotency-Key", "x"},
               {"event-type", "spoofed"},
               {"created-at", "1970-01-01T00:00:00Z"},
               {"tenant", "acme"}};
  ASSERT_EQ(SubmitAndWait(*sink, m).kind, OutcomeKind::kDelivered);
  const auto records = cluster_->ConsumeAll(kTopic, 1, kWait);
  ASSERT_EQ(records.size(), 1u);
  const auto& h = records[0].headers;
  EXPECT_EQ(h.at("idempotency-key"), m.idempotency_key);
  EXPECT_EQ(h.at("outbox-id"), "1");
  EXPECT_EQ(h.at("event-type"), m.event_type);
  EXPECT_NE(h.at("created-at"), "1970-01-01T00:00:00Z");
  EXPECT_EQ(h.count("Idempotency-Key"), 0u) << "names are compared without case";
  EXPECT_EQ(h.at("tenant"), "acme") << "the message's other headers stay";
}

// The default source is a URI reference: a destination's name is percent-encoded in it (a
// space made it invalid, and strict CloudEvents consumers failed on the record; review).
TEST_F(KafkaSinkTest, TheDefaultCloudEventsSourceIsAUriReference) {
  KafkaTarget t = Target();
  t.cloudevents = true;
  auto sink = MakeKafkaSink("order events/\xc3\xbc", t);
  Message m = MakeMessage(1, "order-1");
  m.destination = "order events/\xc3\xbc";
  ASSERT_EQ(SubmitAndWait(*sink, m).kind, OutcomeKind::kDelivered);
  const auto records = cluster_->ConsumeAll(kTopic, 1, kWait);
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0].headers.at("ce_source"), "/outbox-relay/order%20events%2F%C3%BC");
}

TEST_F(KafkaSinkTest, RetriableBrokerErrorsAreRetriedInternally) {
  Recorder rec;
  auto sink = MakeKafkaSink("orders", Target());
  ASSERT_EQ(SubmitAndWait(*sink, MakeMessage(1, "k")).kind, OutcomeKind::kDelivered);

  cluster_->PushRequestErrors(
      RD_KAFKAP_Produce,
      {RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION, RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT,
       RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS, RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE,
       RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION});
  for (int i = 2; i <= 21; ++i)
    sink->Submit(MakeMessage(i, "k" + std::to_string(i % 3)), rec.Callback());
  ASSERT_TRUE(rec.WaitCount(20));
  for (const Outcome& out : rec.outcomes()) {
    EXPECT_EQ(out.kind, OutcomeKind::kDelivered) << Raw(out.id) << ": " << out.reason;
  }
  for (const auto& [id, n] : rec.calls()) EXPECT_EQ(n, 1) << id;

  // The idempotent producer retried without duplicating anything.
  const auto records = cluster_->ConsumeAll(kTopic, 21, kWait);
  std::set<std::string> ids;
  for (const auto& r : records) ids.insert(r.headers.at("outbox-id"));
  EXPECT_EQ(records.size(), 21u);
  EXPECT_EQ(ids.size(), 21u);
}

// Topic per message from a template (issue 18): produced to the topic the message's fields
// name, only within the allow-list or prefix; a message routed nowhere is a dead letter with
// the reason, not a produce error loop.
TEST_F(KafkaSinkTest, ATopicTemplateRoutesEachMessageWithinItsAllowList) {
  cluster_->CreateTopic("routed.paid", 1, 1);
  cluster_->CreateTopic("routed.shipped", 1, 1);
  KafkaTarget t = Target();
  t.topic = "routed.{event_type}";
  t.allowed_topics = {"routed.paid", "routed.shipped"};
  auto sink = MakeKafkaSink("orders", t);
  auto with_type = [](std::int64_t id, std::string type) {
    Message m = MakeMessage(id, "k" + std::to_string(id));
    m.event_type = std::move(type);
    return m;
  };
  EXPECT_EQ(SubmitAndWait(*sink, with_type(1, "paid")).kind, OutcomeKind::kDelivered);
  EXPECT_EQ(SubmitAndWait(*sink, with_type(2, "shipped")).kind, OutcomeKind::kDelivered);
  const Outcome refused = SubmitAndWait(*sink, with_type(3, "cancelled"));
  EXPECT_EQ(refused.kind, OutcomeKind::kPermanent);
  EXPECT_EQ(refused.reason_class, Reason::kInvalidTopic);
  EXPECT_EQ(refused.reason, "routed to topic \"routed.cancelled\", which is not in allowed_topics");
  const Outcome nowhere = SubmitAndWait(*sink, with_type(4, ""));
  EXPECT_EQ(nowhere.kind, OutcomeKind::kPermanent);
  EXPECT_NE(nowhere.reason.find("routed nowhere: the topic template \"routed.{event_type}\" needs "
                                "the event_type"),
            std::string::npos)
      << nowhere.reason;
  const auto paid = cluster_->ConsumeAll("routed.paid", 1, kWait);
  ASSERT_EQ(paid.size(), 1u);
  EXPECT_EQ(paid[0].headers.at("outbox-id"), "1");
  const auto shipped = cluster_->ConsumeAll("routed.shipped", 1, kWait);
  ASSERT_EQ(shipped.size(), 1u);
  EXPECT_EQ(shipped[0].headers.at("outbox-id"), "2");
  EXPECT_EQ(sink->InFlight(), 0u);

  // A prefix instead of a list; a header as the routing field; an invalid routed name.
  cluster_->CreateTopic("tenant.acme", 1, 1);
  KafkaTarget by_tenant = Target();
  by_tenant.topic = "tenant.{header.tenant}";
  by_tenant.topic_prefix = "tenant.";
  auto tenants = MakeKafkaSink("orders", by_tenant);
  Message acme = MakeMessage(5);
  acme.headers = {{"tenant", "acme"}};
  EXPECT_EQ(SubmitAndWait(*tenants, acme).kind, OutcomeKind::kDelivered);
  Message spaced = MakeMessage(6);
  spaced.headers = {{"tenant", "a b"}};
  const Outcome invalid = SubmitAndWait(*tenants, spaced);
  EXPECT_EQ(invalid.kind, OutcomeKind::kPermanent);
  EXPECT_NE(invalid.reason.find("which is not a valid Kafka topic name"), std::string::npos)
      << invalid.reason;
}

TEST_F(KafkaSinkTest, BadTopicTemplatesAreRefusedNamingTheFix) {
  auto error_of = [&](KafkaTarget t) -> std::string {
    try {
      ValidateKafkaTarget("orders", t);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "";
  };
  KafkaTarget t = Target();
  t.topic = "orders.{event_type}";
  EXPECT_NE(error_of(t).find("is a template: add allowed_topics"), std::string::npos)
      << error_of(t);
  t.topic_prefix = "orders.";
  EXPECT_EQ(error_of(t), "");
  t.topic = "orders.{colour}";
  EXPECT_NE(error_of(t).find("unknown placeholder {colour}; use {event_type}, {destination}, "
                             "{key} or {header.NAME}"),
            std::string::npos)
      << error_of(t);
  t.topic = "orders.{event_type";
  EXPECT_NE(error_of(t).find("has an unclosed `{`"), std::string::npos) << error_of(t);
  t.topic = "orders.{event_type}";
  t.allowed_topics = {"bad topic"};
  EXPECT_NE(error_of(t).find("allowed_topics[0] \"bad topic\" is not a valid Kafka topic name"),
            std::string::npos)
      << error_of(t);
  EXPECT_THROW(MakeKafkaSink("orders", t), std::invalid_argument) << "run refuses it too";
  t.topic = "orders.fixed";
  t.allowed_topics = {"orders.fixed"};
  EXPECT_NE(error_of(t).find("apply to a topic template"), std::string::npos) << error_of(
      t);  // Templates that can never give a topic the route accepts were taken, and then every
  // message went to the dead letters as invalid_topic (review).
  t = Target();
  t.topic = "orders/{event_type}";
  t.allowed_topics = {"orders.created"};
  EXPECT_NE(error_of(t).find("\"orders/\" has characters a Kafka topic name cannot have"),
            std::string::npos)
      << error_of(t);
  t.topic = "events.{event_type}";
  t.allowed_topics = {};
  t.topic_prefix = "orders.";
  EXPECT_NE(error_of(t).find("no topic it makes can start with topic_prefix \"orders.\""),
            std::string::npos)
      << error_of(t);
  t.topic = "events.{event_type}";
  t.topic_prefix = "";
  t.allowed_topics = {"orders.created", "orders.paid"};
  EXPECT_NE(error_of(t).find("matches none of allowed_topics"), std::string::npos) << error_of(t);
  t.allowed_topics = {"orders.created", "events.paid"};
  EXPECT_EQ(error_of(t), "") << "one allowed topic it can make is enough";
  t.topic = "{destination}.{event_type}";
  t.allowed_topics = {};
  t.topic_prefix = "order";
  EXPECT_EQ(error_of(t), "");
  try {
    ValidateKafkaTarget("order events", t);
    ADD_FAILURE() << "a destination with a space passed";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("{destination}"), std::string::npos) << e.what();
  }
}

TEST_F(KafkaSinkTest, TooLargeForTheProducerIsPermanentAtOnce) {
  auto sink = MakeKafkaSink("orders", Target({{"message.max.bytes", "1000"}}));
  const Outcome out = SubmitAndWait(*sink, MakeMessage(7, "k", std::string(5000, 'x')));
  EXPECT_EQ(out.id, MessageId{7});
  EXPECT_EQ(out.kind, OutcomeKind::kPermanent);
  EXPECT_EQ(out.reason_class, "msg_too_large");
  EXPECT_FALSE(out.reason.empty());
  EXPECT_EQ(sink->InFlight(), 0u);
  // The sink keeps working for messages that fit.
  EXPECT_EQ(SubmitAndWait(*sink, MakeMessage(8, "k")).kind, OutcomeKind::kDelivered);
}

// What the database accepts against what a destination's producer sends: the relay's default
// covers the database's default limit; a producer setting or a database limit that leaves
// payloads to be dead-lettered is named at start-up with both ways out.
TEST_F(KafkaSinkTest, APayloadLimitTheProducerCannotCarryIsNamedWithTheFix) {
  constexpr long long kDatabaseDefault = 1'048'576;
  EXPECT_EQ(ProducerMessageMaxBytes(Target()), kDefaultProducerMessageMaxBytes);
  EXPECT_EQ(PayloadLimitMismatch("orders", Target(), kDatabaseDefault), std::nullopt);
  EXPECT_EQ(ProducerMessageMaxBytes(Target({{"message.max.bytes", "1000000"}})), 1'000'000);

  const auto low =
      PayloadLimitMismatch("orders", Target({{"message.max.bytes", "1000000"}}), kDatabaseDefault);
  ASSERT_TRUE(low.has_value());
  for (const std::string part :
       {"\"orders\"", "1048576", "outbox.settings.max_payload_bytes", "1000000",
        "message.max.bytes", "msg_too_large", "at least 1052672",
        "UPDATE outbox.settings SET max_payload_bytes = 995904"}) {
    EXPECT_NE(low->find(part), std::string::npos) << part << " in: " << *low;
  }
  // The database's limit raised past the relay's default.
  EXPECT_TRUE(PayloadLimitMismatch("orders", Target(), 4 * kDatabaseDefault).has_value());
  EXPECT_EQ(PayloadLimitMismatch("orders", Target({{"message.max.bytes", "8000000"}}),
                                 4 * kDatabaseDefault),
            std::nullopt);
}

TEST_F(KafkaSinkTest, BrokerRejectionIsPermanentAndLaterMessagesFlow) {
  auto sink = MakeKafkaSink("orders", Target());
  ASSERT_EQ(SubmitAndWait(*sink, MakeMessage(1, "k")).kind, OutcomeKind::kDelivered);
  std::int64_t id = 10;
  for (rd_kafka_resp_err_t err :
       {RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE, RD_KAFKA_RESP_ERR_INVALID_RECORD}) {
    cluster_->PushRequestErrors(RD_KAFKAP_Produce, {err});
    const Outcome rejected = SubmitAndWait(*sink, MakeMessage(++id, "k"));
    EXPECT_EQ(rejected.id, MessageId{id});
    EXPECT_EQ(rejected.kind, OutcomeKind::kPermanent) << rd_kafka_err2name(err);
    EXPECT_EQ(rejected.reason, rd_kafka_err2str(err));
    // After the rejection (the idempotent producer bumps its epoch) delivery goes on.
    const Outcome next = SubmitAndWait(*sink, MakeMessage(++id, "k"));
    EXPECT_EQ(next.kind, OutcomeKind::kDelivered) << next.reason;
  }
  // Authorization failures are permanent too. (librdkafka then marks the topic as failed
  // until its next metadata refresh, so the messages right after fail the same way.)
  cluster_->PushRequestErrors(RD_KAFKAP_Produce, {RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED});
  const Outcome denied = SubmitAndWait(*sink, MakeMessage(++id, "k"));
  EXPECT_EQ(denied.kind, OutcomeKind::kPermanent);
  EXPECT_EQ(denied.reason_class, "authorization");
}

TEST_F(KafkaSinkTest, AllBrokersDownTimesOutThenRecovers) {
  Recorder down_rec;
  Recorder up_rec;
  auto sink = MakeKafkaSink("orders", Target({{"message.timeout.ms", "1500"}}));
  ASSERT_EQ(SubmitAndWait(*sink, MakeMessage(1, "k")).kind, OutcomeKind::kDelivered);
  ASSERT_TRUE(WaitFor([&] { return sink->Ready(); }, kWait));

  cluster_->SetAllBrokersDown(true);
  for (int i = 2; i <= 6; ++i)
    sink->Submit(MakeMessage(i, "k" + std::to_string(i)), down_rec.Callback());
  ASSERT_TRUE(down_rec.WaitCount(5, 10s));
  for (const Outcome& out : down_rec.outcomes()) {
    EXPECT_EQ(out.kind, OutcomeKind::kRetry);
    EXPECT_NE(out.reason.find("timed out"), std::string::npos) << out.reason;
    EXPECT_EQ(out.reason_class, "timeout");
  }
  EXPECT_TRUE(WaitFor([&] { return !sink->Ready(); }, kWait));

  cluster_->SetAllBrokersDown(false);
  EXPECT_TRUE(WaitFor([&] { return sink->Ready(); }, kWait));
  for (int i = 7; i <= 11; ++i)
    sink->Submit(MakeMessage(i, "k" + std::to_string(i)), up_rec.Callback());
  ASSERT_TRUE(up_rec.WaitCount(5));
  for (const Outcome& out : up_rec.outcomes()) {
    EXPECT_EQ(out.kind, OutcomeKind::kDelivered) << Raw(out.id) << ": " << out.reason;
  }
  EXPECT_TRUE(sink->Ready());
}

TEST_F(KafkaSinkTest, NotReadyUntilABrokerAnswers) {
  cluster_->SetAllBrokersDown(true);
  auto sink = MakeKafkaSink("orders", Target());
  // Give it the chance to (wrongly) report ready: several probe rounds.
  EXPECT_FALSE(WaitFor([&] { return sink->Ready(); }, 1500ms));
  cluster_->SetAllBrokersDown(false);
  EXPECT_TRUE(WaitFor([&] { return sink->Ready(); }, kWait));
}

TEST_F(KafkaSinkTest, ShutdownCompletesStuckMessagesWithinTheDeadline) {
  Recorder rec;
  auto sink = MakeKafkaSink("orders", Target());  // message.timeout.ms stays 30 s
  ASSERT_EQ(SubmitAndWait(*sink, MakeMessage(1, "k")).kind, OutcomeKind::kDelivered);
  cluster_->SetAllBrokersDown(true);
  for (int i = 2; i <= 11; ++i)
    sink->Submit(MakeMessage(i, "k" + std::to_string(i)), rec.Callback());
  EXPECT_EQ(sink->InFlight(), 10u);

  constexpr auto kDeadline = 1000ms;
  const auto start = std::chrono::steady_clock::now();
  sink->Shutdown(kDeadline);
  const auto took = std::chrono::steady_clock::now() - start;

  ASSERT_EQ(rec.size(), 10u) << "Shutdown returned before every completion ran";
  for (const Outcome& out : rec.outcomes()) {
    EXPECT_EQ(out.kind, OutcomeKind::kRetry);
    EXPECT_EQ(out.reason, "shutdown");
  }
  for (const auto& [id, n] : rec.calls()) EXPECT_EQ(n, 1) << id;
  EXPECT_EQ(sink->InFlight(), 0u);
  EXPECT_FALSE(sink->Ready());
  // Completions are due by the deadline; destroying the librdkafka handle takes a little more.
  EXPECT_LT(took, kDeadline + 1500ms);

  // After Shutdown: immediate kRetry, and Shutdown is idempotent.
  const Outcome late = SubmitAndWait(*sink, MakeMessage(99, "k"), 1ms);
  EXPECT_EQ(late.kind, OutcomeKind::kRetry);
  EXPECT_EQ(late.reason, "shutdown");
  sink->Shutdown(kDeadline);
  EXPECT_EQ(sink->InFlight(), 0u);
}

TEST_F(KafkaSinkTest, ShutdownFlushesWhatCanBeDelivered) {
  Recorder rec;
  auto sink = MakeKafkaSink("orders", Target({{"linger.ms", "200"}}));
  for (int i = 1; i <= 50; ++i)
    sink->Submit(MakeMessage(i, "k" + std::to_string(i % 4)), rec.Callback());
  sink->Shutdown(10s);
  ASSERT_EQ(rec.size(), 50u);
  for (const Outcome& out : rec.outcomes()) {
    EXPECT_EQ(out.kind, OutcomeKind::kDelivered) << Raw(out.id) << ": " << out.reason;
  }
  EXPECT_EQ(cluster_->ConsumeAll(kTopic, 50, kWait).size(), 50u);
}

TEST_F(KafkaSinkTest, DestructorShutsDown) {
  Recorder rec;
  {
    auto sink = MakeKafkaSink("orders", Target());
    ASSERT_EQ(SubmitAndWait(*sink, MakeMessage(1, "k")).kind, OutcomeKind::kDelivered);
    cluster_->SetAllBrokersDown(true);
    sink->Submit(MakeMessage(2, "k"), rec.Callback());
  }
  ASSERT_EQ(rec.size(), 1u);
  EXPECT_EQ(rec.outcomes().front().kind, OutcomeKind::kRetry);
}

TEST_F(KafkaSinkTest, FatalProducerErrorRecreatesTheProducer) {
  Recorder rec;
  auto sink = MakeKafkaSink("orders", Target());
  ASSERT_EQ(SubmitAndWait(*sink, MakeMessage(1, "k")).kind, OutcomeKind::kDelivered);

  // A sequence error on the head-of-line request is fatal for the idempotent producer.
  cluster_->PushRequestErrors(RD_KAFKAP_Produce, {RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER});
  const Outcome broken = SubmitAndWait(*sink, MakeMessage(2, "k"));
  EXPECT_EQ(broken.kind, OutcomeKind::kRetry);
  EXPECT_EQ(broken.reason_class, "fatal");
  EXPECT_NE(broken.reason.find("OUT_OF_ORDER_SEQUENCE_NUMBER"), std::string::npos) << broken.reason;

  // A new producer takes over: later messages are delivered.
  ASSERT_TRUE(WaitFor([&] { return sink->Ready(); }, kWait));
  for (int i = 3; i <= 12; ++i) sink->Submit(MakeMessage(i, "k"), rec.Callback());
  ASSERT_TRUE(rec.WaitCount(10));
  for (const Outcome& out : rec.outcomes()) {
    EXPECT_EQ(out.kind, OutcomeKind::kDelivered) << Raw(out.id) << ": " << out.reason;
  }
  EXPECT_EQ(sink->InFlight(), 0u);
}

TEST_F(KafkaSinkTest, MissingTopicIsRetriedNotDeadLettered) {
  // The mock cluster auto-creates any topic a client asks metadata for; a topic error makes
  // it answer UNKNOWN_TOPIC_OR_PART instead, as a real cluster without the topic would.
  rd_kafka_mock_topic_set_error(cluster_->raw(), "not.created.yet",
                                RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART);
  KafkaTarget target = Target({{"message.timeout.ms", "1500"}});
  target.topic = "not.created.yet";
  auto sink = MakeKafkaSink("orders", target);
  const Outcome out = SubmitAndWait(*sink, MakeMessage(1, "k"));
  EXPECT_EQ(out.kind, OutcomeKind::kRetry) << out.reason;
  EXPECT_FALSE(out.reason.empty());
}

TEST_F(KafkaSinkTest, FullLocalQueueRetriesWithoutBlockingLong) {
  Recorder rec;
  auto sink = MakeKafkaSink("orders", Target({{"queue.buffering.max.messages", "3"}}));
  ASSERT_EQ(SubmitAndWait(*sink, MakeMessage(1, "k")).kind, OutcomeKind::kDelivered);
  cluster_->SetAllBrokersDown(true);
  for (int i = 2; i <= 4; ++i)
    sink->Submit(MakeMessage(i, "k" + std::to_string(i)), rec.Callback());
  EXPECT_EQ(rec.size(), 0u);
  EXPECT_GE(static_cast<KafkaSink&>(*sink).QueueLength(), 3u);  // plus queued requests

  const auto start = std::chrono::steady_clock::now();
  sink->Submit(MakeMessage(5, "k5"), rec.Callback());
  EXPECT_LT(std::chrono::steady_clock::now() - start, 1s);
  ASSERT_EQ(rec.size(), 1u);  // completed before Submit returned
  const Outcome full = rec.outcomes().front();
  EXPECT_EQ(full.id, MessageId{5});
  EXPECT_EQ(full.kind, OutcomeKind::kRetry);
  EXPECT_EQ(full.reason_class, "queue_full");
  EXPECT_EQ(sink->InFlight(), 3u);
  sink->Shutdown(200ms);
  EXPECT_EQ(rec.size(), 4u);
}

void ExpectInvalid(const KafkaTarget& target, const std::string& must_mention) {
  try {
    MakeKafkaSink("orders", target);
    ADD_FAILURE() << "no exception; expected one naming " << must_mention;
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(must_mention), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("orders"), std::string::npos) << e.what();
  }
}

TEST_F(KafkaSinkTest, InvalidProducerPropertyFailsStartupNamingIt) {
  ExpectInvalid(Target({{"linger.ms", "banana"}}), "linger.ms");
  ExpectInvalid(Target({{"no.such.property", "1"}}), "no.such.property");
  ExpectInvalid(Target({{"compression.type", "zip"}}), "compression.type");
  ExpectInvalid(Target({{"acks", "1"}}), "acks");  // idempotence needs acks=all
  ExpectInvalid(Target({{"enable.idempotence", "false"}}), "enable.idempotence");
  ExpectInvalid(Target({{"transactional.id", "x"}}), "transactional.id");
  KafkaTarget no_brokers = Target();
  no_brokers.brokers.clear();
  ExpectInvalid(no_brokers, "bootstrap.servers");
}

// What librdkafka checks only when it creates the producer (one property against another) is
// checked by the validation check-config runs: a config it passed failed at `run` (review).
TEST_F(KafkaSinkTest, ValidationRefusesWhatTheProducerWouldRefuse) {
  for (const auto& [key, value] : std::vector<std::pair<std::string, std::string>>{
           {"max.in.flight", "10"}, {"retries", "0"}}) {
    KafkaTarget t = Target();
    t.producer[key] = value;
    try {
      ValidateKafkaTarget("orders", t);
      ADD_FAILURE() << key << "=" << value << " passed validation";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("orders"), std::string::npos) << e.what();
    }
    EXPECT_THROW(MakeKafkaSink("orders", t), std::invalid_argument) << key;
  }
  ValidateKafkaTarget("orders", Target());  // the defaults pass
}

TEST_F(KafkaSinkTest, PassesProducerPropertiesThrough) {
  auto sink = MakeKafkaSink("orders", Target({{"compression.type", "lz4"},
                                              {"linger.ms", "0"},
                                              {"acks", "all"},
                                              {"client.id", "relay-test"}}));
  EXPECT_EQ(SubmitAndWait(*sink, MakeMessage(1, std::nullopt)).kind, OutcomeKind::kDelivered);
  const auto records = cluster_->ConsumeAll(kTopic, 1, kWait);
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0].value, MakeMessage(1).payload);
}

}  // namespace
}  // namespace outbox::relay
