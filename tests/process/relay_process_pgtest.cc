// Process-level fault tests: the real `outbox-relay` binary runs as child processes of this
// test, which hosts PostgreSQL (PgTest: a fresh migrated database per test) and librdkafka's
// mock cluster (reached by the children over loopback). The tests kill relays with SIGKILL,
// stop them with SIGTERM/SIGINT, run several at once while the brokers fail, restart
// PostgreSQL under a running relay, and check start-up errors. What arrived is read back
// with an independent consumer and compared with what was enqueued. The harness (child
// processes, configs, the results check) is in process_harness.h.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <iostream>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <ostream>
#include <pqxx/pqxx>
#include <string>
#include <string_view>
#include <thread>
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

// A TCP proxy between a relay process and PostgreSQL that can lose the server's replies: once
// armed, the first connection that executes the prepared claim statement (its Bind message
// names "claim") gets none of the server's answers from then on, though the server runs and
// commits what it is sent, as when the database restarts after committing a statement and
// before its reply reaches the relay. CutAll() then breaks every connection; new ones are
// forwarded normally.
class ReplyLosingProxy {
 public:
  explicit ReplyLosingProxy(int target_port) : target_port_(target_port) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
        ::listen(listen_fd_, 64) != 0) {
      throw std::runtime_error("proxy: cannot listen");
    }
    socklen_t len = sizeof addr;
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    acceptor_ = std::thread([this] { AcceptLoop(); });
  }
  ~ReplyLosingProxy() {
    stop_ = true;
    CutAll();
    ::shutdown(listen_fd_, SHUT_RDWR);
    ::close(listen_fd_);
    acceptor_.join();
    std::lock_guard lk(mu_);
    for (auto& t : pumps_) t.join();
  }
  int port() const { return port_; }
  void ArmOnClaim() { armed_ = true; }
  void CutAll() {
    std::lock_guard lk(mu_);
    for (const int fd : fds_) ::shutdown(fd, SHUT_RDWR);
  }

 private:
  void AcceptLoop() {
    while (!stop_) {
      pollfd p{listen_fd_, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      const int client = ::accept(listen_fd_, nullptr, nullptr);
      if (client < 0) continue;
      const int server = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      addr.sin_port = htons(static_cast<uint16_t>(target_port_));
      if (::connect(server, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
        ::close(client);
        ::close(server);
        continue;
      }
      std::lock_guard lk(mu_);
      fds_.push_back(client);
      fds_.push_back(server);
      auto lost = std::make_shared<std::atomic<bool>>(false);
      pumps_.emplace_back([this, client, server, lost] { Pump(client, server, nullptr, lost); });
      pumps_.emplace_back([this, client, server, lost] { Pump(server, client, lost, nullptr); });
    }
  }
  // `drop_if`: replies of this connection are dropped once it is set; `arm`: the flag this
  // client's claim statement sets while the proxy is armed.
  void Pump(int from, int to, std::shared_ptr<std::atomic<bool>> drop_if,
            std::shared_ptr<std::atomic<bool>> arm) {
    static const std::string kClaimBind("\0claim\0", 7);
    char buf[16384];
    while (true) {
      const ssize_t n = ::recv(from, buf, sizeof buf, 0);
      if (n <= 0) break;
      if (arm && armed_ &&
          std::string_view(buf, static_cast<std::size_t>(n)).find(kClaimBind) !=
              std::string_view::npos) {
        armed_ = false;
        *arm = true;
      }
      if (drop_if && *drop_if) continue;
      if (::send(to, buf, static_cast<std::size_t>(n), MSG_NOSIGNAL) != n) break;
    }
    ::shutdown(to, SHUT_RDWR);
  }

  int target_port_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false}, armed_{false};
  std::mutex mu_;
  std::vector<int> fds_;
  std::vector<std::thread> pumps_;
  std::thread acceptor_;
};

class RelayProcessTest : public RelayProcessFixture {};

std::string WithSignalName(int sig) {
  return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : std::to_string(sig);
}

// 1. A relay SIGKILLed mid-batch, again and again, loses nothing; redeliveries keep their
// idempotency keys, and per key no message is ever delivered before an earlier one was.
TEST_F(RelayProcessTest, SigkilledMidBatchRepeatedlyLosesNothingAndKeepsKeyOrder) {
  const ExpectedMap expected = Enqueue(5000, 50, 8);  // 50 keys, every 8th message without a key
  const std::string config = WriteConfig("relay.yaml", Yaml(db_url_));

  constexpr int kKills = 5;
  constexpr std::int64_t kProgressPerRound = 300;
  int kills_mid_batch = 0;  // kills that left leased rows behind (in flight when killed)
  std::int64_t queued = Queued();
  for (int round = 1; round <= kKills; ++round) {
    ChildProcess& relay = StartRelay(config);
    const std::int64_t target = queued - kProgressPerRound;
    ASSERT_TRUE(WaitFor([&] { return !relay.Running() || Queued() <= target; }, 60s, kDbPoll))
        << "round " << round << ": " << relay.Describe() << " did not deliver " << kProgressPerRound
        << " more within 60 s; " << Queued() << " queued";
    ASSERT_TRUE(relay.Running()) << relay.Describe() << " exited by itself";
    relay.Kill();
    ASSERT_TRUE(relay.status() && WIFSIGNALED(*relay.status()) &&
                WTERMSIG(*relay.status()) == SIGKILL)
        << relay.Describe();
    if (Leased() > 0) ++kills_mid_batch;
    queued = Queued();
    ASSERT_GT(queued, 0) << "round " << round << ": the backlog ran out before the last kill";
  }
  EXPECT_GT(kills_mid_batch, 0) << "no kill caught a relay with messages in flight";

  ChildProcess& last = StartRelay(config);
  ASSERT_TRUE(DrainedBy({&last}, 120s));
  EXPECT_EQ(DeadLetters(), 0);
  EXPECT_EQ(Leased(), 0);
  const auto records = ConsumeAtLeast(expected.size());
  const std::size_t duplicates = ExpectAllDeliveredInKeyOrder(records, expected);
  std::cout << "[ info ] " << records.size() << " records for " << expected.size() << " messages, "
            << duplicates << " redeliveries; " << kills_mid_batch << " of " << kKills
            << " kills left leases behind" << std::endl;
  StopGracefully(last);
}

