#include "process_harness.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>
#include <stdexcept>
#include <system_error>
#include <tuple>
#include <utility>

#include "outbox/outbox.h"
#include "outbox_test/wait.h"

#ifndef OUTBOX_RELAY_BIN
#error "OUTBOX_RELAY_BIN (path of the outbox-relay binary) must be defined by the build"
#endif

namespace outbox::testing {

using namespace std::chrono_literals;

namespace {

constexpr const char* kRelayBin = OUTBOX_RELAY_BIN;

// The environment of a child: ours without OUTBOX_* variables, so that only the config file
// written by the test decides (OUTBOX_DATABASE_URL, OUTBOX_LEASE_MS, ... would override it).
std::vector<std::string> ChildEnvironment() {
  std::vector<std::string> env;
  for (char** e = ::environ; e != nullptr && *e != nullptr; ++e) {
    if (std::strncmp(*e, "OUTBOX_", 7) != 0) env.emplace_back(*e);
  }
  return env;
}

}  // namespace

void ThrowErrno(const std::string& what) {
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
    return "killed by signal " + std::to_string(WTERMSIG(status)) + " (" +
           ::strsignal(WTERMSIG(status)) + ")";
  }
  return "wait status " + std::to_string(status);
}

// ---------------------------------------------------------------------------------------
// ChildProcess

ChildProcess::ChildProcess(std::string name, const std::vector<std::string>& args,
                           const std::string& dir)
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
    static const char msg[] = "process test: execve failed\n";
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

