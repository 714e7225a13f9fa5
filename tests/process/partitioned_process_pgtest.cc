// claim_mode: partitioned with real `outbox-relay` processes (docs/scaling.md): relays join,
// leave (SIGTERM: they hand their buckets back at once), die (SIGKILL: their buckets move
// after partition_lease_ms) and pause (SIGSTOP past both the partition lease and the message
// lease, then SIGCONT) while a producer thread keeps enqueueing. The coordinator's state is
// read from outbox.relay_instances and outbox.bucket_owners; every instance describes itself
// as "<host> pid <pid>", which maps it to its child process. What reached Kafka is checked as
// in relay_process_pgtest: nothing lost, redeliveries keep their idempotency key, per key the
// first occurrences never go backwards; and an invariant monitor samples throughout that no
// two messages of one key are leased at once and that no bucket is owned by an unregistered
// instance. The harness is process_harness.h.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <pqxx/pqxx>
#include <regex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "outbox/outbox.h"
#include "outbox_test/kafka_mock.h"
#include "outbox_test/pg.h"
#include "outbox_test/wait.h"
#include "process_harness.h"

namespace outbox::testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr int kBuckets = 64;             // outbox.partitioning.bucket_count (default)
constexpr Millis kHeartbeat{200};        // partition_heartbeat_ms
constexpr Millis kPartitionLease{1500};  // partition_lease_ms
constexpr Millis kLease{3000};           // lease_ms (in RelayProcessFixture::Yaml)
constexpr Millis kReapInterval{200};     // reap_interval_ms (in RelayProcessFixture::Yaml)

Millis Since(Clock::time_point t) { return std::chrono::duration_cast<Millis>(Clock::now() - t); }

// ---------------------------------------------------------------------------------------
// The coordinator's state, read in one snapshot.
struct Assignment {
  int buckets = 0;                      // rows of outbox.bucket_owners
  int unowned = 0;                      // owner IS NULL
  int orphaned = 0;                     // owner not registered in outbox.relay_instances
  std::map<std::string, int> owned;     // owner -> number of buckets
  std::map<std::string, pid_t> pid_of;  // registered instance -> pid (from its description)

  std::optional<std::string> InstanceOf(pid_t pid) const {
    for (const auto& [id, p] : pid_of) {
      if (p == pid) return id;
    }
    return std::nullopt;
  }
  int OwnedBy(pid_t pid) const {
    const auto id = InstanceOf(pid);
    if (!id) return 0;
    const auto it = owned.find(*id);
    return it == owned.end() ? 0 : it->second;
  }
  std::string Describe() const {
    std::string s = std::to_string(buckets) + " buckets, " + std::to_string(unowned) +
                    " unowned, " + std::to_string(orphaned) +
                    " owned by unregistered instances; registered:";
    for (const auto& [id, pid] : pid_of) {
      const auto it = owned.find(id);
      s += " pid " + std::to_string(pid) + " owns " +
           std::to_string(it == owned.end() ? 0 : it->second) + ";";
    }
    if (pid_of.empty()) s += " none";
    return s;
  }
};

pid_t PidFromDescription(const std::string& description) {
  const auto at = description.rfind(" pid ");
  if (at == std::string::npos) return -1;
  try {
    return static_cast<pid_t>(std::stol(description.substr(at + 5)));
  } catch (const std::exception&) {
    return -1;
  }
}

// The bucket count of the last "this relay now owns N bucket(s)" line of a relay's log, or -1.
int LastOwnedCount(const std::string& log) {
  static const std::regex re(R"(now owns (\d+) bucket\(s\))");
  int last = -1;
  for (auto it = std::sregex_iterator(log.begin(), log.end(), re); it != std::sregex_iterator();
       ++it) {
    last = std::stoi((*it)[1].str());
  }
  return last;
}

// The sum over a relay's log of settlements that wrote nothing: "N settlements fenced" (the
// row is leased by someone else or back in the queue) and "N settlements found their message
// already gone" (another relay delivered it meanwhile).
std::int64_t FencedSettlements(const std::string& log) {
  static const std::regex re(R"((\d+) settlements (fenced|found their message already gone))");
  std::int64_t sum = 0;
  for (auto it = std::sregex_iterator(log.begin(), log.end(), re); it != std::sregex_iterator();
       ++it) {
    sum += std::stoll((*it)[1].str());
  }
  return sum;
}

std::string Pids(const std::vector<ChildProcess*>& relays) {
  std::string s;
  for (const auto* r : relays) s += (s.empty() ? "" : ",") + std::to_string(r->pid());
  return s;
}

class PartitionedProcessTest : public RelayProcessFixture {
 protected:
  void TearDown() override {
    probe_.reset();
    RelayProcessFixture::TearDown();
  }

