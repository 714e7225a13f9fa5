// The metrics registry's text exposition (format 0.0.4) and RelayMetrics' labels.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "outbox_relay/metrics.h"
#include "outbox_relay/metrics_registry.h"

namespace outbox::relay {
namespace {

using metrics::Registry;

TEST(MetricsRegistry, RendersExactExpositionText) {
  Registry r;
  auto& requests = r.AddCounter("app_requests_total", "Requests handled.", {"destination", "code"});
  auto& temp = r.AddGauge("app_temperature_celsius", "Current temperature.");
  auto& lat = r.AddHistogram("app_latency_seconds", "Latency.", {"destination"}, {0.1, 0.5, 1});
  r.AddGauge("app_unused", "Never set.", {"x"});

  requests.Labels({"orders", "200"}).Inc();
  requests.Labels({"orders", "200"}).Inc(2);
  requests.Labels({"billing", "500"}).Inc(0.5);
  temp.Labels({}).Set(-3.25);
  lat.Labels({"orders"}).Observe(0.0625);
  lat.Labels({"orders"}).Observe(0.5);  // on a bound: counts in le="0.5"
  lat.Labels({"orders"}).Observe(0.75);
  lat.Labels({"orders"}).Observe(3);

  EXPECT_EQ(r.Render(),
            "# HELP app_requests_total Requests handled.\n"
            "# TYPE app_requests_total counter\n"
            "app_requests_total{destination=\"billing\",code=\"500\"} 0.5\n"
            "app_requests_total{destination=\"orders\",code=\"200\"} 3\n"
            "# HELP app_temperature_celsius Current temperature.\n"
            "# TYPE app_temperature_celsius gauge\n"
            "app_temperature_celsius -3.25\n"
            "# HELP app_latency_seconds Latency.\n"
            "# TYPE app_latency_seconds histogram\n"
            "app_latency_seconds_bucket{destination=\"orders\",le=\"0.1\"} 1\n"
            "app_latency_seconds_bucket{destination=\"orders\",le=\"0.5\"} 2\n"
            "app_latency_seconds_bucket{destination=\"orders\",le=\"1\"} 3\n"
            "app_latency_seconds_bucket{destination=\"orders\",le=\"+Inf\"} 4\n"
            "app_latency_seconds_sum{destination=\"orders\"} 4.3125\n"
            "app_latency_seconds_count{destination=\"orders\"} 4\n"
            "# HELP app_unused Never set.\n"
            "# TYPE app_unused gauge\n");
}

TEST(MetricsRegistry, EscapesLabelValuesAndHelp) {
  Registry r;
  auto& c =
      r.AddCounter("x_total", "Help with \\ backslash\nand a newline; \"quotes\" stay.", {"v"});
  c.Labels({"a\"b\\c\nd"}).Inc();
  EXPECT_EQ(r.Render(),
            "# HELP x_total Help with \\\\ backslash\\nand a newline; \"quotes\" stay.\n"
            "# TYPE x_total counter\n"
            "x_total{v=\"a\\\"b\\\\c\\nd\"} 1\n");
  EXPECT_EQ(metrics::EscapeLabelValue("plain"), "plain");
}

TEST(MetricsRegistry, FormatsSpecialValues) {
  EXPECT_EQ(metrics::FormatValue(0), "0");
  EXPECT_EQ(metrics::FormatValue(-0.0), "0");
  EXPECT_EQ(metrics::FormatValue(42), "42");
  EXPECT_EQ(metrics::FormatValue(0.005), "0.005");
  EXPECT_EQ(metrics::FormatValue(1e21), "1e+21");
  EXPECT_EQ(metrics::FormatValue(1.0 / 0.0), "+Inf");
  EXPECT_EQ(metrics::FormatValue(-1.0 / 0.0), "-Inf");
  EXPECT_EQ(metrics::FormatValue(0.0 / 0.0), "NaN");
}

TEST(MetricsRegistry, HistogramBucketsAreCumulativeAndCountMatchesInf) {
  Registry r;
  auto& h = r.AddHistogram("h_seconds", "H.", {}, {1, 2, 3});
  for (double v : {0.5, 1.5, 1.5, 2.5, 2.5, 2.5, 10.0}) h.Labels({}).Observe(v);
  h.Labels({}).Observe(0.0 / 0.0);  // NaN is ignored
  const auto snap = h.Labels({}).Collect();
  EXPECT_EQ(snap.cumulative, (std::vector<std::uint64_t>{1, 3, 6, 7}));
  EXPECT_EQ(snap.count, 7u);
  EXPECT_DOUBLE_EQ(snap.sum, 21.0);
  EXPECT_EQ(r.Render(),
            "# HELP h_seconds H.\n"
            "# TYPE h_seconds histogram\n"
            "h_seconds_bucket{le=\"1\"} 1\n"
            "h_seconds_bucket{le=\"2\"} 3\n"
            "h_seconds_bucket{le=\"3\"} 6\n"
            "h_seconds_bucket{le=\"+Inf\"} 7\n"
            "h_seconds_sum 21\n"
            "h_seconds_count 7\n");
}

TEST(MetricsRegistry, GaugeCallbacksRunAtScrapeTime) {
  Registry r;
  auto& g = r.AddGauge("q_length", "Q.", {"destination"});
  std::atomic<int> calls{0};
  double value = 1;
  ASSERT_TRUE(g.SetCallback({"a"}, [&] {
    ++calls;
    return value;
  }));
  ASSERT_TRUE(g.SetCallback({"b"}, []() -> double { throw std::runtime_error("gone"); }));
  g.Labels({"c"}).Set(7);
  EXPECT_EQ(calls, 0) << "not evaluated before a scrape";
  EXPECT_EQ(r.Render(),
            "# HELP q_length Q.\n# TYPE q_length gauge\nq_length{destination=\"a\"} 1\n"
            "q_length{destination=\"c\"} 7\n")
      << "a throwing callback leaves its series out";
  value = 5;
  EXPECT_NE(r.Render().find("q_length{destination=\"a\"} 5\n"), std::string::npos);
  EXPECT_EQ(calls, 2);
  g.Remove({"a"});
  EXPECT_EQ(r.Render().find("destination=\"a\""), std::string::npos);
  EXPECT_EQ(calls, 2);
}

TEST(MetricsRegistry, SeriesAreBoundedPerFamily) {
  Registry r;
  auto& c = r.AddCounter("c_total", "C.", {"k"}, /*max_series=*/2);
  c.Labels({"a"}).Inc();
  c.Labels({"b"}).Inc();
  c.Labels({"c"}).Inc();
  c.Labels({"d"}).Inc(2);
  c.Labels({"a"}).Inc();  // existing series still work when full
  EXPECT_EQ(c.size(), 3u);
  EXPECT_EQ(r.Render(),
            "# HELP c_total C.\n# TYPE c_total counter\n"
            "c_total{k=\"_overflow\"} 3\nc_total{k=\"a\"} 2\nc_total{k=\"b\"} 1\n");
  auto& g = r.AddGauge("g", "G.", {"k"}, 1);
  g.Labels({"a"}).Set(1);
  EXPECT_FALSE(g.SetCallback({"b"}, [] { return 2.0; }))
      << "a callback never lands in the overflow series";
  c.RemoveIf([](const metrics::LabelValues& l) { return l[0] != "a"; });
  EXPECT_EQ(c.size(), 1u);
}

TEST(MetricsRegistry, RejectsInvalidNamesAndLabels) {
  Registry r;
  EXPECT_THROW(r.AddCounter("requests", "no _total"), std::invalid_argument);
  EXPECT_THROW(r.AddGauge("1abc", "starts with a digit"), std::invalid_argument);
  EXPECT_THROW(r.AddGauge("a-b", "dash"), std::invalid_argument);
  EXPECT_THROW(r.AddGauge("ok", "bad label", {"__reserved"}), std::invalid_argument);
  EXPECT_THROW(r.AddGauge("ok2", "bad label", {"a-b"}), std::invalid_argument);
  EXPECT_THROW(r.AddGauge("ok3", "repeated", {"a", "a"}), std::invalid_argument);
  EXPECT_THROW(r.AddHistogram("h", "le", {"le"}, {1}), std::invalid_argument);
  EXPECT_THROW(r.AddHistogram("h2", "order", {}, {1, 1}), std::invalid_argument);
  EXPECT_THROW(r.AddHistogram("h3", "inf", {}, {1, 1.0 / 0.0}), std::invalid_argument);
  auto& g = r.AddGauge("ns:gauge_1", "colons are allowed", {"a"});
  EXPECT_THROW(r.AddGauge("ns:gauge_1", "twice"), std::invalid_argument);
  EXPECT_THROW(g.Labels({}), std::invalid_argument);
  EXPECT_THROW(g.Labels({"x", "y"}), std::invalid_argument);
}

TEST(MetricsRegistry, CounterIgnoresNegativeIncrements) {
  Registry r;
  auto& c = r.AddCounter("n_total", "N.");
  c.Labels({}).Inc(3);
  c.Labels({}).Inc(-1);
  c.Labels({}).Inc(0.0 / 0.0);
  EXPECT_EQ(c.Labels({}).Value(), 3);
}

TEST(MetricsRegistry, ConcurrentUpdatesAreExact) {
  Registry r;
  auto& c = r.AddCounter("hits_total", "H.", {"d"});
  auto& h = r.AddHistogram("lat_seconds", "L.", {"d"}, {0.5});
  constexpr int kThreads = 4, kEach = 20000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const std::string d = t % 2 ? "odd" : "even";
      for (int i = 0; i < kEach; ++i) {
        c.Labels({d}).Inc();
        h.Labels({d}).Observe(i % 2 ? 1.0 : 0.25);
        if (i % 1000 == 0) (void)r.Render();  // scrapes race with updates
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(c.Labels({"odd"}).Value(), 2.0 * kEach);
  EXPECT_EQ(c.Labels({"even"}).Value(), 2.0 * kEach);
  const auto s = h.Labels({"odd"}).Collect();
  EXPECT_EQ(s.count, 2u * kEach);
  EXPECT_EQ(s.cumulative[0], 1u * kEach);
  EXPECT_DOUBLE_EQ(s.sum, kEach * 1.0 + kEach * 0.25);
}

TEST(RelayMetrics, AKafkaTargetsHealthMakesNoWebhookSeries) {
  RelayMetrics m("test");
  TargetHealth h;
  h.kind = "kafka";
  h.delivery = "exactly_once";
  m.UpdateTargetHealth("orders", h);
  const std::string text = m.Render();
  EXPECT_EQ(text.find("outbox_webhook_breaker_state{destination=\"orders\"}"), std::string::npos)
      << text;
  EXPECT_EQ(text.find("outbox_webhook_concurrency_limit{destination=\"orders\"}"),
            std::string::npos)
      << text;
}

TEST(RelayMetrics, TargetHealthSetsGaugesAndCountsOpeningsOnce) {
  RelayMetrics m("test");
  TargetHealth h;
  h.concurrency_limit = 32;
  h.max_concurrency = 32;
  m.UpdateTargetHealth("hooks", h);
  std::string text = m.Render();
  EXPECT_NE(text.find("outbox_webhook_breaker_state{destination=\"hooks\"} 0"), std::string::npos)
      << text;
  EXPECT_NE(text.find("outbox_webhook_breaker_opened_total{destination=\"hooks\"} 0"),
            std::string::npos)
      << "the counter exists before the first opening";
  h.breaker = "open";
  h.times_opened = 2;
  h.concurrency_limit = 8;
  h.paused_for = std::chrono::milliseconds(1500);
  h.times_paused = 1;
  m.UpdateTargetHealth("hooks", h);
  m.UpdateTargetHealth("hooks", h);  // read again: nothing new happened
  text = m.Render();
  EXPECT_NE(text.find("outbox_webhook_breaker_state{destination=\"hooks\"} 2"), std::string::npos);
  EXPECT_NE(text.find("outbox_webhook_breaker_opened_total{destination=\"hooks\"} 2"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("outbox_webhook_concurrency_limit{destination=\"hooks\"} 8"),
            std::string::npos);
  EXPECT_NE(text.find("outbox_webhook_paused_seconds{destination=\"hooks\"} 1.5"),
            std::string::npos);
  EXPECT_NE(text.find("outbox_webhook_pauses_total{destination=\"hooks\"} 1"), std::string::npos);
  h.breaker = "half_open";
  h.times_opened = 3;
  m.UpdateTargetHealth("hooks", h);
  text = m.Render();
  EXPECT_NE(text.find("outbox_webhook_breaker_state{destination=\"hooks\"} 1"), std::string::npos);
  EXPECT_NE(text.find("outbox_webhook_breaker_opened_total{destination=\"hooks\"} 3"),
            std::string::npos);
}

TEST(RelayMetrics, SinkEventsMoveByWhatTheSinkCountedSinceTheLastRead) {
  RelayMetrics m("test");
  m.UpdateSinkEvents("orders", {{"transactions_committed", 3}, {"recovered", 0}});
  std::string text = m.Render();
  EXPECT_NE(
      text.find(
          "outbox_sink_events_total{destination=\"orders\",event=\"transactions_committed\"} 3"),
      std::string::npos)
      << text;
  EXPECT_NE(text.find("outbox_sink_events_total{destination=\"orders\",event=\"recovered\"} 0"),
            std::string::npos)
      << "an event that has not happened yet is a series at 0";
  m.UpdateSinkEvents("orders", {{"transactions_committed", 3}, {"recovered", 0}});  // unchanged
  m.UpdateSinkEvents("orders", {{"transactions_committed", 7}, {"recovered", 2}});
  text = m.Render();
  EXPECT_NE(
      text.find(
          "outbox_sink_events_total{destination=\"orders\",event=\"transactions_committed\"} 7"),
      std::string::npos)
      << text;
  EXPECT_NE(text.find("outbox_sink_events_total{destination=\"orders\",event=\"recovered\"} 2"),
            std::string::npos)
      << text;
}

TEST(RelayMetrics, AWebhookServiceCountsItsEndpointsByStateNeverByEndpoint) {
  RelayMetrics m("test");
  TargetHealth h;
  m.UpdateTargetHealth("plain", h);
  EXPECT_EQ(m.Render().find("outbox_webhook_endpoints{"), std::string::npos)
      << "a plain webhook destination has no endpoints gauge";
  h.service = true;
  h.endpoints = 5;
  h.endpoints_disabled = 2;
  h.endpoints_open = 1;
  h.endpoints_auto_disabled = 1;
  m.UpdateTargetHealth("svc", h);
  m.UpdateTargetHealth("svc", h);  // read again: nothing new happened
  std::string text = m.Render();
  EXPECT_NE(text.find("outbox_webhook_endpoints{destination=\"svc\",state=\"enabled\"} 3"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("outbox_webhook_endpoints{destination=\"svc\",state=\"disabled\"} 2"),
            std::string::npos);
  EXPECT_NE(text.find("outbox_webhook_endpoints{destination=\"svc\",state=\"breaker_open\"} 1"),
            std::string::npos);
  EXPECT_NE(text.find("outbox_webhook_endpoints_auto_disabled_total{destination=\"svc\"} 1"),
            std::string::npos);
  h.endpoints_auto_disabled = 3;
  m.UpdateTargetHealth("svc", h);
  EXPECT_NE(m.Render().find("outbox_webhook_endpoints_auto_disabled_total{destination=\"svc\"} 3"),
            std::string::npos);
}

TEST(MetricsRegistry, ExponentialBuckets) {
  EXPECT_EQ(metrics::ExponentialBuckets(0.001, 10, 3), (std::vector<double>{0.001, 0.01, 0.1}));
  EXPECT_THROW(metrics::ExponentialBuckets(0, 2, 3), std::invalid_argument);
  EXPECT_THROW(metrics::ExponentialBuckets(1, 1, 3), std::invalid_argument);
}

// ---- RelayMetrics ----------------------------------------------------------------------

bool Has(const std::string& text, const std::string& line) {
  return text.find("\n" + line + "\n") != std::string::npos;
}

TEST(RelayMetrics, ReasonClassesAreBounded) {
  // Every sink class maps to a known label.
  EXPECT_EQ(ReasonClass("http_5xx"), "http_5xx");
  EXPECT_EQ(ReasonClass("http_408"), "timeout");
  EXPECT_EQ(ReasonClass("http_3xx"), "http_other");
  EXPECT_EQ(ReasonClass("tls"), "connection");
  EXPECT_EQ(ReasonClass("broker"), "connection");
  EXPECT_EQ(ReasonClass("msg_too_large"), "message_rejected");
  EXPECT_EQ(ReasonClass("unknown_topic"), "topic_or_config");
  EXPECT_EQ(ReasonClass("fatal"), "producer");
  // The relay's own reasons are typed too (they used to be free text parsed back).
  EXPECT_EQ(ReasonClass(Reason::kAttemptsExhausted), "attempts_exhausted");
  EXPECT_EQ(ReasonClass(Reason::kLeaseExpired), "lease_expired");
  EXPECT_EQ(ReasonClass(Reason::kUnknownDestination), "unknown_destination");
  EXPECT_EQ(ReasonClass(Reason::kNone), "other");
  // Anything that is not a reason's label counts as other, never as a label of its own.
  EXPECT_EQ(ReasonClass("order 42 for customer bob@example.com"), "other");
  EXPECT_EQ(ReasonClass(""), "other");

  const std::vector<std::string> inputs = {"http_3xx",
                                           "http_4xx",
                                           "http_408",
                                           "http_429",
                                           "http_5xx",
                                           "http_other",
                                           "timeout",
                                           "connection",
                                           "tls",
                                           "shutdown",
                                           "msg_too_large",
                                           "invalid_message",
                                           "authorization",
                                           "invalid_topic",
                                           "config",
                                           "unknown_topic",
                                           "broker",
                                           "queue_full",
                                           "purged",
                                           "fatal",
                                           "other",
                                           "lease_expired",
                                           "attempts_exhausted",
                                           "unknown_destination",
                                           "anything at all",
                                           "x",
                                           "id 12345"};
  std::set<std::string_view> labels;
  for (const auto& in : inputs) labels.insert(ReasonClass(in));
  EXPECT_LE(labels.size(), 15u) << "at most 14 classes plus other";
}

TEST(RelayMetrics, WebhookResponseClasses) {
  Outcome o;
  o.kind = OutcomeKind::kDelivered;
  EXPECT_EQ(WebhookResponseClass(o), "2xx");
  o.kind = OutcomeKind::kRetry;
  for (const auto& [cls, want] :
       std::vector<std::pair<std::string, std::string>>{{"http_5xx", "5xx"},
                                                        {"http_429", "4xx"},
                                                        {"http_408", "4xx"},
                                                        {"http_3xx", "3xx"},
                                                        {"timeout", "timeout"},
                                                        {"connection", "connection"},
                                                        {"tls", "tls"},
                                                        {"blocked_address", "blocked_address"},
                                                        {"http_other", "other"},
                                                        {"shutdown", ""}}) {
    o.reason_class = ReasonFromLabel(cls);
    EXPECT_EQ(WebhookResponseClass(o), want) << cls;
  }
}

TEST(RelayMetrics, RecordsEveryMetricWithItsLabels) {
  RelayMetrics m("1.2.3");
  m.InitDestination("orders", "kafka");
  std::string text = m.Render();
  EXPECT_TRUE(Has(text, "outbox_relay_build_info{version=\"1.2.3\"} 1"));
  EXPECT_TRUE(Has(text, "outbox_claims_total{destination=\"orders\"} 0"));
  EXPECT_TRUE(Has(text, "outbox_delivered_total{destination=\"orders\"} 0"));
  EXPECT_TRUE(Has(text, "outbox_db_errors_total 0"));
  EXPECT_TRUE(
      Has(text, "outbox_delivery_duration_seconds_count{destination=\"orders\",sink=\"kafka\"} 0"));

  using std::chrono::milliseconds;
  m.RecordClaim("orders", 3, milliseconds(12));
  m.RecordClaim("orders", 0, milliseconds(2));
  m.RecordDeliveryDuration("hooks", "webhook", milliseconds(80));
  Outcome ok;
  ok.kind = OutcomeKind::kDelivered;
  Outcome bad;
  bad.kind = OutcomeKind::kRetry;
  bad.reason_class = Reason::kHttp5xx;
  m.RecordWebhookResponse("hooks", ok);
  m.RecordWebhookResponse("hooks", bad);
  m.RecordWebhookResponse("hooks", bad);
  m.RecordDelivered("orders", std::chrono::duration<double>(0.2));
  m.RecordDelivered("orders",
                    std::chrono::system_clock::now() + std::chrono::hours(1));  // clock skew: 0
  m.RecordRetried("hooks", Reason::kHttp5xx, 2);
  m.RecordDeadLettered("orders", Reason::kAttemptsExhausted);
  m.RecordReaperRequeued(4);
  m.RecordSettleFenced(1);
  m.RecordSweepFound("orders", 2);
  m.RecordDbError();
  int queue = 17;
  m.SetKafkaProducerQueueLength("orders", [&] { return static_cast<double>(queue); });

  text = m.Render();
  EXPECT_TRUE(Has(text, "outbox_claims_total{destination=\"orders\"} 2"));
  EXPECT_TRUE(Has(text, "outbox_empty_polls_total{destination=\"orders\"} 1"));
  EXPECT_TRUE(Has(text, "outbox_messages_claimed_total{destination=\"orders\"} 3"));
  EXPECT_TRUE(
      Has(text, "outbox_poll_cycle_duration_seconds_bucket{destination=\"orders\",le=\"0.01\"} 1"));
  EXPECT_TRUE(Has(
      text, "outbox_poll_cycle_duration_seconds_bucket{destination=\"orders\",le=\"0.015\"} 2"));
  EXPECT_TRUE(Has(text, "outbox_poll_cycle_duration_seconds_count{destination=\"orders\"} 2"));
  EXPECT_TRUE(Has(
      text, "outbox_delivery_duration_seconds_count{destination=\"hooks\",sink=\"webhook\"} 1"));
  EXPECT_TRUE(Has(text, "outbox_webhook_responses_total{destination=\"hooks\",class=\"2xx\"} 1"));
  EXPECT_TRUE(Has(text, "outbox_webhook_responses_total{destination=\"hooks\",class=\"5xx\"} 2"));
  EXPECT_TRUE(Has(text, "outbox_delivered_total{destination=\"orders\"} 2"));
  EXPECT_TRUE(
      Has(text, "outbox_enqueue_to_delivery_seconds_bucket{destination=\"orders\",le=\"0.01\"} 1"));
  EXPECT_TRUE(
      Has(text, "outbox_enqueue_to_delivery_seconds_bucket{destination=\"orders\",le=\"0.25\"} 2"));
  EXPECT_TRUE(Has(text, "outbox_retried_total{destination=\"hooks\",reason=\"http_5xx\"} 2"));
  EXPECT_TRUE(Has(
      text, "outbox_dead_lettered_total{destination=\"orders\",reason=\"attempts_exhausted\"} 1"));
  EXPECT_TRUE(Has(text, "outbox_reaper_requeued_total 4"));
  EXPECT_TRUE(Has(text, "outbox_settle_fenced_total 1"));
  EXPECT_TRUE(Has(text, "outbox_sweep_found_total{destination=\"orders\"} 2"));
  EXPECT_TRUE(Has(text, "outbox_db_errors_total 1"));
  EXPECT_TRUE(Has(text, "outbox_kafka_producer_queue_length{destination=\"orders\"} 17"));
  queue = 3;
  EXPECT_TRUE(Has(m.Render(), "outbox_kafka_producer_queue_length{destination=\"orders\"} 3"));
  m.ClearKafkaProducerQueueLength("orders");
  EXPECT_EQ(m.Render().find("outbox_kafka_producer_queue_length{"), std::string::npos);
}

TEST(RelayMetrics, UpdateFromStatusSetsAndDropsSeries) {
  RelayMetrics m("dev");
  StatusSnapshot s;
  s.taken_at_epoch = 1700000000.5;
  DestinationStatus a;
  a.destination = "a";
  a.depth = 10;
  a.in_flight = 2;
  a.retrying = 3;
  a.blocked = 1;
  a.dead_letters = 4;
  a.oldest_pending_age_seconds = 12.5;
  DestinationStatus b;
  b.destination = "b";
  s.destinations = {a, b};
  s.lock_waiters = 1;
  s.table.live_tuples = 100;
  s.table.dead_tuples = 7;
  s.table.last_autovacuum_epoch = 1699999990;
  s.table.last_vacuum_epoch = 1699999000;
  OldestTransaction t;
  t.kind = "session";
  t.age_seconds = 42;
  s.oldest_transaction = t;
  s.xmin_lag_xids = 9;
  m.UpdateFromStatus(s);
  auto text = m.Render();
  EXPECT_TRUE(Has(text, "outbox_queue_depth{destination=\"a\"} 10"));
  EXPECT_TRUE(Has(text, "outbox_queue_depth{destination=\"b\"} 0"));
  EXPECT_TRUE(Has(text, "outbox_in_flight{destination=\"a\"} 2"));
  EXPECT_TRUE(Has(text, "outbox_retrying{destination=\"a\"} 3"));
  EXPECT_TRUE(Has(text, "outbox_blocked{destination=\"a\"} 1"));
  EXPECT_TRUE(Has(text, "outbox_dead_letters{destination=\"a\"} 4"));
  EXPECT_TRUE(Has(text, "outbox_oldest_pending_age_seconds{destination=\"a\"} 12.5"));
  EXPECT_TRUE(Has(text, "outbox_queue_lock_waiters 1"));
  EXPECT_TRUE(Has(text, "outbox_queue_table_live_tuples 100"));
  EXPECT_TRUE(Has(text, "outbox_queue_table_dead_tuples 7"));
  EXPECT_TRUE(Has(text, "outbox_queue_table_last_vacuum_timestamp_seconds 1699999990"));
  EXPECT_TRUE(Has(text, "outbox_oldest_transaction_age_seconds 42"));
  EXPECT_TRUE(Has(text, "outbox_xmin_lag_transactions 9"));
  EXPECT_TRUE(Has(text, "outbox_status_timestamp_seconds 1700000000.5"));

  s.destinations = {b};
  s.oldest_transaction.reset();
  m.UpdateFromStatus(s);
  text = m.Render();
  EXPECT_EQ(text.find("destination=\"a\""), std::string::npos) << "a left the snapshot";
  EXPECT_TRUE(Has(text, "outbox_queue_depth{destination=\"b\"} 0"));
  EXPECT_TRUE(Has(text, "outbox_oldest_transaction_age_seconds 0"));
}

// A status whose counts were not read (their pass over a huge queue ran past the statement
// timeout) leaves the queue gauges and the status timestamp as they were, but what it did
// read, each destination's live relays and its pause, is set: those gauges stayed frozen too,
// so a pause or a relay lost during a large backlog did not show (review).
TEST(RelayMetrics, CountsNotReadKeepTheQueueGaugesButSetRelaysAndPauses) {
  RelayMetrics m("dev");
  StatusSnapshot s;
  s.taken_at_epoch = 1700000000.5;
  DestinationStatus a;
  a.destination = "a";
  a.depth = 10;
  a.relays = 2;
  s.destinations = {a};
  m.UpdateFromStatus(s);
  s.taken_at_epoch = 1700000060.5;
  s.counts_error = "the pass over the queue and the dead letters took longer than 5000 ms";
  s.destinations[0].depth = 0;  // not read
  s.destinations[0].relays = 0;
  s.destinations[0].paused = true;
  DestinationStatus fresh;  // first seen now, without counts: no series made up for it
  fresh.destination = "fresh";
  fresh.relays = 1;
  s.destinations.push_back(fresh);
  m.UpdateFromStatus(s);
  const auto text = m.Render();
  EXPECT_TRUE(Has(text, "outbox_queue_depth{destination=\"a\"} 10")) << "counts kept";
  EXPECT_TRUE(Has(text, "outbox_status_timestamp_seconds 1700000000.5")) << "stale, as it is";
  EXPECT_TRUE(Has(text, "outbox_destination_relays{destination=\"a\"} 0")) << text;
  EXPECT_TRUE(Has(text, "outbox_destination_paused{destination=\"a\"} 1")) << text;
  EXPECT_EQ(text.find("destination=\"fresh\""), std::string::npos) << text;
}

// Past 1,000 destinations the queue gauges share one `_overflow` series, summed (ages: the
// oldest). It was removed again at the end of every update, as a label set no destination has,
// so those destinations exported nothing and their alerts could not fire (found in review).
TEST(RelayMetrics, DestinationsPastTheSeriesLimitShareTheOverflowSeries) {
  RelayMetrics m("dev");
  StatusSnapshot s;
  for (int i = 0; i < 1002; ++i) {
    DestinationStatus d;
    char name[16];
    std::snprintf(name, sizeof name, "d%04d", i);
    d.destination = name;
    d.depth = 1;
    d.oldest_pending_age_seconds = i;
    s.destinations.push_back(d);
  }
  for (int round = 0; round < 2; ++round) {
    m.UpdateFromStatus(s);
    const auto text = m.Render();
    EXPECT_TRUE(Has(text, "outbox_queue_depth{destination=\"d0000\"} 1")) << round;
    EXPECT_TRUE(Has(text, "outbox_queue_depth{destination=\"d0999\"} 1")) << round;
    EXPECT_EQ(text.find("destination=\"d1000\""), std::string::npos) << round;
    EXPECT_TRUE(Has(text, "outbox_queue_depth{destination=\"_overflow\"} 2")) << round;
    EXPECT_TRUE(Has(text, "outbox_oldest_pending_age_seconds{destination=\"_overflow\"} 1001"))
        << round;
  }
  s.destinations.resize(3);
  m.UpdateFromStatus(s);
  EXPECT_EQ(m.Render().find("_overflow"), std::string::npos) << "none past the limit any more";
}

TEST(RelayMetrics, EveryNameFollowsConventions) {
  RelayMetrics m("dev");
  const auto text = m.Render();
  // Every family renders HELP and TYPE, counters end in _total, units are base units.
  std::size_t families = 0, pos = 0;
  while ((pos = text.find("# TYPE ", pos)) != std::string::npos) {
    const auto end = text.find('\n', pos);
    const auto line = text.substr(pos + 7, end - pos - 7);
    const auto space = line.find(' ');
    const auto name = line.substr(0, space);
    const auto type = line.substr(space + 1);
    EXPECT_EQ(name.rfind("outbox_", 0), 0u) << name;
    if (type == "counter") {
      EXPECT_TRUE(name.size() > 6 && name.substr(name.size() - 6) == "_total") << name;
    }
    EXPECT_EQ(name.find("_ms"), std::string::npos) << name << ": seconds, not milliseconds";
    ++families;
    pos = end;
  }
  EXPECT_EQ(families, 43u);
}

}  // namespace
}  // namespace outbox::relay
