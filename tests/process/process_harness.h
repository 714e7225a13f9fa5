// Shared harness of the process-level tests (relay_process_pgtest, partitioned_process_pgtest):
// the real `outbox-relay` binary runs as child processes of the test, which hosts PostgreSQL
// (PgTest: a fresh migrated database per test) and librdkafka's mock cluster (reached by the
// children over loopback). What arrived is read back with an independent consumer and
// compared with what was enqueued.
#pragma once

#include <gtest/gtest.h>
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <pqxx/pqxx>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "outbox/outbox.h"
#include "outbox_test/kafka_mock.h"
#include "outbox_test/pg.h"
#include "outbox_test/wait.h"

namespace outbox::testing {

using Millis = std::chrono::milliseconds;

/// The topic and destination name every process test delivers to.
inline constexpr const char* kTopic = "orders";
/// shutdown_timeout_ms in every config written by RelayProcessFixture::Yaml.
inline constexpr Millis kShutdownTimeout{5000};
/// How much longer than shutdown_timeout_ms a relay may take to exit after SIGTERM/SIGINT:
/// the settler's last write (at least 2 s in Dispatcher::Stop) plus process teardown.
inline constexpr Millis kShutdownMargin{5000};
/// Pace of the database polls in WaitFor: each poll opens a connection.
inline constexpr Millis kDbPoll{20};

[[noreturn]] void ThrowErrno(const std::string& what);
std::string ReadWholeFile(const std::string& path);
std::string DescribeWaitStatus(int status);

/// One child process (fork + exec). stdin is /dev/null, stdout and stderr go to files in
/// `dir`. The child gets SIGKILL when the thread that started it (the test's main thread)
/// dies, and the destructor SIGKILLs and reaps it if it is still running (stopped or not),
/// so no relay outlives its test, whatever happens to the test.
class ChildProcess {
 public:
  ChildProcess(std::string name, const std::vector<std::string>& args, const std::string& dir);
  ~ChildProcess() { Kill(); }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  const std::string& name() const { return name_; }
  pid_t pid() const { return pid_; }

  /// Whether the child still runs (a stopped child counts as running); reaps it (and
  /// records its status) once it has exited.
  bool Running();
  /// Sends `sig` if the child still runs.
  void Signal(int sig);
  /// SIGKILL and reap; nothing when it already exited.
  void Kill();
  /// Waits up to `timeout` for the child to exit; true if it did.
  bool WaitExit(Millis timeout);

  /// Raw wait status once exited.
  std::optional<int> status() const { return status_; }
  bool ExitedWith(int code) const;
  bool ExitedNonZero() const;

  std::string Describe() const;
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

/// What the test knows about each enqueued message, read back right after enqueueing.
struct Expected {
  std::string idempotency_key;
  std::optional<std::string> ordering_key;
  std::string payload;  // payload::text, what the relay sends as the record value
};
using ExpectedMap = std::map<std::int64_t, Expected>;

/// Reads back, inside the transaction that wrote them, what the consumer must see for the
/// messages `ids` (no relay can have taken them before the commit).
ExpectedMap ReadBackExpected(pqxx::transaction_base& tx, const std::vector<std::int64_t>& ids);

/// Checks the records of one topic against what was enqueued:
///  - every record is a known message, with its idempotency key, ordering key and payload;
///  - every message was consumed at least once;
///  - duplicates (redeliveries) carry the idempotency key of the first occurrence;
///  - per ordering key, after dropping duplicates, the first occurrences are strictly
///    increasing by outbox-id (a redelivery of an earlier message may appear later; a later
///    message may never appear before an earlier one first did).
/// Reports failures with ADD_FAILURE/EXPECT; returns the number of duplicate records.
std::size_t ExpectAllDeliveredInKeyOrder(std::vector<ConsumedRecord> records,
                                         const ExpectedMap& expected);

// A producer thread that enqueues continuously through the SDK, small transactions at a
// steady pace, and remembers what it enqueued (read back inside each transaction).
class ContinuousProducer {
 public:
  /// Every `unkeyed_every`-th message has no key; the others cycle over `keys` keys.
  ContinuousProducer(std::string url, int per_transaction, Millis pace, int keys = 40,
                     int unkeyed_every = 8, std::string tag = "process-test")
      : url_(std::move(url)),
        per_transaction_(per_transaction),
        pace_(pace),
        keys_(keys),
        unkeyed_every_(unkeyed_every),
        tag_(std::move(tag)) {}
  ~ContinuousProducer() { Stop(); }
  ContinuousProducer(const ContinuousProducer&) = delete;
  ContinuousProducer& operator=(const ContinuousProducer&) = delete;

  void Start() {
    thread_ = std::thread([this] { Run(); });
  }
  void Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  std::int64_t count() const { return count_; }
  ExpectedMap expected() const {
    std::lock_guard lk(mu_);
    return expected_;
  }
  std::string error() const {
    std::lock_guard lk(mu_);
    return error_;
  }
  /// Waits until `n` more messages than now were enqueued (messages keep flowing).
  bool WaitForMore(std::int64_t n, Millis timeout) const {
    const std::int64_t target = count_ + n;
    return WaitFor([&] { return count_ >= target || failed_; }, timeout, Millis{5}) && !failed_;
  }

