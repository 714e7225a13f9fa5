#include "outbox_test/pg.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pwd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <pqxx/pqxx>
#include <sstream>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include "outbox_relay/migrate.h"
#include "outbox_test/wait.h"

namespace outbox::testing {
namespace {

constexpr const char* kDefaultPgBin = "/usr/lib/postgresql/15/bin";
constexpr const char* kTemplateDb = "outbox_template";

[[noreturn]] void ThrowErrno(const std::string& what) {
  throw std::system_error(errno, std::generic_category(), what);
}

std::string ShellQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  out += "'";
  return out;
}

std::string FindRunuser() {
  for (const char* p : {"/usr/sbin/runuser", "/sbin/runuser", "/usr/bin/runuser", "/bin/runuser"}) {
    if (::access(p, X_OK) == 0) return p;
  }
  return "runuser";
}

struct CommandResult {
  int exit_code = -1;  ///< Exit status, or 128 + signal number.
  std::string output;  ///< stdout and stderr interleaved.
};

/// Runs `args` (args[0] looked up in PATH) in `cwd` with stdin from /dev/null and stdout and
/// stderr captured. The child inherits no other file descriptor, so a server it starts
/// (postgres via pg_ctl) never holds on to sockets or pipes of the test process.
CommandResult Run(const std::vector<std::string>& args, const std::string& cwd) {
  const int out = ::memfd_create("outbox-test-cmd", MFD_CLOEXEC);
  if (out < 0) ThrowErrno("memfd_create");
  const int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (devnull < 0) {
    ::close(out);
    ThrowErrno("open /dev/null");
  }
  // Everything the child needs is prepared before fork: after fork only syscalls.
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const char* dir = cwd.c_str();

  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(out);
    ::close(devnull);
    ThrowErrno("fork");
  }
  if (pid == 0) {
    if (::dup2(devnull, 0) < 0 || ::dup2(out, 1) < 0 || ::dup2(out, 2) < 0) ::_exit(126);
    ::close_range(3, ~0U, 0);
    if (::chdir(dir) != 0) ::_exit(126);
    ::execvp(argv[0], argv.data());
    static const char msg[] = "exec failed\n";
    [[maybe_unused]] auto ignored = ::write(2, msg, sizeof msg - 1);
    ::_exit(127);
  }
  ::close(devnull);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) {
      ::close(out);
      ThrowErrno("waitpid");
    }
  }
  CommandResult result;
  if (WIFEXITED(status)) {
    result.exit_code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    result.exit_code = 128 + WTERMSIG(status);
  }
  ::lseek(out, 0, SEEK_SET);
  char buf[4096];
  while (true) {
    const ssize_t n = ::read(out, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    result.output.append(buf, static_cast<std::size_t>(n));
  }
  ::close(out);
  return result;
}

std::string ReadFileFrom(const std::string& path, std::uintmax_t offset) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  in.seekg(static_cast<std::streamoff>(offset));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::uintmax_t FileSize(const std::string& path) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  return ec ? 0 : size;
}

}  // namespace

int PickFreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) ThrowErrno("socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    ThrowErrno("bind 127.0.0.1:0");
  }
  socklen_t len = sizeof addr;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    ::close(fd);
    ThrowErrno("getsockname");
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

struct PgCluster::Impl {
  std::string bin;
  std::string base;  // temp dir: data/, postgres.log, unix socket
  std::string data;
  std::string log;
  bool as_postgres = false;
  std::string runuser;
  pid_t owner_pid = 0;
  int port = 0;

  int watchdog_in = -1;    // write end of the pipe the watchdog blocks on
  int watchdog_done = -1;  // read end of a pipe that hits EOF when the watchdog exits

  std::mutex mu;  // guards running/template_ready and serialises Start/Stop/Create*
  bool running = false;
  bool template_ready = false;
  std::atomic<unsigned> db_counter{0};