  // The harness config (full_sweep_interval_ms 2000) in claim_mode partitioned, with the
  // full sweep interval replaced when `full_sweep` is given; `bucket_leases: true` when asked.
  std::string PartitionedConfig(std::optional<Millis> full_sweep = std::nullopt,
                                bool bucket_leases = false) {
    std::string yaml = Yaml(db_url_, {},
                            "claim_mode: partitioned\n"
                            "partition_heartbeat_ms: " +
                                std::to_string(kHeartbeat.count()) +
                                "\n"
                                "partition_lease_ms: " +
                                std::to_string(kPartitionLease.count()) + "\n" +
                                (bucket_leases ? "bucket_leases: true\n" : ""));
    if (full_sweep) {
      const std::string key = "\nfull_sweep_interval_ms: ";
      const auto at = yaml.find(key);
      if (at == std::string::npos)
        throw std::logic_error("the harness config has no full_sweep_interval_ms");
      const auto end = yaml.find('\n', at + 1);
      yaml.replace(at, end - at, key + std::to_string(full_sweep->count()));
    }
    return WriteConfig("relay.yaml", yaml);
  }

  std::vector<int> BucketsOf(pid_t pid) {
    const auto instance = ReadAssignment().InstanceOf(pid);
    if (!instance) return {};
    pqxx::nontransaction tx(Probe());
    std::vector<int> out;
    for (const auto& row :
         tx.exec_params("SELECT bucket FROM outbox.bucket_owners WHERE owner = $1::uuid ORDER BY 1",
                        *instance)) {
      out.push_back(row[0].as<int>());
    }
    return out;
  }

  // Per-key order, and the coordinator never leaves a bucket with an unregistered owner.
  static std::vector<InvariantMonitor::Check> Checks() {
    return {InvariantMonitor::NoKeyLeasedTwice(),
            {"bucket owned by an unregistered instance",
             "SELECT o.bucket, o.owner FROM outbox.bucket_owners o WHERE o.owner IS NOT NULL AND "
             "NOT EXISTS "
             "(SELECT 1 FROM outbox.relay_instances r WHERE r.instance_id = o.owner)"}};
  }

  pqxx::connection& Probe() {
    if (!probe_ || !probe_->is_open()) probe_ = std::make_unique<pqxx::connection>(db_url_);
    return *probe_;
  }

  Assignment ReadAssignment() {
    try {
      pqxx::transaction<pqxx::isolation_level::repeatable_read, pqxx::readwrite_policy::read_only>
          tx(Probe());
      Assignment a;
      for (const auto& row : tx.exec("SELECT o.owner::text, count(*), count(*) FILTER (WHERE "
                                     "o.owner IS NOT NULL AND r.instance_id IS NULL) "
                                     "FROM outbox.bucket_owners o LEFT JOIN outbox.relay_instances "
                                     "r ON r.instance_id = o.owner "
                                     "GROUP BY o.owner")) {
        const int n = row[1].as<int>();
        a.buckets += n;
        a.orphaned += row[2].as<int>();
        if (row[0].is_null()) {
          a.unowned += n;
        } else {
          a.owned[row[0].as<std::string>()] = n;
        }
      }
      for (const auto& row :
           tx.exec("SELECT instance_id::text, description FROM outbox.relay_instances")) {
        a.pid_of[row[0].as<std::string>()] = PidFromDescription(row[1].as<std::string>());
      }
      tx.commit();
      return a;
    } catch (const pqxx::broken_connection&) {
      probe_.reset();
      throw;
    }
  }

  // Empty when the assignment is settled for exactly the relays `live`: every bucket has an
  // owner, the registered instances are exactly `live`, and shares differ by at most one.
  static std::string Unsettled(const Assignment& a, const std::vector<ChildProcess*>& live) {
    if (a.buckets != kBuckets) return "bucket rows: " + std::to_string(a.buckets);
    if (a.unowned != 0 || a.orphaned != 0) return "not every bucket has a registered owner";
    std::set<pid_t> want, have;
    for (const auto* r : live) want.insert(r->pid());
    for (const auto& [id, pid] : a.pid_of) have.insert(pid);
    if (want != have || a.pid_of.size() != live.size())
      return "registered instances are not the live relays";
    int lo = kBuckets, hi = 0;
    for (const auto& [id, pid] : a.pid_of) {
      const auto it = a.owned.find(id);
      const int n = it == a.owned.end() ? 0 : it->second;
      lo = std::min(lo, n);
      hi = std::max(hi, n);
    }
    if (hi - lo > 1) return "shares differ by " + std::to_string(hi - lo);
    return "";
  }

  // Waits until the assignment is settled for `live` (see Unsettled); `took` is measured from
  // `since`. Fails early when a relay of `live` exits.
  ::testing::AssertionResult WaitSettled(const std::vector<ChildProcess*>& live, Millis timeout,
                                         Clock::time_point since, Millis* took = nullptr) {
    Assignment last;
    std::string why = "never read";
    const bool ok = WaitFor(
        [&] {
          for (auto* r : live) {
            if (!r->Running()) return true;
          }
          try {
            last = ReadAssignment();
            why = Unsettled(last, live);
          } catch (const std::exception& e) {
            why = std::string("probe failed: ") + e.what();
          }
          return why.empty();
        },
        timeout, kDbPoll);
    if (took != nullptr) *took = Since(since);
    for (auto* r : live) {
      if (!r->Running()) return ::testing::AssertionFailure() << r->Describe() << " exited";
    }
    if (!ok) {
      return ::testing::AssertionFailure()
             << "assignment for pids " << Pids(live) << " not settled within " << timeout.count()
             << " ms (" << why << "): " << last.Describe();
    }
    return ::testing::AssertionSuccess();
  }