// 2. Four relays at once while the brokers fail (bursts of retriable Produce errors, and every
// broker down once): nothing lost, nothing dead-lettered, per-key order held, and never two
// messages of one key leased at the same time.
TEST_F(RelayProcessTest, FourRelaysWithBrokerFailuresKeepPerKeyOrder) {
  const ExpectedMap expected = Enqueue(4000, 40, 10);  // 40 keys, every 10th without a key
  // One Produce request in flight per connection. librdkafka's mock cluster checks the idempotent
  // producer's sequence numbers only for transactional producers: with requests pipelined it
  // can refuse one (an injected error) and store the next, and librdkafka, for which the next
  // one's success means the broker has the refused one too (a real broker answers
  // OUT_OF_ORDER_SEQUENCE_NUMBER otherwise), reports the refused records delivered
  // ("implicitly acked"): records the topic never gets. See KafkaMockCluster::PushRequestErrors.
  const std::string config =
      WriteConfig("relay.yaml", Yaml(db_url_, {{"max.in.flight.requests.per.connection", "1"}}));

  LeaseOverlapMonitor monitor(db_url_);
  monitor.Start();
  std::vector<ChildProcess*> relays;
  for (int i = 0; i < 4; ++i) relays.push_back(&StartRelay(config));

  const std::vector<rd_kafka_resp_err_t> burst{RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION,
                                               RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT,
                                               RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS,
                                               RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE,
                                               RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS_AFTER_APPEND,
                                               RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT};
  const auto total = static_cast<std::int64_t>(expected.size());
  // Faults are injected as the backlog shrinks (progress-driven, not timed).
  auto wait_progress = [&](std::int64_t left) {
    return WaitFor([&] { return Queued() <= left; }, 60s, kDbPoll);
  };
  int bursts = 0;
  for (const std::int64_t left : {total * 9 / 10, total * 8 / 10, total * 7 / 10}) {
    ASSERT_TRUE(wait_progress(left)) << "stuck above " << left << ": " << Queued() << " queued";
    kafka_->PushRequestErrors(RD_KAFKAP_Produce, burst);
    ++bursts;
  }
  ASSERT_TRUE(wait_progress(total * 6 / 10)) << Queued() << " queued";
  ASSERT_GT(Queued(), total / 4) << "drained too fast to fail the brokers in the middle";
  {
    // Every broker down until deliveries have failed and come back as retries.
    const std::int64_t retried_before = WithAttempts();
    kafka_->SetAllBrokersDown(true);
    const auto down_at = Clock::now();
    const bool retried = WaitFor([&] { return WithAttempts() > retried_before; }, 30s, kDbPoll);
    kafka_->SetAllBrokersDown(false);
    ASSERT_TRUE(retried) << "no retry recorded while every broker was down";
    std::cout << "[ info ] brokers down for "
              << std::chrono::duration_cast<Millis>(Clock::now() - down_at).count() << " ms"
              << std::endl;
  }
  for (const std::int64_t left : {total * 4 / 10, total * 2 / 10}) {
    if (!wait_progress(left)) break;  // checked by the drain below
    kafka_->PushRequestErrors(RD_KAFKAP_Produce, burst);
    ++bursts;
  }

  std::vector<ChildProcess*> all(relays.begin(), relays.end());
  ASSERT_TRUE(DrainedBy(all, 150s));
  monitor.Stop();
  EXPECT_EQ(DeadLetters(), 0);
  EXPECT_EQ(Leased(), 0);
  const auto violations = monitor.violations();
  EXPECT_TRUE(violations.empty()) << violations.size()
                                  << " samples saw one key leased twice, first: "
                                  << violations.front();
  EXPECT_GT(monitor.samples(), 100) << "the lease monitor hardly ran; errors " << monitor.errors()
                                    << ", last " << monitor.last_error();
  const auto records = ConsumeAtLeast(expected.size());
  const std::size_t duplicates = ExpectAllDeliveredInKeyOrder(records, expected);
  std::cout << "[ info ] " << records.size() << " records for " << expected.size() << " messages, "
            << duplicates << " redeliveries; " << bursts << " error bursts; " << monitor.samples()
            << " lease samples" << std::endl;
  for (auto* r : relays) r->Signal(SIGTERM);
  for (auto* r : relays) {
    EXPECT_TRUE(r->WaitExit(kShutdownTimeout + kShutdownMargin)) << r->Describe();
    EXPECT_TRUE(r->ExitedWith(0)) << r->Describe();
  }
}

// 3. Graceful shutdown on SIGTERM and SIGINT while delivering, with the brokers reachable
// (in-flight work finishes) and with every broker down at the moment of the signal (in-flight
// work cannot finish and is handed back): exit status 0 within shutdown_timeout_ms plus a
// margin, no lease left, no attempt counted; the next relay delivers everything.
struct ShutdownCase {
  int signal;
  bool brokers_down;
};

void PrintTo(const ShutdownCase& c, std::ostream* os) {
  *os << WithSignalName(c.signal) << (c.brokers_down ? ", brokers down" : ", brokers up");
}

class RelayShutdownTest : public RelayProcessTest,
                          public ::testing::WithParamInterface<ShutdownCase> {};

TEST_P(RelayShutdownTest, ExitsZeroInTimeHandsBackEverythingAndTheNextRelayDrains) {
  const ShutdownCase param = GetParam();
  const ExpectedMap expected = Enqueue(3000, 30, 6);
  const auto total = static_cast<std::int64_t>(expected.size());
  // linger.ms 50: batches stay in the producer a while, so a signal finds work in flight.
  const std::string config = WriteConfig("relay.yaml", Yaml(db_url_, {{"linger.ms", "50"}}));

  ChildProcess& relay = StartRelay(config);
  ASSERT_TRUE(WaitFor([&] { return !relay.Running() || (Queued() <= total - 200 && Leased() > 0); },
                      60s, kDbPoll))
      << "relay not delivering: " << Queued() << " queued, " << Leased() << " leased";
  ASSERT_TRUE(relay.Running()) << relay.Describe();
  if (param.brokers_down) {
    kafka_->SetAllBrokersDown(true);
    // The relay keeps claiming what it can no longer deliver (until message.timeout.ms).
    ASSERT_TRUE(WaitFor([&] { return Leased() > 0; }, 10s, kDbPoll))
        << "nothing in flight with the brokers down";
  }
  // What is in flight now. With the brokers down it can no longer be acknowledged (short of
  // an acknowledgement already on its way), so it has to be handed back.
  const auto in_flight = Ids("SELECT id FROM outbox.messages WHERE lease_owner IS NOT NULL");
  const auto signalled_at = Clock::now();
  relay.Signal(param.signal);
  const bool exited = relay.WaitExit(kShutdownTimeout + kShutdownMargin);
  const auto took = std::chrono::duration_cast<Millis>(Clock::now() - signalled_at);
  if (param.brokers_down) kafka_->SetAllBrokersDown(false);
  ASSERT_TRUE(exited) << relay.Describe() << " still running " << took.count() << " ms after "
                      << WithSignalName(param.signal) << " (shutdown_timeout_ms "
                      << kShutdownTimeout.count() << ")";
  EXPECT_TRUE(relay.ExitedWith(0)) << relay.Describe();
  std::cout << "[ info ] exited " << took.count() << " ms after " << WithSignalName(param.signal)
            << std::endl;

  EXPECT_EQ(Leased(), 0) << "rows still leased after a graceful shutdown";
  EXPECT_EQ(WithAttempts(), 0) << "a shutdown is not a failed attempt";
  EXPECT_EQ(DeadLetters(), 0);
  EXPECT_GT(Queued(), 0)
      << "the relay drained everything before the signal: nothing was left to hand over";
  std::string in_flight_list;
  for (const auto id : in_flight)
    in_flight_list += (in_flight_list.empty() ? "" : ",") + std::to_string(id);
  const std::int64_t handed_back =
      Scalar("SELECT count(*) FROM outbox.messages WHERE id = ANY('{" + in_flight_list +
             "}'::bigint[]) AND lease_owner IS NULL AND attempts = 0");
  if (param.brokers_down) {
    EXPECT_GT(handed_back, 0) << "of " << in_flight.size()
                              << " messages in flight at the signal, none is back in "
                              << "the queue with its lease released and no attempt counted";
  }
  std::cout << "[ info ] " << in_flight.size() << " in flight at the signal, " << handed_back
            << " handed back" << std::endl;

  ChildProcess& next = StartRelay(config);
  ASSERT_TRUE(DrainedBy({&next}, 120s));
  EXPECT_EQ(DeadLetters(), 0);
  const auto records = ConsumeAtLeast(expected.size());
  ExpectAllDeliveredInKeyOrder(records, expected);
  StopGracefully(next);
}

