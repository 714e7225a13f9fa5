// Operations end to end: the metrics after a known workload, readiness when the database goes
// away and comes back, through the real admin HTTP server.
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <future>
#include <pqxx/pqxx>
#include <regex>

#include "outbox/outbox.h"
#include "outbox_relay/admin_server.h"
#include "outbox_relay/dispatcher.h"
#include "outbox_relay/metrics.h"
#include "outbox_relay/webhook_sink.h"
#include "outbox_test/http_receiver.h"
#include "outbox_test/pg.h"
#include "outbox_test/wait.h"

namespace outbox::relay {
namespace {

using namespace std::chrono_literals;
using testing::WaitFor;

class RelayMetricsTest : public testing::PgTest {
 protected:
  RelayConfig Config(const testing::HttpReceiver& hook) {
    RelayConfig cfg;
    cfg.database_url = db_url_;
    cfg.poll_interval = 100ms;
    cfg.reap_interval = 200ms;
    cfg.shutdown_timeout = 3000ms;
    Destination d;
    d.name = "hooks";
    WebhookTarget w;
    w.url = hook.Url("/in");
    w.allow_private_networks = true;  // the receiver is on loopback
    w.secrets = {"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"};
    w.max_in_flight = 4;
    d.target = w;
    d.retry.max_attempts = 5;
    d.retry.initial_backoff = 10ms;
    d.retry.max_backoff = 50ms;
    cfg.destinations.emplace("hooks", d);
    return cfg;
  }

  // The sink of Config(hook)'s one destination.
  std::map<std::string, SinkPtr> HookSink(const testing::HttpReceiver& hook) {
    std::map<std::string, SinkPtr> sinks;
    sinks.emplace("hooks",
                  MakeWebhookSink(
                      "hooks", Config(hook).destinations.at("hooks").target.Get<WebhookTarget>()));
    return sinks;
  }

  std::int64_t Scalar(const std::string& sql) {
    pqxx::connection c(db_url_);
    pqxx::nontransaction tx(c);
    return tx.exec1(sql)[0].as<std::int64_t>();
  }

  // The value of one sample line of the exposition, or -1.
  static double Sample(const std::string& text, const std::string& series) {
    std::istringstream in(text);
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind(series + " ", 0) == 0) return std::stod(line.substr(series.size() + 1));
    }
    return -1;
  }
};

TEST_F(RelayMetricsTest, MetricsReportExactCountsAfterAKnownWorkload) {
  testing::HttpReceiver hook;
  std::atomic<int> fails_left{4};
  hook.SetResponder([&](const testing::ReceivedRequest& req) {
    testing::Reply r;
    if (req.body.find("\"bad\"") != std::string::npos) {
      r.status = 400;  // permanent
    } else if (req.body.find("\"flaky\"") != std::string::npos && fails_left.fetch_sub(1) > 0) {
      r.status = 503;  // retried
    }
    return r;
  });
  {
    pqxx::connection c(db_url_);
    pqxx::work tx(c);
    std::vector<outbox::OutboxMessage> batch;
    for (int i = 0; i < 10; ++i)
      batch.push_back(outbox::Message::To("hooks").Json(R"({"kind": "ok"})").Build());
    for (int i = 0; i < 3; ++i)
      batch.push_back(outbox::Message::To("hooks").Json(R"({"kind": "bad"})").Build());
    batch.push_back(outbox::Message::To("hooks").Json(R"({"kind": "flaky"})").Build());
    outbox::PublishMany(tx, batch);
    tx.commit();
  }
  RelayMetrics metrics("test");
  Dispatcher relay(Config(hook), HookSink(hook), &metrics, 100ms);
  AdminServer admin(
      "127.0.0.1:0", metrics, [&] { return relay.Ready(); }, [] { return std::string("detail"); });
  admin.Start();
  relay.Start();
  ASSERT_TRUE(WaitFor([&] { return Scalar("SELECT count(*) FROM outbox.messages") == 0; }, 30s));
  httplib::Client client("127.0.0.1", admin.port());
  std::string text;
  // The status gauges refresh every 100 ms: wait until they show the final state (a read taken
  // while the last message was still leased shows it in flight, not pending).
  ASSERT_TRUE(WaitFor(
      [&] {
        auto res = client.Get("/metrics");
        if (!res || res->status != 200) return false;
        text = res->body;
        return Sample(text, "outbox_dead_letters{destination=\"hooks\"}") == 3 &&
               Sample(text, "outbox_queue_depth{destination=\"hooks\"}") == 0 &&
               Sample(text, "outbox_in_flight{destination=\"hooks\"}") == 0;
      },
      10s))
      << text;
  EXPECT_EQ(Sample(text, "outbox_delivered_total{destination=\"hooks\"}"), 11);
  EXPECT_EQ(Sample(text, "outbox_dead_lettered_total{destination=\"hooks\",reason=\"http_4xx\"}"),
            3);
  EXPECT_EQ(Sample(text, "outbox_retried_total{destination=\"hooks\",reason=\"http_5xx\"}"), 4);
  EXPECT_EQ(Sample(text, "outbox_webhook_responses_total{destination=\"hooks\",class=\"2xx\"}"),
            11);
  EXPECT_EQ(Sample(text, "outbox_webhook_responses_total{destination=\"hooks\",class=\"4xx\"}"), 3);
  EXPECT_EQ(Sample(text, "outbox_webhook_responses_total{destination=\"hooks\",class=\"5xx\"}"), 4);
  EXPECT_EQ(Sample(text, "outbox_enqueue_to_delivery_seconds_count{destination=\"hooks\"}"), 11);
  EXPECT_EQ(Sample(text, "outbox_in_flight{destination=\"hooks\"}"), 0);
  EXPECT_GE(Sample(text, "outbox_messages_claimed_total{destination=\"hooks\"}"), 18);
  EXPECT_EQ(Sample(text, "outbox_relay_build_info{version=\"test\"}"), 1);
  EXPECT_NE(text.find("# TYPE outbox_poll_cycle_duration_seconds histogram"), std::string::npos);
  relay.Stop();
}

