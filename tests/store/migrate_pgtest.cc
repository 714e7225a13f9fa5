#include <gtest/gtest.h>

#include <pqxx/pqxx>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "outbox_relay/migrate.h"
#include "outbox_relay/queue_store.h"
#include "outbox_test/pg.h"
#include "store_access.h"  // this module's own test: the translation of libpqxx's errors

namespace outbox::relay {
namespace {

using testing::PgCluster;

TEST(Migrate, AppliesEverythingOnceAndIsIdempotent) {
  const std::string url = PgCluster::Instance().CreateDatabase();
  EXPECT_EQ(CurrentSchemaVersion(url), 0);
  const auto first = Migrate(url);
  EXPECT_EQ(first.from_version, 0);
  EXPECT_EQ(first.to_version, LatestMigrationVersion());
  EXPECT_FALSE(first.applied.empty());
  const auto second = Migrate(url);
  EXPECT_TRUE(second.applied.empty());
  EXPECT_EQ(second.from_version, LatestMigrationVersion());
  pqxx::connection c(url);
  pqxx::nontransaction tx(c);
  EXPECT_EQ(tx.exec1("SELECT count(*) FROM outbox.schema_migrations")[0].as<int>(),
            LatestMigrationVersion());
  // The queue table carries the queue tuning from the seeds.
  const auto opts = tx.exec1(
                          "SELECT array_to_string(reloptions, ',') FROM pg_class WHERE oid = "
                          "'outbox.messages'::regclass")[0]
                        .as<std::string>();
  EXPECT_NE(opts.find("fillfactor=40"), std::string::npos) << opts;
  EXPECT_NE(opts.find("autovacuum_vacuum_scale_factor=0.01"), std::string::npos) << opts;
}

TEST(Migrate, ConcurrentRunsSerialiseAndAllSucceed) {
  const std::string url = PgCluster::Instance().CreateDatabase();
  std::vector<std::thread> threads;
  std::atomic<int> ok{0}, applied_total{0};
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&] {
      try {
        const auto r = Migrate(url);
        applied_total += static_cast<int>(r.applied.size());
        ++ok;
      } catch (const std::exception& e) {
        ADD_FAILURE() << e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok, 4);
  EXPECT_EQ(applied_total, LatestMigrationVersion()) << "each migration applied by exactly one run";
  EXPECT_EQ(CurrentSchemaVersion(url), LatestMigrationVersion());
}

TEST(Migrate, RefusesASchemaNewerThanItKnows) {
  const std::string url = PgCluster::Instance().CreateMigratedDatabase();
  {
    pqxx::connection c(url);
    pqxx::nontransaction tx(c);
    tx.exec(
        "INSERT INTO outbox.schema_migrations (version, name) VALUES (9999, "
        "'9999_from_the_future')");
  }
  try {
    Migrate(url);
    FAIL() << "migrated a schema newer than this binary";
  } catch (const MigrationError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("version 9999"), std::string::npos) << msg;
    EXPECT_NE(msg.find("upgrade outbox-relay"), std::string::npos) << msg;
  }
}

TEST(Migrate, AFailedMigrationLeavesNoTrace) {
  const std::string url = PgCluster::Instance().CreateDatabase();
  {
    // Something in the way of the first migration: its CREATE TABLE will fail.
    pqxx::connection c(url);
    pqxx::nontransaction tx(c);
    tx.exec("CREATE SCHEMA outbox; CREATE TABLE outbox.messages (x int)");
  }
  try {
    Migrate(url);
    ADD_FAILURE() << "the migration ran over an existing outbox.messages";
  } catch (const StoreError& e) {
    EXPECT_EQ(e.sqlstate(), "42P07") << e.what();  // duplicate_table
    EXPECT_FALSE(e.transient()) << "running it again does not help";
  }
  EXPECT_EQ(CurrentSchemaVersion(url), 0) << "the failed migration's transaction rolled back";
  pqxx::connection c(url);
  pqxx::nontransaction tx(c);
  EXPECT_FALSE(tx.exec1("SELECT to_regclass('outbox.dead_letters') IS NOT NULL")[0].as<bool>());
}

// Each migration commits on its own: one that fails leaves those before it applied. The
// error said only the database's message (and the command "nothing of it was applied"); it
// names the migration that failed, the version the schema is now at and what was applied.
TEST(Migrate, AFailureNamesTheMigrationAndTheVersionTheSchemaIsAt) {
  const std::string url = PgCluster::Instance().CreateMigratedDatabase();
  {
    // Back to version 22, with something in the way of 0024 (its DROP INDEX meets a table).
    pqxx::connection c(url);
    pqxx::nontransaction tx(c);
    tx.exec("DELETE FROM outbox.schema_migrations WHERE version >= 23");
    tx.exec("CREATE TABLE outbox.delivered_archive_delivered_at_idx (x int)");
  }
  try {
    Migrate(url);
    ADD_FAILURE() << "0024 dropped a table as an index";
  } catch (const StoreError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("migration 0024_retention_cleans_a_relays_own_destinations failed"),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("the schema is now at version 23"), std::string::npos) << what;
    EXPECT_NE(what.find("applied: 0023_the_relay_role_reads_the_schema_version"),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("is not an index"), std::string::npos) << "the database's reason: " << what;
    EXPECT_FALSE(e.transient());
  }
  EXPECT_EQ(CurrentSchemaVersion(url), 23);
}

