// The relay end to end, in process: real PostgreSQL, the dispatcher, the Kafka sink and
// librdkafka's mock cluster, with an independent consumer checking what arrived.
#include <gtest/gtest.h>

#include <map>
#include <pqxx/pqxx>
#include <set>

#include "outbox/outbox.h"
#include "outbox_relay/dead_letters.h"
#include "outbox_relay/dispatcher.h"
#include "outbox_relay/kafka_sink.h"
#include "outbox_relay/store.h"
#include "outbox_test/kafka_mock.h"
#include "outbox_test/pg.h"
#include "outbox_test/wait.h"

namespace outbox::relay {
namespace {

using namespace std::chrono_literals;
using testing::ConsumedRecord;
using testing::KafkaMockCluster;
using testing::WaitFor;

class RelayKafkaTest : public testing::PgTest {
 protected:
  void SetUp() override {
    PgTest::SetUp();
    kafka_ = std::make_unique<KafkaMockCluster>(3);
    kafka_->CreateTopic("orders", 3);
  }

  RelayConfig Config(std::map<std::string, std::string> producer = {}) {
    RelayConfig cfg;
    cfg.database_url = db_url_;
    cfg.batch_size = 100;
    cfg.poll_interval = 200ms;
    cfg.reap_interval = 200ms;
    cfg.full_sweep_interval = 2s;
    cfg.shutdown_timeout = 5000ms;
    Destination d;
    d.name = "orders";
    KafkaTarget k;
    k.brokers = kafka_->bootstraps();
    k.topic = "orders";
    k.producer = std::move(producer);
    d.target = k;
    d.retry.max_attempts = 50;
    d.retry.initial_backoff = 50ms;
    d.retry.max_backoff = 400ms;
    cfg.destinations.emplace("orders", d);
    return cfg;
  }

  std::unique_ptr<Dispatcher> StartRelay(const RelayConfig& cfg) {
    std::map<std::string, SinkPtr> sinks;
    for (const auto& [name, d] : cfg.destinations)
      sinks.emplace(name, MakeKafkaSink(name, d.target.Get<KafkaTarget>()));
    auto relay = std::make_unique<Dispatcher>(cfg, std::move(sinks));
    relay->Start();
    return relay;
  }

  std::vector<std::int64_t> Enqueue(int n, const std::string& dest = "orders", int keys = 5,
                                    std::size_t payload_size = 0) {
    pqxx::connection c(db_url_);
    pqxx::work tx(c);
    std::vector<outbox::OutboxMessage> batch;
    for (int i = 0; i < n; ++i) {
      auto b = outbox::Message::To(dest);
      std::string body =
          "{\"n\": " + std::to_string(i) + ", \"pad\": \"" + std::string(payload_size, 'x') + "\"}";
      b.Json(body).EventType("order.event").Header("tenant", "acme");
      if (keys > 0 && i % 4 != 3) b.Key("key-" + std::to_string(i % keys));  // every 4th has no key
      batch.push_back(b.Build());
    }
    auto ids = outbox::PublishMany(tx, batch);
    tx.commit();
    return ids;
  }

  std::int64_t Scalar(const std::string& sql) {
    pqxx::connection c(db_url_);
    pqxx::nontransaction tx(c);
    return tx.exec1(sql)[0].as<std::int64_t>();
  }

  std::map<std::int64_t, std::string> IdempotencyKeys() {
    pqxx::connection c(db_url_);
    pqxx::nontransaction tx(c);
    std::map<std::int64_t, std::string> out;
    for (const auto& r : tx.exec("SELECT id, idempotency_key::text FROM outbox.messages")) {
      out[r[0].as<std::int64_t>()] = r[1].as<std::string>();
    }
    return out;
  }

  bool QueueEmpty() { return Scalar("SELECT count(*) FROM outbox.messages") == 0; }

  // Every record's outbox-id, in consumption order per key; asserts order never goes back.
  static void ExpectPerKeyOrder(const std::vector<ConsumedRecord>& records) {
    std::map<std::string, std::int64_t> last;
    for (const auto& r : records) {
      if (!r.key) continue;
      const std::int64_t id = std::stoll(r.headers.at("outbox-id"));
      auto [it, fresh] = last.emplace(*r.key, id);
      if (!fresh) {
        EXPECT_GE(id, it->second) << "key " << *r.key << " went backwards";
        it->second = std::max(it->second, id);
      }
    }
  }

