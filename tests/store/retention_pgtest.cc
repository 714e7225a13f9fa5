// Retention of the delivery archive (migration 0002) and of dead letters, against a real
// PostgreSQL: exactly the rows older than the retention go, nothing else.
#include <gtest/gtest.h>

#include <pqxx/pqxx>
#include <stdexcept>
#include <string>
#include <vector>

#include "outbox_relay/retention.h"
#include "outbox_relay/store.h"
#include "outbox_test/pg.h"
#include "store_access.h"  // this module's own test: the Store's connection

namespace outbox::relay {
namespace {

using namespace std::chrono_literals;

class RetentionTest : public testing::PgTest {
 protected:
  void Exec(const std::string& sql) {
    pqxx::connection c(db_url_);
    pqxx::nontransaction tx(c);
    tx.exec(sql);
  }
  std::vector<std::int64_t> Ids(const std::string& sql) {
    pqxx::connection c(db_url_);
    pqxx::nontransaction tx(c);
    std::vector<std::int64_t> out;
    for (const auto& r : tx.exec(sql)) out.push_back(r[0].as<std::int64_t>());
    return out;
  }
  /// An archived delivery with delivered_at = now() - `age`.
  void Archive(std::int64_t id, const std::string& age, const std::string& destination = "orders") {
    Exec(
        "INSERT INTO outbox.delivered_archive (id, destination, idempotency_key, event_type, "
        "headers, payload, "
        "attempts, created_at, delivered_at) VALUES (" +
        std::to_string(id) + ", '" + destination +
        "', gen_random_uuid(), 'e', '{}', '{\"n\": 1}', 1, now() - interval '" + age +
        "' - interval '1 s', "
        "now() - interval '" +
        age + "')");
  }
  /// A dead letter with dead_at = now() - `age`.
  void Dead(std::int64_t id, const std::string& age, const std::string& destination = "orders") {
    Exec(
        "INSERT INTO outbox.dead_letters (id, destination, idempotency_key, event_type, headers, "
        "payload, "
        "attempts, reason, created_at, dead_at) VALUES (" +
        std::to_string(id) + ", '" + destination +
        "', gen_random_uuid(), '', '{}', '1', 3, 'http 500', now() - interval '30 days', "
        "now() - "
        "interval '" +
        age + "')");
  }
};

TEST_F(RetentionTest, ArchiveTableHasTheDocumentedShape) {
  const auto cols = [&] {
    pqxx::connection c(db_url_);
    pqxx::nontransaction tx(c);
    std::vector<std::string> out;
    for (const auto& r :
         tx.exec("SELECT column_name FROM information_schema.columns WHERE table_schema = 'outbox' "
                 "AND table_name = 'delivered_archive' ORDER BY ordinal_position")) {
      out.push_back(r[0].as<std::string>());
    }
    return out;
  }();
  EXPECT_EQ(cols,
            (std::vector<std::string>{"id", "destination", "ordering_key", "idempotency_key",
                                      "event_type", "headers", "payload", "payload_bytes",
                                      "attempts", "created_at", "delivered_at", "endpoint_id"}));
  EXPECT_EQ(Ids("SELECT count(*) FROM pg_indexes WHERE schemaname = 'outbox' AND tablename = "
                "'delivered_archive' "
                "AND indexdef LIKE '%(destination, delivered_at)%'"),
            (std::vector<std::int64_t>{1}));
}

TEST_F(RetentionTest, CleanupArchiveDeletesExactlyWhatIsOlderThanTheRetention) {
  Archive(1, "10 days");
  Archive(2, "3 days");
  Archive(3, "2 days");
  Archive(4, "1 day 1 minute");       // just past a one-day retention
  Archive(5, "23 hours 59 minutes");  // just inside it
  Archive(6, "1 hour");
  Archive(7, "0 seconds");
  // Neighbours that must not be touched: the queue and the dead letters.
  Exec("SELECT outbox.enqueue('orders', '1'::jsonb)");
  Dead(100, "10 days");

  Store c(db_url_);
  EXPECT_EQ(CleanupArchive(c, {"orders", "o"}, std::chrono::hours(24), /*batch=*/2), 4);  // 1..4 in three batches
  EXPECT_EQ(Ids("SELECT id FROM outbox.delivered_archive ORDER BY id"),
            (std::vector<std::int64_t>{5, 6, 7}));
  EXPECT_EQ(Ids("SELECT count(*) FROM outbox.messages"), (std::vector<std::int64_t>{1}));
  EXPECT_EQ(Ids("SELECT id FROM outbox.dead_letters"), (std::vector<std::int64_t>{100}));
  EXPECT_EQ(CleanupArchive(c, {"orders", "o"}, std::chrono::hours(24), 2), 0) << "idempotent";
  EXPECT_EQ(CleanupArchive(c, {"orders", "o"}, std::chrono::minutes(30), 100), 2);  // 5 and 6
  EXPECT_EQ(Ids("SELECT id FROM outbox.delivered_archive"), (std::vector<std::int64_t>{7}));
}

TEST_F(RetentionTest, CleanupStopsAtTheRowCapOldestFirst) {
  for (int i = 1; i <= 7; ++i) Archive(i, std::to_string(100 - i) + " days");  // id 1 is the oldest
  Archive(8, "1 hour");
  Store c(db_url_);
  EXPECT_EQ(CleanupArchive(c, {"orders", "o"}, std::chrono::hours(24), /*batch=*/2, /*max_rows=*/3), 3);
  EXPECT_EQ(Ids("SELECT id FROM outbox.delivered_archive ORDER BY id"),
            (std::vector<std::int64_t>{4, 5, 6, 7, 8}));
  EXPECT_EQ(CleanupArchive(c, {"orders", "o"}, std::chrono::hours(24), 2, 3), 3);
  EXPECT_EQ(CleanupArchive(c, {"orders", "o"}, std::chrono::hours(24), 2, 3), 1);
  EXPECT_EQ(Ids("SELECT id FROM outbox.delivered_archive"), (std::vector<std::int64_t>{8}));
}

// A batch of cleanup reads the batch, not the table. Written as `id IN (subquery)`, the planner
// hash-joined a scan of every dead letter (or archived delivery) to each batch of 1,000, so
// working off a backlog of N rows read N^2 / 1,000 (review: 100,000 rows read per batch).
// Counted from pg_stat_user_tables, not timed.
TEST_F(RetentionTest, ABatchOfCleanupReadsTheBatchNotTheTable) {
  constexpr int kRows = 60'000, kBatch = 1'000;
  Exec("INSERT INTO outbox.dead_letters (id, destination, idempotency_key, event_type, headers, "
       "payload, attempts, reason, created_at, dead_at) SELECT g, CASE WHEN g % 2 = 0 THEN "
       "'orders' ELSE 'audit' END, gen_random_uuid(), '', '{}', '1', 3, 'http 500', now() - "
       "interval '30 days', now() - interval '20 days' + g * interval '1 ms' "
       "FROM generate_series(1, " + std::to_string(kRows) + ") g");
  Exec("INSERT INTO outbox.delivered_archive (id, destination, idempotency_key, event_type, "
       "headers, payload, attempts, created_at, delivered_at) SELECT g, CASE WHEN g % 2 = 0 "
       "THEN 'orders' ELSE 'audit' END, gen_random_uuid(), 'e', '{}', '1', 1, now() - interval "
       "'30 days', now() - interval '20 days' + g * interval '1 ms' "
       "FROM generate_series(1, " + std::to_string(kRows) + ") g");
  Exec("ANALYZE outbox.dead_letters");
  Exec("ANALYZE outbox.delivered_archive");
  Store c(db_url_);
  // Rows of `table` read so far, the Store's own included (flushed from its backend first: a
  // backend reports its counts at most once a second otherwise).
  const auto read = [&](const std::string& table) {
    pqxx::nontransaction(StoreAccess::Connection(c)).exec("SELECT pg_stat_force_next_flush()");
    return Ids("SELECT seq_tup_read + coalesce(idx_tup_fetch, 0) FROM pg_stat_user_tables "
               "WHERE schemaname = 'outbox' AND relname = '" + table + "'")[0];
  };
  const auto dead_before = read("dead_letters");
  EXPECT_EQ(CleanupDeadLetters(c, {"orders"}, std::chrono::hours(24), kBatch, kBatch), kBatch);
  EXPECT_LE(read("dead_letters") - dead_before, 5 * kBatch) << "a batch read the dead letters";
  const auto archive_before = read("delivered_archive");
  EXPECT_EQ(CleanupArchive(c, {"orders"}, std::chrono::hours(24), kBatch, kBatch), kBatch);
  EXPECT_LE(read("delivered_archive") - archive_before, 5 * kBatch)
      << "a batch read the archive";
}

TEST_F(RetentionTest, CleanupDeadLettersDeletesExactlyTheOldOnes) {
  Dead(1, "40 days");
  Dead(2, "8 days");
  Dead(3, "7 days 1 minute");
  Dead(4, "6 days 23 hours");
  Dead(5, "1 minute");
  Archive(50, "400 days");
  Exec("SELECT outbox.enqueue('orders', '1'::jsonb)");

  Store c(db_url_);
  EXPECT_EQ(CleanupDeadLetters(c, {"orders", "o"}, std::chrono::hours(24 * 7), /*batch=*/1), 3);
  EXPECT_EQ(Ids("SELECT id FROM outbox.dead_letters ORDER BY id"),
            (std::vector<std::int64_t>{4, 5}));
  EXPECT_EQ(Ids("SELECT id FROM outbox.delivered_archive"), (std::vector<std::int64_t>{50}));
  EXPECT_EQ(Ids("SELECT count(*) FROM outbox.messages"), (std::vector<std::int64_t>{1}));
  EXPECT_EQ(CleanupDeadLetters(c, {"orders", "o"}, 0s, 10), 2) << "zero age: every dead letter";
  EXPECT_TRUE(Ids("SELECT id FROM outbox.dead_letters").empty());
}

// Several relays may share a database, each with its own destinations and retention
// (docs/scaling.md: another team's relay). Cleanup deleted every destination's dead letters
// and archive by the cleaning relay's ages: a relay keeping dead letters a day removed another
// team's, the only copy of messages it had not delivered (review). A relay cleans its own.
TEST_F(RetentionTest, ARelayCleansOnlyItsOwnDestinations) {
  Dead(1, "3 days", "orders");
  Dead(2, "3 days", "payments");
  Dead(3, "3 days", "audit");
  Archive(11, "3 days", "orders");
  Archive(12, "3 days", "payments");
  Archive(13, "3 days", "audit");
  Store c(db_url_);
  EXPECT_EQ(CleanupDeadLetters(c, {"orders", "audit"}, std::chrono::hours(24), 1), 2);
  EXPECT_EQ(CleanupArchive(c, {"orders", "audit"}, std::chrono::hours(24), 1), 2);
  EXPECT_EQ(Ids("SELECT id FROM outbox.dead_letters"), (std::vector<std::int64_t>{2}));
  EXPECT_EQ(Ids("SELECT id FROM outbox.delivered_archive"), (std::vector<std::int64_t>{12}));
  EXPECT_EQ(CleanupDeadLetters(c, {}, 0s, 10), 0) << "no destinations: nothing to clean";
}

// The cutoff went to the client as text in the session's DateStyle and back: with
// DateStyle 'Postgres, MDY' and TimeZone Asia/Shanghai it reads "... CST", which comes back
// as US Central time: a one-hour retention deleted what had died minutes ago (review).
TEST_F(RetentionTest, TheCutoffDoesNotDependOnTheSessionsDateStyleOrTimeZone) {
  Exec(
      "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET DateStyle = ''Postgres, MDY''', "
      "current_database()); EXECUTE format('ALTER DATABASE %I SET TimeZone = "
      "''Asia/Shanghai''', current_database()); END $$");
  Dead(1, "5 minutes");
  Dead(2, "2 hours");
  Archive(10, "5 minutes");
  Archive(11, "2 hours");
  Store c(db_url_);  // a new connection: the database's settings apply
  EXPECT_EQ(CleanupDeadLetters(c, {"orders", "o"}, std::chrono::hours(1), 10), 1);
  EXPECT_EQ(Ids("SELECT id FROM outbox.dead_letters"), (std::vector<std::int64_t>{1}));
  EXPECT_EQ(CleanupArchive(c, {"orders", "o"}, std::chrono::hours(1), 10), 1);
  EXPECT_EQ(Ids("SELECT id FROM outbox.delivered_archive"), (std::vector<std::int64_t>{10}));
}

TEST_F(RetentionTest, RejectsInvalidArguments) {
  Store c(db_url_);
  EXPECT_THROW(CleanupArchive(c, {"orders", "o"}, -1s, 10), std::invalid_argument);
  EXPECT_THROW(CleanupArchive(c, {"orders", "o"}, 10s, 0), std::invalid_argument);
  EXPECT_THROW(CleanupArchive(c, {"orders", "o"}, 10s, 10, 0), std::invalid_argument);
  EXPECT_THROW(CleanupDeadLetters(c, {"orders", "o"}, -1s, 10), std::invalid_argument);
  EXPECT_THROW(CleanupDeadLetters(c, {"orders", "o"}, 10s, -5), std::invalid_argument);
}

TEST_F(RetentionTest, TheRelayRoleMayArchiveAndClean) {
  Exec(
      "DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'retention_relay_login') "
      "THEN "
      "CREATE ROLE retention_relay_login LOGIN; END IF; END $$");
  Exec("GRANT outbox_relay TO retention_relay_login");
  std::string url = db_url_;
  url.replace(url.find("postgres@"), 9, "retention_relay_login@");
  pqxx::connection c(url);
  {
    pqxx::work tx(c);
    tx.exec(
        "INSERT INTO outbox.delivered_archive (id, destination, idempotency_key, event_type, "
        "headers, payload, "
        "attempts, created_at, delivered_at) VALUES (1, 'o', gen_random_uuid(), '', '{}', '1', 1, "
        "now() - interval '3 days', now() - interval '2 days')");
    tx.commit();
  }
  Dead(2, "2 days");
  Store relay_store(url);
  EXPECT_EQ(CleanupArchive(relay_store, {"orders", "o"}, std::chrono::hours(24), 10), 1);
  EXPECT_EQ(CleanupDeadLetters(relay_store, {"orders", "o"}, std::chrono::hours(24), 10), 1);
  // The writer role cannot read the archive.
  Exec(
      "DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'retention_writer_login') "
      "THEN "
      "CREATE ROLE retention_writer_login LOGIN; END IF; END $$");
  Exec("GRANT outbox_writer TO retention_writer_login");
  std::string writer_url = db_url_;
  writer_url.replace(writer_url.find("postgres@"), 9, "retention_writer_login@");
  pqxx::connection w(writer_url);
  pqxx::nontransaction wtx(w);
  EXPECT_THROW(wtx.exec("SELECT count(*) FROM outbox.delivered_archive"),
               pqxx::insufficient_privilege);
}

}  // namespace
}  // namespace outbox::relay