  // Waits until each relay of `relays` logged that it now owns as many buckets as the
  // database says it does: the relays learned the assignment, not just the coordinator.
  ::testing::AssertionResult WaitLearned(const std::vector<ChildProcess*>& relays, Millis timeout) {
    std::string last;
    const bool ok = WaitFor(
        [&] {
          last.clear();
          bool all = true;
          const Assignment a = ReadAssignment();
          for (auto* r : relays) {
            const int logged = LastOwnedCount(r->Stderr());
            const int owned = a.OwnedBy(r->pid());
            last += " " + r->name() + " logged " + std::to_string(logged) + ", owns " +
                    std::to_string(owned) + ";";
            all = all && logged == owned && owned > 0;
          }
          return all;
        },
        timeout, kDbPoll);
    if (ok) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure()
           << "the relays did not log their share within " << timeout.count() << " ms:" << last;
  }

  // Starts `n` relays of `config` (into `relays`) and waits until they share the buckets and
  // each has logged its share.
  ::testing::AssertionResult StartSharing(const std::string& config, int n,
                                          std::vector<ChildProcess*>& relays) {
    const auto started = Clock::now();
    for (int i = 0; i < n; ++i) relays.push_back(&StartRelay(config));
    if (auto settled = WaitSettled(relays, 30s, started); !settled) return settled;
    return WaitLearned(relays, 5s);
  }

  // Ends the flow and checks the outcome: the live relays drain the queue, nothing is
  // dead-lettered or left leased, the monitor saw no violation, and Kafka holds every
  // message in per-key order. Returns the number of duplicate records.
  std::size_t StopFlowAndCheck(ContinuousProducer& producer, InvariantMonitor& monitor,
                               const std::vector<ChildProcess*>& live) {
    producer.Stop();
    EXPECT_EQ(producer.error(), "") << "the producer failed";
    const ExpectedMap expected = producer.expected();
    EXPECT_TRUE(DrainedBy(live, 120s));
    monitor.Stop();
    EXPECT_EQ(DeadLetters(), 0);
    EXPECT_EQ(Leased(), 0);
    const auto violations = monitor.violations();
    EXPECT_TRUE(violations.empty()) << violations.size() << " invariant violations sampled, first: "
                                    << (violations.empty() ? "" : violations.front());
    EXPECT_GT(monitor.samples(), 100) << "the invariant monitor hardly ran; errors "
                                      << monitor.errors() << ", last " << monitor.last_error();
    const auto records = ConsumeAtLeast(expected.size());
    const std::size_t duplicates = ExpectAllDeliveredInKeyOrder(records, expected);
    std::cout << "[ info ] " << expected.size() << " messages enqueued while relays changed, "
              << records.size() << " records, " << duplicates << " redeliveries; "
              << monitor.samples() << " invariant samples" << std::endl;
    return duplicates;
  }

  std::unique_ptr<pqxx::connection> probe_;
};

// 1. Relays join (1, then 4) and leave (SIGTERM 2 of 4) while messages flow. After each
// change every bucket has exactly one owner, the owners are exactly the running relays and
// the shares differ by at most one. Leaving relays hand their buckets back at once: the
// others own all of them within two heartbeats (plus a margin), well before the partition
// lease would have moved them.
TEST_F(PartitionedProcessTest, JoinAndGracefulLeaveRebalanceQuicklyAndLoseNothing) {
  ASSERT_EQ(Scalar("SELECT bucket_count FROM outbox.partitioning"), kBuckets);
  const std::string config = PartitionedConfig();
  InvariantMonitor monitor(db_url_, Checks());
  monitor.Start();
  ContinuousProducer producer(db_url_, 10, 20ms);
  producer.Start();

  auto t = Clock::now();
  Millis took{};
  ChildProcess& first = StartRelay(config);
  ASSERT_TRUE(WaitSettled({&first}, 30s, t, &took));
  std::cout << "[ info ] 1 relay: settled " << took.count() << " ms after its start" << std::endl;
  ASSERT_TRUE(WaitLearned({&first}, 5s));
  ASSERT_TRUE(producer.WaitForMore(300, 30s)) << producer.error();

  t = Clock::now();
  std::vector<ChildProcess*> four{&first};
  for (int i = 0; i < 3; ++i) four.push_back(&StartRelay(config));
  ASSERT_TRUE(WaitSettled(four, 30s, t, &took));
  std::cout << "[ info ] 4 relays: settled " << took.count() << " ms after the start of 3 more"
            << std::endl;
  ASSERT_TRUE(WaitLearned(four, 5s));
  ASSERT_TRUE(producer.WaitForMore(500, 30s)) << producer.error();
  // Four relays claim from their own buckets: the backlog stays bounded.
  EXPECT_LT(Queued(), 2000) << "four relays do not keep up with the producer";

  // SIGTERM the first relay (it held every bucket once) and the last one.
  const std::vector<ChildProcess*> leaving{four[0], four[3]};
  const std::vector<ChildProcess*> staying{four[1], four[2]};
  t = Clock::now();
  for (auto* r : leaving) r->Signal(SIGTERM);
  ASSERT_TRUE(WaitSettled(staying, 30s, t, &took));
  const Millis bound = 2 * kHeartbeat + 500ms;
  EXPECT_LT(took, bound)
      << "after SIGTERM of 2 of 4 relays the others owned every bucket only after " << took.count()
      << " ms; handing back is immediate, the partition lease is " << kPartitionLease.count()
      << " ms";
  const Millis learn_bound = bound + 500ms;
  ASSERT_TRUE(WaitLearned(staying, learn_bound - Since(t)));
  const Millis learned = Since(t);
  std::cout << "[ info ] SIGTERM 2 of 4: the other 2 owned all " << kBuckets << " buckets after "
            << took.count() << " ms (bound " << bound.count() << " ms), both had logged it after "
            << learned.count() << " ms" << std::endl;
  for (auto* r : leaving) {
    EXPECT_TRUE(r->WaitExit(kShutdownTimeout + kShutdownMargin)) << r->Describe();
    EXPECT_TRUE(r->ExitedWith(0)) << r->Describe();
    EXPECT_NE(r->Stderr().find("partitioned: handed back all buckets"), std::string::npos)
        << r->name() << " did not log that it handed its buckets back";
  }
  ASSERT_TRUE(producer.WaitForMore(500, 30s)) << producer.error();

  StopFlowAndCheck(producer, monitor, staying);
  for (auto* r : staying) StopGracefully(*r);
}