  std::unique_ptr<KafkaMockCluster> kafka_;
};

TEST_F(RelayKafkaTest, EveryMessageArrivesWithKeyHeadersAndIdempotencyKeyInOrderPerKey) {
  auto ids = Enqueue(400);
  const auto keys = IdempotencyKeys();
  auto relay = StartRelay(Config());
  ASSERT_TRUE(WaitFor([&] { return QueueEmpty(); }, 60s))
      << Scalar("SELECT count(*) FROM outbox.messages");
  auto records = kafka_->ConsumeAll("orders", ids.size(), 30s);
  ASSERT_GE(records.size(), ids.size());
  std::set<std::int64_t> seen;
  for (const auto& r : records) {
    const std::int64_t id = std::stoll(r.headers.at("outbox-id"));
    seen.insert(id);
    EXPECT_EQ(r.headers.at("idempotency-key"), keys.at(id));
    EXPECT_EQ(r.headers.at("event-type"), "order.event");
    EXPECT_EQ(r.headers.at("tenant"), "acme");
    EXPECT_EQ(r.headers.count("created-at"), 1u);
    const auto pos = std::find(ids.begin(), ids.end(), id) - ids.begin();
    if (pos % 4 == 3) {
      EXPECT_FALSE(r.key.has_value());
    } else {
      EXPECT_EQ(r.key.value_or(""), "key-" + std::to_string(pos % 5));
    }
    EXPECT_NE(r.value.find("\"n\": " + std::to_string(pos)), std::string::npos) << r.value;
  }
  EXPECT_EQ(seen.size(), ids.size());
  ExpectPerKeyOrder(records);
  EXPECT_TRUE(relay->Stop());
  EXPECT_EQ(relay->stats().delivered, static_cast<std::int64_t>(ids.size()));
}

// claim_connections: four claim loops on four connections take one backlog apart with real
// SKIP LOCKED claims; every message arrives once and each key in order, in both claim modes.
TEST_F(RelayKafkaTest, FourClaimConnectionsDeliverEveryMessageOnceInOrderPerKey) {
  for (const auto mode : {ClaimMode::kSkipLocked, ClaimMode::kPartitioned}) {
    SCOPED_TRACE(mode == ClaimMode::kSkipLocked ? "skip_locked" : "partitioned");
    const std::string topic = mode == ClaimMode::kSkipLocked ? "cc-skip" : "cc-partitioned";
    kafka_->CreateTopic(topic, 3);
    const auto ids = Enqueue(2000, "orders", /*keys=*/40);
    auto cfg = Config();
    cfg.batch_size = 50;
    cfg.claim_connections = 4;
    // No sweep during the test: a row one loop's claim locked and left, which the other loops'
    // cursors passed, must be found by that loop, not by the sweep.
    cfg.full_sweep_interval = 10min;
    cfg.claim_mode = mode;
    cfg.destinations.at("orders").target.Get<KafkaTarget>().topic = topic;
    auto relay = StartRelay(cfg);
    ASSERT_TRUE(WaitFor([&] { return QueueEmpty(); }, 60s))
        << Scalar("SELECT count(*) FROM outbox.messages");
    const auto records = kafka_->ConsumeAll(topic, ids.size(), 30s);
    std::map<std::int64_t, int> copies;
    for (const auto& r : records) ++copies[std::stoll(r.headers.at("outbox-id"))];
    EXPECT_EQ(copies.size(), ids.size());
    for (const auto id : ids) EXPECT_EQ(copies[id], 1) << "message " << id;
    ExpectPerKeyOrder(records);
    EXPECT_TRUE(relay->Stop());
    EXPECT_EQ(relay->stats().delivered, static_cast<std::int64_t>(ids.size()));
    EXPECT_EQ(relay->stats().sweep_found, 0);
    EXPECT_EQ(Scalar("SELECT count(*) FROM outbox.leases"), 0) << "a claim's record was left";
  }
}

// W3C trace context written in SQL reaches the Kafka consumer unchanged (issue 14).
TEST_F(RelayKafkaTest, TraceContextWrittenInSqlArrivesUnchangedAsKafkaHeaders) {
  const std::string traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
  const std::string tracestate = "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE";
  {
    pqxx::connection c(db_url_);
    pqxx::work tx(c);
    tx.exec_params(
        "SELECT outbox.enqueue('orders', '{\"n\": 1}'::jsonb, headers => "
        "jsonb_build_object('traceparent', $1::text, 'tracestate', $2::text))",
        traceparent, tracestate);
    tx.commit();
  }
  auto relay = StartRelay(Config());
  auto records = kafka_->ConsumeAll("orders", 1, 30s);
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0].headers.at("traceparent"), traceparent);
  EXPECT_EQ(records[0].headers.at("tracestate"), tracestate);
  EXPECT_TRUE(relay->Stop());
}

