// Process-level fault tests: the real `outbox-relay` binary runs as child processes of this
// test, which hosts PostgreSQL (PgTest: a fresh migrated database per test) and librdkafka's
// mock cluster (reached by the children over loopback). The tests kill relays with SIGKILL,
// stop them with SIGTERM/SIGINT, run several at once while the brokers fail, restart
// PostgreSQL under a running relay, and check start-up errors. What arrived is read back
// with an independent consumer and compared with what was enqueued.
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <pqxx/pqxx>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <system_error>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "outbox/outbox.h"
#include "outbox_test/kafka_mock.h"
#include "outbox_test/pg.h"
#include "outbox_test/wait.h"

#ifndef OUTBOX_RELAY_BIN
#error "OUTBOX_RELAY_BIN (path of the outbox-relay binary) must be defined by the build"
#endif

namespace outbox::testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using Millis = std::chrono::milliseconds;

constexpr const char* kRelayBin = OUTBOX_RELAY_BIN;
constexpr const char* kTopic = "orders";
constexpr Millis kShutdownTimeout = 5000ms;  // shutdown_timeout_ms in every config below
// How much longer than shutdown_timeout_ms a relay may take to exit after SIGTERM/SIGINT:
// the settler's last write (at least 2 s in Dispatcher::Stop) plus process teardown.
constexpr Millis kShutdownMargin = 5000ms;
// Pace of the database polls in WaitFor: each poll opens a connection.
constexpr Millis kDbPoll = 20ms;

[[noreturn]] void ThrowErrno(const std::string& what) {
  throw std::system_error(errno, std::generic_category(), what);
}

std::string ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string DescribeWaitStatus(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return "killed by signal " + std::to_string(WTERMSIG(status)) + " (" + ::strsignal(WTERMSIG(status)) + ")";
  }
  return "wait status " + std::to_string(status);
}

// The environment of a child: ours without OUTBOX_* variables, so that only the config file
// written by the test decides (OUTBOX_DATABASE_URL, OUTBOX_LEASE_MS, ... would override it).
std::vector<std::string> ChildEnvironment() {
  std::vector<std::string> env;
  for (char** e = ::environ; e != nullptr && *e != nullptr; ++e) {
    if (std::strncmp(*e, "OUTBOX_", 7) != 0) env.emplace_back(*e);
  }
  return env;
}

