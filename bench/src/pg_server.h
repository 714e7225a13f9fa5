// Where the benchmark's queues live: a throwaway PostgreSQL 15 cluster started for the run,
// or an existing database given with --database-url.
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace outbox::bench {

class PgServer {
 public:
  struct Options {
    std::string bin_dir = "/usr/lib/postgresql/15/bin";
    /// Extra server settings, "name=value" each, on top of PostgreSQL's defaults.
    std::vector<std::string> settings;
  };

  /// initdb + pg_ctl on a free 127.0.0.1 port in a temp dir (as `postgres` when run as root),
  /// with PostgreSQL's default settings (fsync and synchronous_commit on) plus `settings`.
  /// A watchdog process stops it and removes the directory if this process dies. Throws
  /// std::runtime_error with the server log when it cannot start.
  static std::unique_ptr<PgServer> StartThrowaway(const Options& options);
  /// An existing database. Each scenario empties outbox.messages and outbox.dead_letters, so
  /// it refuses a database with queued messages unless `wipe` is set.
  static std::unique_ptr<PgServer> UseExisting(const std::string& url, bool wipe);

  ~PgServer();
  PgServer(const PgServer&) = delete;
  PgServer& operator=(const PgServer&) = delete;

  /// An empty, migrated outbox (plus the bench schema) for one scenario; returns its URL.
  /// Throwaway cluster: a new database cloned from a migrated template, the previous
  /// scenario's database dropped. Existing database: the same database, emptied.
  std::string FreshDatabase(const std::string& scenario);

  /// "PostgreSQL 15.x" and the settings that matter for these numbers.
  std::string Describe();
  /// Pid of the postmaster when the server runs on this machine (found from a backend's
  /// parent), else -1. Used to attribute Postgres CPU time.
  int PostmasterPid();

 private:
  PgServer() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace outbox::bench
