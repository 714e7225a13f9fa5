// Regression: several messages of one key written back to back, at a steady rate. A claim can
// park a message behind its predecessor while that predecessor's settle commits (a race the
// settle's own wake-up cannot see); the claim loop's recheck of blocked keys must wake it
// promptly (and the orphan safety net runs with the reaper) rather than leaving it to the
// full sweep, which took 30 s.
#include <gtest/gtest.h>

#include <pqxx/pqxx>
#include <thread>

#include "outbox/outbox.h"
#include "outbox_relay/dispatcher.h"
#include "outbox_relay/kafka_sink.h"
#include "outbox_test/kafka_mock.h"
#include "outbox_test/pg.h"
#include "outbox_test/wait.h"

namespace outbox::relay {
namespace {

using namespace std::chrono_literals;

class KeyBurstTest : public testing::PgTest {};

TEST_F(KeyBurstTest, BackToBackMessagesOfAKeyAreNotStrandedBehindASettledPredecessor) {
  testing::KafkaMockCluster kafka(1);
  kafka.CreateTopic("orders", 3);
  RelayConfig cfg;
  cfg.database_url = db_url_;
  cfg.retention.archive_delivered = true;  // delivered_at - created_at per message
  cfg.full_sweep_interval = std::chrono::hours(1);
  cfg.reap_interval = 2s;  // the orphan safety net runs with the reaper
  Destination d;
  d.name = "orders";
  KafkaTarget k;
  k.brokers = kafka.bootstraps();
  k.topic = "orders";
  d.target = k;
  cfg.destinations.emplace("orders", d);
  std::map<std::string, SinkPtr> sinks;
  sinks.emplace("orders", MakeKafkaSink("orders", k));
  Dispatcher relay(cfg, std::move(sinks));
  relay.Start();
  pqxx::connection c(db_url_);
  const auto start = std::chrono::steady_clock::now();
  int n = 0;
  while (std::chrono::steady_clock::now() - start < 6s) {  // ~1000/s, three per key in a row
    pqxx::work tx(c);
    outbox::Publish(
        tx, outbox::Message::To("orders").Json("1").Key("k" + std::to_string(n / 3)).Build());
    tx.commit();
    ++n;
    std::this_thread::sleep_until(start + std::chrono::microseconds(n * 1000));
  }
  ASSERT_TRUE(testing::WaitFor(
      [&] {
        pqxx::nontransaction t(c);
        return t.exec1("SELECT count(*) FROM outbox.messages")[0].as<int>() == 0;
      },
      60s));
  pqxx::nontransaction t(c);
  const auto r = t.exec1(
      "SELECT count(*), max(extract(epoch FROM delivered_at - created_at)) FROM "
      "outbox.delivered_archive");
  EXPECT_EQ(r[0].as<int>(), n);
  EXPECT_LT(r[1].as<double>(), 10.0) << "a message waited for the full sweep (switched off here)";
  relay.Stop();
}

}  // namespace
}  // namespace outbox::relay