// 2. One of three relays is SIGKILLed while messages flow: its buckets move to the other two
// once its heartbeat is older than partition_lease_ms (not before), and nothing is lost.
TEST_F(PartitionedProcessTest, SigkilledRelaysBucketsMoveAfterThePartitionLease) {
  const std::string config = PartitionedConfig();
  InvariantMonitor monitor(db_url_, Checks());
  monitor.Start();
  ContinuousProducer producer(db_url_, 10, 20ms);
  producer.Start();

  std::vector<ChildProcess*> three;
  const auto started = Clock::now();
  for (int i = 0; i < 3; ++i) three.push_back(&StartRelay(config));
  ASSERT_TRUE(WaitSettled(three, 30s, started));
  ASSERT_TRUE(WaitLearned(three, 5s));
  ASSERT_TRUE(producer.WaitForMore(500, 30s)) << producer.error();

  ChildProcess& victim = *three[1];
  const Assignment before = ReadAssignment();
  const int victim_buckets = before.OwnedBy(victim.pid());
  ASSERT_GT(victim_buckets, 0);
  // How old its last heartbeat is: its buckets may move once that is partition_lease_ms old.
  const Millis heartbeat_age{
      Scalar("SELECT (extract(epoch FROM clock_timestamp() - heartbeat_at) * 1000)::bigint "
             "FROM outbox.relay_instances WHERE instance_id = '" +
             *before.InstanceOf(victim.pid()) + "'")};
  const auto killed_at = Clock::now();
  victim.Kill();
  ASSERT_TRUE(victim.status() && WIFSIGNALED(*victim.status()) &&
              WTERMSIG(*victim.status()) == SIGKILL)
      << victim.Describe();
  const std::vector<ChildProcess*> survivors{three[0], three[2]};
  Millis took{};
  ASSERT_TRUE(WaitSettled(survivors, kPartitionLease + 10s, killed_at, &took));
  const Millis bound = kPartitionLease + 3s;
  EXPECT_LT(took, bound) << "the killed relay's buckets moved only " << took.count()
                         << " ms after SIGKILL";
  // Not before its last heartbeat (read just before the kill, or a later one) was
  // partition_lease_ms old.
  EXPECT_GE(took, kPartitionLease - heartbeat_age - 100ms)
      << "buckets moved before the partition lease ran out; the last heartbeat was "
      << heartbeat_age.count() << " ms old at the kill";
  std::cout << "[ info ] SIGKILL 1 of 3: its " << victim_buckets
            << " buckets moved to the survivors " << took.count()
            << " ms after the kill (partition lease " << kPartitionLease.count() << " ms, bound "
            << bound.count() << " ms; last heartbeat " << heartbeat_age.count()
            << " ms before the kill)" << std::endl;
  ASSERT_TRUE(WaitLearned(survivors, 5s));
  ASSERT_TRUE(producer.WaitForMore(500, 30s)) << producer.error();

  StopFlowAndCheck(producer, monitor, survivors);
  for (auto* r : survivors) StopGracefully(*r);
}