  Impl() : owner_pid(::getpid()) {
    if (const char* env = std::getenv("OUTBOX_PG_BIN"); env != nullptr && *env != '\0') {
      bin = env;
    } else {
      bin = kDefaultPgBin;
    }
    for (const char* tool : {"initdb", "pg_ctl", "postgres"}) {
      const std::string path = bin + "/" + tool;
      if (::access(path.c_str(), X_OK) != 0) {
        throw std::runtime_error("PostgreSQL binary " + path +
                                 " not found or not executable: install PostgreSQL 15 "
                                 "(scripts/install-deps.sh) or set OUTBOX_PG_BIN");
      }
    }

    char tmpl[] = "/tmp/outbox-pg-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) ThrowErrno("mkdtemp /tmp/outbox-pg-XXXXXX");
    base = tmpl;
    data = base + "/data";
    log = base + "/postgres.log";

    try {
      if (::geteuid() == 0) {
        const passwd* pw = ::getpwnam("postgres");
        if (pw == nullptr) {
          throw std::runtime_error(
              "running as root but there is no `postgres` user to run the server as "
              "(initdb refuses to run as root)");
        }
        if (::chown(base.c_str(), pw->pw_uid, pw->pw_gid) != 0) ThrowErrno("chown " + base);
        as_postgres = true;
        runuser = FindRunuser();
      }
      SpawnWatchdog();

      const auto init = Run(Cmd({bin + "/initdb", "-D", data, "-A", "trust", "-U", "postgres",
                                 "--no-sync", "-E", "UTF8", "--no-locale"}),
                            base);
      if (init.exit_code != 0) {
        throw std::runtime_error("initdb failed (exit " + std::to_string(init.exit_code) + "):\n" +
                                 init.output);
      }
      StartFirstTime();
    } catch (...) {
      Teardown();
      throw;
    }
  }

  ~Impl() { Teardown(); }

  std::vector<std::string> Cmd(std::vector<std::string> args) const {
    if (!as_postgres) return args;
    std::vector<std::string> full{runuser, "-u", "postgres", "--"};
    full.insert(full.end(), args.begin(), args.end());
    return full;
  }

  std::string Url(const std::string& db) const {
    return "postgresql://postgres@127.0.0.1:" + std::to_string(port) + "/" + db;
  }