bool ChildProcess::Running() {
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

void ChildProcess::Signal(int sig) {
  if (Running() && ::kill(pid_, sig) != 0) ThrowErrno("kill " + std::to_string(pid_));
}

void ChildProcess::Kill() {
  if (pid_ <= 0 || status_) return;
  if (!Running()) return;
  ::kill(pid_, SIGKILL);  // ends a stopped process too
  int status = 0;
  pid_t r;
  do {
    r = ::waitpid(pid_, &status, 0);
  } while (r < 0 && errno == EINTR);
  if (r == pid_) status_ = status;
}

bool ChildProcess::WaitExit(Millis timeout) {
  return WaitFor([&] { return !Running(); }, timeout, 5ms);
}

bool ChildProcess::ExitedWith(int code) const {
  return status_ && WIFEXITED(*status_) && WEXITSTATUS(*status_) == code;
}

bool ChildProcess::ExitedNonZero() const {
  return status_ && WIFEXITED(*status_) && WEXITSTATUS(*status_) != 0;
}

std::string ChildProcess::Describe() const {
  return name_ + " (pid " + std::to_string(pid_) + ", " +
         (status_ ? DescribeWaitStatus(*status_) : std::string("running")) + ")";
}

// ---------------------------------------------------------------------------------------
// Results

ExpectedMap ReadBackExpected(pqxx::transaction_base& tx, const std::vector<std::int64_t>& ids) {
  std::string list;
  for (const auto id : ids) list += (list.empty() ? "" : ",") + std::to_string(id);
  ExpectedMap out;
  for (const auto& row :
       tx.exec("SELECT id, idempotency_key::text, ordering_key, payload::text FROM outbox.messages "
               "WHERE id = ANY('{" +
               list + "}'::bigint[])")) {
    Expected e;
    e.idempotency_key = row[1].as<std::string>();
    if (!row[2].is_null()) e.ordering_key = row[2].as<std::string>();
    e.payload = row[3].as<std::string>();
    out.emplace(row[0].as<std::int64_t>(), std::move(e));
  }
  return out;
}

std::size_t ExpectAllDeliveredInKeyOrder(std::vector<ConsumedRecord> records,
                                         const ExpectedMap& expected) {
  // Consumption order = log order; one key lives in one partition.
  std::stable_sort(records.begin(), records.end(),
                   [](const ConsumedRecord& a, const ConsumedRecord& b) {
                     return std::tie(a.partition, a.offset) < std::tie(b.partition, b.offset);
                   });
  int problems = 0;
  auto problem = [&](const std::string& what) {
    if (++problems <= 20) ADD_FAILURE() << what;
  };
  std::map<std::int64_t, std::string>
      first_key_of;  // outbox-id -> idempotency-key, first occurrence
  std::map<std::string, std::int64_t> last_first_id;  // ordering key -> last first-occurrence id
  std::size_t duplicates = 0;
  for (const auto& r : records) {
    const std::string where =
        "partition " + std::to_string(r.partition) + " offset " + std::to_string(r.offset);
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
    const std::string idem =
        key_header == r.headers.end() ? std::string("<missing>") : key_header->second;
    if (idem != e->second.idempotency_key) {
      problem("outbox-id " + std::to_string(id) + " at " + where + ": idempotency-key " + idem +
              ", enqueued with " + e->second.idempotency_key);
    }
    if (r.key != e->second.ordering_key) {
      problem("outbox-id " + std::to_string(id) + " at " + where + ": record key " +
              r.key.value_or("<null>") + ", ordering key " +
              e->second.ordering_key.value_or("<null>"));
    }
    if (r.value != e->second.payload) {
      problem("outbox-id " + std::to_string(id) + " at " + where + ": value " + r.value +
              ", payload " + e->second.payload);
    }
    const auto [first, is_first] = first_key_of.emplace(id, idem);
    if (!is_first) {
      ++duplicates;
      if (idem != first->second) {
        problem("duplicate of outbox-id " + std::to_string(id) + " at " + where +
                " has idempotency-key " + idem + ", its first occurrence had " + first->second);
      }
      continue;
    }
    if (!e->second.ordering_key) continue;
    const auto [last, fresh] = last_first_id.emplace(*e->second.ordering_key, id);
    if (!fresh) {
      if (id <= last->second) {
        problem("key " + *e->second.ordering_key + " went backwards: outbox-id " +
                std::to_string(id) + " first consumed at " + where + ", after outbox-id " +
                std::to_string(last->second));
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
  EXPECT_EQ(problems, 0) << "problems in the consumed records (first 20 reported above); "
                         << records.size() << " records, " << duplicates << " duplicates";
  return duplicates;
}

// ---------------------------------------------------------------------------------------
// InvariantMonitor

InvariantMonitor::Check InvariantMonitor::NoKeyLeasedTwice() {
  return {"one key leased twice",
          "SELECT destination || '/' || ordering_key || ': ' || count(*) || ' leased at once' "
          "FROM outbox.messages WHERE lease_owner IS NOT NULL AND ordering_key IS NOT NULL "
          "GROUP BY destination, ordering_key HAVING count(*) > 1"};
}

InvariantMonitor::InvariantMonitor(std::string url, std::vector<Check> checks)
    : url_(std::move(url)), checks_(std::move(checks)) {}

void InvariantMonitor::Start() {
  thread_ = std::thread([this] { Run(); });
}

void InvariantMonitor::Stop() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

std::vector<std::string> InvariantMonitor::violations() const {
  std::lock_guard lk(mu_);
  return violations_;
}

std::string InvariantMonitor::last_error() const {
  std::lock_guard lk(mu_);
  return last_error_;
}

void InvariantMonitor::Run() {
  std::unique_ptr<pqxx::connection> conn;
  while (!stop_) {
    try {
      if (!conn) conn = std::make_unique<pqxx::connection>(url_);
      for (const auto& check : checks_) {
        pqxx::nontransaction tx(*conn);
        const auto rows = tx.exec(check.sql);
        if (rows.empty()) continue;
        std::lock_guard lk(mu_);
        for (const auto& row : rows) {
          std::string what = check.name + ":";
          for (const auto& field : row)
            what += " " + (field.is_null() ? std::string("NULL") : field.as<std::string>());
          violations_.push_back(std::move(what));
        }
      }
      ++samples_;
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

// ---------------------------------------------------------------------------------------
// RelayProcessFixture

void RelayProcessFixture::SetUp() {
  PgTest::SetUp();
  char tmpl[] = "/tmp/outbox-relay-process-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) ThrowErrno("mkdtemp");
  dir_ = tmpl;
  kafka_ = std::make_unique<KafkaMockCluster>(3);
  kafka_->CreateTopic(kTopic, 3);
}

void RelayProcessFixture::TearDown() {
  for (auto& c : children_) c->Kill();
  // OUTBOX_TEST_SHOW_CHILD_OUTPUT=1 shows it for passing tests too (to see what the relays did).
  if (HasFailure() || std::getenv("OUTBOX_TEST_SHOW_CHILD_OUTPUT") != nullptr) {
    for (const auto& c : children_) {
      std::cerr << "----- " << c->Describe() << ": stderr (" << c->stderr_path() << ") -----\n";
      std::string err = c->Stderr();
      constexpr std::size_t kMax = 24 * 1024;
      if (err.size() > kMax) {
        err = "[... " + std::to_string(err.size() - kMax) + " bytes cut ...]\n" +
              err.substr(err.size() - kMax);
      }
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

std::string RelayProcessFixture::Yaml(const std::string& database_url,
                                      const std::vector<ProducerSetting>& producer_extra,
                                      const std::string& top_level_extra) const {
  std::ostringstream y;
  y << "# written by a process test\n"
    << "database_url: \"" << database_url << "\"\n"
    << "batch_size: 100\n"
    << "lease_ms: 3000\n"
    << "poll_interval_ms: 200\n"
    << "reap_interval_ms: 200\n"
    << "full_sweep_interval_ms: 2000\n"
    << "shutdown_timeout_ms: " << kShutdownTimeout.count() << "\n"
    << top_level_extra << "log:\n"
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

std::string RelayProcessFixture::WriteConfig(const std::string& name,
                                             const std::string& yaml) const {
  const std::string path = dir_ + "/" + name;
  std::ofstream out(path, std::ios::trunc);
  out << yaml;
  out.close();
  if (!out) throw std::runtime_error("cannot write " + path);
  return path;
}

ChildProcess& RelayProcessFixture::Spawn(const std::string& name,
                                         const std::vector<std::string>& args) {
  std::vector<std::string> argv{kRelayBin};
  argv.insert(argv.end(), args.begin(), args.end());
  children_.push_back(std::make_unique<ChildProcess>(name, argv, dir_));
  return *children_.back();
}

ChildProcess& RelayProcessFixture::StartRelay(const std::string& config_path) {
  return Spawn("relay-" + std::to_string(++relay_counter_), {"run", "--config", config_path});
}

ExpectedMap RelayProcessFixture::Enqueue(int n, int keys, int unkeyed_every) {
  pqxx::connection c(db_url_);
  pqxx::work tx(c);
  std::vector<outbox::OutboxMessage> batch;
  batch.reserve(static_cast<std::size_t>(n));
  int keyed = 0;
  for (int i = 0; i < n; ++i) {
    auto b = outbox::Message::To(kTopic);
    b.Json("{\"n\": " + std::to_string(i) + ", \"tag\": \"process-test\"}")
        .EventType("order.event");
    if (unkeyed_every <= 0 || i % unkeyed_every != unkeyed_every - 1) {
      b.Key("key-" + std::to_string(keyed++ % keys));
    }
    batch.push_back(b.Build());
  }
  const auto ids = outbox::PublishMany(tx, batch);
  ExpectedMap out = ReadBackExpected(tx, ids);
  tx.commit();
  EXPECT_EQ(out.size(), ids.size());
  return out;
}

std::int64_t RelayProcessFixture::Scalar(const std::string& sql) const {
  pqxx::connection c(db_url_);
  pqxx::nontransaction tx(c);
  return tx.exec1(sql)[0].as<std::int64_t>();
}

std::string RelayProcessFixture::UrlOfLogin(const std::string& login,
                                            const std::string& role) const {
  {
    pqxx::connection c(db_url_);
    pqxx::nontransaction tx(c);
    tx.exec("DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = " + tx.quote(login) +
            ") THEN CREATE ROLE " + tx.quote_name(login) + " LOGIN; END IF; END $$");
    if (!role.empty()) tx.exec("GRANT " + tx.quote_name(role) + " TO " + tx.quote_name(login));
  }
  std::string url = db_url_;
  const auto at = url.find("postgres@");
  if (at == std::string::npos)
    throw std::runtime_error("the test database's URL names no postgres@: " + url);
  return url.replace(at, 9, login + "@");
}

std::vector<std::int64_t> RelayProcessFixture::Ids(const std::string& sql) const {
  pqxx::connection c(db_url_);
  pqxx::nontransaction tx(c);
  std::vector<std::int64_t> out;
  for (const auto& row : tx.exec(sql)) out.push_back(row[0].as<std::int64_t>());
  return out;
}

::testing::AssertionResult RelayProcessFixture::DrainedBy(const std::vector<ChildProcess*>& relays,
                                                          Millis timeout) {
  const bool ok = WaitFor(
      [&] {
        for (auto* r : relays) {
          if (!r->Running()) return true;
        }
        return Queued() == 0;
      },
      timeout, kDbPoll);
  for (auto* r : relays) {
    if (!r->Running())
      return ::testing::AssertionFailure() << r->Describe() << " exited while draining";
  }
  if (!ok) {
    return ::testing::AssertionFailure()
           << "queue not drained within " << timeout.count() << " ms: " << Queued() << " left, "
           << Leased() << " leased";
  }
  return ::testing::AssertionSuccess();
}

void RelayProcessFixture::StopGracefully(ChildProcess& relay) {
  relay.Signal(SIGTERM);
  EXPECT_TRUE(relay.WaitExit(kShutdownTimeout + kShutdownMargin))
      << relay.Describe() << " ignored SIGTERM";
  EXPECT_TRUE(relay.ExitedWith(0)) << relay.Describe();
}

std::vector<ConsumedRecord> RelayProcessFixture::ConsumeAtLeast(std::size_t n) {
  return kafka_->ConsumeAll(kTopic, n, 60s);
}

}  // namespace outbox::testing