INSTANTIATE_TEST_SUITE_P(Signals, RelayShutdownTest,
                         ::testing::Values(ShutdownCase{SIGTERM, false},
                                           ShutdownCase{SIGINT, false}, ShutdownCase{SIGTERM, true},
                                           ShutdownCase{SIGINT, true}),
                         [](const ::testing::TestParamInfo<ShutdownCase>& info) {
                           return WithSignalName(info.param.signal) +
                                  (info.param.brokers_down ? "_BrokersDown" : "_BrokersUp");
                         });

// 4. PostgreSQL restarted under a relay running as its own process: it survives, reconnects
// and delivers everything, including messages written after the restart.
TEST_F(RelayProcessTest, PostgresRestartedMidRunLosesNothingAndTheRelayKeepsDraining) {
  // 20 keys with ~170 messages each: a long chain per key, so the restart lands mid-run.
  ExpectedMap expected = Enqueue(4000, 20, 6);
  const auto total = static_cast<std::int64_t>(expected.size());
  const std::string config = WriteConfig("relay.yaml", Yaml(db_url_));
  ChildProcess& relay = StartRelay(config);
  ASSERT_TRUE(WaitFor([&] { return !relay.Running() || Queued() <= total - 300; }, 60s, kDbPoll))
      << Queued() << " queued";
  ASSERT_TRUE(relay.Running()) << relay.Describe();
  ASSERT_GT(Queued(), 0) << "drained before the restart";

  PgCluster::Instance().Restart();
  ASSERT_TRUE(relay.Running()) << relay.Describe() << " died when PostgreSQL restarted";
  // Nothing is delivered while the server is down, so a backlog now was a backlog then.
  ASSERT_GT(Queued(), 0) << "the relay had drained everything before PostgreSQL went down";
  ExpectedMap more = Enqueue(500, 20, 6);
  expected.insert(more.begin(), more.end());

  ASSERT_TRUE(DrainedBy({&relay}, 120s));
  EXPECT_TRUE(relay.Running()) << relay.Describe();
  EXPECT_EQ(DeadLetters(), 0);
  EXPECT_EQ(Leased(), 0);
  const auto records = ConsumeAtLeast(expected.size());
  ExpectAllDeliveredInKeyOrder(records, expected);
  StopGracefully(relay);
}

// 5. Start-up errors: a clear message and a non-zero exit, never a relay that half-starts.
TEST_F(RelayProcessTest, UnknownConfigKeyStopsStartupNamingTheKey) {
  const std::string config = WriteConfig("bad.yaml", Yaml(db_url_, {}, "reap_intervall_ms: 200\n"));
  ChildProcess& relay = StartRelay(config);
  ASSERT_TRUE(relay.WaitExit(30s)) << relay.Describe();
  EXPECT_TRUE(relay.ExitedNonZero()) << relay.Describe();
  const std::string err = relay.Stderr();
  EXPECT_NE(err.find("unknown key `reap_intervall_ms`"), std::string::npos) << err;
  EXPECT_NE(err.find("bad.yaml"), std::string::npos) << "names the file: " << err;
}

TEST_F(RelayProcessTest, UnmigratedDatabaseStopsStartupAskingForMigrate) {
  const std::string empty_db = PgCluster::Instance().CreateDatabase();
  const std::string config = WriteConfig("relay.yaml", Yaml(empty_db));
  ChildProcess& relay = StartRelay(config);
  ASSERT_TRUE(relay.WaitExit(30s)) << relay.Describe();
  EXPECT_TRUE(relay.ExitedNonZero()) << relay.Describe();
  const std::string err = relay.Stderr();
  EXPECT_NE(err.find("run `outbox-relay migrate`"), std::string::npos) << err;
  pqxx::connection c(empty_db);
  EXPECT_TRUE(
      pqxx::nontransaction(c).exec1("SELECT to_regclass('outbox.messages') IS NULL")[0].as<bool>())
      << "run must not create the schema itself";
}

TEST_F(RelayProcessTest, SchemaNewerThanTheBinaryStopsMigrateAndRunAskingForUpgrade) {
  {
    pqxx::connection c(db_url_);
    pqxx::nontransaction(c).exec(
        "INSERT INTO outbox.schema_migrations (version, name) VALUES (9999, "
        "'9999_from_the_future.sql')");
  }
  const std::int64_t migrations_before = Scalar("SELECT count(*) FROM outbox.schema_migrations");

  ChildProcess& migrate = Spawn("migrate", {"migrate", "--database-url", db_url_});
  ASSERT_TRUE(migrate.WaitExit(30s)) << migrate.Describe();
  EXPECT_TRUE(migrate.ExitedNonZero()) << migrate.Describe();
  const std::string migrate_err = migrate.Stderr();
  EXPECT_NE(migrate_err.find("9999"), std::string::npos) << migrate_err;
  EXPECT_NE(migrate_err.find("upgrade outbox-relay"), std::string::npos) << migrate_err;
  EXPECT_EQ(Scalar("SELECT count(*) FROM outbox.schema_migrations"), migrations_before);

  // The relay refuses that database too (URL from --database-url, over the file's).
  const std::string config =
      WriteConfig("relay.yaml", Yaml(PgCluster::Instance().CreateMigratedDatabase()));
  ChildProcess& relay =
      Spawn("relay-newer-schema", {"run", "--config", config, "--database-url", db_url_});
  ASSERT_TRUE(relay.WaitExit(30s)) << relay.Describe();
  EXPECT_TRUE(relay.ExitedNonZero()) << relay.Describe();
  const std::string relay_err = relay.Stderr();
  EXPECT_NE(relay_err.find("9999"), std::string::npos) << relay_err;
  EXPECT_NE(relay_err.find("upgrade outbox-relay"), std::string::npos) << relay_err;
}