  // A grandchild (reparented to init, own session) that blocks on a pipe from this process.
  // When the pipe hits EOF, i.e. this process exited for whatever reason (including SIGKILL,
  // or a test runner killing the process tree on timeout), it stops the server and deletes
  // the temp dir. At a normal exit Teardown has already done both, so it just exits.
  void SpawnWatchdog() {
    int in[2];
    int done[2];
    if (::pipe2(in, O_CLOEXEC) != 0) ThrowErrno("pipe2");
    if (::pipe2(done, O_CLOEXEC) != 0) {
      ::close(in[0]);
      ::close(in[1]);
      ThrowErrno("pipe2");
    }
    const std::string run_as = as_postgres ? ShellQuote(runuser) + " -u postgres -- " : "";
    const std::string script =
        "cat >/dev/null 2>&1\n"
        "if [ -f " +
        ShellQuote(data + "/postmaster.pid") + " ]; then " + run_as + ShellQuote(bin + "/pg_ctl") +
        " stop -D " + ShellQuote(data) +
        " -m immediate -w -t 30 >/dev/null 2>&1; fi\n"
        "rm -rf " +
        ShellQuote(base) + "\n";
    const char* argv[] = {"/bin/sh", "-c", script.c_str(), "outbox-pg-watchdog", nullptr};

    const pid_t pid = ::fork();
    if (pid < 0) {
      for (int fd : {in[0], in[1], done[0], done[1]}) ::close(fd);
      ThrowErrno("fork");
    }
    if (pid == 0) {
      // Intermediate child: only async-signal-safe calls from here on.
      ::setsid();
      const pid_t grandchild = ::fork();
      if (grandchild != 0) ::_exit(grandchild < 0 ? 1 : 0);
      if (::dup2(in[0], 0) < 0 || ::dup2(done[1], 1) < 0 || ::dup2(done[1], 2) < 0) ::_exit(126);
      ::close_range(3, ~0U, 0);
      if (::chdir("/") != 0) ::_exit(126);
      ::execv("/bin/sh", const_cast<char* const*>(argv));
      ::_exit(127);
    }
    ::close(in[0]);
    ::close(done[1]);
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    watchdog_in = in[1];
    watchdog_done = done[0];
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      throw std::runtime_error("could not start the Postgres watchdog process");
    }
  }

  void StartFirstTime() {
    for (int attempt = 0;; ++attempt) {
      port = PickFreePort();
      const auto log_offset = FileSize(log);
      std::string error;
      if (StartServer(&error)) return;
      const std::string server_log = ReadFileFrom(log, log_offset);
      const bool port_taken = server_log.find("Address already in use") != std::string::npos;
      if (attempt == 0 && port_taken) {
        std::cerr << "[outbox_test] port " << port << " was taken, retrying on another port\n";
        continue;
      }
      std::cerr << "[outbox_test] PostgreSQL failed to start; server log " << log << ":\n"
                << server_log << std::endl;
      throw std::runtime_error(error);
    }
  }

  // pg_ctl start on `port`; true once the server accepts connections.
  bool StartServer(std::string* error) {
    const std::string opts = "-c listen_addresses=127.0.0.1 -p " + std::to_string(port) +
                             " -c unix_socket_directories=" + base +
                             " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
                             " -c max_connections=200 -c shared_buffers=128MB"
                             // two-phase commit, for the writers that end with it
                             " -c max_prepared_transactions=4";
    const auto r = Run(
        Cmd({bin + "/pg_ctl", "start", "-D", data, "-l", log, "-w", "-t", "60", "-o", opts}), base);
    if (r.exit_code == 0) {
      running = true;
      return true;
    }
    *error = "pg_ctl start failed (exit " + std::to_string(r.exit_code) + ", port " +
             std::to_string(port) + "):\n" + r.output;
    return false;
  }

  void StartLocked() {
    if (running) return;
    const auto log_offset = FileSize(log);
    std::string error;
    if (!StartServer(&error)) {
      std::cerr << "[outbox_test] PostgreSQL failed to start; server log " << log << ":\n"
                << ReadFileFrom(log, log_offset) << std::endl;
      throw std::runtime_error(error);
    }
  }

  void StopLocked(const char* mode) {
    if (!running) return;
    const auto r =
        Run(Cmd({bin + "/pg_ctl", "stop", "-D", data, "-m", mode, "-w", "-t", "60"}), base);
    if (r.exit_code != 0) {
      throw std::runtime_error("pg_ctl stop -m " + std::string(mode) + " failed (exit " +
                               std::to_string(r.exit_code) + "):\n" + r.output);
    }
    running = false;
  }

  std::string NewDatabaseName() {
    return "t" + std::to_string(::getpid()) + "_" + std::to_string(db_counter.fetch_add(1) + 1);
  }

  std::string CreateDatabaseLocked(const std::string& template_db) {
    StartLocked();  // a previous test may have left the server stopped
    const std::string name = NewDatabaseName();
    pqxx::connection conn(Url("postgres"));
    std::string sql = "CREATE DATABASE " + conn.quote_name(name);
    if (!template_db.empty()) sql += " TEMPLATE " + conn.quote_name(template_db);
    pqxx::nontransaction(conn).exec(sql);
    return Url(name);
  }

  void EnsureTemplateLocked() {
    if (template_ready) return;
    StartLocked();
    {
      pqxx::connection conn(Url("postgres"));
      pqxx::nontransaction tx(conn);
      tx.exec(std::string("DROP DATABASE IF EXISTS ") + kTemplateDb);
      tx.exec(std::string("CREATE DATABASE ") + kTemplateDb);
    }
    outbox::relay::Migrate(Url(kTemplateDb));  // closes its connection before returning
    {
      // Nobody may connect to the template any more: CREATE DATABASE ... TEMPLATE needs it idle.
      pqxx::connection conn(Url("postgres"));
      pqxx::nontransaction(conn).exec(std::string("ALTER DATABASE ") + kTemplateDb +
                                      " WITH IS_TEMPLATE true ALLOW_CONNECTIONS false");
    }
    template_ready = true;
  }

  void Teardown() {
    if (::getpid() != owner_pid) return;  // e.g. a forked child running exit handlers
    if (running) {
      try {
        Run(Cmd({bin + "/pg_ctl", "stop", "-D", data, "-m", "immediate", "-w", "-t", "60"}), "/");
      } catch (const std::exception& e) {
        std::cerr << "[outbox_test] stopping PostgreSQL failed: " << e.what() << "\n";
      }
      running = false;
    }
    if (!base.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(base, ec);
      if (ec)
        std::cerr << "[outbox_test] could not remove " << base << ": " << ec.message() << "\n";
    }
    if (watchdog_in >= 0) {
      ::close(watchdog_in);  // EOF: the watchdog finds nothing left to do and exits
      watchdog_in = -1;
    }
    if (watchdog_done >= 0) {
      // Wait (bounded) for the watchdog to exit so it never outlives us by much.
      pollfd p{watchdog_done, POLLIN, 0};
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (std::chrono::steady_clock::now() < deadline) {
        const int rc = ::poll(&p, 1, 100);
        if (rc < 0 && errno == EINTR) continue;
        if (rc != 0) {
          char buf[256];
          const ssize_t n = ::read(watchdog_done, buf, sizeof buf);
          if (n == 0 || (n < 0 && errno != EINTR)) break;  // EOF: watchdog gone
        }
      }
      ::close(watchdog_done);
      watchdog_done = -1;
    }
  }
};