 private:
  void Run() {
    try {
      pqxx::connection c(url_);
      std::int64_t n = 0;
      int keyed = 0;
      while (!stop_) {
        pqxx::work tx(c);
        std::vector<outbox::OutboxMessage> batch;
        for (int i = 0; i < per_transaction_; ++i, ++n) {
          auto b = outbox::Message::To(kTopic);
          b.Json("{\"n\": " + std::to_string(n) + ", \"tag\": \"" + tag_ + "\"}")
              .EventType("order.event");
          if (n % unkeyed_every_ != unkeyed_every_ - 1)
            b.Key("key-" + std::to_string(keyed++ % keys_));
          batch.push_back(b.Build());
        }
        const auto ids = outbox::PublishMany(tx, batch);
        ExpectedMap got = ReadBackExpected(tx, ids);
        tx.commit();
        if (got.size() != ids.size())
          throw std::runtime_error("read back " + std::to_string(got.size()) + " of " +
                                   std::to_string(ids.size()) + " messages");
        {
          std::lock_guard lk(mu_);
          expected_.merge(got);
        }
        count_ += static_cast<std::int64_t>(ids.size());
        // Pace of the flow (not a wait for a condition).
        std::this_thread::sleep_for(pace_);
      }
    } catch (const std::exception& e) {
      std::lock_guard lk(mu_);
      error_ = e.what();
      failed_ = true;
    }
  }

  std::string url_;
  int per_transaction_;
  Millis pace_;
  int keys_;
  int unkeyed_every_;
  std::string tag_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> failed_{false};
  std::atomic<std::int64_t> count_{0};
  mutable std::mutex mu_;
  ExpectedMap expected_;
  std::string error_;
  std::thread thread_;
};

/// Samples, from its own thread and connection, invariants that must hold at every instant:
/// each check is a query that returns one row per violation. The default check: no two
/// messages of one key are leased at the same time (per-key order).
class InvariantMonitor {
 public:
  struct Check {
    std::string name;
    std::string sql;  // every row returned is a violation; its columns describe it
  };
  /// The per-key order check, on by default.
  static Check NoKeyLeasedTwice();

  explicit InvariantMonitor(std::string url, std::vector<Check> checks = {NoKeyLeasedTwice()});
  ~InvariantMonitor() { Stop(); }
  InvariantMonitor(const InvariantMonitor&) = delete;
  InvariantMonitor& operator=(const InvariantMonitor&) = delete;

  void Start();
  void Stop();
  std::int64_t samples() const { return samples_; }
  std::int64_t errors() const { return errors_; }
  std::vector<std::string> violations() const;
  std::string last_error() const;

 private:
  void Run();

  std::string url_;
  std::vector<Check> checks_;
  std::atomic<bool> stop_{false};
  std::atomic<std::int64_t> samples_{0};
  std::atomic<std::int64_t> errors_{0};
  mutable std::mutex mu_;
  std::vector<std::string> violations_;
  std::string last_error_;
  std::thread thread_;
};

/// The monitor of the first process tests: only the per-key lease check.
using LeaseOverlapMonitor = InvariantMonitor;

struct ProducerSetting {
  std::string name;
  std::string value;
};

/// Fixture: a fresh migrated database (PgTest), a 3-broker mock cluster with topic kTopic
/// (3 partitions), a temp dir for configs and child output, and the children started by the
/// test (killed at the end; their stderr is shown when the test failed, or always with
/// OUTBOX_TEST_SHOW_CHILD_OUTPUT=1).
class RelayProcessFixture : public PgTest {
 protected:
  void SetUp() override;
  void TearDown() override;

  /// A relay config with the small timings every process test uses.
  std::string Yaml(const std::string& database_url,
                   const std::vector<ProducerSetting>& producer_extra = {},
                   const std::string& top_level_extra = "") const;
  std::string WriteConfig(const std::string& name, const std::string& yaml) const;

  ChildProcess& Spawn(const std::string& name, const std::vector<std::string>& args);
  ChildProcess& StartRelay(const std::string& config_path);

  /// Enqueues `n` messages in one transaction: every `unkeyed_every`-th has no ordering key,
  /// the others cycle over `keys` keys. Returns what the test needs to check the deliveries.
  ExpectedMap Enqueue(int n, int keys, int unkeyed_every);

  std::int64_t Scalar(const std::string& sql) const;
  /// The test database's URL for `login`, a login role created if missing and granted `role`
  /// (none when empty): what a relay or an operator with only that role connects as.
  std::string UrlOfLogin(const std::string& login, const std::string& role) const;
  std::vector<std::int64_t> Ids(const std::string& sql) const;
  std::int64_t Queued() const { return Scalar("SELECT count(*) FROM outbox.messages"); }
  std::int64_t Leased() const {
    return Scalar("SELECT count(*) FROM outbox.messages WHERE lease_owner IS NOT NULL");
  }
  std::int64_t DeadLetters() const { return Scalar("SELECT count(*) FROM outbox.dead_letters"); }
  std::int64_t WithAttempts() const {
    return Scalar("SELECT count(*) FROM outbox.messages WHERE attempts > 0");
  }

  /// Waits until the queue is empty, or a relay in `relays` exits, or `timeout`.
  ::testing::AssertionResult DrainedBy(const std::vector<ChildProcess*>& relays, Millis timeout);
  /// SIGTERM and expect a clean exit (status 0) within the shutdown bound.
  void StopGracefully(ChildProcess& relay);
  std::vector<ConsumedRecord> ConsumeAtLeast(std::size_t n);

  std::string dir_;
  std::unique_ptr<KafkaMockCluster> kafka_;
  // Declared after kafka_: destroyed (killed) first, while the brokers they talk to still exist.
  std::vector<std::unique_ptr<ChildProcess>> children_;
  int relay_counter_ = 0;
};

}  // namespace outbox::testing