// 2b. Bucket leases (docs/adr/0003-bucket-leases.md): nothing is written in the rows, so what
// a relay has in flight is its own only by the bucket. Two relays join one while keyed
// messages flow (the first hands the buckets over only once it settled what it read from
// them, so none of its settles is fenced), one of the three is SIGKILLed (its buckets move
// after the partition lease, and its unsettled messages are delivered again), and one leaves
// (SIGTERM: it settles, then hands its buckets back). The full sweep reads the lane again every
// 2 s. Nothing is lost or left leased, Kafka holds every key in order, and a relay of the other
// lease mode is refused while they run.
TEST_F(PartitionedProcessTest, BucketLeasesKeepKeyOrderThroughJoinsAKillAndALeave) {
  const std::string config = PartitionedConfig(std::nullopt, /*bucket_leases=*/true);
  InvariantMonitor monitor(db_url_, Checks());
  monitor.Start();
  ContinuousProducer producer(db_url_, 10, 20ms);
  producer.Start();

  ChildProcess& first = StartRelay(config);
  ASSERT_TRUE(WaitSettled({&first}, 30s, Clock::now()));
  ASSERT_TRUE(producer.WaitForMore(300, 30s)) << producer.error();
  std::vector<ChildProcess*> three{&first, &StartRelay(config), &StartRelay(config)};
  ASSERT_TRUE(WaitSettled(three, 30s, Clock::now()));
  ASSERT_TRUE(WaitLearned(three, 5s));
  EXPECT_NE(first.Stderr().find("once what this relay had read from them was settled"),
            std::string::npos)
      << "the first relay did not hand its buckets over";
  ASSERT_TRUE(producer.WaitForMore(500, 30s)) << producer.error();

  // A row-lease relay may not join them: its heartbeat, the first thing it writes, is refused
  // (migration 0037; before, outbox.coordinate refused it: "runs with bucket_leases true, this
  // one with false", which still refuses one serving other destinations).
  ChildProcess& other = StartRelay(PartitionedConfig());
  ASSERT_TRUE(WaitFor(
      [&] {
        return other.Stderr().find(
                   "by bucket leases, this one by row "
                   "leases") != std::string::npos;
      },
      30s, kDbPoll))
      << other.Describe();
  EXPECT_TRUE(ReadAssignment().InstanceOf(other.pid()) == std::nullopt)
      << "the refused relay registered";
  StopGracefully(other);
  // Nor a skip_locked relay of their destinations, which never calls the coordinator: its
  // heartbeat is refused (migration 0037), and it claims nothing (the monitor would see the
  // duplicates and the keys out of order).
  ChildProcess& unpartitioned = StartRelay(WriteConfig("skip_locked.yaml", Yaml(db_url_, {})));
  ASSERT_TRUE(WaitFor(
      [&] {
        return unpartitioned.Stderr().find(
                   "by bucket leases, this one by "
                   "row leases") != std::string::npos;
      },
      30s, kDbPoll))
      << unpartitioned.Describe();
  ASSERT_TRUE(producer.WaitForMore(200, 30s)) << producer.error();
  StopGracefully(unpartitioned);
  EXPECT_NE(unpartitioned.Stderr().find("stopped: delivered 0,"), std::string::npos)
      << unpartitioned.Describe();

  ChildProcess& victim = *three[1];
  const auto killed_at = Clock::now();
  victim.Kill();
  const std::vector<ChildProcess*> two{three[0], three[2]};
  ASSERT_TRUE(WaitSettled(two, kPartitionLease + 10s, killed_at));
  ASSERT_TRUE(producer.WaitForMore(500, 30s)) << producer.error();

  three[2]->Signal(SIGTERM);
  ASSERT_TRUE(three[2]->WaitExit(kShutdownTimeout + kShutdownMargin)) << three[2]->Describe();
  EXPECT_TRUE(three[2]->ExitedWith(0)) << three[2]->Describe();
  ASSERT_TRUE(WaitSettled({&first}, 30s, Clock::now()));
  ASSERT_TRUE(producer.WaitForMore(300, 30s)) << producer.error();

  StopFlowAndCheck(producer, monitor, {&first});
  EXPECT_EQ(FencedSettlements(first.Stderr()), 0)
      << "a settle of the relay that handed buckets over and kept the rest was fenced";
  EXPECT_EQ(first.Stderr().find("the full sweep found"), std::string::npos)
      << "the sweep counted what the relay held as missed";
  // A claim that read an earlier claim's rows again while those were still on their way to
  // the sink took them again (Prepare then refused the copy, logging this; CI, 2 cores).
  EXPECT_EQ(first.Stderr().find("was claimed again while its earlier claim"), std::string::npos)
      << "a claim took rows an earlier one had read and not yet handed to the sink";
  StopGracefully(first);
}