TEST_F(RelayKafkaTest, NewMessagesLeaveWithinMillisecondsThroughNotify) {
  auto relay = StartRelay(Config());
  Enqueue(1);  // warm up: producer connected
  ASSERT_TRUE(WaitFor([&] { return QueueEmpty(); }, 30s));
  // With poll_interval at 10 s, only a notification can explain a fast delivery.
  relay->Stop();
  auto cfg = Config();
  cfg.poll_interval = 10s;
  relay = StartRelay(cfg);
  ASSERT_TRUE(WaitFor([&] { return relay->Ready(); }, 20s));
  const auto start = std::chrono::steady_clock::now();
  Enqueue(1);
  ASSERT_TRUE(WaitFor([&] { return QueueEmpty(); }, 9s, 1ms)) << "not woken by NOTIFY";
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
}

TEST_F(RelayKafkaTest, RetriableBrokerErrorsAreRetriedThenSucceed) {
  auto ids = Enqueue(50);
  kafka_->PushRequestErrors(
      RD_KAFKAP_Produce,
      {RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION, RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT,
       RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS, RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE});
  auto relay = StartRelay(Config());
  ASSERT_TRUE(WaitFor([&] { return QueueEmpty(); }, 60s));
  auto records = kafka_->ConsumeAll("orders", ids.size(), 30s);
  std::set<std::int64_t> seen;
  for (const auto& r : records) seen.insert(std::stoll(r.headers.at("outbox-id")));
  EXPECT_EQ(seen.size(), ids.size());
  EXPECT_EQ(Scalar("SELECT count(*) FROM outbox.dead_letters"), 0);
  ExpectPerKeyOrder(records);
}

TEST_F(RelayKafkaTest, BrokersDownForAWhileLoseNothingAndKeysStayStable) {
  auto ids = Enqueue(60);
  const auto keys = IdempotencyKeys();
  kafka_->SetAllBrokersDown(true);
  auto relay = StartRelay(Config({{"message.timeout.ms", "700"}}));
  // Deliveries time out and go back to the queue as retries.
  ASSERT_TRUE(WaitFor(
      [&] { return Scalar("SELECT count(*) FROM outbox.messages WHERE attempts > 0") > 0; }, 30s));
  kafka_->SetAllBrokersDown(false);
  ASSERT_TRUE(WaitFor([&] { return QueueEmpty(); }, 90s))
      << Scalar("SELECT count(*) FROM outbox.messages");
  EXPECT_EQ(Scalar("SELECT count(*) FROM outbox.dead_letters"), 0);
  auto records = kafka_->ConsumeAll("orders", ids.size(), 30s);
  std::set<std::int64_t> seen;
  for (const auto& r : records) {
    const std::int64_t id = std::stoll(r.headers.at("outbox-id"));
    seen.insert(id);
    EXPECT_EQ(r.headers.at("idempotency-key"), keys.at(id)) << "stable across redeliveries";
  }
  EXPECT_EQ(seen.size(), ids.size());
  ExpectPerKeyOrder(records);
  EXPECT_GT(relay->stats().retried, 0);
}

TEST_F(RelayKafkaTest, PermanentErrorsDeadLetterAtOnceWithTheReason) {
  Enqueue(3, "orders", 0, 5000);  // larger than message.max.bytes below
  Enqueue(2, "orders", 0, 10);
  auto relay = StartRelay(Config({{"message.max.bytes", "2000"}}));
  ASSERT_TRUE(WaitFor([&] { return QueueEmpty(); }, 30s));
  EXPECT_EQ(Scalar("SELECT count(*) FROM outbox.dead_letters"), 3);
  EXPECT_EQ(Scalar("SELECT count(*) FROM outbox.dead_letters WHERE attempts = 1 AND reason ILIKE "
                   "'%too large%'"),
            3);
  EXPECT_EQ(relay->stats().delivered, 2);
}

// The database takes payloads up to outbox.settings.max_payload_bytes, 1 MiB by default;
// librdkafka's producer refused anything over its message.max.bytes, 1,000,000 by default,
// payload, key and headers together. A payload in between was accepted from the writer and
// then dead-lettered at once as msg_too_large (review). The relay's producer default covers
// the database's default limit now.
TEST_F(RelayKafkaTest, APayloadUnderTheDatabasesDefaultLimitIsDeliveredNotDeadLettered) {
  const auto ids = Enqueue(1, "orders", 1, 1'040'000);
  auto relay = StartRelay(Config());
  ASSERT_TRUE(WaitFor([&] { return QueueEmpty(); }, 30s));
  EXPECT_EQ(Scalar("SELECT count(*) FROM outbox.dead_letters"), 0);
  EXPECT_EQ(relay->stats().delivered, 1);
  const auto records = kafka_->ConsumeAll("orders", 1, 30s);
  ASSERT_EQ(records.size(), 1u);
  EXPECT_GT(records.front().value.size(), 1'040'000u);
  EXPECT_EQ(std::stoll(records.front().headers.at("outbox-id")), ids.front());
}