// check-config and run share one validation: whatever run refuses at start-up, check-config
// refuses with the same message (it used to say "ok" to both of these).
// What a packaged service (systemd, Kubernetes) needs at start-up: a config it cannot use
// makes `run` exit non-zero at once, with one line that says what is wrong.
TEST_F(RelayProcessTest, StartupProblemsFailFastWithOneClearLine) {
  struct Case {
    std::string name;
    std::vector<std::string> args;
    std::string message;
  };
  const std::string secret_yaml = "database_url: \"" + db_url_ +
                                  "\"\n"
                                  "destinations:\n"
                                  "  hooks:\n"
                                  "    webhook:\n"
                                  "      url: \"https://hooks.example.com/in\"\n"
                                  "      secret_file: " +
                                  dir_ + "/no-such-secret\n";
  const std::string unreachable =
      "database_url: \"postgresql://relay@127.0.0.1:1/app?connect_timeout=5\"\n"
      "destinations:\n"
      "  orders:\n"
      "    kafka: {brokers: \"127.0.0.1:1\", topic: orders}\n";
  const std::vector<Case> cases = {
      {"missing-config", {"run", "--config", dir_ + "/nowhere.yaml"}, "nowhere.yaml"},
      {"unreadable-secret",
       {"run", "--config", WriteConfig("secret.yaml", secret_yaml)},
       "no-such-secret"},
      {"database-unreachable",
       {"run", "--config", WriteConfig("unreachable.yaml", unreachable)},
       "cannot reach the database"},
  };
  for (const auto& c : cases) {
    ChildProcess& relay = Spawn(c.name, c.args);
    ASSERT_TRUE(relay.WaitExit(20s)) << c.name << " still runs: " << relay.Describe();
    EXPECT_TRUE(relay.ExitedNonZero()) << c.name;
    const std::string err = relay.Stderr();
    EXPECT_NE(err.find(c.message), std::string::npos) << c.name << ": " << err;
    EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << c.name << ": one line: " << err;
  }
}

