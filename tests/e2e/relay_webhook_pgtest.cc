// The relay end to end with webhook destinations: real PostgreSQL, the dispatcher, the
// webhook sink and in-process HTTP receivers on loopback.
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <map>
#include <mutex>
#include <pqxx/pqxx>
#include <set>
#include <sstream>
#include <thread>

#include "outbox/outbox.h"
#include "outbox_relay/dispatcher.h"
#include "outbox_relay/webhook_sink.h"
#include "outbox_test/http_receiver.h"
#include "outbox_test/pg.h"
#include "outbox_test/wait.h"

namespace outbox::relay {
namespace {

using namespace std::chrono_literals;
using testing::HttpReceiver;
using testing::Reply;
using testing::WaitFor;

constexpr const char* kSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

class RelayWebhookTest : public testing::PgTest {
 protected:
  Destination Hook(const std::string& name, const HttpReceiver& r, int max_in_flight = 8) {
    Destination d;
    d.name = name;
    WebhookTarget w;
    w.url = r.Url("/hooks/" + name);
    w.allow_private_networks = true;  // the receiver is on loopback
    w.secrets = {kSecret};
    w.timeout = 5000ms;
    w.max_in_flight = max_in_flight;
    d.target = w;
    d.retry.max_attempts = 20;
    d.retry.initial_backoff = 20ms;
    d.retry.max_backoff = 200ms;
    return d;
  }

