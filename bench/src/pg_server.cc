#include "pg_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pwd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <pqxx/pqxx>

#include <cstdlib>
#include <filesystem>
#include <stdexcept>

#include "common.h"
#include "outbox_relay/migrate.h"
#include "workload.h"

namespace outbox::bench {
namespace {

constexpr const char* kTemplate = "bench_template";

int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    if (fd >= 0) ::close(fd);
    throw std::runtime_error("cannot find a free port on 127.0.0.1");
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

// Paths come from mkdtemp and settings from the command line; single-quote them for sh.
std::string Quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

}  // namespace

struct PgServer::Impl {
  // Throwaway cluster (empty base_dir: an existing database).
  std::string bin, base_dir, data_dir, log_path, commands_log, run_as;
  int port = 0;
  int watchdog_fd = -1;
  std::string current_db;
  bool template_ready = false;
  // Existing database.
  std::string existing_url;
  bool wipe = false, checked_empty = false;

  std::string Url(const std::string& db) const {
    return "postgresql://postgres@127.0.0.1:" + std::to_string(port) + "/" + db;
  }
  std::string AdminUrl() const { return existing_url.empty() ? Url("postgres") : existing_url; }

  void Run(const std::string& command) const {
    // Our own output goes to a separate file: the server (another user) writes log_path.
    const int rc = std::system((run_as + command + " >>" + Quote(commands_log) + " 2>&1").c_str());
    if (rc != 0) {
      throw std::runtime_error("command failed (" + std::to_string(rc) + "): " + command + "\n" +
                               ReadTextFile(commands_log) + "\nserver log " + log_path + ":\n" +
                               ReadTextFile(log_path));
    }
  }