// One child process (fork + exec). stdin is /dev/null, stdout and stderr go to files in the
// test's temp dir. The child gets SIGKILL when the thread that started it (the test's main
// thread) dies, and the destructor SIGKILLs and reaps it if it is still running, so no relay
// outlives its test, whatever happens to the test.
class ChildProcess {
 public:
  ChildProcess(std::string name, const std::vector<std::string>& args, const std::string& dir)
      : name_(std::move(name)),
        stdout_path_(dir + "/" + name_ + ".stdout"),
        stderr_path_(dir + "/" + name_ + ".stderr") {
    const int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (devnull < 0) ThrowErrno("open /dev/null");
    const int out = ::open(stdout_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    const int err = ::open(stderr_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (out < 0 || err < 0) {
      const int saved = errno;
      for (int fd : {devnull, out, err}) {
        if (fd >= 0) ::close(fd);
      }
      errno = saved;
      ThrowErrno("open " + stdout_path_ + " / " + stderr_path_);
    }
    // Everything the child needs is prepared before fork: after fork only system calls.
    const std::vector<std::string> env = ChildEnvironment();
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    std::vector<char*> envp;
    for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
    envp.push_back(nullptr);
    sigset_t no_signals;
    sigemptyset(&no_signals);
    struct sigaction default_action {};
    default_action.sa_handler = SIG_DFL;
    sigemptyset(&default_action.sa_mask);
    const pid_t parent = ::getpid();

    pid_ = ::fork();
    if (pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(126);  // the test died before prctl took effect
      ::sigprocmask(SIG_SETMASK, &no_signals, nullptr);
      for (int sig : {SIGINT, SIGTERM, SIGPIPE}) ::sigaction(sig, &default_action, nullptr);
      if (::dup2(devnull, 0) < 0 || ::dup2(out, 1) < 0 || ::dup2(err, 2) < 0) ::_exit(126);
      // No other descriptor of the test process (mock broker sockets, ...) leaks into it.
      ::close_range(3, ~0U, 0);
      ::execve(argv[0], argv.data(), envp.data());
      static const char msg[] = "relay_process_pgtest: execve failed\n";
      [[maybe_unused]] auto ignored = ::write(2, msg, sizeof msg - 1);
      ::_exit(127);
    }
    const int saved = errno;
    for (int fd : {devnull, out, err}) ::close(fd);
    if (pid_ < 0) {
      errno = saved;
      ThrowErrno("fork");
    }
  }

  ~ChildProcess() { Kill(); }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  const std::string& name() const { return name_; }
  pid_t pid() const { return pid_; }

  /// Whether the child still runs; reaps it (and records its status) once it has exited.
  bool Running() {
    if (status_) return false;
    int status = 0;
    pid_t r;
    do {
      r = ::waitpid(pid_, &status, WNOHANG);
    } while (r < 0 && errno == EINTR);
    if (r == pid_) {
      status_ = status;
      return false;
    }
    if (r < 0) ThrowErrno("waitpid " + std::to_string(pid_));
    return true;
  }

  void Signal(int sig) {
    if (Running() && ::kill(pid_, sig) != 0) ThrowErrno("kill " + std::to_string(pid_));
  }

  /// SIGKILL and reap; nothing when it already exited.
  void Kill() {
    if (pid_ <= 0 || status_) return;
    if (!Running()) return;
    ::kill(pid_, SIGKILL);
    int status = 0;
    pid_t r;
    do {
      r = ::waitpid(pid_, &status, 0);
    } while (r < 0 && errno == EINTR);
    if (r == pid_) status_ = status;
  }

  /// Waits up to `timeout` for the child to exit; true if it did.
  bool WaitExit(Millis timeout) { return WaitFor([&] { return !Running(); }, timeout, 5ms); }

  /// Raw wait status once exited.
  std::optional<int> status() const { return status_; }
  bool ExitedWith(int code) const { return status_ && WIFEXITED(*status_) && WEXITSTATUS(*status_) == code; }
  bool ExitedNonZero() const { return status_ && WIFEXITED(*status_) && WEXITSTATUS(*status_) != 0; }

  std::string Describe() const {
    return name_ + " (pid " + std::to_string(pid_) + ", " +
           (status_ ? DescribeWaitStatus(*status_) : std::string("running")) + ")";
  }
  std::string Stderr() const { return ReadWholeFile(stderr_path_); }
  std::string Stdout() const { return ReadWholeFile(stdout_path_); }
  const std::string& stderr_path() const { return stderr_path_; }

 private:
  std::string name_;
  std::string stdout_path_;
  std::string stderr_path_;
  pid_t pid_ = -1;
  std::optional<int> status_;
};

// What the test knows about each enqueued message, read back right after enqueueing.
struct Expected {
  std::string idempotency_key;
  std::optional<std::string> ordering_key;
  std::string payload;  // payload::text, what the relay sends as the record value
};
using ExpectedMap = std::map<std::int64_t, Expected>;

// Checks the records of one topic against what was enqueued:
//  - every record is a known message, with its idempotency key, ordering key and payload;
//  - every message was consumed at least once;
//  - duplicates (redeliveries) carry the idempotency key of the first occurrence;
//  - per ordering key, after dropping duplicates, the first occurrences are strictly
//    increasing by outbox-id (a redelivery of an earlier message may appear later; a later
//    message may never appear before an earlier one first did).
// Returns the number of duplicate records.
std::size_t ExpectAllDeliveredInKeyOrder(std::vector<ConsumedRecord> records, const ExpectedMap& expected) {
  // Consumption order = log order; one key lives in one partition.
  std::stable_sort(records.begin(), records.end(), [](const ConsumedRecord& a, const ConsumedRecord& b) {
    return std::tie(a.partition, a.offset) < std::tie(b.partition, b.offset);
  });
  int problems = 0;
  auto problem = [&](const std::string& what) {
    if (++problems <= 20) ADD_FAILURE() << what;
  };
  std::map<std::int64_t, std::string> first_key_of;     // outbox-id -> idempotency-key, first occurrence
  std::map<std::string, std::int64_t> last_first_id;    // ordering key -> last first-occurrence id
  std::size_t duplicates = 0;
  for (const auto& r : records) {
    const std::string where = "partition " + std::to_string(r.partition) + " offset " + std::to_string(r.offset);
    const auto id_header = r.headers.find("outbox-id");
    if (id_header == r.headers.end()) {
      problem("record without outbox-id header at " + where);
      continue;
    }
    const std::int64_t id = std::stoll(id_header->second);
    const auto e = expected.find(id);
    if (e == expected.end()) {
      problem("record for unknown outbox-id " + std::to_string(id) + " at " + where);
      continue;
    }
    const auto key_header = r.headers.find("idempotency-key");
    const std::string idem = key_header == r.headers.end() ? std::string("<missing>") : key_header->second;
    if (idem != e->second.idempotency_key) {
      problem("outbox-id " + std::to_string(id) + " at " + where + ": idempotency-key " + idem + ", enqueued with " +
              e->second.idempotency_key);
    }
    if (r.key != e->second.ordering_key) {
      problem("outbox-id " + std::to_string(id) + " at " + where + ": record key " + r.key.value_or("<null>") +
              ", ordering key " + e->second.ordering_key.value_or("<null>"));
    }
    if (r.value != e->second.payload) {
      problem("outbox-id " + std::to_string(id) + " at " + where + ": value " + r.value + ", payload " +
              e->second.payload);
    }
    const auto [first, is_first] = first_key_of.emplace(id, idem);
    if (!is_first) {
      ++duplicates;
      if (idem != first->second) {
        problem("duplicate of outbox-id " + std::to_string(id) + " at " + where + " has idempotency-key " + idem +
                ", its first occurrence had " + first->second);
      }
      continue;
    }
    if (!e->second.ordering_key) continue;
    const auto [last, fresh] = last_first_id.emplace(*e->second.ordering_key, id);
    if (!fresh) {
      if (id <= last->second) {
        problem("key " + *e->second.ordering_key + " went backwards: outbox-id " + std::to_string(id) +
                " first consumed at " + where + ", after outbox-id " + std::to_string(last->second));
      } else {
        last->second = id;
      }
    }
  }
  std::size_t missing = 0;
  std::string missing_ids;
  for (const auto& [id, e] : expected) {
    if (first_key_of.count(id) != 0) continue;
    if (++missing <= 20) missing_ids += " " + std::to_string(id);
  }
  EXPECT_EQ(missing, 0u) << "messages never consumed (first 20):" << missing_ids;
  EXPECT_EQ(problems, 0) << "problems in the consumed records (first 20 reported above); " << records.size()
                         << " records, " << duplicates << " duplicates";
  return duplicates;
}

// Samples, from its own thread and connection, whether two messages of one key are leased at
// the same time. Any row the query returns is a violation of per-key order.
class LeaseOverlapMonitor {
 public:
  explicit LeaseOverlapMonitor(std::string url) : url_(std::move(url)) {}
  ~LeaseOverlapMonitor() { Stop(); }
  LeaseOverlapMonitor(const LeaseOverlapMonitor&) = delete;
  LeaseOverlapMonitor& operator=(const LeaseOverlapMonitor&) = delete;

  void Start() {
    thread_ = std::thread([this] { Run(); });
  }
  void Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  std::int64_t samples() const { return samples_; }
  std::int64_t errors() const { return errors_; }
  std::vector<std::string> violations() const {
    std::lock_guard lk(mu_);
    return violations_;
  }
  std::string last_error() const {
    std::lock_guard lk(mu_);
    return last_error_;
  }

 private:
  void Run() {
    std::unique_ptr<pqxx::connection> conn;
    while (!stop_) {
      try {
        if (!conn) conn = std::make_unique<pqxx::connection>(url_);
        pqxx::nontransaction tx(*conn);
        const auto rows = tx.exec(
            "SELECT destination, ordering_key, count(*) FROM outbox.messages "
            "WHERE lease_owner IS NOT NULL AND ordering_key IS NOT NULL "
            "GROUP BY 1, 2 HAVING count(*) > 1");
        ++samples_;
        if (!rows.empty()) {
          std::lock_guard lk(mu_);
          for (const auto& row : rows) {
            violations_.push_back(row[0].as<std::string>() + "/" + row[1].as<std::string>() + ": " +
                                  row[2].as<std::string>() + " leased at once");
          }
        }
      } catch (const std::exception& e) {
        ++errors_;
        conn.reset();
        std::lock_guard lk(mu_);
        last_error_ = e.what();
      }
      // Pace between samples (not a wait for a condition), to leave CPU to the relays.
      std::this_thread::sleep_for(2ms);
    }
  }

  std::string url_;
  std::atomic<bool> stop_{false};
  std::atomic<std::int64_t> samples_{0};
  std::atomic<std::int64_t> errors_{0};
  mutable std::mutex mu_;
  std::vector<std::string> violations_;
  std::string last_error_;
  std::thread thread_;
};

struct ProducerSetting {
  std::string name;
  std::string value;
};

class RelayProcessTest : public PgTest {
 protected:
  void SetUp() override {
    PgTest::SetUp();
    char tmpl[] = "/tmp/outbox-relay-process-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) ThrowErrno("mkdtemp");
    dir_ = tmpl;
    kafka_ = std::make_unique<KafkaMockCluster>(3);
    kafka_->CreateTopic(kTopic, 3);
  }

  void TearDown() override {
    for (auto& c : children_) c->Kill();
    // OUTBOX_TEST_SHOW_CHILD_OUTPUT=1 shows it for passing tests too (to see what the relays did).
    if (HasFailure() || std::getenv("OUTBOX_TEST_SHOW_CHILD_OUTPUT") != nullptr) {
      for (const auto& c : children_) {
        std::cerr << "----- " << c->Describe() << ": stderr (" << c->stderr_path() << ") -----\n";
        std::string err = c->Stderr();
        constexpr std::size_t kMax = 24 * 1024;
        if (err.size() > kMax) err = "[... " + std::to_string(err.size() - kMax) + " bytes cut ...]\n" + err.substr(err.size() - kMax);
        std::cerr << err;
        const std::string out = c->Stdout();
        if (!out.empty()) std::cerr << "----- " << c->name() << ": stdout -----\n" << out;
      }
      std::cerr << "----- end of child output -----" << std::endl;
    }
    children_.clear();
    kafka_.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  // A relay config with the small timings every test here uses.
  std::string Yaml(const std::string& database_url, const std::vector<ProducerSetting>& producer_extra = {},
                   const std::string& top_level_extra = "") const {
    std::ostringstream y;
    y << "# written by relay_process_pgtest\n"
      << "database_url: \"" << database_url << "\"\n"
      << "batch_size: 100\n"
      << "lease_ms: 2000\n"
      << "poll_interval_ms: 200\n"
      << "reap_interval_ms: 200\n"
      << "full_sweep_interval_ms: 2000\n"
      << "shutdown_timeout_ms: " << kShutdownTimeout.count() << "\n"
      << top_level_extra
      << "log:\n"
      << "  level: info\n"
      << "  format: text\n"
      << "destinations:\n"
      << "  " << kTopic << ":\n"
      << "    kafka:\n"
      << "      brokers: \"" << kafka_->bootstraps() << "\"\n"
      << "      topic: " << kTopic << "\n"
      << "      producer:\n"
      << "        message.timeout.ms: 2000\n"
      << "        reconnect.backoff.max.ms: 200\n";
    for (const auto& p : producer_extra) y << "        " << p.name << ": \"" << p.value << "\"\n";
    y << "    retry:\n"
      << "      max_attempts: 50\n"
      << "      initial_backoff_ms: 50\n"
      << "      max_backoff_ms: 500\n";
    return y.str();
  }

  std::string WriteConfig(const std::string& name, const std::string& yaml) const {
    const std::string path = dir_ + "/" + name;
    std::ofstream out(path, std::ios::trunc);
    out << yaml;
    out.close();
    if (!out) throw std::runtime_error("cannot write " + path);
    return path;
  }

  ChildProcess& Spawn(const std::string& name, const std::vector<std::string>& args) {
    std::vector<std::string> argv{kRelayBin};
    argv.insert(argv.end(), args.begin(), args.end());
    children_.push_back(std::make_unique<ChildProcess>(name, argv, dir_));
    return *children_.back();
  }

  ChildProcess& StartRelay(const std::string& config_path) {
    return Spawn("relay-" + std::to_string(++relay_counter_), {"run", "--config", config_path});
  }

  // Enqueues `n` messages in one transaction: every `unkeyed_every`-th has no ordering key,
  // the others cycle over `keys` keys. Returns what the test needs to check the deliveries.
  ExpectedMap Enqueue(int n, int keys, int unkeyed_every) {
    pqxx::connection c(db_url_);
    pqxx::work tx(c);
    std::vector<outbox::OutboxMessage> batch;
    batch.reserve(static_cast<std::size_t>(n));
    int keyed = 0;
    for (int i = 0; i < n; ++i) {
      auto b = outbox::Message::To(kTopic);
      b.Json("{\"n\": " + std::to_string(i) + ", \"tag\": \"process-test\"}").EventType("order.event");
      if (unkeyed_every <= 0 || i % unkeyed_every != unkeyed_every - 1) {
        b.Key("key-" + std::to_string(keyed++ % keys));
      }
      batch.push_back(b.Build());
    }
    const auto ids = outbox::PublishMany(tx, batch);
    const std::set<std::int64_t> wanted(ids.begin(), ids.end());
    ExpectedMap out;
    // Read back inside the writing transaction: no relay can have taken them yet.
    for (const auto& row : tx.exec("SELECT id, idempotency_key::text, ordering_key, payload::text FROM outbox.messages")) {
      const auto id = row[0].as<std::int64_t>();
      if (wanted.count(id) == 0) continue;
      Expected e;
      e.idempotency_key = row[1].as<std::string>();
      if (!row[2].is_null()) e.ordering_key = row[2].as<std::string>();
      e.payload = row[3].as<std::string>();
      out.emplace(id, std::move(e));
    }
    tx.commit();
    EXPECT_EQ(out.size(), ids.size());
    return out;
  }

  std::int64_t Scalar(const std::string& sql) const {
    pqxx::connection c(db_url_);
    pqxx::nontransaction tx(c);
    return tx.exec1(sql)[0].as<std::int64_t>();
  }
  std::vector<std::int64_t> Ids(const std::string& sql) const {
    pqxx::connection c(db_url_);
    pqxx::nontransaction tx(c);
    std::vector<std::int64_t> out;
    for (const auto& row : tx.exec(sql)) out.push_back(row[0].as<std::int64_t>());
    return out;
  }
  std::int64_t Queued() const { return Scalar("SELECT count(*) FROM outbox.messages"); }
  std::int64_t Leased() const { return Scalar("SELECT count(*) FROM outbox.messages WHERE lease_owner IS NOT NULL"); }
  std::int64_t DeadLetters() const { return Scalar("SELECT count(*) FROM outbox.dead_letters"); }
  std::int64_t WithAttempts() const { return Scalar("SELECT count(*) FROM outbox.messages WHERE attempts > 0"); }

  // Waits until the queue is empty, or a relay in `relays` exits, or `timeout`.
  ::testing::AssertionResult DrainedBy(const std::vector<ChildProcess*>& relays, Millis timeout) {
    const bool ok = WaitFor(
        [&] {
          for (auto* r : relays) {
            if (!r->Running()) return true;
          }
          return Queued() == 0;
        },
        timeout, kDbPoll);
    for (auto* r : relays) {
      if (!r->Running()) return ::testing::AssertionFailure() << r->Describe() << " exited while draining";
    }
    if (!ok) {
      return ::testing::AssertionFailure() << "queue not drained within " << timeout.count() << " ms: " << Queued()
                                           << " left, " << Leased() << " leased";
    }
    return ::testing::AssertionSuccess();
  }

  // SIGTERM and expect a clean exit (status 0) within the shutdown bound.
  void StopGracefully(ChildProcess& relay) {
    relay.Signal(SIGTERM);
    EXPECT_TRUE(relay.WaitExit(kShutdownTimeout + kShutdownMargin)) << relay.Describe() << " ignored SIGTERM";
    EXPECT_TRUE(relay.ExitedWith(0)) << relay.Describe();
  }

  std::vector<ConsumedRecord> ConsumeAtLeast(std::size_t n) { return kafka_->ConsumeAll(kTopic, n, 60s); }

  std::string dir_;
  std::unique_ptr<KafkaMockCluster> kafka_;
  // Declared after kafka_: destroyed (killed) first, while the brokers they talk to still exist.
  std::vector<std::unique_ptr<ChildProcess>> children_;
  int relay_counter_ = 0;
};

std::string WithSignalName(int sig) { return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : std::to_string(sig); }

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
    ASSERT_TRUE(relay.status() && WIFSIGNALED(*relay.status()) && WTERMSIG(*relay.status()) == SIGKILL)
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
  std::cout << "[ info ] " << records.size() << " records for " << expected.size() << " messages, " << duplicates
            << " redeliveries; " << kills_mid_batch << " of " << kKills << " kills left leases behind" << std::endl;
  StopGracefully(last);
}

// 2. Four relays at once while the brokers fail (bursts of retriable Produce errors, and every
// broker down once): nothing lost, nothing dead-lettered, per-key order held, and never two
// messages of one key leased at the same time.
TEST_F(RelayProcessTest, FourRelaysWithBrokerFailuresKeepPerKeyOrder) {
  const ExpectedMap expected = Enqueue(4000, 40, 10);  // 40 keys, every 10th without a key
  const std::string config = WriteConfig("relay.yaml", Yaml(db_url_));

  LeaseOverlapMonitor monitor(db_url_);
  monitor.Start();
  std::vector<ChildProcess*> relays;
  for (int i = 0; i < 4; ++i) relays.push_back(&StartRelay(config));

  const std::vector<rd_kafka_resp_err_t> burst{
      RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION, RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT,
      RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS,      RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE,
      RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS_AFTER_APPEND, RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT};
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
              << std::chrono::duration_cast<Millis>(Clock::now() - down_at).count() << " ms" << std::endl;
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
  EXPECT_TRUE(violations.empty()) << violations.size() << " samples saw one key leased twice, first: "
                                  << violations.front();
  EXPECT_GT(monitor.samples(), 100) << "the lease monitor hardly ran; errors " << monitor.errors() << ", last "
                                    << monitor.last_error();
  const auto records = ConsumeAtLeast(expected.size());
  const std::size_t duplicates = ExpectAllDeliveredInKeyOrder(records, expected);
  std::cout << "[ info ] " << records.size() << " records for " << expected.size() << " messages, " << duplicates
            << " redeliveries; " << bursts << " error bursts; " << monitor.samples() << " lease samples"
            << std::endl;
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

class RelayShutdownTest : public RelayProcessTest, public ::testing::WithParamInterface<ShutdownCase> {};

TEST_P(RelayShutdownTest, ExitsZeroInTimeHandsBackEverythingAndTheNextRelayDrains) {
  const ShutdownCase param = GetParam();
  const ExpectedMap expected = Enqueue(3000, 30, 6);
  const auto total = static_cast<std::int64_t>(expected.size());
  // linger.ms 50: batches stay in the producer a while, so a signal finds work in flight.
  const std::string config = WriteConfig("relay.yaml", Yaml(db_url_, {{"linger.ms", "50"}}));

  ChildProcess& relay = StartRelay(config);
  ASSERT_TRUE(WaitFor([&] { return !relay.Running() || (Queued() <= total - 200 && Leased() > 0); }, 60s, kDbPoll))
      << "relay not delivering: " << Queued() << " queued, " << Leased() << " leased";
  ASSERT_TRUE(relay.Running()) << relay.Describe();
  if (param.brokers_down) {
    kafka_->SetAllBrokersDown(true);
    // The relay keeps claiming what it can no longer deliver (until message.timeout.ms).
    ASSERT_TRUE(WaitFor([&] { return Leased() > 0; }, 10s, kDbPoll)) << "nothing in flight with the brokers down";
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
                      << WithSignalName(param.signal) << " (shutdown_timeout_ms " << kShutdownTimeout.count() << ")";
  EXPECT_TRUE(relay.ExitedWith(0)) << relay.Describe();
  std::cout << "[ info ] exited " << took.count() << " ms after " << WithSignalName(param.signal) << std::endl;

  EXPECT_EQ(Leased(), 0) << "rows still leased after a graceful shutdown";
  EXPECT_EQ(WithAttempts(), 0) << "a shutdown is not a failed attempt";
  EXPECT_EQ(DeadLetters(), 0);
  EXPECT_GT(Queued(), 0) << "the relay drained everything before the signal: nothing was left to hand over";
  std::string in_flight_list;
  for (const auto id : in_flight) in_flight_list += (in_flight_list.empty() ? "" : ",") + std::to_string(id);
  const std::int64_t handed_back = Scalar("SELECT count(*) FROM outbox.messages WHERE id = ANY('{" +
                                          in_flight_list + "}'::bigint[]) AND lease_owner IS NULL AND attempts = 0");
  if (param.brokers_down) {
    EXPECT_GT(handed_back, 0) << "of " << in_flight.size() << " messages in flight at the signal, none is back in "
                              << "the queue with its lease released and no attempt counted";
  }
  std::cout << "[ info ] " << in_flight.size() << " in flight at the signal, " << handed_back << " handed back"
            << std::endl;

  ChildProcess& next = StartRelay(config);
  ASSERT_TRUE(DrainedBy({&next}, 120s));
  EXPECT_EQ(DeadLetters(), 0);
  const auto records = ConsumeAtLeast(expected.size());
  ExpectAllDeliveredInKeyOrder(records, expected);
  StopGracefully(next);
}

INSTANTIATE_TEST_SUITE_P(Signals, RelayShutdownTest,
                         ::testing::Values(ShutdownCase{SIGTERM, false}, ShutdownCase{SIGINT, false},
                                           ShutdownCase{SIGTERM, true}, ShutdownCase{SIGINT, true}),
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
  EXPECT_TRUE(pqxx::nontransaction(c).exec1("SELECT to_regclass('outbox.messages') IS NULL")[0].as<bool>())
      << "run must not create the schema itself";
}

TEST_F(RelayProcessTest, SchemaNewerThanTheBinaryStopsMigrateAndRunAskingForUpgrade) {
  {
    pqxx::connection c(db_url_);
    pqxx::nontransaction(c).exec(
        "INSERT INTO outbox.schema_migrations (version, name) VALUES (9999, '9999_from_the_future.sql')");
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
  const std::string config = WriteConfig("relay.yaml", Yaml(PgCluster::Instance().CreateMigratedDatabase()));
  ChildProcess& relay = Spawn("relay-newer-schema", {"run", "--config", config, "--database-url", db_url_});
  ASSERT_TRUE(relay.WaitExit(30s)) << relay.Describe();
  EXPECT_TRUE(relay.ExitedNonZero()) << relay.Describe();
  const std::string relay_err = relay.Stderr();
  EXPECT_NE(relay_err.find("9999"), std::string::npos) << relay_err;
  EXPECT_NE(relay_err.find("upgrade outbox-relay"), std::string::npos) << relay_err;
}

}  // namespace
}  // namespace outbox::testing
