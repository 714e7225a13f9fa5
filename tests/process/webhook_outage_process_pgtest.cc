// Webhook endpoint outages with the real `outbox-relay` binary against a loopback receiver
// that fails, throttles, answers slowly and recovers (issue 17): the circuit breaker spends no
// attempts on an endpoint that is down, a Retry-After pauses the endpoint, and a slow endpoint
// causes no duplicates.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "outbox_test/http_receiver.h"
#include "outbox_test/wait.h"
#include "process_harness.h"

namespace outbox::testing {
namespace {

using namespace std::chrono_literals;

const char* const kSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

class WebhookOutageTest : public RelayProcessFixture {
 protected:
  // One webhook destination named kTopic (so Enqueue writes to it), small timings.
  std::string WebhookYaml(const std::string& webhook_extra, const std::string& retry) const {
    std::ostringstream y;
    y << "database_url: \"" << db_url_ << "\"\n"
      << "batch_size: 50\n"
      << "lease_ms: 3000\n"
      << "poll_interval_ms: 200\n"
      << "reap_interval_ms: 200\n"
      << "full_sweep_interval_ms: 2000\n"
      << "shutdown_timeout_ms: " << kShutdownTimeout.count() << "\n"
      << "log: {level: info, format: text}\n"
      << "destinations:\n"
      << "  " << kTopic << ":\n"
      << "    webhook:\n"
      << "      url: \"" << receiver_.Url("/hooks") << "\"\n"
      << "      secret: \"" << kSecret << "\"\n"
      << "      timeout_ms: 1000\n"
      << "      connect_timeout_ms: 500\n"
      << "      allow_private_networks: true\n"
      << webhook_extra << "    retry: " << retry << "\n";
    return y.str();
  }

  // Requests received, by webhook-id, and how many of them were answered 2xx.
  struct Seen {
    std::map<std::string, int> requests;
    std::map<std::string, int> delivered;
  };
  Seen Tally() const {
    Seen s;
    std::lock_guard lock(mu_);
    for (const auto& [id, status] : answers_) {
      ++s.requests[id];
      if (status >= 200 && status <= 299) ++s.delivered[id];
    }
    return s;
  }
  // Answers every request with `decide(request)` and records (webhook-id, status).
  void Answer(std::function<Reply(const ReceivedRequest&)> decide) {
    receiver_.SetResponder([this, decide](const ReceivedRequest& r) {
      Reply reply = decide(r);
      std::lock_guard lock(mu_);
      answers_.emplace_back(r.Header("webhook-id"), reply.status);
      return reply;
    });
  }
  std::size_t Answered() const {
    std::lock_guard lock(mu_);
    return answers_.size();
  }