// 2c. Bucket leases: one of two relays is SIGSTOPped under keyed flow and stays stopped until
// the other owns every bucket and the queue is drained past what it held; after SIGCONT it
// finds its buckets gone (its claims read nothing at its old epochs, its late settles are
// fenced or find their rows gone), rejoins through a handover (32/32), and Kafka holds every
// message with each key in order (a duplicate of what it had in flight at most).
TEST_F(PartitionedProcessTest, BucketLeasesSigstoppedRelayIsFencedAndRejoinsOnSigcont) {
  const std::string config = PartitionedConfig(std::nullopt, /*bucket_leases=*/true);
  InvariantMonitor monitor(db_url_, Checks());
  monitor.Start();
  ContinuousProducer producer(db_url_, 10, 20ms);
  producer.Start();

  std::vector<ChildProcess*> two;
  ASSERT_TRUE(StartSharing(config, 2, two));
  ChildProcess& paused = *two[0];
  ChildProcess& other = *two[1];
  ASSERT_TRUE(producer.WaitForMore(500, 30s)) << producer.error();

  const auto top = Scalar("SELECT coalesce(max(id), 0) FROM outbox.messages");
  const auto stopped_at = Clock::now();
  paused.Signal(SIGSTOP);
  std::optional<Millis> moved_after;
  const bool taken_over = WaitFor(
      [&] {
        if (!other.Running()) return true;
        if (!moved_after && Unsettled(ReadAssignment(), {&other}).empty())
          moved_after = Since(stopped_at);
        // Everything written before the stop delivered by the other relay.
        return moved_after && Scalar("SELECT count(*) FROM outbox.messages WHERE id <= " +
                                     std::to_string(top)) == 0;
      },
      kPartitionLease + 30s, kDbPoll);
  ASSERT_TRUE(other.Running()) << other.Describe();
  ASSERT_TRUE(taken_over) << "while " << paused.name() << " was stopped: "
                          << (moved_after ? "the other relay took every bucket but did not drain"
                                          : "the other relay did not take every bucket")
                          << "; " << ReadAssignment().Describe();
  EXPECT_LT(*moved_after, kPartitionLease + 3s) << "the stopped relay's buckets moved late";
  std::cout << "[ info ] SIGSTOP 1 of 2 (bucket leases): the other owned all " << kBuckets
            << " buckets after " << moved_after->count() << " ms" << std::endl;

  const auto continued_at = Clock::now();
  paused.Signal(SIGCONT);
  Millis rejoined{};
  ASSERT_TRUE(WaitSettled({&paused, &other}, 20s, continued_at, &rejoined));
  ASSERT_TRUE(WaitLearned({&paused, &other}, 5s));
  std::cout << "[ info ] SIGCONT: 2 relays own 32/32 buckets again after " << rejoined.count()
            << " ms, the resumed one's late settles: " << FencedSettlements(paused.Stderr())
            << " fenced or gone" << std::endl;
  EXPECT_EQ(FencedSettlements(other.Stderr()), 0)
      << "the relay that never stopped had settlements fenced (it handed buckets over)";
  ASSERT_TRUE(producer.WaitForMore(500, 30s)) << producer.error();

  StopFlowAndCheck(producer, monitor, {&paused, &other});
  StopGracefully(paused);
  StopGracefully(other);
}

// 2d. Bucket leases: PostgreSQL restarted under two relays draining a keyed backlog: both
// survive, reconnect, take their buckets again, and deliver everything in key order.
TEST_F(PartitionedProcessTest, BucketLeasesPostgresRestartedMidRunLosesNothing) {
  const std::string config = PartitionedConfig(std::nullopt, /*bucket_leases=*/true);
  ExpectedMap expected = Enqueue(4000, 20, 6);
  const auto total = static_cast<std::int64_t>(expected.size());
  ChildProcess& a = StartRelay(config);
  ChildProcess& b = StartRelay(config);
  ASSERT_TRUE(WaitFor([&] { return !a.Running() || !b.Running() || Queued() <= total - 300; }, 60s,
                      kDbPoll))
      << Queued() << " queued";
  ASSERT_GT(Queued(), 0) << "drained before the restart";
  probe_.reset();
  PgCluster::Instance().Restart();
  ASSERT_TRUE(a.Running()) << a.Describe() << " died when PostgreSQL restarted";
  ASSERT_TRUE(b.Running()) << b.Describe() << " died when PostgreSQL restarted";
  ExpectedMap more = Enqueue(500, 20, 6);
  expected.insert(more.begin(), more.end());
  ASSERT_TRUE(DrainedBy({&a, &b}, 120s));
  EXPECT_EQ(DeadLetters(), 0);
  EXPECT_EQ(Leased(), 0);
  const auto records = ConsumeAtLeast(expected.size());
  ExpectAllDeliveredInKeyOrder(records, expected);
  StopGracefully(a);
  StopGracefully(b);
}