// The delivery counters count what the settle wrote (docs/operations.md): an outcome whose
// lease had moved on counts nothing, a message dead-lettered before any attempt (its attempts
// used up) counts under attempts_exhausted, and one the reaper takes back from a relay that
// died counts as a retry for lease_expired.
TEST_F(RelayMetricsTest, CountersCountWhatTheSettleWrote) {
  testing::HttpReceiver hook;
  std::atomic<int> requests{0};
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  hook.SetResponder([&](const testing::ReceivedRequest&) {
    if (requests.fetch_add(1) == 0) released.wait_for(30s);  // the first attempt hangs
    return testing::Reply{};
  });
  std::int64_t stolen = 0;
  {
    pqxx::connection c(db_url_);
    pqxx::work tx(c);
    stolen =
        outbox::Publish(tx, outbox::Message::To("hooks").Json(R"({"kind": "stolen"})").Build());
    const auto exhausted =
        outbox::Publish(tx, outbox::Message::To("hooks").Json(R"({"kind": "exhausted"})").Build());
    const auto orphan =
        outbox::Publish(tx, outbox::Message::To("hooks").Json(R"({"kind": "orphan"})").Build());
    tx.exec0("UPDATE outbox.messages SET attempts = 5, parked = true WHERE id = " +
             std::to_string(exhausted));
    // Leased by a relay that died a while ago (its claim's lease record with it): the reaper
    // takes it back.
    tx.exec0(
        "WITH l AS (UPDATE outbox.messages SET lease_owner = gen_random_uuid(), lease_until = "
        "clock_timestamp() - interval '1 minute' WHERE id = " +
        std::to_string(orphan) +
        " RETURNING id, lease_owner, lease_until) "
        "INSERT INTO outbox.leases (token, lease_until, ids, remaining) "
        "SELECT lease_owner, lease_until, ARRAY[id], 1 FROM l");
    tx.commit();
  }
  RelayMetrics metrics("test");
  Dispatcher relay(Config(hook), HookSink(hook), &metrics, 100ms);
  relay.Start();
  // The first attempt of `stolen` hangs; meanwhile its lease moves on to another relay (as
  // after expiry and the reaper), which has it now.
  ASSERT_TRUE(WaitFor([&] { return requests.load() >= 1; }, 20s));
  Scalar(
      "WITH r AS (UPDATE outbox.messages SET lease_owner = gen_random_uuid(), "
      "lease_until = clock_timestamp() + interval '1 hour', attempts = attempts + 1 "
      "WHERE id = " +
      std::to_string(stolen) + " RETURNING 1) SELECT count(*) FROM r");
  ASSERT_TRUE(WaitFor([&] { return Scalar("SELECT count(*) FROM outbox.messages") == 1; }, 30s));
  release.set_value();  // the first attempt's 200 now settles nothing: the lease moved on
  const std::string ok_series =
      "outbox_webhook_responses_total{destination=\"hooks\",class=\"2xx\"}";
  ASSERT_TRUE(WaitFor([&] { return Sample(metrics.Render(), ok_series) == 2; }, 20s))
      << metrics.Render();
  ASSERT_TRUE(
      WaitFor([&] { return Sample(metrics.Render(), "outbox_settle_fenced_total") == 1; }, 20s))
      << metrics.Render();
  relay.Stop();
  const std::string text = metrics.Render();
  EXPECT_EQ(Sample(text, "outbox_delivered_total{destination=\"hooks\"}"), 1)
      << "the orphan; the stolen message's 200 wrote nothing\n"
      << text;
  EXPECT_EQ(Sample(text, "outbox_enqueue_to_delivery_seconds_count{destination=\"hooks\"}"), 1);
  EXPECT_EQ(
      Sample(text,
             "outbox_dead_lettered_total{destination=\"hooks\",reason=\"attempts_exhausted\"}"),
      1);
  EXPECT_EQ(Sample(text, "outbox_retried_total{destination=\"hooks\",reason=\"lease_expired\"}"),
            1);
  EXPECT_EQ(Scalar("SELECT count(*) FROM outbox.dead_letters"), 1);
}

TEST_F(RelayMetricsTest, ReadinessFlipsWhenTheDatabaseGoesAwayAndComesBack) {
  testing::HttpReceiver hook;
  RelayMetrics metrics("test");
  Dispatcher relay(Config(hook), HookSink(hook), &metrics, 100ms);
  AdminServer admin(
      "127.0.0.1:0", metrics, [&] { return relay.Ready(); }, [] { return std::string("db down"); });
  admin.Start();
  relay.Start();
  httplib::Client client("127.0.0.1", admin.port());
  auto status = [&](const char* path) {
    auto res = client.Get(path);
    return res ? res->status : -1;
  };
  ASSERT_TRUE(WaitFor([&] { return status("/readyz") == 200; }, 20s));
  testing::PgCluster::Instance().Stop();
  EXPECT_TRUE(WaitFor([&] { return status("/readyz") == 503; }, 20s));
  EXPECT_EQ(status("/healthz"), 200) << "alive while not ready";
  testing::PgCluster::Instance().Start();
  EXPECT_TRUE(WaitFor([&] { return status("/readyz") == 200; }, 30s));
  relay.Stop();
}

}  // namespace
}  // namespace outbox::relay