  std::unique_ptr<Dispatcher> StartRelay(const std::vector<Destination>& dests,
                                         Millis lease = Millis(30'000),
                                         Millis longest_attempt = Millis(10'000),
                                         bool bucket_leases = false) {
    RelayConfig cfg;
    cfg.database_url = db_url_;
    if (bucket_leases) {
      cfg.claim_mode = ClaimMode::kPartitioned;
      cfg.bucket_leases = true;
    }
    cfg.lease = lease;
    cfg.renew_every = RenewEvery(lease, longest_attempt);  // as ParseConfig sets it
    cfg.batch_size = 100;
    cfg.poll_interval = 100ms;
    cfg.reap_interval = 500ms;
    cfg.shutdown_timeout = 3000ms;
    std::map<std::string, SinkPtr> sinks;
    for (const auto& d : dests) {
      cfg.destinations.emplace(d.name, d);
      sinks.emplace(d.name, MakeWebhookSink(d.name, d.target.Get<WebhookTarget>()));
    }
    auto relay = std::make_unique<Dispatcher>(cfg, std::move(sinks));
    relay->Start();
    return relay;
  }

  void Enqueue(const std::string& dest, int n, int keys) {
    pqxx::connection c(db_url_);
    pqxx::work tx(c);
    std::vector<outbox::OutboxMessage> batch;
    for (int i = 0; i < n; ++i) {
      auto b = outbox::Message::To(dest);
      b.Json("{\"seq\": " + std::to_string(i) + "}").EventType("thing.happened");
      if (keys > 0) b.Key("key-" + std::to_string(i % keys));
      batch.push_back(b.Build());
    }
    outbox::PublishMany(tx, batch);
    tx.commit();
  }

  std::int64_t Scalar(const std::string& sql) {
    pqxx::connection c(db_url_);
    pqxx::nontransaction tx(c);
    return tx.exec1(sql)[0].as<std::int64_t>();
  }
};

TEST_F(RelayWebhookTest, ASlowEndpointDoesNotHoldBackAnotherDestination) {
  HttpReceiver slow, fast;
  slow.SetResponder([](const testing::ReceivedRequest&) {
    Reply r;
    r.status = 200;
    r.delay = 1500ms;
    return r;
  });
  Enqueue("slow", 40, 0);
  Enqueue("fast", 300, 0);
  auto relay = StartRelay({Hook("slow", slow, 2), Hook("fast", fast, 8)});
  // The slow destination needs 40 x 1.5 s / 2 = 30 s; the fast one must not wait for it.
  ASSERT_TRUE(WaitFor(
      [&] {
        return Scalar("SELECT count(*) FROM outbox.messages WHERE destination = 'fast'") == 0;
      },
      25s))
      << fast.Count();
  EXPECT_GE(fast.Count(), 300u);
  EXPECT_LT(slow.Count(), 40u)
      << "the slow endpoint was still busy: the fast one did not wait for it";
  relay->Stop();
}

// Messages waiting in the sink behind a slow endpoint wait longer than their lease, though
// each attempt fits in one: the relay renews the leases of what it still holds, so nothing is
// reaped, sent twice or charged an extra attempt.
TEST_F(RelayWebhookTest, LeasesOfMessagesStillQueuedInTheSinkAreRenewedNotReaped) {
  HttpReceiver slow;
  slow.SetResponder([](const testing::ReceivedRequest&) {
    Reply r;
    r.delay = 500ms;
    return r;
  });
  Enqueue("slow", 14, 0);
  // One request at a time: the 14th claimed message waits ~6.5 s, over twice the lease. The
  // lease covers one whole attempt (timeout_ms 800) between renewals
  // (as often as ParseConfig would renew: RenewEvery), as the config's checks require: a
  // worker writes no request its claim would not cover.
  Destination hook = Hook("slow", slow, 1);
  hook.target.Get<WebhookTarget>().timeout = 800ms;
  hook.target.Get<WebhookTarget>().connect_timeout = 500ms;
  auto relay = StartRelay({hook}, 3000ms, /*longest_attempt=*/1300ms);
  ASSERT_TRUE(WaitFor([&] { return Scalar("SELECT count(*) FROM outbox.messages") == 0; }, 30s));
  relay->Stop();
  EXPECT_EQ(slow.Count(), 14u) << "a message was sent twice";
  EXPECT_EQ(relay->stats().reaped, 0);
  EXPECT_EQ(relay->stats().fenced, 0);
  EXPECT_EQ(relay->stats().delivered, 14);
}

// Under bucket leases a message's claim is its bucket's, renewed by heartbeats a few seconds at
// a time (partition_lease_ms, 5 s): a worker that asked it to cover the request's whole timeout
// (10 s by default) sent nothing, handing every message back again and again (review of the
// change that asked row leases for it).
TEST_F(RelayWebhookTest, UnderBucketLeasesAWebhookDestinationDeliversWithTheDefaultTimeout) {
  HttpReceiver hook;
  Enqueue("hooks", 30, 5);
  Destination d = Hook("hooks", hook);
  d.target.Get<WebhookTarget>().timeout = 10'000ms;  // over partition_lease_ms
  auto relay = StartRelay({d}, Millis(30'000), Millis(15'000), /*bucket_leases=*/true);
  ASSERT_TRUE(WaitFor([&] { return Scalar("SELECT count(*) FROM outbox.messages") == 0; }, 30s))
      << hook.Count() << " received";
  relay->Stop();
  EXPECT_EQ(hook.Count(), 30u);
}

// What docs/webhooks.md promises a receiver: a JSON payload arrives in jsonb's normal form
// (keys sorted, duplicates reduced, one space after ':' and ','), a bytes payload byte for byte.
// W3C trace context written in SQL reaches the webhook receiver unchanged (issue 14), and the
// relay logs its trace id whatever the case of the header's name (an HTTP header name's case
// means nothing; migration 0031 checks the value under any case).
TEST_F(RelayWebhookTest, TraceContextWrittenInSqlArrivesUnchangedAsHttpHeaders) {
  HttpReceiver hook;
  const std::string traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
  {
    pqxx::connection c(db_url_);
    pqxx::work tx(c);
    tx.exec_params(
        "SELECT outbox.enqueue('hooks', '{\"n\": 1}'::jsonb, headers => "
        "jsonb_build_object('Traceparent', $1::text, 'tracestate', 'congo=t61rcWkgMzE'))",
        traceparent);
    tx.commit();
  }
  // The relay logs the trace id with the delivery outcome (at trace level for a delivery).
  std::ostringstream log;
  auto previous = spdlog::default_logger();
  auto capture = std::make_shared<spdlog::logger>(
      "capture", std::make_shared<spdlog::sinks::ostream_sink_mt>(log));
  capture->set_level(spdlog::level::trace);
  spdlog::set_default_logger(capture);
  auto relay = StartRelay({Hook("hooks", hook)});
  ASSERT_TRUE(hook.WaitForCount(1, 30s));
  ASSERT_TRUE(WaitFor([&] { return Scalar("SELECT count(*) FROM outbox.messages") == 0; }, 30s))
      << "settled";
  relay->Stop();
  spdlog::set_default_logger(previous);
  EXPECT_EQ(hook.Requests()[0].Header("traceparent"), traceparent);
  EXPECT_EQ(hook.Requests()[0].Header("tracestate"), "congo=t61rcWkgMzE");
  EXPECT_NE(log.str().find("delivered trace_id=0af7651916cd43dd8448eb211c80319c"),
            std::string::npos)
      << log.str();
}

TEST_F(RelayWebhookTest, AReceiverGetsJsonInItsNormalFormAndBytesAsWritten) {
  HttpReceiver hook;
  {
    pqxx::connection c(db_url_);
    pqxx::work tx(c);
    outbox::PublishMany(
        tx,
        {outbox::Message::To("hooks").Json(R"({"b":1,"a":2,"a":3,"list":[1,2]})").Build(),
         outbox::Message::To("hooks").Bytes(std::string("{\"b\":1,\"a\":2}\0\xff", 15)).Build()});
    tx.commit();
  }
  auto relay = StartRelay({Hook("hooks", hook)});
  ASSERT_TRUE(hook.WaitForCount(2, 30s));
  relay->Stop();
  std::set<std::string> bodies;
  for (const auto& r : hook.Requests()) bodies.insert(r.body);
  EXPECT_EQ(bodies.count(R"({"a": 3, "b": 1, "list": [1, 2]})"), 1u);
  EXPECT_EQ(bodies.count(std::string("{\"b\":1,\"a\":2}\0\xff", 15)), 1u);
}

TEST_F(RelayWebhookTest, PerKeyOrderHoldsWithSeveralKeysInFlightAndFailures) {
  HttpReceiver hook;
  std::atomic<int> calls{0}, in_flight{0}, max_in_flight{0};
  std::mutex mu;
  std::map<std::string, std::vector<int>> accepted;  // key -> seq values answered 2xx, in order
  hook.SetResponder([&](const testing::ReceivedRequest& req) {
    const int now = ++in_flight;
    int prev = max_in_flight.load();
    while (now > prev && !max_in_flight.compare_exchange_weak(prev, now)) {
    }
    // The endpoint takes a few milliseconds to answer (server-side work, not a test wait),
    // so concurrent requests overlap here.
    std::this_thread::sleep_for(5ms);
    Reply r;
    if (++calls % 5 == 0) {
      r.status = 503;  // every fifth call fails and is retried
    } else {
      std::lock_guard lk(mu);
      const auto pos = req.body.find("\"seq\": ");
      const int seq = std::stoi(req.body.substr(pos + 7));
      accepted["key-" + std::to_string(seq % 6)].push_back(seq);
    }
    --in_flight;
    return r;
  });
  Enqueue("hooks", 240, 6);
  auto relay = StartRelay({Hook("hooks", hook, 8)});
  ASSERT_TRUE(WaitFor([&] { return Scalar("SELECT count(*) FROM outbox.messages") == 0; }, 60s));
  std::lock_guard lk(mu);
  std::set<int> all;
  for (const auto& [key, seqs] : accepted) {
    std::set<int> seen;
    int last = -1;
    for (int seq : seqs) {
      if (!seen.insert(seq).second) continue;  // a duplicate
      EXPECT_GT(seq, last) << key << " out of order";
      last = seq;
      all.insert(seq);
    }
  }
  EXPECT_EQ(all.size(), 240u);
  EXPECT_GT(max_in_flight.load(), 1) << "different keys went out concurrently";
  EXPECT_LE(max_in_flight.load(), 8) << "max_in_flight honoured";
  EXPECT_EQ(Scalar("SELECT count(*) FROM outbox.dead_letters"), 0);
}

TEST_F(RelayWebhookTest, FailuresRetryWithTheSameIdAndClientErrorsDeadLetter) {
  HttpReceiver hook;
  std::atomic<int> calls{0};
  hook.SetResponder([&](const testing::ReceivedRequest& req) {
    Reply r;
    if (req.body.find("\"seq\": 0") != std::string::npos) {
      r.status = 422;
      r.body = "schema mismatch: field amount missing";
    } else if (++calls <= 2) {
      r.status = 500;  // the first two deliveries of seq 1 fail
    }
    return r;
  });
  Enqueue("hooks", 2, 0);
  auto relay = StartRelay({Hook("hooks", hook)});
  ASSERT_TRUE(WaitFor([&] { return Scalar("SELECT count(*) FROM outbox.messages") == 0; }, 30s));
  EXPECT_EQ(Scalar("SELECT count(*) FROM outbox.dead_letters WHERE reason LIKE '%422%' "
                   "AND reason LIKE '%schema mismatch%'"),
            1);
  std::vector<std::string> ids_of_seq1;
  for (const auto& r : hook.Requests()) {
    if (r.body.find("\"seq\": 1") != std::string::npos)
      ids_of_seq1.push_back(r.Header("webhook-id"));
  }
  ASSERT_EQ(ids_of_seq1.size(), 3u) << "two failures, then success";
  EXPECT_EQ(ids_of_seq1[0], ids_of_seq1[1]);
  EXPECT_EQ(ids_of_seq1[1], ids_of_seq1[2]);
  for (const auto& r : hook.Requests()) {
    EXPECT_TRUE(VerifyStandardWebhook(kSecret, r.Header("webhook-id"),
                                      std::stoll(r.Header("webhook-timestamp")), r.body,
                                      r.Header("webhook-signature")));
  }
}

}  // namespace
}  // namespace outbox::relay
