// Several relays in partitioned mode, in one process (each Dispatcher is its own relay
// instance with its own id), on a real PostgreSQL and librdkafka's mock cluster.
#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <pqxx/pqxx>
#include <set>
#include <thread>

#include "outbox/outbox.h"
#include "outbox_relay/dispatcher.h"
#include "outbox_relay/kafka_sink.h"
#include "outbox_relay/store.h"
#include "outbox_test/kafka_mock.h"
#include "outbox_test/pg.h"
#include "outbox_test/wait.h"

namespace outbox::relay {
namespace {

using namespace std::chrono_literals;
using testing::WaitFor;

class PartitionedTest : public testing::PgTest {
 protected:
  void SetUp() override {
    PgTest::SetUp();
    kafka_ = std::make_unique<testing::KafkaMockCluster>(1);
    kafka_->CreateTopic("orders", 4);
  }

  RelayConfig Config(ClaimMode mode) {
    RelayConfig cfg;
    cfg.database_url = db_url_;
    cfg.batch_size = 200;
    cfg.poll_interval = 200ms;
    cfg.reap_interval = 500ms;
    cfg.full_sweep_interval = 2s;
    cfg.shutdown_timeout = 5000ms;
    cfg.claim_mode = mode;
    cfg.partition_heartbeat = 100ms;
    cfg.partition_lease = 1000ms;
    Destination d;
    d.name = "orders";
    KafkaTarget k;
    k.brokers = kafka_->bootstraps();
    k.topic = "orders";
    d.target = k;
    d.retry.initial_backoff = 50ms;
    d.retry.max_backoff = 400ms;
    cfg.destinations.emplace("orders", d);
    return cfg;
  }

  std::unique_ptr<Dispatcher> StartRelay(const RelayConfig& cfg) {
    std::map<std::string, SinkPtr> sinks;
    sinks.emplace("orders",
                  MakeKafkaSink("orders", cfg.destinations.at("orders").target.Get<KafkaTarget>()));
    auto relay = std::make_unique<Dispatcher>(cfg, std::move(sinks));
    relay->Start();
    return relay;
  }

  void Enqueue(int n, int keys, std::optional<outbox::Clock::time_point> at = std::nullopt) {
    pqxx::connection c(db_url_);
    for (int start = 0; start < n; start += 5000) {
      pqxx::work tx(c);
      std::vector<outbox::OutboxMessage> batch;
      for (int i = start; i < std::min(n, start + 5000); ++i) {
        auto b = outbox::Message::To("orders");
        b.Json("{\"i\": " + std::to_string(i) + "}");
        if (keys > 0) b.Key("k" + std::to_string(i % keys));
        if (at) b.DeliverAt(*at);
        batch.push_back(b.Build());
      }
      outbox::PublishMany(tx, batch);
      tx.commit();
    }
  }

  std::int64_t Scalar(const std::string& sql) {
    pqxx::connection c(db_url_);
    pqxx::nontransaction tx(c);
    return tx.exec1(sql)[0].as<std::int64_t>();
  }

  // Once settled: every bucket has exactly one owner, a live relay, and shares differ by at most 1.
  bool Settled(std::size_t relays) {
    pqxx::connection c(db_url_);
    pqxx::nontransaction tx(c);
    auto r = tx.exec1(
        "SELECT (SELECT count(*) FROM outbox.relay_instances), "
        "(SELECT count(*) FROM outbox.bucket_owners WHERE owner IS NULL OR owner NOT IN "
        "  (SELECT instance_id FROM outbox.relay_instances)), "
        "(SELECT coalesce(max(n) - min(n), 0) FROM (SELECT count(*) n FROM outbox.bucket_owners "
        "GROUP BY owner) s), "
        "(SELECT count(DISTINCT owner) FROM outbox.bucket_owners)");
    return r[0].as<std::size_t>() == relays && r[1].as<int>() == 0 && r[2].as<int>() <= 1 &&
           r[3].as<std::size_t>() == relays;
  }