PgCluster::PgCluster() : impl_(nullptr) {
  try {
    impl_ = new Impl();
  } catch (const std::exception& e) {
    std::cerr << "\n[outbox_test] FATAL: cannot start the test PostgreSQL cluster: " << e.what()
              << std::endl;
    std::abort();
  }
}

PgCluster::~PgCluster() { delete impl_; }

PgCluster& PgCluster::Instance() {
  static PgCluster cluster;
  return cluster;
}

int PgCluster::port() const { return impl_->port; }

std::string PgCluster::base_dir() const { return impl_->base; }

std::string PgCluster::Url(const std::string& dbname) const { return impl_->Url(dbname); }

std::string PgCluster::CreateDatabase() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->CreateDatabaseLocked("");
}

std::string PgCluster::CreateMigratedDatabase() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->EnsureTemplateLocked();
  return impl_->CreateDatabaseLocked(kTemplateDb);
}

void PgCluster::Restart() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->StopLocked("fast");
  impl_->StartLocked();
}

void PgCluster::Stop() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->StopLocked("fast");
}

void PgCluster::Start() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->StartLocked();
}

void PgTest::SetUp() { db_url_ = PgCluster::Instance().CreateMigratedDatabase(); }

bool PgTest::WaitForALockWait(std::chrono::milliseconds timeout) const {
  pqxx::connection watch(db_url_);
  return WaitFor(
      [&] {
        return pqxx::nontransaction(watch)
                   .exec1("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'")[0]
                   .as<int>() > 0;
      },
      timeout);
}

}  // namespace outbox::testing

// LeakSanitizer hook (unused without -fsanitize=address/leak). libpqxx 6.4 + libpq 15 leak
// one PGresult when a statement runs on a connection the server has terminated (what
// Restart()/Stop() tests provoke on purpose). Only allocations made inside libpq itself are
// suppressed: a leaked pqxx object allocated by our code is still reported.
extern "C" const char* __lsan_default_suppressions() { return "leak:libpq.so\n"; }