  // A shell that blocks on a pipe only this process holds open (O_CLOEXEC, so helpers and
  // postgres do not inherit it). EOF means this process is gone: stop the server, clean up.
  void SpawnWatchdog() {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
    const std::string script = "cat >/dev/null 2>&1; " + run_as + Quote(bin + "/pg_ctl") +
                               " stop -D " + Quote(data_dir) +
                               " -m immediate -w >/dev/null 2>&1; rm -rf " + Quote(base_dir);
    const pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error("fork failed");
    if (pid == 0) {
      ::setsid();
      if (::fork() != 0) ::_exit(0);  // the grandchild is reparented and outlives us
      ::dup2(fds[0], 0);
      const int devnull = ::open("/dev/null", O_WRONLY);
      ::dup2(devnull, 1);
      ::dup2(devnull, 2);
      ::close_range(3, ~0U, 0);
      ::execl("/bin/sh", "sh", "-c", script.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    ::waitpid(pid, nullptr, 0);
    ::close(fds[0]);
    watchdog_fd = fds[1];
  }

  void Start(const Options& options) {
    bin = options.bin_dir;
    if (::access((bin + "/initdb").c_str(), X_OK) != 0) {
      throw std::runtime_error(bin + "/initdb not found: install PostgreSQL 15 "
                               "(scripts/install-deps.sh) or pass --pg-bin / --database-url");
    }
    char tmpl[] = "/tmp/outbox-bench-pg-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) throw std::runtime_error("mkdtemp failed");
    base_dir = tmpl;
    data_dir = base_dir + "/data";
    log_path = base_dir + "/postgres.log";
    commands_log = base_dir + "/commands.log";
    if (::geteuid() == 0) {
      const passwd* pw = ::getpwnam("postgres");
      if (pw == nullptr) throw std::runtime_error("running as root but there is no `postgres` user");
      if (::chown(base_dir.c_str(), pw->pw_uid, pw->pw_gid) != 0) {
        throw std::runtime_error("chown " + base_dir + " failed");
      }
      run_as = "runuser -u postgres -- ";
    }
    SpawnWatchdog();
    Run(Quote(bin + "/initdb") + " -D " + Quote(data_dir) +
        " -A trust -U postgres -E UTF8 --no-locale --no-sync");
    port = FreePort();
    std::string opts = "-c listen_addresses=127.0.0.1 -p " + std::to_string(port) +
                       " -c unix_socket_directories=" + base_dir + " -c max_connections=100";
    for (const auto& s : options.settings) opts += " -c " + s;
    Run(Quote(bin + "/pg_ctl") + " start -D " + Quote(data_dir) + " -l " + Quote(log_path) +
        " -w -t 60 -o " + Quote(opts));
  }

  void Stop() {
    if (base_dir.empty()) return;
    std::system((run_as + Quote(bin + "/pg_ctl") + " stop -D " + Quote(data_dir) +
                 " -m fast -w >/dev/null 2>&1")
                    .c_str());
    std::error_code ec;
    std::filesystem::remove_all(base_dir, ec);
    if (watchdog_fd >= 0) ::close(watchdog_fd);  // the watchdog finds nothing left to do
    base_dir.clear();
  }

  std::string FreshThrowaway(const std::string& scenario) {
    pqxx::connection admin(Url("postgres"));
    pqxx::nontransaction tx(admin);
    if (!template_ready) {
      tx.exec(std::string("CREATE DATABASE ") + kTemplate);
      outbox::relay::Migrate(Url(kTemplate));
      {
        pqxx::connection c(Url(kTemplate));
        CreateBenchSchema(c);
      }
      tx.exec(std::string("ALTER DATABASE ") + kTemplate + " WITH ALLOW_CONNECTIONS false");
      template_ready = true;
    }
    if (!current_db.empty()) tx.exec("DROP DATABASE IF EXISTS " + tx.quote_name(current_db) + " WITH (FORCE)");
    current_db = "bench_" + scenario;
    tx.exec("DROP DATABASE IF EXISTS " + tx.quote_name(current_db) + " WITH (FORCE)");
    tx.exec("CREATE DATABASE " + tx.quote_name(current_db) + " TEMPLATE " + kTemplate);
    return Url(current_db);
  }

  std::string FreshExisting() {
    outbox::relay::Migrate(existing_url);
    pqxx::connection c(existing_url);
    CreateBenchSchema(c);
    pqxx::nontransaction tx(c);
    if (!checked_empty && !wipe) {
      const auto queued = tx.exec1("SELECT count(*) FROM outbox.messages")[0].as<long long>();
      if (queued > 0) {
        throw std::runtime_error("--database-url has " + std::to_string(queued) +
                                 " queued outbox messages; the benchmark empties the queue "
                                 "before each scenario: use a scratch database or pass --wipe");
      }
    }
    checked_empty = true;
    tx.exec("TRUNCATE outbox.messages, outbox.dead_letters, bench.created");
    tx.exec("VACUUM ANALYZE outbox.messages");
    return existing_url;
  }
};

std::unique_ptr<PgServer> PgServer::StartThrowaway(const Options& options) {
  std::unique_ptr<PgServer> server(new PgServer);
  server->impl_ = std::make_unique<Impl>();
  server->impl_->Start(options);
  return server;
}

std::unique_ptr<PgServer> PgServer::UseExisting(const std::string& url, bool wipe) {
  std::unique_ptr<PgServer> server(new PgServer);
  server->impl_ = std::make_unique<Impl>();
  server->impl_->existing_url = url;
  server->impl_->wipe = wipe;
  return server;
}

PgServer::~PgServer() {
  if (impl_) impl_->Stop();
}

std::string PgServer::FreshDatabase(const std::string& scenario) {
  return impl_->existing_url.empty() ? impl_->FreshThrowaway(scenario) : impl_->FreshExisting();
}

std::string PgServer::Describe() {
  pqxx::connection c(impl_->AdminUrl());
  pqxx::nontransaction tx(c);
  std::string out = "PostgreSQL " + tx.exec1("SHOW server_version")[0].as<std::string>();
  for (const char* s : {"shared_buffers", "fsync", "synchronous_commit", "max_wal_size",
                        "autovacuum"}) {
    out += std::string(", ") + s + "=" + tx.exec1(std::string("SHOW ") + s)[0].as<std::string>();
  }
  out += impl_->existing_url.empty() ? " (throwaway cluster, otherwise defaults)" : " (--database-url)";
  return out;
}

int PgServer::PostmasterPid() {
  pqxx::connection c(impl_->AdminUrl());
  pqxx::nontransaction tx(c);
  const int backend = tx.exec1("SELECT pg_backend_pid()")[0].as<int>();
  const int parent = ParentPid(backend);
  return parent > 0 && ProcessName(parent).find("postgres") != std::string::npos ? parent : -1;
}

}  // namespace outbox::bench
