// `delivery: exactly_once` with real `outbox-relay` processes (docs/delivery-semantics.md,
// ADR 0002): two relays in claim_mode partitioned deliver a continuous flow to the mock
// cluster while they are SIGKILLed and restarted in turn (mid-transaction, between commit and
// settle: wherever the kill lands), stopped gracefully mid-flow, cut off from every broker and
// put through a Postgres restart. At the end a consumer finds every message exactly once, in
// per-key order, and `outbox-relay verify` (read_committed) reports no duplicate and no gap.
//
// Not here: a relay that stalls (SIGSTOP) past its leases and wakes up. Against a real broker
// the new owner's init_transactions fences it (same transactional id, bumped epoch); the
// mock cluster gives every new producer a fresh producer id and fences nobody, so the stalled
// relay could still commit, and this test would measure the mock, not the relay.
//
// The mock cluster keeps no transaction state for consumers (what a transaction that did not
// commit wrote stays visible), so a message a killed relay produced without committing is
// seen here as sent: the recovery of the relay that takes it over reads what a consumer reads
// and settles it without producing it again, and the check below holds either way.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "outbox_test/pg.h"
#include "outbox_test/wait.h"
#include "process_harness.h"

namespace outbox::testing {
namespace {

using namespace std::chrono_literals;

// The sum over a relay's log of "exactly-once recovery: N of M message(s)".
std::int64_t Recovered(const std::string& log) {
  static const std::regex re(R"(exactly-once recovery: (\d+) of)");
  std::int64_t sum = 0;
  for (auto it = std::sregex_iterator(log.begin(), log.end(), re); it != std::sregex_iterator();
       ++it) {
    sum += std::stoll((*it)[1].str());
  }
  return sum;
}

class ExactlyOnceProcessTest : public RelayProcessFixture {
 protected:
  std::string Config() {
    std::string yaml = Yaml(db_url_, {},
                            "claim_mode: partitioned\n"
                            "partition_heartbeat_ms: 200\n"
                            "partition_lease_ms: 1500\n"
                            "retention:\n"
                            "  archive_delivered: true\n");
    const std::string topic_line = std::string("      topic: ") + kTopic + "\n";
    const auto at = yaml.find(topic_line);
    if (at == std::string::npos) throw std::logic_error("the harness config has no topic line");
    yaml.insert(at + topic_line.size(), "      delivery: exactly_once\n");
    return WriteConfig("relay.yaml", yaml);
  }

  std::int64_t Archived() const { return Scalar("SELECT count(*) FROM outbox.delivered_archive"); }

  // Waits until the relays delivered `n` more messages than now.
  ::testing::AssertionResult DeliveredMore(std::int64_t n, Millis timeout) const {
    const std::int64_t target = Archived() + n;
    if (WaitFor([&] { return Archived() >= target; }, timeout, kDbPoll)) {
      return ::testing::AssertionSuccess();
    }
    return ::testing::AssertionFailure() << "only " << Archived() << " of " << target
                                         << " delivered within " << timeout.count() << " ms";
  }