// Migration 0028's index may be built beforehand with CREATE INDEX CONCURRENTLY; one that
// failed or was cancelled leaves an invalid index of that name, which IF NOT EXISTS took as
// built and the planner never uses. The migration refuses it and says how to rebuild it.
TEST(Migrate, AnInvalidPrebuiltParkedBucketIndexIsRefusedWithTheFix) {
  const std::string url = PgCluster::Instance().CreateMigratedDatabase();
  {
    pqxx::connection c(url);
    pqxx::nontransaction tx(c);
    tx.exec("DELETE FROM outbox.schema_migrations WHERE version >= 28");
    // As a cancelled CREATE INDEX CONCURRENTLY leaves it.
    tx.exec(
        "UPDATE pg_index SET indisvalid = false "
        "WHERE indexrelid = 'outbox.messages_parked_bucket_idx'::regclass");
  }
  try {
    Migrate(url);
    ADD_FAILURE() << "0028 took an invalid index as built";
  } catch (const StoreError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("messages_parked_bucket_idx is invalid"), std::string::npos) << what;
    EXPECT_NE(what.find("DROP INDEX CONCURRENTLY outbox.messages_parked_bucket_idx"),
              std::string::npos)
        << "the fix: " << what;
  }
  EXPECT_EQ(CurrentSchemaVersion(url), 27);
}

// Migration 0034 has the relays take the reaper's scan of the whole queue in turns. An
// upgrade that finds a lease without a lease record (a relay older than schema version 11
// still running) leaves the first turn due at once; without one, an interval away.
TEST(Migrate, AnUpgradeThatFindsALeaseWithoutARecordLeavesTheQueueScanDue) {
  const std::string url = PgCluster::Instance().CreateMigratedDatabase();
  const auto due = [&] {
    pqxx::connection c(url);
    return pqxx::nontransaction(c)
        .exec1("SELECT last_scan_at = '-infinity' FROM outbox.queue_scans")[0]
        .as<bool>();
  };
  EXPECT_FALSE(due()) << "nothing was leased without a record";
  {
    pqxx::connection c(url);
    pqxx::nontransaction tx(c);
    tx.exec("DELETE FROM outbox.schema_migrations WHERE version >= 34");
    tx.exec("DROP TABLE outbox.queue_scans");
    tx.exec(
        "INSERT INTO outbox.messages (destination, idempotency_key, payload, deliver_after, "
        "created_at, bucket, lease_owner, lease_until) VALUES ('d', gen_random_uuid(), '1', "
        "now(), now(), 0, gen_random_uuid(), now() + interval '1 hour')");
  }
  Migrate(url);
  EXPECT_TRUE(due());
}

// libpqxx 6.4 throws some SQL errors as their own classes without the SQLSTATE
// (deadlock_detected, serialization_failure, transaction_rollback,
// statement_completion_unknown, insufficient_privilege): sqlstate() is empty. A deadlock
// then read as a permanent error (the claim loop logged "this does not pass by waiting", the
// management API answered 500), and a login without the relay's role as a database the relay
// could not reach. Every StoreError carries the state the server sent.
TEST(StoreErrors, CarryTheServersSqlStateAndWhetherWaitingHelps) {
  const std::string url = PgCluster::Instance().CreateMigratedDatabase();
  Store store(url);
  for (const auto& [state, transient] : std::vector<std::pair<std::string, bool>>{
           {"40P01", true},
           {"40001", true},
           {"40000", true},
           {"40003", true},
           {"42501", false},
           {"42601", false},
           {"55P03", true},
           {"22023", false}}) {
    SCOPED_TRACE(state);
    try {
      Translated([&] {
        pqxx::nontransaction tx(StoreAccess::Connection(store));
        tx.exec("DO $$ BEGIN RAISE EXCEPTION 'raised' USING ERRCODE = '" + state + "'; END $$");
      });
      ADD_FAILURE() << "nothing thrown";
    } catch (const StoreError& e) {
      EXPECT_EQ(e.sqlstate(), state) << e.what();
      EXPECT_EQ(e.transient(), transient) << e.what();
    }
  }
}

}  // namespace
}  // namespace outbox::relay