// SIGTERM during start-up (here: while the database has not answered its connect yet) took
// the default action: the signals were blocked only once the schema was checked. As PID 1 of
// a container the kernel drops such a signal instead, and the relay went on to claim until
// SIGKILL, its leases left to expire (review). Blocked from the start, it is taken once the
// start-up ends: the relay exits, and says why.
TEST_F(RelayProcessTest, ASigtermDuringStartUpIsNotLost) {
  const int silent = ::socket(AF_INET, SOCK_STREAM, 0);  // accepts connections, answers nothing
  ASSERT_GE(silent, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(silent, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(silent, 16), 0);
  socklen_t len = sizeof addr;
  ASSERT_EQ(::getsockname(silent, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const std::string config = WriteConfig(
      "silent.yaml", "database_url: \"postgresql://relay@127.0.0.1:" +
                         std::to_string(ntohs(addr.sin_port)) +
                         "/app?connect_timeout=3\"\n"
                         "destinations:\n"
                         "  orders:\n"
                         "    kafka: {brokers: \"127.0.0.1:1\", topic: orders}\n");
  ChildProcess& relay = StartRelay(config);
  pollfd connecting{silent, POLLIN, 0};  // start-up under way: its connect has arrived
  ASSERT_EQ(::poll(&connecting, 1, 10'000), 1) << relay.Describe();
  relay.Signal(SIGTERM);
  ASSERT_TRUE(relay.WaitExit(20s)) << relay.Describe();
  ::close(silent);
  EXPECT_FALSE(relay.status() && WIFSIGNALED(*relay.status()))
      << "killed by the signal during start-up: " << relay.Describe();
}

TEST_F(RelayProcessTest, CheckConfigRefusesExactlyWhatRunRefuses) {
  struct Case {
    std::string name, yaml, message;
  };
  const std::vector<Case> cases = {
      {"bad-kafka-property", Yaml(db_url_, {{"compression.type", "not-a-codec"}}),
       "invalid producer property \"compression.type\""},
      {"kafka-duration-with-a-unit", Yaml(db_url_, {{"linger.ms", "5s"}}),
       "linger.ms: \"5s\" is not a whole number of milliseconds"},
      {"webhook-credentials",
       "database_url: \"" + db_url_ +
           "\"\n"
           "destinations:\n"
           "  hooks:\n"
           "    webhook:\n"
           "      url: \"https://user:password@example.com/hooks\"\n"
           "      secret: \"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"\n",
       "must not contain credentials"},
      // The SSRF guard refuses a private address written as a literal, in any notation.
      {"webhook-metadata-address",
       "database_url: \"" + db_url_ +
           "\"\n"
           "destinations:\n"
           "  hooks:\n"
           "    webhook:\n"
           "      url: \"http://169.254.169.254/latest/meta-data\"\n"
           "      secret: \"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"\n",
       "169.254.169.254 is a link-local (cloud metadata endpoints live here) address, which "
       "only an allowed_networks entry within 169.254.0.0/16 opens (not allow_private_networks, "
       "nor a wider entry). If this endpoint really is there, list it in "
       "destinations.hooks.webhook.allowed_networks"},
      {"webhook-decimal-loopback",
       "database_url: \"" + db_url_ +
           "\"\n"
           "destinations:\n"
           "  hooks:\n"
           "    webhook:\n"
           "      url: \"http://2130706433:8080/hooks\"\n"
           "      secret: \"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"\n",
       "the host 2130706433 is refused by the SSRF guard: 127.0.0.1 is a loopback address"},
  };
  for (const auto& c : cases) {
    const std::string config = WriteConfig(c.name + ".yaml", c.yaml);
    ChildProcess& check = Spawn("check-" + c.name, {"check-config", "--config", config});
    ChildProcess& run = StartRelay(config);
    ASSERT_TRUE(check.WaitExit(30s)) << check.Describe();
    ASSERT_TRUE(run.WaitExit(30s)) << run.Describe();
    EXPECT_TRUE(check.ExitedNonZero()) << c.name << ": check-config said ok\n" << check.Stdout();
    EXPECT_TRUE(run.ExitedNonZero()) << c.name << ": run started";
    EXPECT_NE(check.Stderr().find(c.message), std::string::npos)
        << c.name << ": " << check.Stderr();
    EXPECT_NE(run.Stderr().find(c.message), std::string::npos) << c.name << ": " << run.Stderr();
    EXPECT_NE(check.Stderr().find(config), std::string::npos)
        << "names the file: " << check.Stderr();
  }
}

// Operators have the relay's config file at hand: the operator commands take it for its
// database_url (docs/operations.md shows `status --config relay.yaml`).
TEST_F(RelayProcessTest, OperatorCommandsTakeTheConfigFileForTheDatabase) {
  Enqueue(3, 1, 1);
  const std::string config = WriteConfig("relay.yaml", Yaml(db_url_));
  ChildProcess& status = Spawn("status", {"status", "--config", config, "--json"});
  ChildProcess& dlq = Spawn("dlq-list", {"dlq", "list", "--config", config});
  ChildProcess& migrate = Spawn("migrate", {"migrate", "--config", config});
  ChildProcess& check = Spawn("check-config", {"check-config", "--config", config});
  for (ChildProcess* p : {&status, &dlq, &migrate, &check}) {
    ASSERT_TRUE(p->WaitExit(30s)) << p->Describe();
    EXPECT_FALSE(p->ExitedNonZero()) << p->Describe() << "\n" << p->Stderr();
  }
  EXPECT_NE(status.Stdout().find(kTopic), std::string::npos) << status.Stdout();
  EXPECT_NE(dlq.Stdout().find("0 dead letter(s)"), std::string::npos) << dlq.Stdout();
  EXPECT_NE(migrate.Stdout().find("up to date"), std::string::npos) << migrate.Stdout();
  // Each destination's retry horizon (issue 17): 50 attempts, delays capped at 50, 100, 200,
  // 400 ms, then 45 x 500 ms: 23.25 s in all.
  EXPECT_NE(check.Stdout().find("orders (kafka, at least once): 50 attempt(s), then dead "
                                "letters; retries wait "
                                "up to 23s in all (about 11s on average)"),
            std::string::npos)
      << check.Stdout();

  ChildProcess& nowhere = Spawn("status-no-db", {"status"});
  ASSERT_TRUE(nowhere.WaitExit(30s)) << nowhere.Describe();
  EXPECT_TRUE(nowhere.ExitedNonZero());
  EXPECT_NE(nowhere.Stderr().find("pass --config relay.yaml or --database-url"), std::string::npos)
      << nowhere.Stderr();
}

// `dlq replay 7 7`: the same id twice is one dead letter, replayed once. The command counted
// the ids given, not the distinct ones, and said one of them was no dead letter, exit 1, after
// replaying it (review): a script retrying on exit 1 replayed nothing more but was misled.
TEST_F(RelayProcessTest, DlqReplayOfAnIdGivenTwiceReplaysItOnceAndSucceeds) {
  {
    pqxx::connection c(db_url_);
    pqxx::work tx(c);
    tx.exec(
        "INSERT INTO outbox.dead_letters (id, destination, idempotency_key, event_type, headers, "
        "payload, attempts, reason, created_at) VALUES (7, 'orders', gen_random_uuid(), '', "
        "'{}', '1', 3, 'http 500', now())");
    tx.commit();
  }
  const std::string config = WriteConfig("relay.yaml", Yaml(db_url_));
  ChildProcess& replay = Spawn("dlq-replay", {"dlq", "replay", "7", "7", "--config", config});
  ASSERT_TRUE(replay.WaitExit(30s)) << replay.Describe();
  EXPECT_FALSE(replay.ExitedNonZero()) << replay.Stderr();
  EXPECT_NE(replay.Stdout().find("replayed 1 message(s)"), std::string::npos) << replay.Stdout();
  pqxx::connection c(db_url_);
  pqxx::nontransaction tx(c);
  EXPECT_EQ(tx.exec1("SELECT count(*) FROM outbox.messages")[0].as<int>(), 1);
  EXPECT_EQ(tx.exec1("SELECT count(*) FROM outbox.dead_letters")[0].as<int>(), 0);
}

// `dlq replay` of a dead letter whose webhook endpoint was deleted holds it back (a new
// endpoint of that id would get it), says which and why, and exits 1; the rest is replayed.
TEST_F(RelayProcessTest, DlqReplayHoldsBackADeletedEndpointsDeadLetterAndSaysSo) {
  {
    pqxx::connection c(db_url_);
    pqxx::work tx(c);
    tx.exec(
        "INSERT INTO outbox.dead_letters (id, destination, idempotency_key, event_type, headers, "
        "payload, attempts, reason, created_at, endpoint_id) VALUES "
        "(7, 'orders', gen_random_uuid(), '', '{}', '1', 3, 'endpoint gone was deleted', now(), "
        " 'gone'), "
        "(8, 'orders', gen_random_uuid(), '', '{}', '2', 3, 'http 500', now(), NULL)");
    tx.commit();
  }
  const std::string config = WriteConfig("relay.yaml", Yaml(db_url_));
  ChildProcess& replay = Spawn(
      "dlq-replay", {"dlq", "replay", "--all", "--destination", "orders", "--config", config});
  ASSERT_TRUE(replay.WaitExit(30s)) << replay.Describe();
  EXPECT_TRUE(replay.ExitedNonZero());
  EXPECT_NE(replay.Stdout().find("replayed 1 message(s)"), std::string::npos) << replay.Stdout();
  EXPECT_NE(replay.Stderr().find("1 dead letter(s) of a webhook endpoint that was deleted held "
                                 "back"),
            std::string::npos)
      << replay.Stderr();
  EXPECT_NE(replay.Stderr().find(": 7;"), std::string::npos) << replay.Stderr();
  EXPECT_NE(replay.Stderr().find("dlq purge"), std::string::npos) << replay.Stderr();
  pqxx::connection c(db_url_);
  pqxx::nontransaction tx(c);
  EXPECT_EQ(tx.exec1("SELECT count(*) FROM outbox.dead_letters WHERE id = 7")[0].as<int>(), 1);
  EXPECT_EQ(tx.exec1("SELECT count(*) FROM outbox.messages")[0].as<int>(), 1);
}

// `dlq purge 999` (no such dead letter) printed "purged 0" and exited 0, where replay exits 1
// naming what it did not find; and `dlq list` printed its page size ("50 dead letter(s)") as
// if it were the total (review).
TEST_F(RelayProcessTest, DlqPurgeOfIdsThatAreNotDeadLettersFailsAndListSaysHowManyThereAre) {
  {
    pqxx::connection c(db_url_);
    pqxx::work tx(c);
    tx.exec(
        "INSERT INTO outbox.dead_letters (id, destination, idempotency_key, event_type, headers, "
        "payload, attempts, reason, created_at) SELECT g, 'orders', gen_random_uuid(), '', "
        "'{}', '1', 3, 'http 500', now() FROM generate_series(1, 5) g");
    tx.commit();
  }
  const std::string config = WriteConfig("relay.yaml", Yaml(db_url_));
  ChildProcess& list = Spawn("dlq-list", {"dlq", "list", "--limit", "2", "--config", config});
  ASSERT_TRUE(list.WaitExit(30s)) << list.Describe();
  EXPECT_FALSE(list.ExitedNonZero()) << list.Stderr();
  EXPECT_NE(list.Stdout().find("2 of 5 dead letter(s)"), std::string::npos) << list.Stdout();

  ChildProcess& purge =
      Spawn("dlq-purge", {"dlq", "purge", "1", "999", "998", "--config", config});
  ASSERT_TRUE(purge.WaitExit(30s)) << purge.Describe();
  EXPECT_TRUE(purge.ExitedNonZero()) << purge.Stdout();
  EXPECT_NE(purge.Stdout().find("purged 1 dead letter(s)"), std::string::npos) << purge.Stdout();
  EXPECT_NE(purge.Stderr().find("2 of the given ids are not dead letters"), std::string::npos)
      << purge.Stderr();
  EXPECT_EQ(Scalar("SELECT count(*) FROM outbox.dead_letters"), 4);

  ChildProcess& exact = Spawn("dlq-purge-ok", {"dlq", "purge", "2", "2", "--config", config});
  ASSERT_TRUE(exact.WaitExit(30s)) << exact.Describe();
  EXPECT_FALSE(exact.ExitedNonZero()) << exact.Stderr();
}

// `destinations add` counts a name's characters, as outbox.destinations does: a non-ASCII
// name of 255 characters (510 bytes) was refused though the database takes it.
TEST_F(RelayProcessTest, DestinationsAddCountsCharactersNotBytes) {
  std::string name;
  for (int i = 0; i < 255; ++i) name += "\u00e9";
  ChildProcess& add = Spawn("add", {"destinations", "add", "--database-url", db_url_, name});
  ChildProcess& too_long =
      Spawn("add-long", {"destinations", "add", "--database-url", db_url_, name + "x"});
  for (ChildProcess* p : {&add, &too_long}) ASSERT_TRUE(p->WaitExit(30s)) << p->Describe();
  EXPECT_FALSE(add.ExitedNonZero()) << add.Stderr();
  EXPECT_TRUE(too_long.ExitedNonZero()) << too_long.Stdout();
  EXPECT_NE(too_long.Stderr().find("1 to 255 characters"), std::string::npos) << too_long.Stderr();
  EXPECT_EQ(Scalar("SELECT count(*) FROM outbox.destinations WHERE length(name) = 255"), 1);
}

// Issue: a relay dead-lettered messages of destinations it does not know while another relay
// was delivering them (a rolling deploy that adds a destination, a canary). Now a relay leaves
// other relays' destinations alone, says once when nothing serves one, and status shows it.
TEST_F(RelayProcessTest, ARelayLeavesDestinationsItDoesNotServeToOtherRelays) {
  kafka_->CreateTopic("hooks", 3);
  {
    pqxx::connection c(db_url_);
    pqxx::work tx(c);
    std::vector<outbox::OutboxMessage> batch;
    for (int i = 0; i < 300; ++i) {
      batch.push_back(
          outbox::Message::To("hooks").Json("1").Key("k" + std::to_string(i % 7)).Build());
    }
    outbox::PublishMany(tx, batch);
    tx.commit();
  }
  // The old relay: only kTopic.
  const std::string old_config = WriteConfig("old.yaml", Yaml(db_url_));
  ChildProcess& old_relay = StartRelay(old_config);
  ASSERT_TRUE(WaitFor(
      [&] {
        return old_relay.Stderr().find("\"hooks\" has messages that no running relay serves") !=
               std::string::npos;
      },
      30s))
      << old_relay.Stderr();
  EXPECT_EQ(DeadLetters(), 0) << "a relay must not dead-letter a destination it does not serve";
  EXPECT_EQ(Scalar("SELECT count(*) FROM outbox.messages WHERE destination = 'hooks'"), 300);

  ChildProcess& status = Spawn("status", {"status", "--config", old_config, "--json"});
  ASSERT_TRUE(status.WaitExit(30s)) << status.Describe();
  const auto snapshot = nlohmann::json::parse(status.Stdout());
  bool seen = false;
  for (const auto& d : snapshot["destinations"]) {
    if (d["destination"] == "hooks") {
      seen = true;
      EXPECT_TRUE(d["unserved"].get<bool>()) << d.dump();
      EXPECT_EQ(d["relays"].get<int>(), 0);
    }
    if (d["destination"] == kTopic) {
      EXPECT_EQ(d["relays"].get<int>(), 1) << d.dump();
    }
  }
  EXPECT_TRUE(seen) << status.Stdout();

  // The new relay serves both; the old one keeps running beside it, through its sweeps.
  const std::string new_config =
      WriteConfig("new.yaml", Yaml(db_url_) + "  hooks:\n    kafka:\n      brokers: \"" +
                                  kafka_->bootstraps() + "\"\n      topic: hooks\n");
  ChildProcess& new_relay = StartRelay(new_config);
  ASSERT_TRUE(DrainedBy({&old_relay, &new_relay}, 60s));
  EXPECT_EQ(DeadLetters(), 0);
  StopGracefully(new_relay);
  StopGracefully(old_relay);
  EXPECT_EQ(Scalar("SELECT count(*) FROM outbox.relay_heartbeats"), 0)
      << "relays that stop cleanly leave";
}

// Issue: with the lease equal to the producer's message.timeout.ms, every broker outage longer
// than the lease expired and reaped what was in flight (an attempt counted each) and fenced
// its settles. Now an attempt ends inside its lease (config refuses or derives the bounds) and
// the relay renews the leases of what it still holds: an outage of three leases reaps nothing.
TEST_F(RelayProcessTest, ABrokerOutageLongerThanTheLeaseExpiresNoLease) {
  const ExpectedMap expected = Enqueue(300, 10, 4);
  kafka_->SetAllBrokersDown(true);
  ChildProcess& relay = StartRelay(WriteConfig("relay.yaml", Yaml(db_url_)));  // lease 3000 ms
  const auto down_since = Clock::now();
  // Down for three leases, while the relay keeps trying (its attempts time out and retry).
  ASSERT_TRUE(WaitFor(
      [&] { return !relay.Running() || (Clock::now() - down_since > 9s && WithAttempts() > 0); },
      60s, kDbPoll));
  ASSERT_TRUE(relay.Running()) << relay.Describe();
  kafka_->SetAllBrokersDown(false);
  ASSERT_TRUE(DrainedBy({&relay}, 60s));
  const auto records = ConsumeAtLeast(expected.size());
  ExpectAllDeliveredInKeyOrder(records, expected);
  StopGracefully(relay);
  const std::string log = relay.Stderr();
  EXPECT_EQ(log.find("reaper: returned"), std::string::npos) << "a lease expired:\n" << log;
  EXPECT_EQ(log.find("settlements fenced"), std::string::npos) << log;
  EXPECT_EQ(DeadLetters(), 0);
}

// Issue: after `pg_ctl restart -m immediate`, a claim that committed but whose reply never
// reached the relay kept its rows leased for the whole lease, and every later message of those
// keys waited behind them. The relay knows the token it sent: on reconnecting it hands back
// what that claim leased, so the keys move within a reconnect.
TEST_F(RelayProcessTest, AClaimWhoseReplyWasLostIsHandedBackOnReconnect) {
  ReplyLosingProxy proxy(PgCluster::Instance().port());
  std::string via_proxy = db_url_;
  const std::string pg_port = ":" + std::to_string(PgCluster::Instance().port()) + "/";
  via_proxy.replace(via_proxy.find(pg_port), pg_port.size(),
                    ":" + std::to_string(proxy.port()) + "/");
  std::string yaml = Yaml(via_proxy);
  yaml.replace(yaml.find("lease_ms: 3000"), 14, "lease_ms: 30000");  // the stranded wait
  // Claims only on wake-ups (no idle polls), so the next claim is the one for our messages.
  yaml.replace(yaml.find("poll_interval_ms: 200"), 21, "poll_interval_ms: 60000");
  ChildProcess& relay = StartRelay(WriteConfig("relay.yaml", yaml));
  // Unkeyed, so no blocked key keeps the claim loop rechecking: afterwards it only claims
  // when woken by a new message.
  const ExpectedMap warm = Enqueue(5, 1, 1);
  ASSERT_TRUE(DrainedBy({&relay}, 30s)) << "the relay does not deliver through the proxy";

  proxy.ArmOnClaim();
  ExpectedMap expected = Enqueue(40, 2, 1000);  // two keys
  ASSERT_TRUE(WaitFor([&] { return !relay.Running() || Leased() > 0; }, 30s, kDbPoll))
      << "no claim committed; queued " << Queued() << "\n"
      << relay.Stderr();
  // The claim committed; its reply is gone. Now the connections break, as in a restart.
  proxy.CutAll();
  // Within a reconnect or two, far inside the 30 s lease.
  ASSERT_TRUE(DrainedBy({&relay}, 10s))
      << Leased() << " still leased: the lost claim's rows were not handed back";
  for (const auto& [id, e] : warm) expected.emplace(id, e);
  const auto records = ConsumeAtLeast(expected.size());
  ExpectAllDeliveredInKeyOrder(records, expected);
  EXPECT_EQ(WithAttempts(), 0) << "handing back a lost claim is not a failed attempt";
  EXPECT_NE(relay.Stderr().find("leased by a claim whose reply was lost"), std::string::npos)
      << relay.Stderr();
  StopGracefully(relay);
}

// Issue 17 (pause and resume): an operator pauses a destination from the CLI; a relay started
// while it is paused claims nothing for it, status shows it, and resume lets the relay drain.
TEST_F(RelayProcessTest, AnOperatorPausesAndResumesADestinationFromTheCli) {
  const ExpectedMap expected = Enqueue(200, 5, 4);
  const std::string config = WriteConfig("relay.yaml", Yaml(db_url_));
  ChildProcess& pause =
      Spawn("pause", {"pause", kTopic, "--config", config, "--reason", "broker maintenance"});
  ASSERT_TRUE(pause.WaitExit(30s)) << pause.Describe();
  ASSERT_FALSE(pause.ExitedNonZero()) << pause.Stderr();
  EXPECT_NE(pause.Stdout().find("paused"), std::string::npos) << pause.Stdout();

  ChildProcess& relay = StartRelay(config);
  ASSERT_TRUE(WaitFor(
      [&] { return relay.Stderr().find("is paused (broker maintenance)") != std::string::npos; },
      30s))
      << relay.Stderr();
  ChildProcess& status = Spawn("status", {"status", "--config", config, "--json"});
  ASSERT_TRUE(status.WaitExit(30s)) << status.Describe();
  bool seen = false;
  const auto snapshot = nlohmann::json::parse(status.Stdout());
  for (const auto& d : snapshot["destinations"]) {
    if (d["destination"] != kTopic) continue;
    seen = true;
    EXPECT_TRUE(d["paused"].get<bool>()) << d.dump();
    EXPECT_EQ(d["paused_reason"], "broker maintenance") << d.dump();
  }
  EXPECT_TRUE(seen) << status.Stdout();
  EXPECT_EQ(Queued(), 200) << "the relay claimed a destination paused before it started";
  EXPECT_EQ(Leased(), 0);
  EXPECT_EQ(WithAttempts(), 0);

  ChildProcess& resume = Spawn("resume", {"resume", kTopic, "--config", config});
  ASSERT_TRUE(resume.WaitExit(30s)) << resume.Describe();
  ASSERT_FALSE(resume.ExitedNonZero()) << resume.Stderr();
  ASSERT_TRUE(DrainedBy({&relay}, 60s));
  EXPECT_NE(relay.Stderr().find("resumed"), std::string::npos) << relay.Stderr();
  const auto records = ConsumeAtLeast(expected.size());
  ExpectAllDeliveredInKeyOrder(records, expected);

  ChildProcess& again = Spawn("resume-again", {"resume", kTopic, "--config", config});
  ASSERT_TRUE(again.WaitExit(30s)) << again.Describe();
  EXPECT_FALSE(again.ExitedNonZero()) << again.Stderr();
  EXPECT_NE(again.Stdout().find("was not paused"), std::string::npos) << again.Stdout();
  StopGracefully(relay);
}

// /readyz of the binary as run: with every broker down the body names the destination and
// why, once prefixed. (RunRelay's readiness text and the admin server both added "not ready:
// ", so it read "not ready: not ready: orders: ...".)
TEST_F(RelayProcessTest, ReadyzOfARunningRelaySaysOnceWhyItIsNotReady) {
  kafka_->SetAllBrokersDown(true);
  const std::string config = WriteConfig(
      "relay.yaml",
      Yaml(db_url_, {}, "admin_listen: \"127.0.0.1:" + std::to_string(PickFreePort()) + "\"\n"));
  ChildProcess& relay = StartRelay(config);
  int port = 0;
  ASSERT_TRUE(WaitFor(
      [&] {
        const std::string log = relay.Stderr();
        const auto at = log.find("admin server on 127.0.0.1:");
        if (at == std::string::npos) return false;
        port = std::stoi(log.substr(at + 26));
        return port > 0;
      },
      20s))
      << relay.Stderr();
  httplib::Client admin("127.0.0.1", port);
  std::string body;
  ASSERT_TRUE(WaitFor(
      [&] {
        auto res = admin.Get("/readyz");
        if (!res || res->status != 503) return false;
        body = res->body;
        return body.find(kTopic) != std::string::npos;
      },
      30s))
      << body << relay.Stderr();
  EXPECT_EQ(body.rfind("not ready: ", 0), 0u) << body;
  EXPECT_EQ(body.find("not ready: not ready"), std::string::npos) << body;
  kafka_->SetAllBrokersDown(false);
  EXPECT_TRUE(WaitFor(
      [&] {
        auto res = admin.Get("/readyz");
        return res && res->status == 200 && res->body == "ready\n";
      },
      30s));
  StopGracefully(relay);
}

// docs/roles.md: a relay's login needs only the outbox_relay role. `run` first reads the
// schema version from outbox.schema_migrations, on which no migration granted anything, so a
// relay with exactly that role stopped at startup ("permission denied", reported as a database
// it could not reach) (review). Run and the operator commands, as a login that has only
// outbox_relay.
TEST_F(RelayProcessTest, ARelayWhoseLoginHasOnlyTheRelayRoleRunsAndServesTheCommands) {
  const std::string url = UrlOfLogin("least_relay_login", "outbox_relay");
  const ExpectedMap expected = Enqueue(100, 5, 4);
  const std::string config = WriteConfig("relay.yaml", Yaml(url));

  for (const auto& args : std::vector<std::vector<std::string>>{
           {"status", "--config", config},
           {"pause", kTopic, "--config", config},
           {"resume", kTopic, "--config", config},
           {"dlq", "list", "--config", config}}) {
    ChildProcess& cmd = Spawn(args[0], args);
    ASSERT_TRUE(cmd.WaitExit(30s)) << cmd.Describe();
    EXPECT_FALSE(cmd.ExitedNonZero()) << args[0] << ": " << cmd.Stderr();
  }
  ChildProcess& relay = StartRelay(config);
  ASSERT_TRUE(DrainedBy({&relay}, 60s)) << relay.Stderr();
  ExpectAllDeliveredInKeyOrder(ConsumeAtLeast(expected.size()), expected);
  StopGracefully(relay);

  // A login without the role is told what to grant, not that the database is unreachable.
  {
    pqxx::connection c(db_url_);
    pqxx::nontransaction(c).exec("REVOKE outbox_relay FROM least_relay_login");
  }
  ChildProcess& refused = StartRelay(config);
  ASSERT_TRUE(refused.WaitExit(30s)) << refused.Describe();
  EXPECT_TRUE(refused.ExitedNonZero()) << refused.Describe();
  EXPECT_NE(refused.Stderr().find("GRANT outbox_relay TO"), std::string::npos)
      << refused.Stderr();
  EXPECT_EQ(refused.Stderr().find("cannot reach"), std::string::npos) << refused.Stderr();
}

// docs/roles.md: outbox_reader runs the commands that only look (status, dlq list / show,
// attempts) and nothing that changes the outbox; a command it may not run says which role it
// needs, and changes nothing. It cannot read the signing secrets, nor an endpoint's url and
// headers (where credentials go).
TEST_F(RelayProcessTest, ALoginWithTheReaderRoleLooksButChangesNothing) {
  const std::string url = UrlOfLogin("reader_login", "outbox_reader");
  {
    pqxx::connection c(db_url_);
    pqxx::nontransaction tx(c);
    tx.exec(
        "INSERT INTO outbox.dead_letters (id, destination, idempotency_key, event_type, headers, "
        "payload, attempts, reason, created_at) VALUES (7, '" +
        std::string(kTopic) + "', gen_random_uuid(), '', '{}', '1', 3, 'http 500', now())");
  }
  Enqueue(10, 2, 4);
  const std::string config = WriteConfig("reader.yaml", Yaml(url));

  for (const auto& args :
       std::vector<std::vector<std::string>>{{"status", "--config", config},
                                             {"status", "--json", "--config", config},
                                             {"dlq", "list", "--config", config},
                                             {"dlq", "show", "7", "--config", config},
                                             {"attempts", "--config", config}}) {
    ChildProcess& cmd = Spawn(args[0], args);
    ASSERT_TRUE(cmd.WaitExit(30s)) << cmd.Describe();
    EXPECT_FALSE(cmd.ExitedNonZero()) << args[0] << " " << args[1] << ": " << cmd.Stderr();
  }
  for (const auto& args :
       std::vector<std::vector<std::string>>{{"pause", kTopic, "--config", config},
                                             {"dlq", "replay", "7", "--config", config},
                                             {"dlq", "purge", "7", "--config", config}}) {
    ChildProcess& cmd = Spawn(args[0] + "-refused", args);
    ASSERT_TRUE(cmd.WaitExit(30s)) << cmd.Describe();
    EXPECT_TRUE(cmd.ExitedNonZero()) << args[0] << ": " << cmd.Stdout();
    EXPECT_NE(cmd.Stderr().find("permission denied"), std::string::npos) << cmd.Stderr();
    EXPECT_NE(cmd.Stderr().find("GRANT outbox_relay TO"), std::string::npos)
        << args[0] << " does not say what it needs: " << cmd.Stderr();
  }
  EXPECT_EQ(Scalar("SELECT count(*) FROM outbox.paused_destinations"), 0);
  EXPECT_EQ(Scalar("SELECT count(*) FROM outbox.dead_letters WHERE id = 7"), 1);
  EXPECT_EQ(Scalar("SELECT count(*) FROM outbox.messages"), 10);

  pqxx::connection reader(url);
  pqxx::nontransaction tx(reader);
  EXPECT_EQ(tx.exec1("SELECT count(*) FROM outbox.messages")[0].as<int>(), 10);
  for (const std::string denied :
       {"SELECT secret FROM outbox.endpoint_secrets", "SELECT url FROM outbox.endpoints",
        "SELECT headers FROM outbox.endpoints", "DELETE FROM outbox.messages",
        "UPDATE outbox.dead_letters SET attempts = 0"}) {
    try {
      tx.exec(denied);
      ADD_FAILURE() << "outbox_reader may: " << denied;
    } catch (const pqxx::insufficient_privilege&) {
    }
  }
}

// outbox-sample-receiver decoded its --secret only when a request came: a malformed one
// (a password, a signing key whsk_...) threw inside the handler, every delivery got a 500,
// the receiver printed nothing, and the relay retried and dead-lettered (review). Refused at
// start, naming the option.
TEST_F(RelayProcessTest, TheSampleReceiverRefusesAMalformedSecretAtStart) {
  for (const std::string secret : {"hunter2", "whsec_not-base64!"}) {
    SCOPED_TRACE(secret);
    ChildProcess receiver("receiver-" + std::to_string(secret.size()),
                          {OUTBOX_SAMPLE_RECEIVER_BIN, "--port", "0", "--secret", secret}, dir_);
    ASSERT_TRUE(receiver.WaitExit(10s)) << "it listened with a secret it cannot verify with";
    EXPECT_TRUE(receiver.ExitedNonZero());
    EXPECT_NE(receiver.Stderr().find("--secret"), std::string::npos) << receiver.Stderr();
    EXPECT_EQ(receiver.Stderr().find(secret), std::string::npos)
        << "the secret is not echoed: " << receiver.Stderr();
  }
}

}  // namespace
}  // namespace outbox::testing