  std::int64_t BucketsOf(pid_t pid) const {
    return Scalar(
        "SELECT count(*) FROM outbox.bucket_owners o JOIN outbox.relay_instances i ON "
        "o.owner = i.instance_id WHERE i.description LIKE '% pid " +
        std::to_string(pid) + "'");
  }
};

TEST_F(ExactlyOnceProcessTest, ConsumersSeeEveryMessageOnceAcrossKillsOutagesAndRestarts) {
  // Few buckets: each is a transactional producer in the relay that owns it.
  Scalar("SELECT count(*) FROM (SELECT outbox.set_bucket_count(6)) s");
  const std::string config = Config();
  ChildProcess& check = Spawn("check-config", {"check-config", "--config", config});
  ASSERT_TRUE(check.WaitExit(30s)) << check.Describe();
  EXPECT_TRUE(check.ExitedWith(0)) << check.Describe() << check.Stderr();
  EXPECT_NE(check.Stdout().find("orders (kafka, exactly once): 50 attempt(s)"), std::string::npos)
      << check.Stdout();
  auto producer =
      std::make_unique<ContinuousProducer>(db_url_, 10, 20ms, 12, 8, "exactly-once-process-test");
  producer->Start();
  std::vector<ChildProcess*> relays = {&StartRelay(config), &StartRelay(config)};
  std::vector<ChildProcess*> every = relays;  // every relay process the test started
  ASSERT_TRUE(DeliveredMore(200, 60s));
  // Their heartbeats say they deliver exactly once, so the bucket count (the buckets being
  // what their producers fence each other by) does not change under them (migration 0017).
  EXPECT_EQ(Scalar("SELECT count(*) FROM outbox.relay_instances WHERE exactly_once"), 2);
  EXPECT_THROW(Scalar("SELECT count(*) FROM (SELECT outbox.set_bucket_count(4)) s"),
               pqxx::sql_error);

  // 1. SIGKILL each relay twice, in turn, while messages flow (mid-transaction, between the
  //    commit and the settle, wherever it lands); restart it at once.
  for (int round = 0; round < 4; ++round) {
    ChildProcess*& victim = relays[round % 2];
    victim->Kill();
    victim = &StartRelay(config);
    every.push_back(victim);
    ASSERT_TRUE(producer->WaitForMore(150, 30s)) << producer->error();
    ASSERT_TRUE(DeliveredMore(150, 60s));
  }
  // 2. A graceful stop in the middle of the flow (what a transaction holds at the deadline
  //    counts as an attempt), and a restart.
  StopGracefully(*relays[0]);
  relays[0] = &StartRelay(config);
  every.push_back(relays[0]);
  ASSERT_TRUE(DeliveredMore(150, 60s));
  // 3. Every broker down while transactions are open, then back.
  kafka_->SetAllBrokersDown(true);
  ASSERT_TRUE(producer->WaitForMore(200, 30s)) << producer->error();
  kafka_->SetAllBrokersDown(false);
  ASSERT_TRUE(DeliveredMore(150, 60s));
  // 4. Postgres restarted under the relays (the writer reconnects as a new producer).
  producer->Stop();
  ASSERT_TRUE(producer->error().empty()) << producer->error();
  ExpectedMap expected = producer->expected();
  PgCluster::Instance().Restart();
  producer =
      std::make_unique<ContinuousProducer>(db_url_, 10, 20ms, 12, 8, "exactly-once-process-test");
  producer->Start();
  ASSERT_TRUE(producer->WaitForMore(150, 30s)) << producer->error();
  ASSERT_TRUE(DeliveredMore(150, 60s));

  producer->Stop();
  ASSERT_TRUE(producer->error().empty()) << producer->error();
  expected.merge(producer->expected());
  ASSERT_TRUE(DrainedBy(relays, 120s));
  EXPECT_EQ(DeadLetters(), 0);

  const std::vector<ConsumedRecord> records = ConsumeAtLeast(expected.size());
  const std::size_t duplicates = ExpectAllDeliveredInKeyOrder(records, expected);
  EXPECT_EQ(duplicates, 0u) << "a consumer saw " << duplicates << " message(s) twice";

  for (ChildProcess* r : relays) StopGracefully(*r);
  // A bucket's transactional id is the same in whichever relay owns it: the relay that takes
  // a bucket over creates the producer the previous owner had (with a real broker, that
  // fences it; the mock cluster hands each new producer a fresh producer id instead).
  static const std::regex ready(R"(transactional producer (\S+) ready)");
  std::map<std::string, std::set<pid_t>> users;  // transactional id -> relay processes
  std::int64_t recovered = 0;
  for (ChildProcess* r : every) {
    const std::string log = r->Stderr();
    for (auto it = std::sregex_iterator(log.begin(), log.end(), ready);
         it != std::sregex_iterator(); ++it) {
      users[(*it)[1].str()].insert(r->pid());
    }
    recovered += Recovered(log);
  }
  EXPECT_EQ(users.size(), 6u) << "one transactional id per bucket";
  for (const auto& [id, pids] : users) {
    EXPECT_TRUE(id.starts_with("outbox-relay.orders.")) << id;
    EXPECT_GE(pids.size(), 2u) << id << " was used by one relay only";
  }
  std::cout << "[ info ] " << expected.size()
            << " messages through 4 SIGKILLs, a SIGTERM, a broker outage and a Postgres "
               "restart: "
            << records.size() << " records, " << duplicates << " duplicates; recovery found "
            << recovered << " message(s) already committed and did not produce them again"
            << std::endl;

  ChildProcess& verify = Spawn("verify", {"verify", "--config", config, "--json", dir_ + "/v.json",
                                          "--timeout-ms", "60000"});
  ASSERT_TRUE(verify.WaitExit(90s)) << verify.Describe();
  EXPECT_TRUE(verify.ExitedWith(0)) << verify.Describe() << "\n"
                                    << verify.Stdout() << verify.Stderr();
  const auto report = nlohmann::json::parse(ReadWholeFile(dir_ + "/v.json"));
  EXPECT_EQ(report["duplicate_count"], 0) << report.dump(2);
  EXPECT_EQ(report["gap_count"], 0) << report.dump(2);
  EXPECT_EQ(report["archived"], static_cast<std::int64_t>(expected.size()));
}

}  // namespace
}  // namespace outbox::testing
