// The claim's cost does not depend on the planner's statistics (docs/adr/0001-claim-path.md,
// "Plan stability"). A queue table that was last analyzed while empty and then receives a
// burst is the ordinary case after a deploy, a batch job or a replay: with row estimates of
// 1-5 the planner once chose a bitmap scan that fetched the whole backlog past the cursor and
// sorted it to keep 500. These tests set up exactly that (analyzed empty, autoanalyze kept
// from running, 300k rows queued) and read what the claim statement touched from
// EXPLAIN (ANALYZE, BUFFERS): rows examined and buffers, never wall time.
#include <gtest/gtest.h>

#include <algorithm>
#include <tuple>

#include <nlohmann/json.hpp>
#include <pqxx/pqxx>

#include "outbox_relay/dead_letters.h"
#include "outbox_relay/store.h"
#include "outbox_test/pg.h"
#include "queries.h"
#include "store_access.h"  // this module's own test: the Store's connection

namespace outbox::relay {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

constexpr int kBacklog = 300'000;
constexpr int kBatch = 200;

struct Touched {
  std::int64_t max_rows_examined = 0;  // one plan node: (rows + rows removed) x loops
  std::int64_t buffers = 0;            // shared buffers hit or read, whole statement
  bool sorted_on_disk = false;
  bool jit = false;  // compiled: costs hundreds of ms per claim
  std::string plan;  // node by node, for the failure message
};

void Walk(const json& node, Touched& t, int depth = 0) {
  const auto loops = node.value("Actual Loops", std::int64_t{1});
  std::int64_t examined = node.value("Actual Rows", std::int64_t{0});
  examined += node.value("Rows Removed by Filter", std::int64_t{0});
  examined += node.value("Rows Removed by Index Recheck", std::int64_t{0});
  t.max_rows_examined = std::max(t.max_rows_examined, examined * loops);
  if (node.value("Sort Space Type", "") == "Disk") t.sorted_on_disk = true;
  t.plan += std::string(2 * depth, ' ') + node.value("Node Type", "?") + " " +
            node.value("Index Name", node.value("Relation Name", "")) + ": examined " +
            std::to_string(examined) + " x " + std::to_string(loops) + " loops\n";
  if (node.contains("Plans")) {
    for (const auto& child : node["Plans"]) Walk(child, t, depth + 1);
  }
}

// claim_partitioned's $8 and $9: the owned buckets and their epochs as array literals.
std::pair<std::string, std::string> BucketsAndEpochs(const std::vector<BucketLease>& owned) {
  std::string buckets = "{", epochs = "{";
  for (std::size_t i = 0; i < owned.size(); ++i) {
    buckets += (i ? "," : "") + std::to_string(owned[i].bucket);
    epochs += (i ? "," : "") + std::to_string(owned[i].epoch);
  }
  return {buckets + "}", epochs + "}"};
}

class ClaimPlanTest : public testing::PgTest {
 protected:
  // The table as autoanalyze last saw it: empty. Then a burst it has not analyzed since
  // (autovacuum off on the table stands for "autoanalyze has not run yet").
  void QueueBurstAfterEmptyAnalyze() {
    AnalyzeEmpty();
    QueueBurst();
  }
  void AnalyzeEmpty() {
    pqxx::connection c(db_url_);
    pqxx::nontransaction tx(c);
    tx.exec("ALTER TABLE outbox.messages SET (autovacuum_enabled = false)");
    tx.exec("ANALYZE outbox.messages");
  }
  void QueueBurst() {
    pqxx::connection c(db_url_);
    pqxx::nontransaction tx(c);
    // Straight into the table (as the superuser) for speed: the claim's plan is the subject
    // here, not the enqueue path. Rows look like enqueue's: fresh, due, one bucket each.
    tx.exec(
        "INSERT INTO outbox.messages (destination, idempotency_key, payload, deliver_after, "
        "created_at, bucket) "
        "SELECT 'd', gen_random_uuid(), jsonb_build_object('n', g, 'pad', repeat('x', 100)), "
        "now(), now(), g % 64 FROM generate_series(1, " +
        std::to_string(kBacklog) + ") g");
  }