// 3. One of two relays is SIGSTOPped with messages in flight, and stays stopped until the
// other owns every bucket and has delivered what the stopped one held (its message leases
// expired and were reaped): past both the partition lease and the message lease. After
// SIGCONT its late settlements are all fenced, it rejoins (32/32), and Kafka may hold
// duplicates of what it had in flight but never a message ahead of an earlier one of its key.
TEST_F(PartitionedProcessTest, SigstoppedRelayIsFencedAfterItsLeasesAndRejoinsOnSigcont) {
  const std::string config = PartitionedConfig();
  InvariantMonitor monitor(db_url_, Checks());
  monitor.Start();
  ContinuousProducer producer(db_url_, 10, 20ms);
  producer.Start();

  std::vector<ChildProcess*> two;
  ASSERT_TRUE(StartSharing(config, 2, two));
  ChildProcess& paused = *two[0];
  ChildProcess& other = *two[1];
  ASSERT_TRUE(producer.WaitForMore(500, 30s)) << producer.error();

  // Stop it at a moment it has messages in flight: rows leased in its buckets are its own.
  // If a stop finds none, let it go on and try again.
  std::map<std::int64_t, std::string> frozen;  // id -> lease token, held by the stopped relay
  Clock::time_point stopped_at;
  Millis lease_left{};  // until the first of their leases expires, from the stop
  for (int attempt = 1; attempt <= 50 && frozen.empty(); ++attempt) {
    const auto instance = ReadAssignment().InstanceOf(paused.pid());
    ASSERT_TRUE(instance) << "relay " << paused.Describe() << " is not registered";
    paused.Signal(SIGSTOP);
    stopped_at = Clock::now();
    pqxx::nontransaction tx(Probe());
    // A statement the relay sent just before the stop still runs to its end on the server
    // (a settle can delete its rows): wait until every statement that started before the
    // stop has finished, then read what the stopped relay holds.
    const std::string stop_ts = tx.exec1("SELECT clock_timestamp()::text")[0].as<std::string>();
    ASSERT_TRUE(WaitFor(
        [&] {
          return tx.exec_params1(
                       "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' "
                       "AND query_start < $1::timestamptz AND pid <> pg_backend_pid() "
                       "AND datname = current_database()",
                       stop_ts)[0]
                     .as<int>() == 0;
        },
        10s, kDbPoll));
    for (const auto& row : tx.exec_params(
             "SELECT m.id, m.lease_owner::text, "
             "       (extract(epoch FROM m.lease_until - clock_timestamp()) * 1000)::bigint "
             "FROM outbox.messages m JOIN outbox.bucket_owners o ON o.bucket = m.bucket "
             "WHERE m.lease_owner IS NOT NULL AND o.owner = $1::uuid",
             *instance)) {
      frozen.emplace(row[0].as<std::int64_t>(), row[1].as<std::string>());
      const Millis left{row[2].as<std::int64_t>()};
      lease_left = frozen.size() == 1 ? left : std::min(lease_left, left);
    }
    if (frozen.empty()) {
      paused.Signal(SIGCONT);
      ASSERT_TRUE(producer.WaitForMore(20, 10s)) << producer.error();
    }
  }
  ASSERT_FALSE(frozen.empty()) << "never caught the relay with messages in flight";
  std::string frozen_ids;
  for (const auto& [id, token] : frozen)
    frozen_ids += (frozen_ids.empty() ? "" : ",") + std::to_string(id);

  // Stopped until the other relay owns every bucket and has delivered every message the
  // stopped one held (they can only leave its hands through the reaper, after lease_ms).
  std::optional<Millis> moved_after;
  bool delivered_by_other = false;
  const bool taken_over = WaitFor(
      [&] {
        if (!other.Running()) return true;
        if (!moved_after && Unsettled(ReadAssignment(), {&other}).empty())
          moved_after = Since(stopped_at);
        if (!moved_after) return false;
        delivered_by_other = Scalar("SELECT count(*) FROM outbox.messages WHERE id = ANY('{" +
                                    frozen_ids + "}'::bigint[])") == 0;
        return delivered_by_other;
      },
      kPartitionLease + kLease + 20s, kDbPoll);
  const Millis stopped_for = Since(stopped_at);
  ASSERT_TRUE(other.Running()) << other.Describe();
  ASSERT_TRUE(taken_over) << "while " << paused.name() << " was stopped for " << stopped_for.count()
                          << " ms: "
                          << (moved_after ? "the other relay took every bucket, "
                                          : "the other relay did not take every bucket, ")
                          << (delivered_by_other
                                  ? ""
                                  : "the messages it held were not delivered by the other; ")
                          << ReadAssignment().Describe();
  EXPECT_LT(*moved_after, kPartitionLease + 3s) << "the stopped relay's buckets moved late";
  EXPECT_GE(stopped_for, lease_left)
      << "a message left the stopped relay's hands before its lease expired";
  EXPECT_TRUE(paused.Running()) << paused.Describe();
  std::cout << "[ info ] SIGSTOP 1 of 2 with " << frozen.size()
            << " messages in flight: the other owned all " << kBuckets << " buckets after "
            << moved_after->count() << " ms and had delivered those messages after "
            << stopped_for.count() << " ms (partition lease " << kPartitionLease.count()
            << " ms, lease " << kLease.count() << " ms, reap interval " << kReapInterval.count()
            << " ms)" << std::endl;

  const std::size_t log_mark = paused.Stderr().size();
  const auto continued_at = Clock::now();
  paused.Signal(SIGCONT);
  Millis rejoined{};
  ASSERT_TRUE(WaitSettled({&paused, &other}, 10s, continued_at, &rejoined));
  EXPECT_LT(rejoined, 2 * kHeartbeat + 2s) << "the resumed relay rejoined late";
  ASSERT_TRUE(WaitLearned({&paused, &other}, 5s));
  std::cout << "[ info ] SIGCONT: 2 relays own 32/32 buckets again after " << rejoined.count()
            << " ms" << std::endl;

  // Everything it had in flight ends in a settlement with a stale lease token, and is fenced.
  std::int64_t fenced = 0;
  const bool all_fenced = WaitFor(
      [&] {
        fenced = FencedSettlements(paused.Stderr().substr(log_mark));
        return fenced >= static_cast<std::int64_t>(frozen.size());
      },
      15s, kDbPoll);
  EXPECT_TRUE(all_fenced) << "the resumed relay reported " << fenced
                          << " fenced settlements, it held " << frozen.size()
                          << " leases that expired while it was stopped";
  EXPECT_EQ(FencedSettlements(other.Stderr()), 0)
      << "the relay that never stopped had settlements fenced";
  std::cout << "[ info ] the resumed relay's late settlements: " << fenced << " fenced ("
            << frozen.size() << " were in flight when it stopped)" << std::endl;
  ASSERT_TRUE(producer.WaitForMore(500, 30s)) << producer.error();

  StopFlowAndCheck(producer, monitor, {&paused, &other});
  StopGracefully(paused);
  StopGracefully(other);
}