  std::unique_ptr<testing::KafkaMockCluster> kafka_;
};

TEST_F(PartitionedTest, OneThenFourThenTwoRelaysWhileMessagesFlow) {
  std::atomic<bool> producing{true};
  std::atomic<int> produced{0};
  std::thread producer([&] {
    while (producing) {
      Enqueue(200, 30);
      produced += 200;
    }
  });
  std::vector<std::unique_ptr<Dispatcher>> relays;
  relays.push_back(StartRelay(Config(ClaimMode::kPartitioned)));
  ASSERT_TRUE(WaitFor([&] { return Settled(1); }, 20s));
  ASSERT_TRUE(WaitFor([&] { return relays[0]->stats().delivered > 500; }, 30s));
  for (int i = 0; i < 3; ++i) relays.push_back(StartRelay(Config(ClaimMode::kPartitioned)));
  ASSERT_TRUE(WaitFor([&] { return Settled(4); }, 20s)) << "four relays, 16 buckets each";
  ASSERT_TRUE(WaitFor([&] { return relays[3]->stats().delivered > 100; }, 30s))
      << "the newcomer works";
  relays[0]->Stop();
  relays[1]->Stop();
  ASSERT_TRUE(WaitFor([&] { return Settled(2); }, 20s)) << "stopped relays hand their buckets back";
  producing = false;
  producer.join();
  ASSERT_TRUE(WaitFor([&] { return Scalar("SELECT count(*) FROM outbox.messages") == 0; }, 120s))
      << Scalar("SELECT count(*) FROM outbox.messages") << " left";
  auto records = kafka_->ConsumeAll("orders", static_cast<std::size_t>(produced.load()), 60s);
  std::set<std::int64_t> seen;
  std::map<std::string, std::int64_t> last;
  for (const auto& r : records) {
    const std::int64_t id = std::stoll(r.headers.at("outbox-id"));
    if (!seen.insert(id).second) continue;  // a duplicate (at least once)
    auto [it, fresh] = last.emplace(r.key.value_or(""), id);
    if (!fresh) {
      EXPECT_GT(id, it->second) << "key " << *r.key << " went backwards";
      it->second = id;
    }
  }
  EXPECT_EQ(seen.size(), static_cast<std::size_t>(produced.load()));
  EXPECT_EQ(Scalar("SELECT count(*) FROM outbox.dead_letters"), 0);
}

TEST_F(PartitionedTest, ABurstWithOneDeliverTimeDrainsInBothModes) {
  for (const auto mode : {ClaimMode::kSkipLocked, ClaimMode::kPartitioned}) {
    Enqueue(20000, 0, outbox::Clock::now() + 1500ms);
    std::vector<std::unique_ptr<Dispatcher>> relays;
    for (int i = 0; i < 2; ++i) relays.push_back(StartRelay(Config(mode)));
    EXPECT_TRUE(WaitFor([&] { return Scalar("SELECT count(*) FROM outbox.messages") == 0; }, 120s))
        << (mode == ClaimMode::kPartitioned ? "partitioned" : "skip_locked") << ": "
        << Scalar("SELECT count(*) FROM outbox.messages") << " left";
    for (auto& r : relays) r->Stop();
  }
  EXPECT_EQ(Scalar("SELECT count(*) FROM outbox.dead_letters"), 0);
}

// The slow lane takes a share of its limit from each bucket, so with every due retry in one
// bucket a claim gets a share of a few rows: the claim says more is due and the relay claims
// again at once. Judged by the count it got (fewer than it asked for: "drained"), it waited for
// the next poll (a minute here) after each share.
TEST_F(PartitionedTest, RetriesDueInOneBucketDrainWithoutWaitingForThePoll) {
  Scalar("SELECT count(*) FROM outbox.set_bucket_count(8)");
  Scalar(
      "WITH i AS (INSERT INTO outbox.messages (destination, idempotency_key, payload, "
      "deliver_after, created_at, parked, attempts, bucket) SELECT 'orders', gen_random_uuid(), "
      "jsonb_build_object('i', g), now() - interval '1 minute', now(), true, 1, 5 "
      "FROM generate_series(1, 1000) g RETURNING 1) SELECT count(*) FROM i");
  auto cfg = Config(ClaimMode::kPartitioned);
  cfg.poll_interval = 60s;
  auto relay = StartRelay(cfg);
  EXPECT_TRUE(WaitFor([&] { return Scalar("SELECT count(*) FROM outbox.messages") == 0; }, 30s))
      << Scalar("SELECT count(*) FROM outbox.messages") << " of 1000 left";
  relay->Stop();
}

// A relay claims the buckets of an owner that does not serve its destination (the owner's
// heartbeat says so). Such a bucket joined the scan when the owner's heartbeat appeared, which
// the relay's own buckets did not show: its fresh-lane cursor, moved on over its own buckets'
// rows, passed every row there, left for the full sweep (review). A change of the buckets a
// claim scans now starts the lane over.
TEST_F(PartitionedTest, RowsOfABucketWhoseOwnerTurnsOutNotToServeTheDestinationGoWithoutTheSweep) {
  auto cfg = Config(ClaimMode::kPartitioned);
  cfg.full_sweep_interval = std::chrono::minutes(10);
  auto relay = StartRelay(cfg);
  ASSERT_TRUE(WaitFor([&] { return Settled(1); }, 10s));
  // Another relay, serving only "payments", joins: half the buckets are its. Its heartbeat
  // (which says what it serves) comes later, as a starting relay's does.
  const std::string other = "00000000-0000-4000-8000-0000000000bb";
  std::atomic<bool> stop{false};
  std::thread coordinator([&] {
    Store store(db_url_);
    while (!stop) {
      store.Coordinate(other, 1000ms, false, "payments relay");
      std::this_thread::sleep_for(100ms);
    }
    store.Coordinate(other, 1000ms, true, "payments relay");
  });
  struct Join {
    std::atomic<bool>& stop;
    std::thread& t;
    ~Join() {
      stop = true;
      t.join();
    }
  } join{stop, coordinator};
  ASSERT_TRUE(WaitFor([&] { return Settled(2); }, 10s));
  Enqueue(400, 400);
  const std::string in_others =
      "SELECT count(*) FROM outbox.messages m JOIN outbox.bucket_owners o USING (bucket) "
      "WHERE o.owner = '" +
      other + "'";
  const std::int64_t theirs = Scalar(in_others);
  ASSERT_GT(theirs, 0);
  // The relay drains its own buckets, its cursor passing the ids of the other's rows.
  ASSERT_TRUE(
      WaitFor([&] { return Scalar("SELECT count(*) FROM outbox.messages") == theirs; }, 20s));
  Store(db_url_).Heartbeat(other, {"payments"}, "payments relay", {});
  EXPECT_TRUE(WaitFor([&] { return Scalar("SELECT count(*) FROM outbox.messages") == 0; }, 15s))
      << Scalar("SELECT count(*) FROM outbox.messages") << " of " << theirs
      << " left in the other relay's buckets (the full sweep is 10 minutes away)";
  relay->Stop();
}

}  // namespace
}  // namespace outbox::relay