  HttpReceiver receiver_;
  mutable std::mutex mu_;
  std::vector<std::pair<std::string, int>> answers_;  // guarded by mu_
};

TEST_F(WebhookOutageTest, AnOutageOpensTheBreakerSpendsNoAttemptsAndDeliveryResumes) {
  std::atomic<bool> down{true};
  Answer([&](const ReceivedRequest&) {
    return down ? Reply{503, "maintenance", {}, 0ms} : Reply{200, "ok", {}, 0ms};
  });
  // Four attempts within a second: without the breaker the outage below would dead-letter
  // every message several times over.
  const std::string config = WriteConfig(
      "relay.yaml", WebhookYaml("      max_in_flight: 4\n"
                                "      adaptive_concurrency: false\n"
                                "      breaker: {failure_threshold: 5, cooldown_ms: 300, "
                                "max_cooldown_ms: 600}\n",
                                "{schedule_ms: [100, 200, 400]}"));
  const ExpectedMap expected = Enqueue(200, 20, 5);
  ChildProcess& relay = StartRelay(config);
  ASSERT_TRUE(WaitFor(
      [&] { return relay.Stderr().find("circuit breaker OPEN") != std::string::npos; }, 30s))
      << relay.Stderr();
  const auto opened_at = Answered();
  const auto opened_time = std::chrono::steady_clock::now();

  // The outage goes on for 4 s: a probe every 300-600 ms, nothing else.
  // `status` shows the relay's breaker once its next heartbeat carried it.
  std::string shown;
  const bool seen = WaitFor(
      [&] {
        ChildProcess& status = Spawn("status", {"status", "--config", config, "--json"});
        if (!status.WaitExit(30s)) return false;
        shown = status.Stdout();
        const auto snapshot = nlohmann::json::parse(shown);
        for (const auto& d : snapshot["destinations"]) {
          if (d["destination"] != kTopic) continue;
          for (const auto& t : d["targets"]) {
            if (t["breaker"] != "closed" && t["times_opened"].get<int>() >= 1) return true;
          }
        }
        return false;
      },
      20s, 500ms);
  EXPECT_TRUE(seen) << "status shows the relay's open breaker: " << shown;
  const auto deadline = std::chrono::steady_clock::now() + 4s;
  WaitFor([&] { return std::chrono::steady_clock::now() >= deadline; }, 10s);
  const auto during = Answered() - opened_at;
  const auto cooldowns = (std::chrono::steady_clock::now() - opened_time) / 300ms;
  EXPECT_LE(during, static_cast<std::size_t>(4 + cooldowns + 1))
      << "in-flight requests that ended after the opening, then one probe per cool-down";
  EXPECT_GE(during, 2u) << "probes went out";
  EXPECT_EQ(DeadLetters(), 0) << "an open breaker burns no attempts";
  EXPECT_LE(Scalar("SELECT coalesce(max(attempts), 0) FROM outbox.messages"), 3);

  down = false;
  ASSERT_TRUE(DrainedBy({&relay}, 60s));
  EXPECT_EQ(DeadLetters(), 0);
  const Seen s = Tally();
  EXPECT_EQ(s.delivered.size(), expected.size()) << "every message delivered";
  for (const auto& [id, n] : s.delivered) EXPECT_EQ(n, 1) << id << " delivered twice";
  EXPECT_NE(relay.Stderr().find("probe succeeded; circuit breaker closed"), std::string::npos)
      << relay.Stderr();
  StopGracefully(relay);
}

TEST_F(WebhookOutageTest, RetryAfterPausesTheWholeEndpoint) {
  std::mutex mu;
  std::vector<std::chrono::steady_clock::time_point> at;
  std::atomic<int> n{0};
  Answer([&](const ReceivedRequest& r) {
    {
      std::lock_guard lock(mu);
      at.push_back(r.at);
    }
    return n++ == 0 ? Reply{429, "slow down", {{"Retry-After", "2"}}, 0ms}
                    : Reply{200, "ok", {}, 0ms};
  });
  const std::string config = WriteConfig(
      "relay.yaml", WebhookYaml("      max_in_flight: 1\n", "{schedule_ms: [100, 200]}"));
  const ExpectedMap expected = Enqueue(30, 30, 0);
  ChildProcess& relay = StartRelay(config);
  ASSERT_TRUE(DrainedBy({&relay}, 60s));
  EXPECT_EQ(DeadLetters(), 0);
  std::lock_guard lock(mu);
  ASSERT_GE(at.size(), 31u) << "30 deliveries and the 429";
  EXPECT_GE(at[1] - at[0], 1800ms) << "nothing was sent to the endpoint during its pause";
  EXPECT_NE(relay.Stderr().find("pausing it for"), std::string::npos) << relay.Stderr();
  EXPECT_EQ(Tally().delivered.size(), expected.size());
  StopGracefully(relay);
}

TEST_F(WebhookOutageTest, ASlowEndpointCausesNoDuplicatesAndNoExtraAttempts) {
  // Each request takes 300 ms and two run at once: the last of 40 messages waits about 6 s in
  // the relay, twice the 3 s lease. Leases of what the relay holds are renewed.
  Answer([](const ReceivedRequest&) { return Reply{200, "ok", {}, 300ms}; });
  const std::string config = WriteConfig(
      "relay.yaml", WebhookYaml("      max_in_flight: 2\n", "{schedule_ms: [100, 200]}"));
  const ExpectedMap expected = Enqueue(40, 40, 0);
  ChildProcess& relay = StartRelay(config);
  ASSERT_TRUE(DrainedBy({&relay}, 60s));
  const Seen s = Tally();
  EXPECT_EQ(s.requests.size(), expected.size());
  for (const auto& [id, n] : s.requests) EXPECT_EQ(n, 1) << id << " sent more than once";
  EXPECT_EQ(relay.Stderr().find("fenced"), std::string::npos) << "no lease moved on";
  EXPECT_EQ(relay.Stderr().find("reaper"), std::string::npos) << relay.Stderr();
  StopGracefully(relay);
}

TEST_F(WebhookOutageTest, AHangingEndpointMakesNoLeaseExpireAndNothingIsDeliveredTwice) {
  // For 5 s every request hangs past timeout_ms (1 s); then the endpoint answers at once.
  // Requests that time out are failed attempts (and open the breaker); none may lead to a
  // second delivery: what waits in the relay keeps its lease (3 s) however long it waits.
  std::atomic<bool> hanging{true};
  Answer([&](const ReceivedRequest&) {
    // (A hung request's answer comes after the relay gave up; its status is only the
    // test's record that it hung.)
    return hanging ? Reply{504, "too late", {}, 1500ms} : Reply{200, "ok", {}, 0ms};
  });
  const std::string config = WriteConfig(
      "relay.yaml", WebhookYaml("      max_in_flight: 4\n"
                                "      breaker: {failure_threshold: 8, cooldown_ms: 500, "
                                "max_cooldown_ms: 1000}\n",
                                "{schedule_ms: [200, 400, 800], max_attempts: 20}"));
  const ExpectedMap expected = Enqueue(60, 60, 0);
  ChildProcess& relay = StartRelay(config);
  ASSERT_TRUE(WaitFor([&] { return Answered() >= 4; }, 30s));
  const auto until = std::chrono::steady_clock::now() + 5s;
  WaitFor([&] { return std::chrono::steady_clock::now() >= until; }, 10s);
  hanging = false;
  ASSERT_TRUE(DrainedBy({&relay}, 60s));
  EXPECT_EQ(DeadLetters(), 0);
  const Seen s = Tally();
  EXPECT_EQ(s.requests.size(), expected.size());
  // Timed-out requests are failed attempts, retried (at least once). What must not happen is
  // a lease expiring while a message waits in the relay: no settle fenced, nothing reaped,
  // and once the endpoint answers, every message is delivered exactly once.
  EXPECT_EQ(relay.Stderr().find("fenced"), std::string::npos) << relay.Stderr();
  EXPECT_EQ(relay.Stderr().find("reaper: returned"), std::string::npos) << relay.Stderr();
  EXPECT_EQ(s.delivered.size(), expected.size());
  for (const auto& [id, n] : s.delivered) EXPECT_EQ(n, 1) << id << " delivered twice";
  StopGracefully(relay);
}

}  // namespace
}  // namespace outbox::testing
