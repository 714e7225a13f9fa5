// ReadStatus against a real PostgreSQL after a known workload, and the status rendering
// (table and JSON) of what it read.
#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <pqxx/pqxx>
#include <sstream>
#include <thread>

#include "outbox_relay/dead_letters.h"
#include "outbox_relay/metrics.h"
#include "outbox_relay/status.h"
#include "outbox_relay/status_render.h"
#include "outbox_relay/store.h"
#include "outbox_test/pg.h"
#include "outbox_test/wait.h"

namespace outbox::relay {
namespace {

using namespace std::chrono_literals;
using outbox::testing::WaitFor;

class StatusTest : public testing::PgTest {
 protected:
  void Exec(const std::string& sql) {
    pqxx::connection c(db_url_);
    pqxx::nontransaction tx(c);
    tx.exec(sql);
  }
  std::int64_t Enqueue(const std::string& destination, const std::string& extra = "") {
    pqxx::connection c(db_url_);
    pqxx::nontransaction tx(c);
    return tx
        .exec1("SELECT outbox.enqueue(" + tx.quote(destination) + ", '{\"n\": 1}'::jsonb" + extra +
               ")")[0]
        .as<std::int64_t>();
  }
  void DeadLetter(std::int64_t id, const std::string& destination) {
    Exec(
        "INSERT INTO outbox.dead_letters (id, destination, idempotency_key, event_type, headers, "
        "payload, "
        "attempts, reason, created_at) VALUES (" +
        std::to_string(id) + ", '" + destination +
        "', gen_random_uuid(), '', '{}', '1', 3, 'http 500', now() - interval '1 hour')");
  }
  StatusSnapshot Read(const StatusOptions& o = {}) {
    Store c(db_url_);
    return ReadStatus(c, o);
  }
};

TEST_F(StatusTest, EmptyDatabaseHasNoDestinations) {
  const auto s = Read();
  EXPECT_TRUE(s.destinations.empty());
  EXPECT_EQ(s.lock_waiters, 0);
  EXPECT_GT(s.taken_at_epoch, 1.6e9);
  EXPECT_GT(s.table.total_bytes, 0);
  EXPECT_FALSE(s.oldest_transaction) << "nothing else is open in the test cluster";
  const auto table = RenderStatusTable(s);
  EXPECT_NE(table.find("(no destinations"), std::string::npos) << table;
  EXPECT_EQ(StatusToJson(s)["destinations"].size(), 0u);
}

TEST_F(StatusTest, PausedDestinationsShowWithTheirReasonUntilResumed) {
  Enqueue("orders");
  Store store(db_url_);
  PauseDestination(store, "orders", "endpoint maintenance");
  PauseDestination(store, "hooks", "");  // paused before it has any message: still shown
  EXPECT_EQ(store.PausedDestinations(), (std::map<std::string, std::string>{
                                            {"hooks", ""}, {"orders", "endpoint maintenance"}}));

  auto s = Read();
  ASSERT_NE(s.Find("orders"), nullptr);
  EXPECT_TRUE(s.Find("orders")->paused);
  EXPECT_EQ(s.Find("orders")->paused_reason, "endpoint maintenance");
  EXPECT_EQ(s.Find("orders")->depth, 1) << "pausing moves nothing";
  ASSERT_NE(s.Find("hooks"), nullptr);
  EXPECT_TRUE(s.Find("hooks")->paused);
  const auto json = StatusToJson(s);
  bool seen = false;
  for (const auto& d : json["destinations"]) {
    if (d["destination"] != "orders") continue;
    seen = true;
    EXPECT_TRUE(d["paused"].get<bool>());
    EXPECT_EQ(d["paused_reason"], "endpoint maintenance");
  }
  EXPECT_TRUE(seen) << json.dump();
  EXPECT_NE(RenderStatusTable(s).find("WARNING: destination \"orders\" is paused (endpoint "
                                      "maintenance): relays claim nothing for it"),
            std::string::npos)
      << RenderStatusTable(s);
  RelayMetrics m("test");
  m.UpdateFromStatus(s);
  EXPECT_NE(m.Render().find("outbox_destination_paused{destination=\"orders\"} 1"),
            std::string::npos);

  PauseDestination(store, "orders", "second reason");  // pausing again replaces the reason
  EXPECT_EQ(store.PausedDestinations().at("orders"), "second reason");
  EXPECT_TRUE(ResumeDestination(store, "orders"));
  EXPECT_FALSE(ResumeDestination(store, "orders")) << "was not paused any more";
  s = Read();
  EXPECT_FALSE(s.Find("orders")->paused);
  m.UpdateFromStatus(s);
  EXPECT_NE(m.Render().find("outbox_destination_paused{destination=\"orders\"} 0"),
            std::string::npos);
}

TEST_F(StatusTest, EachLiveRelaysViewOfItsWebhookEndpointsShows) {
  Store store(db_url_);
  TargetHealth open;
  open.breaker = "open";
  open.consecutive_failures = 12;
  open.concurrency_limit = 4;
  open.max_concurrency = 32;
  open.probe_in = 20s;
  open.times_opened = 2;
  TargetHealth paused;
  paused.concurrency_limit = 16;
  paused.max_concurrency = 32;
  paused.paused_for = 90s;
  paused.times_paused = 1;
  store.Heartbeat("00000000-0000-4000-8000-00000000000a", {"hooks", "orders"}, "host-a pid 1",
                  {{"hooks", open}});
  store.Heartbeat("00000000-0000-4000-8000-00000000000b", {"hooks"}, "host-b pid 2",
                  {{"hooks", paused}});
  // A relay that stopped beating long ago does not count.
  store.Heartbeat("00000000-0000-4000-8000-00000000000c", {"hooks"}, "host-c pid 3",
                  {{"hooks", open}});
  Exec(
      "UPDATE outbox.relay_heartbeats SET heartbeat_at = now() - interval '1 hour' "
      "WHERE description = 'host-c pid 3'");

  const auto s = Read(StatusOptions{{"hooks", "orders"}});
  const auto* hooks = s.Find("hooks");
  ASSERT_NE(hooks, nullptr);
  ASSERT_EQ(hooks->targets.size(), 2u);
  EXPECT_EQ(hooks->targets[0].relay, "host-a pid 1");
  EXPECT_EQ(hooks->targets[0].health.breaker, "open");
  EXPECT_EQ(hooks->targets[0].health.consecutive_failures, 12);
  EXPECT_EQ(hooks->targets[0].health.probe_in, 20s);
  EXPECT_EQ(hooks->targets[0].health.times_opened, 2);
  EXPECT_EQ(hooks->targets[1].health.paused_for, 90s);
  EXPECT_EQ(hooks->targets[1].health.concurrency_limit, 16);
  EXPECT_TRUE(s.Find("orders")->targets.empty()) << "a Kafka destination reports none";

  const auto table = RenderStatusTable(s);
  EXPECT_NE(table.find("WARNING: hooks: circuit breaker open on relay host-a pid 1 after 12 "
                       "consecutive failures; next probe in 20.0s"),
            std::string::npos)
      << table;
  EXPECT_NE(table.find("WARNING: hooks: the endpoint asked to wait (Retry-After); relay host-b "
                       "pid 2 sends nothing for another 1m30s"),
            std::string::npos)
      << table;
  EXPECT_NE(table.find("endpoint hooks (relay host-b pid 2): breaker closed, concurrency 16/32"),
            std::string::npos)
      << table;
  const auto json = StatusToJson(s);
  bool seen = false;
  for (const auto& d : json["destinations"]) {
    if (d["destination"] != "hooks") continue;
    seen = true;
    ASSERT_EQ(d["targets"].size(), 2u);
    EXPECT_EQ(d["targets"][0]["kind"], "webhook");
    EXPECT_EQ(d["targets"][0]["breaker"], "open");
    EXPECT_EQ(d["targets"][0]["probe_in_seconds"], 20.0);
    EXPECT_EQ(d["targets"][1]["paused_for_seconds"], 90.0);
  }
  EXPECT_TRUE(seen) << json.dump();
}

TEST_F(StatusTest, EachLiveRelaysKafkaDeliveryModeShowsAndADisagreementWarns) {
  Store store(db_url_);
  TargetHealth exactly;
  exactly.kind = "kafka";
  exactly.delivery = "exactly_once";
  exactly.transactions_committed = 41;
  exactly.transactions_failed = 2;
  exactly.recovered = 7;
  TargetHealth at_least;
  at_least.kind = "kafka";
  at_least.delivery = "at_least_once";
  store.Heartbeat("00000000-0000-4000-8000-00000000000a", {"orders", "payments"}, "host-a pid 1",
                  {{"orders", exactly}, {"payments", exactly}});
  store.Heartbeat("00000000-0000-4000-8000-00000000000b", {"orders", "payments"}, "host-b pid 2",
                  {{"orders", at_least}, {"payments", exactly}});

  const auto s = Read(StatusOptions{{"orders", "payments"}});
  const auto* orders = s.Find("orders");
  ASSERT_NE(orders, nullptr);
  ASSERT_EQ(orders->targets.size(), 2u);
  EXPECT_EQ(orders->targets[0].health.kind, "kafka");
  EXPECT_EQ(orders->targets[0].health.delivery, "exactly_once");
  EXPECT_EQ(orders->targets[0].health.transactions_committed, 41);
  EXPECT_EQ(orders->targets[0].health.transactions_failed, 2);
  EXPECT_EQ(orders->targets[0].health.recovered, 7);
  EXPECT_EQ(orders->targets[1].health.delivery, "at_least_once");

  const auto table = RenderStatusTable(s);
  EXPECT_NE(table.find("kafka orders (relay host-a pid 1): delivery exactly_once, 41 "
                       "transaction(s) committed, 2 failed, 7 message(s) recovered"),
            std::string::npos)
      << table;
  EXPECT_NE(table.find("kafka orders (relay host-b pid 2): delivery at_least_once\n"),
            std::string::npos)
      << table;
  EXPECT_NE(table.find("WARNING: orders: relays deliver it differently (at_least_once on relay "
                       "host-b pid 2, exactly_once on relay host-a pid 1)"),
            std::string::npos)
      << table;
  EXPECT_EQ(table.find("WARNING: payments"), std::string::npos) << "both relays agree\n" << table;
  EXPECT_EQ(table.find("breaker"), std::string::npos) << "no webhook fields for Kafka\n" << table;

  const auto json = StatusToJson(s);
  bool seen = false;
  for (const auto& d : json["destinations"]) {
    if (d["destination"] != "orders") continue;
    seen = true;
    ASSERT_EQ(d["targets"].size(), 2u);
    EXPECT_EQ(d["targets"][0]["kind"], "kafka");
    EXPECT_EQ(d["targets"][0]["delivery"], "exactly_once");
    EXPECT_EQ(d["targets"][0]["recovered"], 7);
    EXPECT_FALSE(d["targets"][0].contains("breaker"));
    EXPECT_EQ(d["targets"][1]["delivery"], "at_least_once");
  }
  EXPECT_TRUE(seen) << json.dump();
}

// Fencing holds only between equal transactional ids: relays of one destination with different
// transactional_id_prefix values (a rolling change of it) fence nothing of each other, and
// nothing said so (review). Each exactly-once relay's prefix shows, and a disagreement warns.
TEST_F(StatusTest, ExactlyOnceRelaysWithDifferentTransactionalIdPrefixesWarn) {
  Store store(db_url_);
  TargetHealth billing;
  billing.kind = "kafka";
  billing.delivery = "exactly_once";
  billing.transactional_id_prefix = "billing";
  TargetHealth shop = billing;
  shop.transactional_id_prefix = "shop";
  store.Heartbeat("00000000-0000-4000-8000-00000000000a", {"orders", "payments"}, "host-a pid 1",
                  {{"orders", billing}, {"payments", billing}});
  store.Heartbeat("00000000-0000-4000-8000-00000000000b", {"orders", "payments"}, "host-b pid 2",
                  {{"orders", shop}, {"payments", billing}});
  const auto s = Read(StatusOptions{{"orders", "payments"}});
  ASSERT_NE(s.Find("orders"), nullptr);
  EXPECT_EQ(s.Find("orders")->targets[0].health.transactional_id_prefix, "billing");
  const auto table = RenderStatusTable(s);
  EXPECT_NE(table.find("kafka orders (relay host-a pid 1): delivery exactly_once (transactional "
                       "ids billing.orders.<bucket>)"),
            std::string::npos)
      << table;
  EXPECT_NE(table.find("WARNING: orders: its exactly-once relays use different "
                       "transactional_id_prefix values (billing on relay host-a pid 1, shop on "
                       "relay host-b pid 2)"),
            std::string::npos)
      << table;
  EXPECT_EQ(table.find("WARNING: payments"), std::string::npos) << "both relays agree\n" << table;
  bool seen = false;
  const auto json = StatusToJson(s);
  for (const auto& d : json["destinations"]) {
    if (d["destination"] != "orders") continue;
    seen = true;
    EXPECT_EQ(d["targets"][1]["transactional_id_prefix"], "shop");
  }
  EXPECT_TRUE(seen);
}

TEST_F(StatusTest, ReportsExactCountsPerDestination) {
  // orders: 7 rows in every state.
  const auto fresh1 = Enqueue("orders");
  const auto fresh2 = Enqueue("orders");
  const auto leased = Enqueue("orders");
  const auto expired = Enqueue("orders");
  const auto retrying = Enqueue("orders");
  const auto blocked = Enqueue("orders", ", ordering_key => 'k'");
  const auto scheduled = Enqueue("orders", ", deliver_after => now() + interval '1 hour'");
  Exec(
      "UPDATE outbox.messages SET lease_owner = gen_random_uuid(), lease_until = now() + interval "
      "'30 s', "
      "created_at = now() - interval '2000 s' WHERE id = " +
      std::to_string(leased));
  Exec(
      "UPDATE outbox.messages SET lease_owner = gen_random_uuid(), lease_until = now() - interval "
      "'1 s' "
      "WHERE id = " +
      std::to_string(expired));
  Exec(
      "UPDATE outbox.messages SET attempts = 2, parked = true, deliver_after = now() + interval '1 "
      "min', "
      "created_at = now() - interval '300 s', due_at = now() - interval '300 s' WHERE id = " +
      std::to_string(retrying));
  Exec(
      "UPDATE outbox.messages SET parked = true, deliver_after = 'infinity', "
      "created_at = now() - interval '120 s', due_at = now() - interval '120 s' WHERE id = " +
      std::to_string(blocked));
  Exec("UPDATE outbox.messages SET created_at = now() - interval '1000 s' WHERE id = " +
       std::to_string(scheduled));
  Exec(
      "UPDATE outbox.messages SET created_at = now() - interval '100 s', deliver_after = now() - "
      "interval '100 s', due_at = now() - interval '100 s' "
      "WHERE id = " +
      std::to_string(fresh1));
  (void)fresh2;
  // billing: 2 fresh rows, the older one 50 s old.
  const auto b1 = Enqueue("billing");
  Enqueue("billing");
  Exec(
      "UPDATE outbox.messages SET created_at = now() - interval '50 s', deliver_after = now() - "
      "interval '50 s', due_at = now() - interval '50 s' "
      "WHERE id = " +
      std::to_string(b1));
  // sched: enqueued long ago for a time that came 10 s ago: it waits since it became due.
  const auto s1 = Enqueue("sched");
  Exec(
      "UPDATE outbox.messages SET parked = true, created_at = now() - interval '5000 s', "
      "deliver_after = now() - interval '10 s', due_at = now() - interval '10 s' WHERE id = " +
      std::to_string(s1));
  // Dead letters: 3 of orders, 1 of a destination with nothing queued.
  DeadLetter(1001, "orders");
  DeadLetter(1002, "orders");
  DeadLetter(1003, "orders");
  DeadLetter(1004, "gone");
  // Two live relays serve orders, one of them billing too; nothing serves sched.
  Exec(
      "INSERT INTO outbox.relay_heartbeats (instance_id, destinations, heartbeat_at) VALUES "
      "(gen_random_uuid(), '{orders,billing}', now()), (gen_random_uuid(), '{orders}', now()), "
      "(gen_random_uuid(), '{sched}', now() - interval '1 hour')");

  StatusOptions o;
  o.destinations = {"orders", "billing", "idle"};
  const auto s = Read(o);
  EXPECT_EQ(s.Find("orders")->relays, 2);
  EXPECT_EQ(s.Find("billing")->relays, 1);
  EXPECT_EQ(s.Find("sched")->relays, 0) << "its relay has been silent for an hour";
  EXPECT_TRUE(s.Find("sched")->Unserved());
  EXPECT_FALSE(s.Find("orders")->Unserved());

  ASSERT_EQ(s.destinations.size(), 5u);
  std::vector<std::string> names;
  for (const auto& d : s.destinations) names.push_back(d.destination);
  EXPECT_EQ(names, (std::vector<std::string>{"billing", "gone", "idle", "orders", "sched"}));

  const auto* orders = s.Find("orders");
  ASSERT_NE(orders, nullptr);
  EXPECT_EQ(orders->depth, 5);  // fresh1, fresh2, retrying, blocked, scheduled
  EXPECT_EQ(orders->in_flight, 2);
  EXPECT_EQ(orders->retrying, 1);
  EXPECT_EQ(orders->blocked, 1);
  EXPECT_EQ(orders->expired_leases, 1);
  EXPECT_EQ(orders->dead_letters, 3);
  ASSERT_TRUE(orders->newest_dead_letter_epoch);
  // The retrying row (enqueued 300 s ago) is the oldest wait; the leased row (2000 s) and
  // the scheduled one (1000 s, not due) do not count.
  EXPECT_GE(orders->oldest_pending_age_seconds, 300);
  EXPECT_LT(orders->oldest_pending_age_seconds, 360);

  const auto* billing = s.Find("billing");
  ASSERT_NE(billing, nullptr);
  EXPECT_EQ(billing->depth, 2);
  EXPECT_EQ(billing->in_flight, 0);
  EXPECT_EQ(billing->retrying, 0);
  EXPECT_EQ(billing->dead_letters, 0);
  EXPECT_GE(billing->oldest_pending_age_seconds, 50);
  EXPECT_LT(billing->oldest_pending_age_seconds, 110);

  const auto* sched = s.Find("sched");
  ASSERT_NE(sched, nullptr);
  EXPECT_EQ(sched->depth, 1);
  EXPECT_GE(sched->oldest_pending_age_seconds, 10);
  EXPECT_LT(sched->oldest_pending_age_seconds, 70)
      << "counted from when it became due, not from enqueue";

  const auto* gone = s.Find("gone");
  ASSERT_NE(gone, nullptr);
  EXPECT_EQ(gone->depth, 0);
  EXPECT_EQ(gone->dead_letters, 1);
  EXPECT_EQ(gone->oldest_pending_age_seconds, 0);

  const auto* idle = s.Find("idle");
  ASSERT_NE(idle, nullptr);
  EXPECT_EQ(idle->depth + idle->in_flight + idle->dead_letters, 0);
  EXPECT_FALSE(idle->newest_dead_letter_epoch);

  // The JSON carries exactly what the table shows.
  const auto table = RenderStatusTable(s);
  const auto json = StatusToJson(s);
  std::istringstream lines(table);
  std::string line;
  std::getline(lines, line);
  EXPECT_EQ(line.substr(0, 11), "DESTINATION") << table;
  std::map<std::string, std::vector<std::string>> rows;
  while (std::getline(lines, line) && !line.empty()) {
    std::istringstream cells(line);
    std::vector<std::string> v;
    std::string cell;
    while (cells >> cell) v.push_back(cell);
    ASSERT_EQ(v.size(), 9u) << line;
    rows[v[0]] = v;
  }
  ASSERT_EQ(rows.size(), json["destinations"].size()) << table;
  for (const auto& d : json["destinations"]) {
    const auto& r = rows.at(d["destination"].get<std::string>());
    EXPECT_EQ(r[1], std::to_string(d["pending"].get<std::int64_t>()));
    EXPECT_EQ(r[2], std::to_string(d["in_flight"].get<std::int64_t>()));
    EXPECT_EQ(r[3], std::to_string(d["retrying"].get<std::int64_t>()));
    EXPECT_EQ(r[4], std::to_string(d["blocked"].get<std::int64_t>()));
    EXPECT_EQ(r[5], std::to_string(d["expired_leases"].get<std::int64_t>()));
    EXPECT_EQ(r[6], std::to_string(d["dead_letters"].get<std::int64_t>()));
    EXPECT_EQ(r[7], FormatAge(d["oldest_pending_age_seconds"].get<double>()));
    EXPECT_EQ(r[8], std::to_string(d["relays"].get<std::int64_t>()));
  }
  EXPECT_EQ(rows.at("orders")[1], "5");
  EXPECT_EQ(rows.at("orders")[6], "3");
  EXPECT_EQ(json["queue_table"]["live_tuples"].get<std::int64_t>(), s.table.live_tuples);
  EXPECT_EQ(json["lock_waits"]["waiters"].get<std::int64_t>(), 0);
  EXPECT_TRUE(json["oldest_transaction"].is_null());
  // The expired lease and the unserved destination are the warnings, in both renderings.
  ASSERT_EQ(json["warnings"].size(), 2u) << json["warnings"].dump();
  std::string all;
  for (const auto& w : json["warnings"]) {
    all += w.get<std::string>() + "\n";
    EXPECT_NE(table.find("WARNING: " + w.get<std::string>() + "\n"), std::string::npos) << table;
  }
  EXPECT_NE(all.find("orders: 1 lease(s) expired"), std::string::npos) << all;
  EXPECT_NE(all.find("sched: 1 message(s) that no running relay serves"), std::string::npos) << all;
  EXPECT_NE(all.find("outbox-relay dlq bury --destination sched"), std::string::npos) << all;
}

// The oldest pending age counted a never-tried message from its deliver_after, which a
// hand-back (an endpoint held, a relay stopping, a lost claim) and a key's wake-up rewrite:
// an endpoint whose messages were claimed and handed back every few seconds never looked
// older than that, and OutboxOldestPendingOverSLA could not fire. And a deliver_after in the
// past (a writer's clock, a backfill) made a new message look days old (review). Counted now
// from when the message first became due.
TEST_F(StatusTest, TheOldestPendingAgeSurvivesHandBacksAndIgnoresAPastDeliverAfter) {
  Enqueue("past", ", deliver_after => now() - interval '1 day'");
  const auto held = Enqueue("held");
  Store store(db_url_);
  ASSERT_TRUE(WaitFor(
      [&] {
        const auto s = Read();  // Find points into it (ASan: a temporary's, freed)
        const auto* d = s.Find("held");
        return d != nullptr && d->oldest_pending_age_seconds >= 1.5;
      },
      30s));
  for (int round = 0; round < 2; ++round) {
    const auto claim = store.Claim("held", round == 0 ? 0 : held, 10, 10, 30s);
    ASSERT_EQ(claim.messages.size(), 1u) << round;
    Settlement release;
    release.id = claim.messages[0].id;
    release.lease_token = claim.lease_token;
    release.kind = Settlement::Kind::kRelease;
    release.delay = round == 0 ? 0ms : 10min;  // handed back due now, then held for a while
    ASSERT_EQ(store.Settle({release}).released, 1) << round;
    const auto s = Read();
    ASSERT_NE(s.Find("held"), nullptr);
    EXPECT_GE(s.Find("held")->oldest_pending_age_seconds, 1.5)
        << "round " << round << ": the hand-back reset the age";
  }
  // A row without due_at (written before migration 0025, or by the relay: a fan-out's
  // endpoint rows): from its deliver_after, or its enqueue if later.
  Enqueue("legacy");
  Exec(
      "UPDATE outbox.messages SET due_at = NULL, created_at = now() - interval '40 s', "
      "deliver_after = now() - interval '1 day' WHERE destination = 'legacy'");
  const auto s = Read();
  ASSERT_NE(s.Find("past"), nullptr);
  EXPECT_LT(s.Find("past")->oldest_pending_age_seconds, 600)
      << "a deliver_after in the past is not a wait";
  ASSERT_NE(s.Find("legacy"), nullptr);
  EXPECT_GE(s.Find("legacy")->oldest_pending_age_seconds, 40);
  EXPECT_LT(s.Find("legacy")->oldest_pending_age_seconds, 600);
}

// A fan-out's endpoint rows and replayed rows had no due_at (migration 0025 wrote it in the
// insert function only): never tried, they were counted from their deliver_after, which
// every hand-back rewrites, so an endpoint held for an hour never looked older than its last
// hand-back. An endpoint row is pending since its message was; a replayed row since the
// replay.
TEST_F(StatusTest, EndpointRowsAndReplayedRowsKeepTheirAgeThroughHandBacks) {
  Store store(db_url_);
  const auto hand_back = [&](const std::string& destination) {
    const auto claim = store.Claim(destination, 0, 10, 10, 30s);
    EXPECT_EQ(claim.messages.size(), 1u) << destination;
    if (claim.messages.empty()) return;
    Settlement release;
    release.id = claim.messages[0].id;
    release.lease_token = claim.lease_token;
    release.kind = Settlement::Kind::kRelease;
    EXPECT_EQ(store.Settle({release}).released, 1) << destination;
  };
  const auto age = [&](const std::string& destination) {
    const auto s = Read();
    const auto* d = s.Find(destination);
    return d == nullptr ? -1.0 : d->oldest_pending_age_seconds;
  };

  // A message due 100 s ago, fanned out now: its endpoint is held (the row is handed back).
  const auto parent = Enqueue("hooks");
  Exec("UPDATE outbox.messages SET due_at = now() - interval '100 s' WHERE id = " +
       std::to_string(parent));
  const auto claim = store.Claim("hooks", 0, 10, 10, 30s);
  ASSERT_EQ(claim.messages.size(), 1u);
  Settlement fan;
  fan.id = claim.messages[0].id;
  fan.lease_token = claim.lease_token;
  fan.kind = Settlement::Kind::kFanOut;
  fan.children = {{"ep_a", Settlement::Kind::kRelease, 0ms, "endpoint held", 0, {}}};
  ASSERT_EQ(store.Settle({fan}).spawned, 1);
  hand_back("hooks");
  EXPECT_GE(age("hooks"), 100) << "the endpoint's row counts from when its message was due";
  EXPECT_LT(age("hooks"), 600);

  // A dead letter of an hour ago, replayed: pending from the replay, not from its enqueue nor
  // from its last hand-back.
  DeadLetter(Enqueue("replayed"), "replayed");
  Exec("DELETE FROM outbox.messages WHERE destination = 'replayed'");
  ASSERT_EQ(ReplayDeadLetters(store, {}, "replayed").ids.size(), 1u);
  ASSERT_TRUE(WaitFor([&] { return age("replayed") >= 1.5; }, 30s));
  hand_back("replayed");
  EXPECT_GE(age("replayed"), 1.5) << "the hand-back reset the replayed row's age";
  EXPECT_LT(age("replayed"), 600) << "counted from the dead letter's enqueue";
}

TEST_F(StatusTest, QueueAndDeadLettersAreReadFromOneSnapshot) {
  // A message moved to the dead letters between the two counts would be counted twice or
  // not at all under READ COMMITTED; the snapshot read counts it exactly once.
  const auto id = Enqueue("d");
  const auto before = Read();
  ASSERT_NE(before.Find("d"), nullptr);
  EXPECT_EQ(before.Find("d")->depth + before.Find("d")->dead_letters, 1);
  Exec("WITH m AS (DELETE FROM outbox.messages WHERE id = " + std::to_string(id) +
       " RETURNING *) INSERT INTO outbox.dead_letters (id, destination, idempotency_key, "
       "event_type, headers, "
       "payload, attempts, reason, created_at) SELECT id, destination, idempotency_key, "
       "event_type, headers, "
       "payload, attempts, 'x', created_at FROM m");
  const auto after = Read();
  EXPECT_EQ(after.Find("d")->depth, 0);
  EXPECT_EQ(after.Find("d")->dead_letters, 1);
}

TEST_F(StatusTest, ReportsTableStatisticsAndVacuum) {
  for (int i = 0; i < 10; ++i) Enqueue("t");
  Exec(
      "DELETE FROM outbox.messages WHERE id IN (SELECT id FROM outbox.messages ORDER BY id LIMIT "
      "4)");
  // Statistics reach the shared stats when a backend flushes them (at latest when it exits).
  ASSERT_TRUE(WaitFor(
      [&] {
        const auto s = Read();
        return s.table.live_tuples == 6 && s.table.dead_tuples == 4;
      },
      20s, 50ms))
      << "live " << Read().table.live_tuples << " dead " << Read().table.dead_tuples;
  const auto before = Read();
  EXPECT_DOUBLE_EQ(before.table.DeadRatio(), 0.4);
  EXPECT_EQ(before.table.vacuum_count, 0);
  EXPECT_FALSE(before.table.last_vacuum_epoch);

  Exec("VACUUM outbox.messages");
  ASSERT_TRUE(WaitFor([&] { return Read().table.vacuum_count == 1; }, 20s, 50ms));
  const auto after = Read();
  EXPECT_EQ(after.table.dead_tuples, 0);
  ASSERT_TRUE(after.table.last_vacuum_epoch);
  EXPECT_NEAR(*after.table.last_vacuum_epoch, after.taken_at_epoch, 60);
  ASSERT_TRUE(after.table.LastAnyVacuumEpoch());
  EXPECT_NE(RenderStatusTable(after).find("(manual)"), std::string::npos)
      << RenderStatusTable(after);
}

TEST_F(StatusTest, CountsSessionsWaitingForLocksOnTheQueue) {
  const auto id = Enqueue("locks");
  pqxx::connection holder(db_url_);
  pqxx::work hold(holder);
  hold.exec("SELECT id FROM outbox.messages WHERE id = " + std::to_string(id) + " FOR UPDATE");

  // Two sessions updating the locked row without SKIP LOCKED: the first waits on the
  // holder's transaction, the second on the row's tuple lock.
  std::atomic<int> finished{0};
  std::vector<std::thread> waiters;
  for (int i = 0; i < 2; ++i) {
    waiters.emplace_back([&] {
      pqxx::connection c(db_url_);
      pqxx::nontransaction tx(c);
      tx.exec("UPDATE outbox.messages SET attempts = attempts + 1 WHERE id = " +
              std::to_string(id));
      ++finished;
    });
  }
  StatusSnapshot s;
  const bool seen = WaitFor(
      [&] {
        s = Read();
        return s.lock_waiters == 2;
      },
      20s, 20ms);
  hold.abort();
  for (auto& t : waiters) t.join();
  ASSERT_TRUE(seen) << "lock_waiters " << s.lock_waiters;
  EXPECT_GE(s.longest_lock_wait_seconds, 0);
  EXPECT_EQ(finished, 2);
  const auto warnings = StatusWarnings(s);
  ASSERT_FALSE(warnings.empty());
  EXPECT_NE(warnings[0].find("2 session(s) waiting for a lock on outbox.messages"),
            std::string::npos);
  EXPECT_EQ(Read().lock_waiters, 0) << "released";
}

TEST_F(StatusTest, AdvisoryLockWaitsOfWritersAreNotQueueContention) {
  // Writers of one ordering key queue behind each other in outbox.insert_message by design.
  pqxx::connection first(db_url_);
  pqxx::work w1(first);
  w1.exec("SELECT outbox.enqueue('adv', '1'::jsonb, ordering_key => 'same')");
  std::thread second([&] {
    pqxx::connection c(db_url_);
    pqxx::nontransaction tx(c);
    tx.exec("SELECT outbox.enqueue('adv', '2'::jsonb, ordering_key => 'same')");
  });
  // Wait until the second writer is really blocked on the advisory lock.
  const bool blocked = WaitFor(
      [&] {
        pqxx::connection c(db_url_);
        pqxx::nontransaction tx(c);
        return tx.exec1("SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'advisory'")[0]
                   .as<int>() == 1;
      },
      20s, 20ms);
  const auto s = Read();
  w1.commit();
  second.join();
  ASSERT_TRUE(blocked);
  EXPECT_EQ(s.lock_waiters, 0);
}

TEST_F(StatusTest, ReportsTheOldestOpenTransaction) {
  pqxx::connection other(db_url_);
  const int pid = other.backendpid();
  pqxx::work open(other);
  open.exec("SELECT pg_current_xact_id()");  // takes an xid, then sits idle in transaction
  Enqueue("later");                          // a younger transaction finishes meanwhile
  const auto s = Read();
  ASSERT_TRUE(s.oldest_transaction);
  EXPECT_EQ(s.oldest_transaction->kind, "session");
  ASSERT_TRUE(s.oldest_transaction->pid);
  EXPECT_EQ(*s.oldest_transaction->pid, pid);
  EXPECT_EQ(s.oldest_transaction->state, "idle in transaction");
  EXPECT_EQ(s.oldest_transaction->user, "postgres");
  EXPECT_GE(s.oldest_transaction->age_seconds, 0);
  EXPECT_LT(s.oldest_transaction->age_seconds, 60);
  EXPECT_GE(s.xmin_lag_xids, 1) << "the open xid holds the horizon behind the finished one";
  const auto json = StatusToJson(s);
  EXPECT_EQ(json["oldest_transaction"]["pid"].get<int>(), pid);
  EXPECT_NE(RenderStatusTable(s).find("oldest transaction: pid " + std::to_string(pid)),
            std::string::npos);
  open.abort();
  EXPECT_FALSE(Read().oldest_transaction);
}

TEST_F(StatusTest, WorksWithOnlyTheRelayRole) {
  Enqueue("r");
  Exec(
      "DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'status_relay_login') "
      "THEN "
      "CREATE ROLE status_relay_login LOGIN; END IF; END $$");
  Exec("GRANT outbox_relay TO status_relay_login");
  std::string url = db_url_;
  url.replace(url.find("postgres@"), 9, "status_relay_login@");
  Store c(url);
  const auto s = ReadStatus(c);
  ASSERT_NE(s.Find("r"), nullptr);
  EXPECT_EQ(s.Find("r")->depth, 1);
}

// Counts that run past the statement timeout (a queue of many millions of rows; here the dead
// letters are locked, so their pass waits past it) leave the rest of the status readable: the
// oldest transaction, often the cause of such a backlog, included. The counts say they were
// not read, and the metrics keep the last ones read (the status was an error and nothing else).
TEST_F(StatusTest, CountsThatRunPastTheTimeoutLeaveTheRestReadable) {
  Enqueue("d");
  RelayMetrics m("test");
  m.UpdateFromStatus(Read());
  const auto gauges = m.Render();
  ASSERT_NE(gauges.find("outbox_queue_depth{destination=\"d\"} 1"), std::string::npos) << gauges;
  pqxx::connection holder(db_url_);
  const int pid = holder.backendpid();
  pqxx::work hold(holder);
  hold.exec("SELECT pg_current_xact_id()");
  hold.exec("LOCK TABLE outbox.dead_letters IN ACCESS EXCLUSIVE MODE");
  Exec("DELETE FROM outbox.messages");
  StatusOptions o;
  o.statement_timeout = 300ms;
  o.destinations = {"d"};
  StatusSnapshot s;
  ASSERT_NO_THROW(s = Read(o));
  EXPECT_NE(s.counts_error.find("statement_timeout"), std::string::npos) << s.counts_error;
  ASSERT_TRUE(s.oldest_transaction);
  ASSERT_TRUE(s.oldest_transaction->pid);
  EXPECT_EQ(*s.oldest_transaction->pid, pid);
  const auto table = RenderStatusTable(s);
  EXPECT_NE(table.find("counts by destination not read: "), std::string::npos) << table;
  EXPECT_EQ(table.find("PENDING"), std::string::npos) << table;
  EXPECT_NE(table.find("oldest transaction: pid " + std::to_string(pid)), std::string::npos);
  const auto json = StatusToJson(s);
  EXPECT_EQ(json["counts_error"], s.counts_error);
  ASSERT_EQ(json["destinations"].size(), 1u);
  EXPECT_TRUE(json["destinations"][0]["pending"].is_null()) << "a zero reads as nothing queued";
  EXPECT_TRUE(json["destinations"][0]["unserved"].is_null()) << "false reads as served";
  m.UpdateFromStatus(s);
  const auto after = m.Render();
  EXPECT_NE(after.find("outbox_queue_depth{destination=\"d\"} 1"), std::string::npos)
      << "counts not read replaced the last ones read: " << after;
  const auto timestamp = [](const std::string& text) {
    const auto at = text.find("\noutbox_status_timestamp_seconds ");
    return at == std::string::npos ? std::string() : text.substr(at, text.find('\n', at + 1) - at);
  };
  EXPECT_EQ(timestamp(after), timestamp(gauges)) << "the gauges went stale unseen";
  hold.abort();
}

TEST_F(StatusTest, StatementTimeoutApplies) {
  pqxx::connection holder(db_url_);
  pqxx::work hold(holder);
  hold.exec("LOCK TABLE outbox.messages IN ACCESS EXCLUSIVE MODE");
  StatusOptions o;
  o.statement_timeout = 200ms;
  Store c(db_url_);
  const auto start = std::chrono::steady_clock::now();
  try {
    ReadStatus(c, o);
    ADD_FAILURE() << "the status read outlived its statement timeout";
  } catch (const StoreError& e) {
    EXPECT_EQ(e.sqlstate(), "57014") << e.what();  // query_canceled
    EXPECT_TRUE(e.transient()) << "a timed-out read may succeed later";
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
  hold.abort();
}

}  // namespace
}  // namespace outbox::relay
