// Operations end to end: the metrics after a known workload, readiness when the database goes
// away and comes back, through the real admin HTTP server.
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
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
    w.secrets = {"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"};
    w.max_in_flight = 4;
    d.target = w;
    d.retry.max_attempts = 5;
    d.retry.initial_backoff = 10ms;
    d.retry.max_backoff = 50ms;
    cfg.destinations.emplace("hooks", d);
    return cfg;
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
  std::map<std::string, SinkPtr> sinks;
  const auto cfg = Config(hook);
  sinks.emplace(
      "hooks",
      MakeWebhookSink("hooks", std::get<WebhookTarget>(cfg.destinations.at("hooks").target)));
  Dispatcher relay(cfg, std::move(sinks), &metrics, 100ms);
  AdminServer admin(
      "127.0.0.1:0", metrics, [&] { return relay.Ready(); }, [] { return std::string("detail"); });
  admin.Start();
  relay.Start();
  ASSERT_TRUE(WaitFor([&] { return Scalar("SELECT count(*) FROM outbox.messages") == 0; }, 30s));
  httplib::Client client("127.0.0.1", admin.port());
  std::string text;
  // The status gauges refresh every 100 ms: wait until they show the final state.
  ASSERT_TRUE(WaitFor(
      [&] {
        auto res = client.Get("/metrics");
        if (!res || res->status != 200) return false;
        text = res->body;
        return Sample(text, "outbox_dead_letters{destination=\"hooks\"}") == 3 &&
               Sample(text, "outbox_queue_depth{destination=\"hooks\"}") == 0;
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

TEST_F(RelayMetricsTest, ReadinessFlipsWhenTheDatabaseGoesAwayAndComesBack) {
  testing::HttpReceiver hook;
  RelayMetrics metrics("test");
  std::map<std::string, SinkPtr> sinks;
  const auto cfg = Config(hook);
  sinks.emplace(
      "hooks",
      MakeWebhookSink("hooks", std::get<WebhookTarget>(cfg.destinations.at("hooks").target)));
  Dispatcher relay(cfg, std::move(sinks), &metrics, 100ms);
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