  // EXPLAIN ANALYZE of the Store's own prepared claim statement on the Store's own
  // connection, so the plan is the one the relay would use (its settings, its plan cache);
  // under `plan_cache_mode`, or the connection's own when that is empty.
  Touched Explain(Store& store, const std::string& execute, const std::string& plan_cache_mode) {
    auto& c = StoreAccess::Connection(store);
    pqxx::nontransaction tx(c);
    const auto session_mode = tx.exec1("SHOW plan_cache_mode")[0].as<std::string>();
    const auto mode = plan_cache_mode.empty() ? session_mode : plan_cache_mode;
    tx.exec("SET plan_cache_mode = " + mode);
    const auto r = tx.exec1("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + execute);
    tx.exec("SET plan_cache_mode = " + session_mode);
    const json plan = json::parse(r[0].c_str())[0];
    Touched t;
    Walk(plan["Plan"], t);
    t.jit = plan.contains("JIT") && plan["JIT"].value("Functions", 0) > 0;
    t.buffers = plan["Plan"].value("Shared Hit Blocks", std::int64_t{0}) +
                plan["Plan"].value("Shared Read Blocks", std::int64_t{0});
    return t;
  }

  // SELECT count(*) FROM `from_where`.
  int Count(const std::string& from_where) {
    pqxx::connection c(db_url_);
    return pqxx::nontransaction(c).exec1("SELECT count(*) FROM " + from_where)[0].as<int>();
  }

  // On the order of the batch: a few index probes and a heap page or two per claimed row.
  // Fetching the backlog (300k rows, ~20k pages) is two orders of magnitude above.
  static void ExpectBatchSized(const Touched& t, const std::string& what) {
    EXPECT_LE(t.max_rows_examined, 10 * kBatch) << what << ": a plan node walked the backlog\n"
                                                << t.plan;
    EXPECT_LE(t.buffers, 25 * kBatch) << what << ": buffers far beyond the batch\n" << t.plan;
    EXPECT_FALSE(t.sorted_on_disk) << what << ": sorted on disk\n" << t.plan;
    EXPECT_FALSE(t.jit) << what << ": JIT-compiled\n" << t.plan;
  }
};

TEST_F(ClaimPlanTest, ClaimReadsTheBatchNotTheBacklogWhenStatisticsSayEmpty) {
  QueueBurstAfterEmptyAnalyze();
  Store store(db_url_);
  // As the relay does: claims before the burst was known to the planner, so a plan may be
  // cached. Then the statement as the relay runs it, with custom and with generic plans.
  ASSERT_EQ(store.Claim("d", 0, kBatch, kBatch / 2, 30s).messages.size(), std::size_t{kBatch});
  for (const char* mode : {"force_generic_plan", "force_custom_plan", "auto"}) {
    const auto t = Explain(store,
                           "EXECUTE claim('d', 0, " + std::to_string(kBatch) + ", " +
                               std::to_string(kBatch / 2) + ", '" + NewUuid() + "', 30000)",
                           mode);
    ExpectBatchSized(t, std::string("claim, ") + mode);
  }
}

TEST_F(ClaimPlanTest, PartitionedClaimReadsTheBatchNotTheBacklogWhenStatisticsSayEmpty) {
  QueueBurstAfterEmptyAnalyze();
  Store store(db_url_);
  const std::string me = NewUuid();
  const auto owned = store.Coordinate(me, 10s, false, "claim_plan_pgtest");
  ASSERT_EQ(owned.size(), 64u);
  ASSERT_GT(store.ClaimPartitioned("d", 0, kBatch, kBatch / 2, 30s, me, owned).messages.size(),
            0u);
  const auto [buckets, epochs] = BucketsAndEpochs(owned);
  for (const char* mode : {"force_generic_plan", "force_custom_plan", "auto"}) {
    const auto t = Explain(store,
                           "EXECUTE claim_partitioned('d', 0, " + std::to_string(kBatch) +
                               ", " + std::to_string(kBatch / 2) + ", '" + NewUuid() +
                               "', 30000, '" + me + "', '" + buckets + "', '" + epochs + "')",
                           mode);
    ExpectBatchSized(t, std::string("claim_partitioned, ") + mode);
  }
}

// Bucket leases (claim_owned.sql, ADR 0003): the plain scan from the cursor with the owned
// buckets filtered reads the batch, whatever the statistics say; its fenced settle probes the
// primary key for its rows (as a join with the fence it walked each bucket's index).
TEST_F(ClaimPlanTest, BucketLeaseClaimAndSettleReadTheBatchNotTheBacklogWhenStatisticsSayEmpty) {
  QueueBurstAfterEmptyAnalyze();
  Store store(db_url_);
  const std::string me = NewUuid();
  const auto owned = store.Coordinate(me, 10s, false, "claim_plan_pgtest");
  ASSERT_EQ(owned.size(), 64u);
  const auto claim = store.ClaimOwned("d", 0, kBatch, kBatch / 2, 30s, me, owned);
  ASSERT_EQ(claim.messages.size(), std::size_t{kBatch});
  const auto [buckets, epochs] = BucketsAndEpochs(owned);
  for (const char* mode : {"force_generic_plan", "force_custom_plan", "auto"}) {
    const auto t = Explain(store,
                           "EXECUTE claim_owned('d', 0, " + std::to_string(kBatch) + ", " +
                               std::to_string(kBatch / 2) + ", '" + me + "', '" + buckets + "', '" +
                               epochs + "')",
                           mode);
    ExpectBatchSized(t, std::string("claim_owned, ") + mode);
  }
  std::string ids = "{";
  for (std::size_t i = 0; i < claim.messages.size(); ++i) {
    ids += (i ? "," : "") + std::to_string(Raw(claim.messages[i].id));
  }
  ids += "}";
  // Prepared on the connection by a first settle (of an id that does not exist).
  ASSERT_EQ(store.SettleOwnedDelivered({MessageId{0}}, me, owned).gone, 1);
  for (const char* mode : {"force_generic_plan", "force_custom_plan"}) {
    const auto t = Explain(store,
                           "EXECUTE settle_owned_delivered('" + ids + "', '" + buckets + "', '" +
                               epochs + "', '" + me + "')",
                           mode);
    ExpectBatchSized(t, std::string("settle_owned_delivered, ") + mode);
  }
  EXPECT_EQ(Count("outbox.messages"), kBacklog - kBatch) << "the settle deleted the batch";
}

// A generic plan does not know which destination it claims for. With true statistics of two
// destinations it once walked the primary key from the cursor and filtered on the destination:
// cheap for the busy one, a walk over the busy one's whole backlog for the rare one (claims run
// on the claim connection with generic plans: claim_session.sql). The lane's ORDER BY names the
// index's leading columns, so the only plan without a sort walks that index.
TEST_F(ClaimPlanTest, GenericPlanOfARareDestinationReadsItsBatchNotTheBusyOnesBacklog) {
  {
    pqxx::connection c(db_url_);
    pqxx::nontransaction tx(c);
    tx.exec(
        "INSERT INTO outbox.messages (destination, idempotency_key, payload, deliver_after, "
        "created_at, bucket) "
        "SELECT CASE WHEN g > 100000 THEN 'rare' ELSE 'busy' END, gen_random_uuid(), "
        "jsonb_build_object('n', g), now(), now(), g % 64 FROM generate_series(1, 100000 + " +
        std::to_string(2 * kBatch) + ") g");
    tx.exec("ANALYZE outbox.messages");  // true statistics this time
  }
  Store store(db_url_);
  const std::string me = NewUuid();
  const auto owned = store.Coordinate(me, 10s, false, "claim_plan_pgtest");
  ASSERT_EQ(owned.size(), 64u);
  const auto [buckets, epochs] = BucketsAndEpochs(owned);
  // Prepare both statements on the Store's connection, as the relay does.
  ASSERT_EQ(store.Claim("rare", 0, kBatch, 0, 30s).messages.size(), std::size_t{kBatch});
  ASSERT_GT(store.ClaimPartitioned("rare", 0, 4, 0, 30s, me, owned).messages.size(), 0u);
  for (const char* mode : {"force_generic_plan", "auto"}) {
    ExpectBatchSized(Explain(store,
                             "EXECUTE claim('rare', 0, " + std::to_string(kBatch) + ", " +
                                 std::to_string(kBatch / 2) + ", '" + NewUuid() + "', 30000)",
                             mode),
                     std::string("claim of the rare destination, ") + mode);
    ExpectBatchSized(
        Explain(store,
                "EXECUTE claim_partitioned('rare', 0, 4, " + std::to_string(kBatch / 2) + ", '" +
                    NewUuid() + "', 30000, '" + me + "', '" + buckets + "', '" + epochs + "')",
                mode),
        std::string("partitioned claim of the rare destination, ") + mode);
  }
}

// The claim connection plans each claim statement once and keeps the plan (claim_session.sql):
// planning it again for every claim cost ~0.8 ms of Postgres CPU per claim, and PostgreSQL's
// `auto` kept choosing to.
TEST_F(ClaimPlanTest, ClaimsReuseOneGenericPlan) {
  pqxx::connection c(db_url_);
  pqxx::nontransaction(c).exec(
      "INSERT INTO outbox.messages (destination, idempotency_key, payload, deliver_after, "
      "created_at, bucket) SELECT 'd', gen_random_uuid(), '{}', now(), now(), g % 64 "
      "FROM generate_series(1, 100) g");
  Store store(db_url_);
  const std::string me = NewUuid();
  const auto owned = store.Coordinate(me, 10s, false, "claim_plan_pgtest");
  for (int i = 0; i < 8; ++i) {
    (void)store.Claim("d", 0, 5, 5, 30s);
    (void)store.ClaimPartitioned("d", 0, 1, 5, 30s, me, owned);
  }
  auto& conn = StoreAccess::Connection(store);
  pqxx::nontransaction tx(conn);
  for (const char* name : {"claim", "claim_partitioned"}) {
    const auto r = tx.exec1(
        std::string(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE name = ") +
        tx.quote(name));
    EXPECT_EQ(r[1].as<std::int64_t>(), 0) << name << " was planned again for a claim";
    EXPECT_GE(r[0].as<std::int64_t>(), 8) << name;
  }
}

// The reaper finds expired leases through the claims' lease records (outbox.leases), not by
// reading the whole queue: a sequential scan of a 1M backlog took ~0.6 s, every
// reap_interval, in every relay. Here 300k rows are queued, one claim of a batch leases them
// for 1 ms, and the reap statement must return that batch having examined about that many.
TEST_F(ClaimPlanTest, ReaperReadsTheExpiredLeasesNotTheBacklog) {
  QueueBurstAfterEmptyAnalyze();
  Store store(db_url_);
  ASSERT_TRUE(store.Reap(1h).empty());  // as a relay would have: the statement is prepared
  ASSERT_EQ(store.Claim("d", 0, kBatch, 0, 1ms).messages.size(), std::size_t{kBatch});
  {
    pqxx::connection c(db_url_);
    pqxx::nontransaction tx(c);
    ASSERT_EQ(tx.exec1("SELECT count(*) FROM outbox.messages WHERE lease_until < "
                       "clock_timestamp() + interval '1 ms' AND lease_owner IS NOT NULL")[0]
                  .as<int>(),
              kBatch);
    tx.exec("SELECT pg_sleep(0.01)");  // the 1 ms leases are over
  }
  ExpectBatchSized(Explain(store, "EXECUTE reap", "auto"), "reap");
  EXPECT_EQ(Count("outbox.messages WHERE lease_owner IS NOT NULL"), 0)
      << "the reap returned every expired lease";
  EXPECT_EQ(Count("outbox.messages WHERE attempts = 1"), kBatch);
}

// The maintenance statements of a relay that started on a quiet queue were planned while the
// table was empty, and a statement without parameters (reap) or planned five times alike
// (renew_leases, wake_keys: PostgreSQL then keeps a generic plan) keeps that plan until the
// table is analyzed again. Planned for an empty table, a scan of the table costs nothing; after
// a burst the same plan reads the whole backlog on every reap and every lease renewal.
TEST_F(ClaimPlanTest, MaintenanceStatementsPlannedOnAnEmptyQueueReadTheirRowsAfterABurst) {
  AnalyzeEmpty();
  Store store(db_url_);  // the maintenance connection of a relay started on the empty queue
  const std::vector<std::pair<MessageId, std::string>> nobody{{MessageId{1}, NewUuid()}};
  {
    pqxx::connection c(db_url_);
    pqxx::nontransaction(c).exec("UPDATE outbox.queue_scans SET last_scan_at = '-infinity'");
  }
  for (int i = 0; i < 8; ++i) {
    ASSERT_TRUE(store.Reap(1h).empty());  // the first reap's turn at the queue scan is due
    ASSERT_TRUE(store.RenewLeases(nobody, 30s).empty());
    ASSERT_EQ(store.WakeKeys("d", {BlockedKey{"k", std::nullopt}}), 0);
    ASSERT_EQ(store.WakeOrphans("d", 0, kBatch).woken, 0);
  }
  {
    // The first reap also ran the full scan (reap_full.sql), with sequential scans allowed
    // for it alone.
    pqxx::nontransaction tx(StoreAccess::Connection(store));
    EXPECT_TRUE(
        tx.exec1("SELECT last_scan_at > '-infinity' FROM outbox.queue_scans")[0].as<bool>());
    EXPECT_EQ(tx.exec1("SHOW enable_seqscan")[0].as<std::string>(), "off");
    EXPECT_EQ(tx.exec1("SHOW enable_bitmapscan")[0].as<std::string>(), "off");
  }
  QueueBurst();
  Store claimer(db_url_);
  const auto claim = claimer.Claim("d", 0, kBatch, 0, 1ms);
  ASSERT_EQ(claim.messages.size(), std::size_t{kBatch});
  {
    pqxx::connection c(db_url_);
    pqxx::nontransaction(c).exec("SELECT pg_sleep(0.01)");  // the 1 ms leases are over
  }
  ExpectBatchSized(Explain(store, "EXECUTE reap", ""), "reap planned on an empty queue");
  auto held = nlohmann::json::array();
  for (const auto& m : claim.messages) held.push_back({{"id", Raw(m.id)}, {"token", NewUuid()}});
  ExpectBatchSized(Explain(store, "EXECUTE renew_leases('" + held.dump() + "', 30000)", ""),
                   "renew_leases planned on an empty queue");
  ExpectBatchSized(Explain(store, R"(EXECUTE wake_keys('d', '[["k", null]]'))", ""),
                   "wake_keys planned on an empty queue");
  ExpectBatchSized(
      Explain(store, "EXECUTE wake_orphans('d', 0, " + std::to_string(kBatch) + ")", ""),
      "wake_orphans planned on an empty queue");
}

// Handing back a claim whose reply was lost (a database restart mid-claim) finds its rows
// through the claim's lease record too, not with a scan of the queue.
TEST_F(ClaimPlanTest, HandingBackALostClaimReadsItsRowsNotTheBacklog) {
  QueueBurstAfterEmptyAnalyze();
  Store store(db_url_);
  ASSERT_EQ(store.ReleaseLostClaims({NewUuid()}), 0);  // prepared, as in a relay
  const auto lost = store.Claim("d", 0, kBatch, 0, 30s);
  ASSERT_EQ(lost.messages.size(), std::size_t{kBatch});
  ExpectBatchSized(
      Explain(store, "EXECUTE release_lost_claims('{" + lost.lease_token + "}')", "auto"),
      "release_lost_claims");
  EXPECT_EQ(Count("outbox.messages WHERE lease_owner IS NOT NULL"), 0)
      << "the lost claim's rows were handed back";
  EXPECT_EQ(Count("outbox.leases"), 0) << "with its lease record";
}

// The partitioned claim walks each owned bucket's rows in messages_fresh_bucket_idx. With few
// buckets the planner preferred the primary key from the cursor, filtered on the bucket, with
// true statistics and no burst at all: each bucket's scan read other buckets' rows until it
// found its own, and a bucket with nothing queued (here bucket 7) read the whole backlog, in
// every claim.
TEST_F(ClaimPlanTest, PartitionedClaimReadsOnlyItsBucketsRows) {
  {
    pqxx::connection c(db_url_);
    pqxx::nontransaction tx(c);
    tx.exec("SELECT outbox.set_bucket_count(8)");
    tx.exec(
        "INSERT INTO outbox.messages (destination, idempotency_key, payload, deliver_after, "
        "created_at, bucket) SELECT 'd', gen_random_uuid(), jsonb_build_object('n', g), now(), "
        "now(), g % 7 FROM generate_series(1, 100000) g");
    tx.exec("ANALYZE outbox.messages");
  }
  Store store(db_url_);
  const std::string me = NewUuid();
  const auto owned = store.Coordinate(me, 10s, false, "claim_plan_pgtest");
  ASSERT_EQ(owned.size(), 8u);
  // A share of kBatch / 8 from each bucket; bucket 7 has none.
  ASSERT_EQ(store.ClaimPartitioned("d", 0, kBatch, 0, 30s, me, owned).messages.size(),
            std::size_t{7 * (kBatch / 8)});
  const auto [buckets, epochs] = BucketsAndEpochs(owned);
  const auto t =
      Explain(store,
              "EXECUTE claim_partitioned('d', 0, " + std::to_string(kBatch) + ", 0, '" +
                  NewUuid() + "', 30000, '" + me + "', '" + buckets + "', '" + epochs + "')",
              "auto");
  EXPECT_LE(t.max_rows_examined, 2 * kBatch) << "a bucket's scan read other buckets' rows\n"
                                             << t.plan;
}

// The partitioned claim's slow lane (rows parked for a retry and now due) read
// messages_parked_idx (destination, deliver_after, id) and filtered on the owned buckets: a
// relay read every due retry of the other relays' buckets older than its own, in every claim
// (while another relay's endpoint was down, tens of thousands of rows a claim).
TEST_F(ClaimPlanTest, PartitionedSlowLaneReadsOnlyItsBucketsDueRows) {
  pqxx::connection c(db_url_);
  pqxx::nontransaction(c).exec("SELECT outbox.set_bucket_count(8)");
  Store store(db_url_);
  const std::string me = NewUuid(), other = NewUuid();
  store.Coordinate(me, 10s, false, "claim_plan_pgtest");
  store.Coordinate(other, 10s, false, "claim_plan_pgtest");
  const auto owned = store.Coordinate(me, 10s, false, "claim_plan_pgtest");
  ASSERT_EQ(owned.size(), 4u) << "two relays split the eight buckets";
  std::string mine = "{", theirs = "{";
  for (int b = 0; b < 8; ++b) {
    const bool own = std::any_of(owned.begin(), owned.end(),
                                 [b](const BucketLease& l) { return l.bucket == b; });
    std::string& list = own ? mine : theirs;
    list += (list.size() > 1 ? "," : "") + std::to_string(b);
  }
  {
    pqxx::nontransaction tx(c);
    // The other relay's retries fell due an hour ago; this relay's a minute ago.
    for (const auto& [buckets, rows, age] :
         {std::tuple{theirs + "}", 30000, "1 hour"}, std::tuple{mine + "}", 2000, "1 minute"}}) {
      tx.exec(
          "INSERT INTO outbox.messages (destination, idempotency_key, payload, deliver_after, "
          "created_at, parked, attempts, bucket) SELECT 'd', gen_random_uuid(), "
          "jsonb_build_object('n', g), now() - interval '" +
          std::string(age) + "', now(), true, 1, ('" + buckets + "'::int[])[1 + g % 4] " +
          "FROM generate_series(1, " + std::to_string(rows) + ") g");
    }
    tx.exec("ANALYZE outbox.messages");
  }
  ASSERT_EQ(store.ClaimPartitioned("d", 0, kBatch, kBatch / 2, 30s, me, owned).messages.size(),
            std::size_t{kBatch / 2});
  const auto [buckets, epochs] = BucketsAndEpochs(owned);
  for (const auto* mode : {"force_custom_plan", "force_generic_plan"}) {
    // Each run from the same start: the claims before it leased rows at the front of the due
    // range, which a scan passes over (the slow lane's open item in ADR 0001).
    pqxx::nontransaction(c).exec(
        "UPDATE outbox.messages SET lease_owner = NULL, lease_until = NULL "
        "WHERE lease_owner IS NOT NULL");
    const auto t = Explain(store,
                           "EXECUTE claim_partitioned('d', 0, " + std::to_string(kBatch) + ", " +
                               std::to_string(kBatch / 2) + ", '" + NewUuid() + "', 30000, '" +
                               me + "', '" + buckets + "', '" + epochs + "')",
                           mode);
    EXPECT_LE(t.max_rows_examined, 2 * kBatch)
        << mode << ": the slow lane read other buckets' due rows\n"
        << t.plan;
  }
}

// Waking a key's next message (the settle of its predecessor, the claim loop's recheck of a
// blocked key) looks up the key's first row in messages_key_order_idx. Written as min(id), the
// planner (estimating one row per key) read every row of the key's backlog instead: a key with
// 10k queued messages cost ~100 ms of Postgres per settle, so draining a hot key was quadratic.
// Counted from the statistics views: rows and index entries of the queue the statement read.
class KeyProbeTest : public ClaimPlanTest {
 protected:
  static constexpr int kKeyBacklog = 5'000;

  // One key with a backlog behind its head, as claims leave it (the rest parked), and many keys
  // of one message each, as most keys are (in another destination): the planner estimates a
  // row or two per key. Then a claim leases the head.
  ClaimResult QueueOneHotKeyAndClaimIt(Store& store) {
    {
      pqxx::connection c(db_url_);
      pqxx::nontransaction tx(c);
      tx.exec(
          "INSERT INTO outbox.messages (destination, ordering_key, idempotency_key, payload, "
          "deliver_after, parked, created_at) SELECT 'd', 'hot', gen_random_uuid(), "
          "jsonb_build_object('n', g), CASE WHEN g = 1 THEN now() ELSE 'infinity' END, g > 1, "
          "now() FROM generate_series(1, " +
          std::to_string(kKeyBacklog) + ") g");
      tx.exec(
          "INSERT INTO outbox.messages (destination, ordering_key, idempotency_key, payload, "
          "deliver_after, parked, created_at) SELECT 'o', 'k' || (g % 200), gen_random_uuid(), "
          "jsonb_build_object('n', g), 'infinity', true, now() FROM generate_series(1, 20000) g");
      tx.exec("ANALYZE outbox.messages");
    }
    auto claim = store.Claim("d", 0, 100, 50, 30s);
    EXPECT_EQ(claim.messages.size(), 1u) << "the key's head only";
    return claim;
  }

  // Rows and index entries of outbox.messages read so far, the Store's own included (flushed
  // from its backend first: a backend reports its counts at most once a second otherwise).
  std::int64_t RowsRead(Store& store) {
    pqxx::nontransaction(StoreAccess::Connection(store)).exec("SELECT pg_stat_force_next_flush()");
    pqxx::connection c(db_url_);
    return pqxx::nontransaction(c)
        .exec1(
            "SELECT (SELECT coalesce(sum(idx_tup_read), 0) FROM pg_stat_user_indexes "
            "        WHERE schemaname = 'outbox' AND relname = 'messages') + "
            "       (SELECT seq_tup_read FROM pg_stat_user_tables "
            "        WHERE schemaname = 'outbox' AND relname = 'messages')")[0]
        .as<std::int64_t>();
  }

  static constexpr std::int64_t kProbeBound = 100;  // a few entries per probe, not the backlog
};

TEST_F(KeyProbeTest, SettlingAKeysMessageReadsTheNextEntryNotTheKeysBacklog) {
  Store store(db_url_);
  const auto claim = QueueOneHotKeyAndClaimIt(store);
  ASSERT_EQ(claim.messages.size(), 1u);
  const auto before = RowsRead(store);
  Settlement s;
  s.id = claim.messages[0].id;
  s.lease_token = claim.lease_token;
  s.kind = Settlement::Kind::kDelivered;
  EXPECT_EQ(store.Settle({s}).woken, 1) << "the key's next message";
  const auto read = RowsRead(store) - before;
  EXPECT_LE(read, kProbeBound) << "the settle read the key's backlog";

  // The same through settle.sql, which writes every batch that is not plain deliveries alone
  // (here: the archive on); settle_delivered.sql wrote the one above.
  const auto next = store.Claim("d", 0, 100, 50, 30s);
  ASSERT_EQ(next.messages.size(), 1u) << "the key's next message";
  const auto before_archived = RowsRead(store);
  s.id = next.messages[0].id;
  s.lease_token = next.lease_token;
  EXPECT_EQ(store.Settle({s}, true).woken, 1) << "the key's next message";
  EXPECT_LE(RowsRead(store) - before_archived, kProbeBound)
      << "the archived settle read the key's backlog";
}

TEST_F(KeyProbeTest, RecheckingABlockedKeyReadsItsHeadNotTheKeysBacklog) {
  Store store(db_url_);
  const auto claim = QueueOneHotKeyAndClaimIt(store);
  ASSERT_EQ(claim.messages.size(), 1u);
  // Its predecessor's settle committed after the claim's snapshot without waking it (the race
  // wake_keys.sql heals): here the head simply goes.
  {
    pqxx::connection c(db_url_);
    pqxx::nontransaction(c).exec("DELETE FROM outbox.messages WHERE id = " +
                                 std::to_string(Raw(claim.messages[0].id)));
  }
  const auto before = RowsRead(store);
  EXPECT_EQ(store.WakeKeys("d", {{"hot", std::nullopt}}), 1);
  const auto read = RowsRead(store) - before;
  EXPECT_LE(read, kProbeBound) << "the recheck read the key's backlog";
}

// The orphan sweep (the safety net behind the rechecks) reads the blocked rows a page at a time,
// in id order, and probes each key's head once per page. In one statement it read every
// blocked row of the destination and, with min(), every row of each blocked key: ~5 s for a
// million blocked rows, every reap_interval_ms, on the maintenance thread that also renews the
// leases of messages in flight. Here 20,000 rows of 200 keys are parked at 'infinity' with no
// message before them: each key's first row is an orphan.
TEST_F(KeyProbeTest, TheOrphanSweepReadsAPageAtATimeNotTheBlockedBacklog) {
  Store store(db_url_);
  QueueOneHotKeyAndClaimIt(store);
  constexpr int kPage = 1'000;
  std::int64_t after = 0, woken = 0;
  int pages = 0;
  do {
    const auto before = RowsRead(store);
    const auto page = store.WakeOrphans("o", after, kPage);
    EXPECT_LE(RowsRead(store) - before, 5 * kPage) << "page " << pages << " read past its page";
    EXPECT_TRUE(page.next_after == 0 || page.next_after > after) << "page " << pages;
    woken += page.woken;
    after = page.next_after;
    ++pages;
  } while (after != 0 && pages < 100);
  EXPECT_EQ(woken, 200) << "each key's first row, once";
  EXPECT_LE(pages, 21) << "20,000 blocked rows, 1,000 a page, and the end";
  EXPECT_EQ(Count("outbox.messages WHERE destination = 'o' AND deliver_after <> 'infinity'"), 200);
  // A pass that reached the end starts over; nothing is left to wake.
  EXPECT_EQ(store.WakeOrphans("o", 0, kPage).woken, 0);
}

// Whether a fan-out's keys still have endpoint rows waiting (PostgresEndpointDirectory::OwedKeys,
// for every planned batch of keyed messages of a webhook service): one probe per key. As a
// DISTINCT over `ordering_key = ANY(...)` it read every endpoint row of each key.
TEST_F(KeyProbeTest, OwedKeysProbesEachKeyOnceNotItsEndpointRows) {
  pqxx::connection c(db_url_);
  pqxx::nontransaction tx(c);
  tx.exec(
      "INSERT INTO outbox.messages (destination, ordering_key, idempotency_key, payload, "
      "deliver_after, parked, created_at, endpoint_id) SELECT 'd', CASE WHEN g <= 5000 THEN "
      "'hot' ELSE 'k' || g END, gen_random_uuid(), jsonb_build_object('n', g), now(), true, "
      "now(), 'ep' || (g % 3) FROM generate_series(1, 20000) g");
  tx.exec("ANALYZE outbox.messages");
  tx.exec("PREPARE owed(text, text) AS " + std::string(sql::queries::kowed_keys));
  const auto r = tx.exec1(
      "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE owed('d', '[\"hot\", \"k6000\", "
      "\"none\"]')");
  Touched t;
  Walk(json::parse(r[0].c_str())[0]["Plan"], t);
  EXPECT_LE(t.max_rows_examined, 10) << "read a key's endpoint rows\n" << t.plan;
  std::vector<std::string> owed;
  for (const auto& row : tx.exec("EXECUTE owed('d', '[\"hot\", \"k6000\", \"none\"]')"))
    owed.push_back(row[0].as<std::string>());
  std::sort(owed.begin(), owed.end());
  EXPECT_EQ(owed, (std::vector<std::string>{"hot", "k6000"}));
}

// `dlq list` (and the management API) shows the newest dead letters first: a walk of
// dead_letters_dead_at_idx backwards to the limit. It sorted by the formatted dead_at column
// of its output (text), which no index gives: a sort of every dead letter for each page.
// A partitioned claim also scans the buckets of owners that do not serve its destination, and
// splits each lane's limit over every bucket it scans: over only its own, a relay owning 32
// buckets beside 32 such read and locked twice the rows it could lease (review).
TEST_F(KeyProbeTest, APartitionedClaimSplitsItsLimitOverEveryBucketItScans) {
  pqxx::connection c(db_url_);
  pqxx::nontransaction(c).exec(
      "INSERT INTO outbox.messages (destination, idempotency_key, payload, deliver_after, "
      "created_at, parked, attempts, bucket) SELECT 'hooks', gen_random_uuid(), "
      "jsonb_build_object('n', g), now() - interval '1 minute', now(), true, 1, g % 64 "
      "FROM generate_series(1, 640) g");
  Store store(db_url_);
  const std::string a = NewUuid(), b = NewUuid();
  store.Heartbeat(a, {"orders"}, "relay a", {});
  store.Heartbeat(b, {"orders", "hooks"}, "relay b", {});
  store.Coordinate(a, 10s, false, "");
  const auto b_owns = store.Coordinate(b, 10s, false, "");
  ASSERT_EQ(store.Coordinate(a, 10s, false, "").size(), 32u);
  ASSERT_EQ(b_owns.size(), 32u);
  const auto entries_read = [&] {
    pqxx::nontransaction(StoreAccess::Connection(store)).exec("SELECT pg_stat_force_next_flush()");
    return pqxx::nontransaction(c)
        .exec1(
            "SELECT idx_tup_read FROM pg_stat_user_indexes "
            "WHERE schemaname = 'outbox' AND indexrelname = 'messages_parked_bucket_idx'")[0]
        .as<std::int64_t>();
  };
  const auto before = entries_read();
  const auto r = store.ClaimPartitioned("hooks", 0, 0, 64, 30s, b, b_owns);
  EXPECT_EQ(r.messages.size(), 64u) << "a row from each of the 64 buckets";
  EXPECT_TRUE(r.facts.slow_full);
  EXPECT_LE(entries_read() - before, 64) << "more than a share of 1 from each of the 64 buckets scanned";
}

TEST_F(ClaimPlanTest, ListingDeadLettersReadsThePageNotEveryDeadLetter) {
  pqxx::connection c(db_url_);
  pqxx::nontransaction tx(c);
  tx.exec(
      "INSERT INTO outbox.dead_letters (id, destination, idempotency_key, event_type, headers, "
      "payload, attempts, reason, created_at, dead_at) SELECT g, 'd', gen_random_uuid(), '', "
      "'{}', '1', 3, 'http 500', now() - interval '30 days', now() - interval '20 days' + g * "
      "interval '1 s' FROM generate_series(1, 20000) g");
  tx.exec("ANALYZE outbox.dead_letters");
  tx.exec("PREPARE list(text, bigint, int) AS " + std::string(sql::queries::kdlq_list));
  for (const char* destination : {"", "d"}) {
    const auto r = tx.exec1("EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE list('" +
                            std::string(destination) + "', 0, 20)");
    Touched t;
    Walk(json::parse(r[0].c_str())[0]["Plan"], t);
    EXPECT_LE(t.max_rows_examined, 200) << "destination '" << destination << "'\n" << t.plan;
  }
  const auto newest = tx.exec("EXECUTE list('', 0, 3)");
  ASSERT_EQ(newest.size(), 3u);
  EXPECT_EQ(newest[0]["id"].as<std::int64_t>(), 20000);
  EXPECT_EQ(newest[2]["id"].as<std::int64_t>(), 19998);
}

// `outbox-relay dlq bury` reads each row once: every batch of 5,000 starts after the last id the
// previous batch moved. Each batch used to start over from the lowest id, so the rows it passed
// over (other destinations', leased ones) were read again by every batch: quadratic in the
// destination's backlog (review).
TEST_F(KeyProbeTest, BuryingADestinationReadsEachRowOnce) {
  {
    pqxx::connection c(db_url_);
    pqxx::nontransaction tx(c);
    for (const auto& [destination, rows] : {std::pair{"other", 50'000}, {"gone", 20'000}}) {
      tx.exec(
          "INSERT INTO outbox.messages (destination, idempotency_key, payload, deliver_after, "
          "created_at) SELECT '" + std::string(destination) + "', gen_random_uuid(), "
          "jsonb_build_object('n', g), now(), now() FROM generate_series(1, " +
          std::to_string(rows) + ") g");
    }
    tx.exec("ANALYZE outbox.messages");
  }
  Store store(db_url_);
  const auto before = RowsRead(store);
  EXPECT_EQ(BuryDestination(store, "gone", "no relay serves it"), 20'000);
  // One pass, and one more from the start for rows held by another transaction when passed.
  EXPECT_LE(RowsRead(store) - before, 200'000) << "batches read the same rows again";
  EXPECT_EQ(Count("outbox.dead_letters"), 20'000);
  EXPECT_EQ(Count("outbox.messages WHERE destination = 'other'"), 50'000);
}

}  // namespace
}  // namespace outbox::relay