TEST_F(RelayKafkaTest, ExhaustedAttemptsDeadLetterAndReplayDeliversWithTheSameKey) {
  auto ids = Enqueue(4, "orders", 2);
  const auto keys = IdempotencyKeys();
  kafka_->SetAllBrokersDown(true);
  auto cfg = Config({{"message.timeout.ms", "300"}});
  cfg.destinations.at("orders").retry.max_attempts = 2;
  auto relay = StartRelay(cfg);
  ASSERT_TRUE(WaitFor([&] { return QueueEmpty(); }, 60s));
  EXPECT_EQ(Scalar("SELECT count(*) FROM outbox.dead_letters WHERE attempts = 2 AND reason LIKE "
                   "'gave up after 2 attempts%'"),
            4);
  kafka_->SetAllBrokersDown(false);
  Store c(db_url_);
  EXPECT_EQ(ReplayDeadLetters(c, {}, "orders").ids.size(), 4u);
  ASSERT_TRUE(WaitFor([&] { return QueueEmpty(); }, 60s));
  EXPECT_EQ(Scalar("SELECT count(*) FROM outbox.dead_letters"), 0);
  auto records = kafka_->ConsumeAll("orders", 4, 30s);
  std::set<std::string> delivered_keys;
  for (const auto& r : records) delivered_keys.insert(r.headers.at("idempotency-key"));
  for (const auto& [id, key] : keys)
    EXPECT_EQ(delivered_keys.count(key), 1u) << "replayed with its idempotency key";
}

// A destination this relay does not serve may be another relay's: it is left alone (never
// dead-lettered by a relay), and its messages wait for a relay that serves it.
TEST_F(RelayKafkaTest, UnknownDestinationIsLeftForARelayThatServesIt) {
  Enqueue(3, "no-such-destination");
  auto ids = Enqueue(5, "orders");
  auto relay = StartRelay(Config());  // full sweeps (and the unserved check) every 2 s
  ASSERT_TRUE(WaitFor([&] { return relay->stats().delivered == 5; }, 30s));
  // Past the first checks for unserved destinations (5 s, then every full sweep, 2 s here).
  ASSERT_TRUE(WaitFor([&] { return relay->stats().claims > 40; }, 30s));
  EXPECT_EQ(Scalar("SELECT count(*) FROM outbox.dead_letters"), 0);
  EXPECT_EQ(Scalar("SELECT count(*) FROM outbox.messages WHERE destination = "
                   "'no-such-destination' AND lease_owner IS NULL AND attempts = 0"),
            3);
}

TEST_F(RelayKafkaTest, GracefulShutdownLeavesNothingLeasedAndLosesNothing) {
  auto ids = Enqueue(3000, "orders", 50);
  auto relay = StartRelay(Config({{"linger.ms", "50"}}));
  ASSERT_TRUE(WaitFor([&] { return relay->stats().delivered > 0; }, 30s));
  EXPECT_TRUE(relay->Stop());
  EXPECT_EQ(Scalar("SELECT count(*) FROM outbox.messages WHERE lease_owner IS NOT NULL"), 0);
  EXPECT_EQ(Scalar("SELECT count(*) FROM outbox.messages WHERE attempts > 0"), 0)
      << "a shutdown is not a failed attempt";
  relay = StartRelay(Config());
  ASSERT_TRUE(WaitFor([&] { return QueueEmpty(); }, 120s));
  auto records = kafka_->ConsumeAll("orders", ids.size(), 30s);
  std::set<std::int64_t> seen;
  for (const auto& r : records) seen.insert(std::stoll(r.headers.at("outbox-id")));
  EXPECT_EQ(seen.size(), ids.size());
  ExpectPerKeyOrder(records);
}

TEST_F(RelayKafkaTest, PostgresRestartedMidRunLosesNothing) {
  auto ids = Enqueue(2000, "orders", 20);
  auto relay = StartRelay(Config());
  ASSERT_TRUE(WaitFor([&] { return relay->stats().delivered > 0; }, 30s));
  testing::PgCluster::Instance().Restart();
  auto more = Enqueue(500, "orders", 20);
  ASSERT_TRUE(WaitFor([&] { return QueueEmpty(); }, 120s))
      << Scalar("SELECT count(*) FROM outbox.messages");
  auto records = kafka_->ConsumeAll("orders", ids.size() + more.size(), 30s);
  std::set<std::int64_t> seen;
  for (const auto& r : records) seen.insert(std::stoll(r.headers.at("outbox-id")));
  EXPECT_EQ(seen.size(), ids.size() + more.size());
  ExpectPerKeyOrder(records);
  EXPECT_GT(relay->stats().db_errors, 0) << "the restart was noticed";
}

}  // namespace
}  // namespace outbox::relay
