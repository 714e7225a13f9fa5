// A throwaway PostgreSQL 15 cluster per test binary, and a fixture that gives each test a
// fresh migrated database. Nothing here mocks Postgres.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <string>

namespace outbox::testing {

/// A 127.0.0.1 TCP port that was free a moment ago (bound, read, closed), for a child
/// process whose config needs a fixed port.
int PickFreePort();

/// One cluster per process, started on first use: initdb + pg_ctl on a free 127.0.0.1 port,
/// data and socket directories in a temp dir (as the `postgres` user when running as root).
/// Torn down at exit, and by a watchdog process if the test binary dies (abort, SIGKILL).
class PgCluster {
 public:
  /// Starts the cluster on first call. Aborts the test binary with a clear message when
  /// PostgreSQL cannot be started (e.g. binaries missing: run scripts/install-deps.sh).
  static PgCluster& Instance();

  int port() const;
  /// The cluster's temp dir (data directory, server log postgres.log, unix socket). Removed
  /// at exit or by the watchdog.
  std::string base_dir() const;
  /// URL of database `dbname` as the superuser, e.g. postgresql://postgres@127.0.0.1:5433/x
  std::string Url(const std::string& dbname) const;
  /// A new empty database with a unique name; returns its URL.
  std::string CreateDatabase();
  /// A new database already migrated to the latest outbox schema (cloned from a template
  /// migrated once per process, so it is fast); returns its URL.
  std::string CreateMigratedDatabase();

  /// Fast shutdown of the server (connections are cut), then start again on the same port
  /// and data. For "Postgres restarted mid-run" tests. Blocks until accepting connections.
  void Restart();
  /// Stop / Start separately, for tests that keep the database away for a while.
  void Stop();
  void Start();

  PgCluster(const PgCluster&) = delete;
  PgCluster& operator=(const PgCluster&) = delete;
  ~PgCluster();

 private:
  PgCluster();
  struct Impl;
  Impl* impl_;
};

/// Fixture: each test gets its own freshly migrated database in db_url_.
class PgTest : public ::testing::Test {
 protected:
  void SetUp() override;
  /// Whether, within `timeout`, some session of the cluster waits for a lock (pg_stat_activity):
  /// a statement a test means to block has got as far as the lock.
  bool WaitForALockWait(std::chrono::milliseconds timeout) const;
  std::string db_url_;
};

}  // namespace outbox::testing