// 4. After a failover the backlog of the moved buckets is claimed by their new owners within
// a few heartbeats (docs/scaling.md: buckets are redistributed within partition_lease_ms +
// partition_heartbeat_ms), with full_sweep_interval_ms at its default of 30 s. The other
// tests run with the harness's 2 s full sweep, which bounds the stall this test looks for.
TEST_F(PartitionedProcessTest, MovedBucketsBacklogIsClaimedWithoutWaitingForAFullSweep) {
  constexpr Millis kDefaultFullSweep{30000};
  const std::string config = PartitionedConfig(kDefaultFullSweep);
  InvariantMonitor monitor(db_url_, Checks());
  monitor.Start();
  ContinuousProducer producer(db_url_, 10, 20ms);
  producer.Start();

  std::vector<ChildProcess*> three;
  for (int i = 0; i < 3; ++i) three.push_back(&StartRelay(config));
  ASSERT_TRUE(WaitSettled(three, 30s, Clock::now()));
  ASSERT_TRUE(WaitLearned(three, 5s));
  ASSERT_TRUE(producer.WaitForMore(500, 30s)) << producer.error();

  ChildProcess& victim = *three[1];
  const std::vector<int> moved = BucketsOf(victim.pid());
  ASSERT_FALSE(moved.empty());
  std::string moved_list;
  for (const int b : moved) moved_list += (moved_list.empty() ? "" : ",") + std::to_string(b);
  const auto killed_at = Clock::now();
  victim.Kill();
  const std::vector<ChildProcess*> survivors{three[0], three[2]};
  ASSERT_TRUE(WaitSettled(survivors, kPartitionLease + 10s, killed_at));
  const Millis moved_after = Since(killed_at);
  const std::string handover =
      pqxx::nontransaction(Probe()).exec1("SELECT clock_timestamp()::text")[0].as<std::string>();
  const auto handover_at = Clock::now();
  const std::string backlog_sql = "FROM outbox.messages m WHERE m.bucket = ANY('{" + moved_list +
                                  "}'::int[]) AND m.created_at <= '" + handover + "'::timestamptz";
  const std::int64_t backlog = Scalar("SELECT count(*) " + backlog_sql);

  // The new owners learn at their next heartbeat (or at once) and claim at their next poll;
  // the killed relay's leases have expired or are about to (lease_ms after its last claim).
  const Millis bound = kLease + 2 * kHeartbeat + 1s;
  const bool claimed =
      WaitFor([&] { return Scalar("SELECT count(*) " + backlog_sql) == 0; }, bound, kDbPoll);
  const Millis took = Since(handover_at);
  if (!claimed) {
    // The signature of the bug: rows never claimed nor parked (the fresh lane) in the moved
    // buckets, and later messages of their keys scanned and parked behind them.
    const std::int64_t fresh =
        Scalar("SELECT count(*) " + backlog_sql + " AND NOT m.parked AND m.lease_owner IS NULL");
    const std::int64_t min_fresh = Scalar("SELECT coalesce(min(m.id), 0) " + backlog_sql +
                                          " AND NOT m.parked AND m.lease_owner IS NULL");
    const std::int64_t top = Scalar("SELECT coalesce(max(id), 0) FROM outbox.messages");
    const std::int64_t parked_behind = Scalar(
        "SELECT count(*) FROM outbox.messages m WHERE m.parked AND m.deliver_after = 'infinity' "
        "AND EXISTS ("
        "SELECT 1 FROM outbox.messages p WHERE p.destination = m.destination AND p.ordering_key = "
        "m.ordering_key "
        "AND p.id < m.id AND NOT p.parked AND p.lease_owner IS NULL AND p.bucket = ANY('{" +
        moved_list + "}'::int[]))");
    const std::int64_t left = Scalar("SELECT count(*) " + backlog_sql);
    std::ostringstream why;
    why << "of the " << backlog << " messages in the killed relay's " << moved.size()
        << " buckets at the handover (" << moved_after.count() << " ms after SIGKILL), " << left
        << " were still queued " << took.count() << " ms later (bound " << bound.count()
        << " ms): " << fresh << " of them never claimed nor parked (lowest id " << min_fresh
        << ", newest id in the queue " << top << "), " << parked_behind
        << " later messages of their keys parked at 'infinity' behind them";
    ADD_FAILURE() << "the moved buckets' backlog was claimed late"
                  << (fresh > 0 ? " (fresh rows of the gained buckets were left below the cursor: "
                                  "the claim loop must restart its cursor when its buckets change)"
                                : "")
                  << ": " << why.str();
  } else {
    std::cout << "[ info ] SIGKILL 1 of 3: its " << backlog << " queued messages were claimed "
              << took.count() << " ms after the handover (bound " << bound.count() << " ms)"
              << std::endl;
  }

  // However long it took, nothing is lost and per-key order holds (the full sweep picks the
  // stranded rows up at the latest).
  StopFlowAndCheck(producer, monitor, survivors);
  for (auto* r : survivors) StopGracefully(*r);
}

}  // namespace
}  // namespace outbox::testing
