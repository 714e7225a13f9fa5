// The webhook service (issue 13) with the real `outbox-relay` binary: endpoints stored in
// Postgres and managed with `outbox-relay endpoints` while the relay runs, fan-out with
// event-type filters, one failing endpoint beside healthy ones, disable/enable, and secret
// rotation checked by a receiver holding either secret.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "outbox_relay/webhook_service.h"
#include "outbox_relay/webhook_sink.h"
#include "outbox_test/http_receiver.h"
#include "outbox_test/wait.h"
#include "process_harness.h"

namespace outbox::testing {
namespace {

using namespace std::chrono_literals;

constexpr const char* kDest = "hooks";

struct Request {
  std::string path;
  std::string id;  // webhook-id
  std::string timestamp;
  std::string signature;
  std::string body;
  int status = 0;
};

class WebhookServiceTest : public RelayProcessFixture {
 protected:
  void SetUp() override {
    RelayProcessFixture::SetUp();
    receiver_.SetResponder([this](const ReceivedRequest& r) {
      int status = 200;
      {
        std::lock_guard lock(mu_);
        if (auto it = status_by_path_.find(r.path); it != status_by_path_.end()) {
          status = it->second;
        }
        requests_.push_back(Request{r.path, r.Header("webhook-id"), r.Header("webhook-timestamp"),
                                    r.Header("webhook-signature"), r.body, status});
      }
      return Reply{status, status == 200 ? "ok" : "down", {}, 0ms};
    });
  }

  std::string ServiceYaml() const {
    std::ostringstream y;
    y << "database_url: \"" << db_url_ << "\"\n"
      << "batch_size: 50\n"
      << "lease_ms: 5000\n"
      << "poll_interval_ms: 200\n"
      << "reap_interval_ms: 200\n"
      << "full_sweep_interval_ms: 2000\n"
      << "shutdown_timeout_ms: " << kShutdownTimeout.count() << "\n"
      << "log: {level: info, format: text}\n"
      << "destinations:\n"
      << "  " << kDest << ":\n"
      << "    webhook:\n"
      << "      endpoints: database\n"
      << "      timeout_ms: 1000\n"
      << "      connect_timeout_ms: 500\n"
      << "      max_in_flight: 4\n"
      << "      allow_private_networks: true\n"
      << "      breaker: {failure_threshold: 3, cooldown_ms: 200, max_cooldown_ms: 400}\n"
      << "    retry: {schedule_ms: [100, 200, 400], max_attempts: 50}\n";
    return y.str();
  }

  // Runs `outbox-relay <args> --config <config>`; the exit code and stdout.
  std::pair<int, std::string> Cli(std::vector<std::string> args) {
    args.push_back("--config");
    args.push_back(config_);
    ChildProcess& p = Spawn("cli-" + std::to_string(++cli_runs_), args);
    if (!p.WaitExit(30s)) return {-1, "timed out"};
    const int code = p.ExitedWith(0) ? 0 : 1;
    return {code, code == 0 ? p.Stdout() : p.Stderr()};
  }
  // `endpoints add`; returns the secret it printed.
  std::string AddEndpoint(const std::string& id, const std::vector<std::string>& extra = {}) {
    std::vector<std::string> args = {"endpoints",     "add", "--id",  id,
                                     "--destination", kDest, "--url", receiver_.Url("/" + id),
                                     "--json"};
    args.insert(args.end(), extra.begin(), extra.end());
    const auto [code, out] = Cli(args);
    EXPECT_EQ(code, 0) << out;
    if (code != 0) return "";
    return nlohmann::json::parse(out)["secret"].get<std::string>();
  }

  // Writes n messages: event types cycle through `types`, keys k0..k{keys-1}; payload
  // {"n": first + i, "key": ...}.
  void Write(int first, int n, int keys, const std::vector<std::string>& types) {
    std::ostringstream sql;
    sql << "SELECT count(outbox.enqueue('" << kDest << "', jsonb_build_object('n', g, 'key', "
        << "'k' || (g % " << keys << ")), 'k' || (g % " << keys << "), '{}'::jsonb, (ARRAY[";
    for (std::size_t i = 0; i < types.size(); ++i) sql << (i ? "," : "") << "'" << types[i] << "'";
    sql << "])[1 + g % " << types.size() << "])) FROM generate_series(" << first << ", "
        << first + n - 1 << ") g";
    ASSERT_EQ(Scalar(sql.str()), n);
  }

  std::vector<Request> Requests() const {
    std::lock_guard lock(mu_);
    return requests_;
  }
  // The distinct messages (payload n) an endpoint acknowledged with 2xx.
  std::set<int> DeliveredTo(const std::string& id) const {
    std::set<int> out;
    for (const auto& r : Requests()) {
      if (r.path == "/" + id && r.status == 200) {
        out.insert(nlohmann::json::parse(r.body)["n"].get<int>());
      }
    }
    return out;
  }
  void SetStatus(const std::string& id, int status) {
    std::lock_guard lock(mu_);
    status_by_path_["/" + id] = status;
  }
  static std::set<int> Range(int first, int n, std::function<bool(int)> keep = nullptr) {
    std::set<int> s;
    for (int i = first; i < first + n; ++i) {
      if (!keep || keep(i)) s.insert(i);
    }
    return s;
  }
  bool LogSays(ChildProcess& relay, const std::string& text) {
    return WaitFor([&] { return relay.Stderr().find(text) != std::string::npos; }, 20s);
  }
  // Per key, the messages an endpoint acknowledged came in the order they were written.
  void ExpectKeyOrder(const std::string& id) {
    std::map<std::string, int> last;
    for (const auto& r : Requests()) {
      if (r.path != "/" + id || r.status != 200) continue;
      const auto body = nlohmann::json::parse(r.body);
      const std::string key = body["key"].get<std::string>();
      const int n = body["n"].get<int>();
      if (auto it = last.find(key); it != last.end()) {
        EXPECT_GT(n, it->second) << "endpoint " << id << ", key " << key << ": " << n
                                 << " acknowledged after " << it->second;
      }
      last[key] = std::max(last[key], n);
    }
  }

  HttpReceiver receiver_;
  std::string config_;
  int cli_runs_ = 0;
  mutable std::mutex mu_;
  std::vector<Request> requests_;              // guarded by mu_
  std::map<std::string, int> status_by_path_;  // guarded by mu_
};

TEST_F(WebhookServiceTest, FansOutToEveryMatchingEndpointSignedWithItsOwnSecret) {
  config_ = WriteConfig("relay.yaml", ServiceYaml());
  const std::string all = AddEndpoint("all");
  const std::string inv = AddEndpoint("inv", {"--event-type", "invoice.*"});
  const std::string ord = AddEndpoint("ord", {"-e", "order.created", "-e", "order.paid"});
  ASSERT_FALSE(all.empty() || inv.empty() || ord.empty());
  // g % 3: 0 invoice.paid, 1 order.created, 2 user.signup
  Write(1, 60, 4, {"invoice.paid", "order.created", "user.signup"});
  const auto written_keys = Scalar("SELECT count(*) FROM outbox.messages");
  ASSERT_EQ(written_keys, 60);
  ChildProcess& relay = StartRelay(config_);

  const auto want_all = Range(1, 60);
  const auto want_inv = Range(1, 60, [](int g) { return g % 3 == 0; });
  const auto want_ord = Range(1, 60, [](int g) { return g % 3 == 1; });
  ASSERT_TRUE(WaitFor(
      [&] {
        return DeliveredTo("all") == want_all && DeliveredTo("inv") == want_inv &&
               DeliveredTo("ord") == want_ord && Queued() == 0;
      },
      60s))
      << relay.Stderr();
  EXPECT_EQ(DeadLetters(), 0);
  EXPECT_EQ(Scalar("SELECT count(*) FROM outbox.messages WHERE endpoint_id IS NOT NULL"), 0)
      << "every endpoint took its messages on the first send: no rows of its own";

  // Each request is signed with its endpoint's secret (and no other), and its webhook-id is
  // the endpoint's delivery id: distinct per endpoint, stable for the message.
  const std::map<std::string, std::string> secrets = {{"/all", all}, {"/inv", inv}, {"/ord", ord}};
  std::map<std::string, std::set<std::string>> ids_by_path;
  for (const auto& r : Requests()) {
    const long long ts = std::stoll(r.timestamp);
    EXPECT_TRUE(relay::VerifyStandardWebhook(secrets.at(r.path), r.id, ts, r.body, r.signature))
        << r.path;
    for (const auto& [path, secret] : secrets) {
      if (path != r.path) {
        EXPECT_FALSE(relay::VerifyStandardWebhook(secret, r.id, ts, r.body, r.signature));
      }
    }
    ids_by_path[r.path].insert(r.id);
  }
  for (const auto& [path, ids] : ids_by_path) {
    for (const auto& [other, other_ids] : ids_by_path) {
      if (other == path) continue;
      for (const auto& id : ids) EXPECT_FALSE(other_ids.count(id)) << id << " sent twice";
    }
  }
  ExpectKeyOrder("all");
  ExpectKeyOrder("inv");
  StopGracefully(relay);
}

TEST_F(WebhookServiceTest, AFailingEndpointHoldsBackNoOtherAndKeepsItsOwnOrder) {
  config_ = WriteConfig("relay.yaml", ServiceYaml());
  ASSERT_FALSE(AddEndpoint("good").empty());
  ASSERT_FALSE(AddEndpoint("bad").empty());
  SetStatus("bad", 503);
  Write(1, 80, 5, {"order.created"});
  ChildProcess& relay = StartRelay(config_);

  // The healthy endpoint gets everything while the other one fails...
  ASSERT_TRUE(WaitFor([&] { return DeliveredTo("good") == Range(1, 80); }, 60s)) << relay.Stderr();
  // ...and what the failing one owes waits in rows of its own, with no dead letter.
  ASSERT_TRUE(WaitFor(
      [&] {
        return Scalar("SELECT count(*) FROM outbox.messages WHERE endpoint_id = 'bad'") == 80 &&
               Scalar("SELECT count(*) FROM outbox.messages WHERE endpoint_id IS NULL") == 0;
      },
      30s));
  EXPECT_EQ(DeadLetters(), 0);
  EXPECT_TRUE(DeliveredTo("bad").empty());
  const auto [code, shown] = Cli({"endpoints", "show", "bad", "--json"});
  ASSERT_EQ(code, 0) << shown;
  EXPECT_EQ(nlohmann::json::parse(shown)["backlog"].get<int>(), 80);

  // It recovers: everything arrives, per key in the order written.
  SetStatus("bad", 200);
  ASSERT_TRUE(WaitFor([&] { return DeliveredTo("bad") == Range(1, 80) && Queued() == 0; }, 90s))
      << relay.Stderr();
  EXPECT_EQ(DeadLetters(), 0);
  ExpectKeyOrder("bad");
  ExpectKeyOrder("good");
  // Retries kept the endpoint's delivery id.
  std::map<std::string, std::set<std::string>> ids_by_body;
  for (const auto& r : Requests()) {
    if (r.path == "/bad") ids_by_body[r.body].insert(r.id);
  }
  for (const auto& [body, ids] : ids_by_body) EXPECT_EQ(ids.size(), 1u) << body;
  StopGracefully(relay);
}

TEST_F(WebhookServiceTest, EndpointsAddedDisabledAndEnabledWhileTrafficFlows) {
  config_ = WriteConfig("relay.yaml", ServiceYaml());
  ASSERT_FALSE(AddEndpoint("a").empty());
  ChildProcess& relay = StartRelay(config_);
  Write(1, 20, 3, {"order.created"});
  ASSERT_TRUE(WaitFor([&] { return DeliveredTo("a") == Range(1, 20) && Queued() == 0; }, 60s))
      << relay.Stderr();

  // Added at run time: it receives what is written from then on, not what was delivered.
  ASSERT_FALSE(AddEndpoint("b").empty());
  ASSERT_TRUE(LogSays(relay, "endpoint b added")) << relay.Stderr();
  Write(21, 20, 3, {"order.created"});
  ASSERT_TRUE(WaitFor(
      [&] { return DeliveredTo("a") == Range(1, 40) && DeliveredTo("b") == Range(21, 20); }, 60s))
      << relay.Stderr();

  // Disabled: nothing is sent to it, and what it misses waits for it.
  auto [code, out] = Cli({"endpoints", "disable", "b", "--reason", "customer asked"});
  ASSERT_EQ(code, 0) << out;
  ASSERT_TRUE(LogSays(relay, "endpoint b disabled")) << relay.Stderr();
  Write(41, 20, 3, {"order.created"});
  ASSERT_TRUE(WaitFor(
      [&] {
        return DeliveredTo("a") == Range(1, 60) &&
               Scalar("SELECT count(*) FROM outbox.messages WHERE endpoint_id = 'b'") == 20;
      },
      60s))
      << relay.Stderr();
  EXPECT_EQ(DeliveredTo("b"), Range(21, 20)) << "a disabled endpoint receives nothing";
  std::tie(code, out) = Cli({"endpoints", "list", "--json"});
  ASSERT_EQ(code, 0) << out;
  for (const auto& e : nlohmann::json::parse(out)) {
    if (e["id"] == "b") {
      EXPECT_FALSE(e["enabled"].get<bool>());
      EXPECT_EQ(e["disabled_reason"], "customer asked");
    }
    EXPECT_FALSE(e.contains("secret")) << "list never shows secrets";
  }

  // Enabled again: it resumes where it stopped, at once, in order.
  std::tie(code, out) = Cli({"endpoints", "enable", "b"});
  ASSERT_EQ(code, 0) << out;
  ASSERT_TRUE(WaitFor([&] { return DeliveredTo("b") == Range(21, 40) && Queued() == 0; }, 30s))
      << relay.Stderr();
  ExpectKeyOrder("b");
  EXPECT_EQ(DeadLetters(), 0);

  // Deleted: no longer sent to.
  std::tie(code, out) = Cli({"endpoints", "delete", "b"});
  ASSERT_EQ(code, 0) << out;
  ASSERT_TRUE(LogSays(relay, "endpoint b removed")) << relay.Stderr();
  Write(61, 10, 3, {"order.created"});
  ASSERT_TRUE(WaitFor([&] { return DeliveredTo("a") == Range(1, 70) && Queued() == 0; }, 60s));
  EXPECT_EQ(DeliveredTo("b"), Range(21, 40));
  StopGracefully(relay);
}

TEST_F(WebhookServiceTest, RotatedSecretsSignTogetherDuringTheOverlapOnly) {
  config_ = WriteConfig("relay.yaml", ServiceYaml());
  const std::string first = AddEndpoint("r");
  ASSERT_FALSE(first.empty());
  ChildProcess& relay = StartRelay(config_);
  auto verifies = [&](int n, const std::string& secret) {
    for (const auto& r : Requests()) {
      if (nlohmann::json::parse(r.body)["n"].get<int>() != n) continue;
      return relay::VerifyStandardWebhook(secret, r.id, std::stoll(r.timestamp), r.body,
                                          r.signature);
    }
    ADD_FAILURE() << "message " << n << " never arrived";
    return false;
  };

  Write(1, 5, 1, {"e"});
  ASSERT_TRUE(WaitFor([&] { return DeliveredTo("r") == Range(1, 5); }, 60s)) << relay.Stderr();

  // Rotation with an overlap: the new and the old secret both sign.
  auto [code, out] = Cli({"endpoints", "rotate-secret", "r", "--overlap", "1h", "--json"});
  ASSERT_EQ(code, 0) << out;
  const std::string second = nlohmann::json::parse(out)["secret"].get<std::string>();
  ASSERT_NE(second, first);
  ASSERT_TRUE(LogSays(relay, "endpoint r updated")) << relay.Stderr();
  Write(6, 5, 1, {"e"});
  ASSERT_TRUE(WaitFor([&] { return DeliveredTo("r") == Range(1, 10); }, 60s));
  for (int n = 6; n <= 10; ++n) {
    EXPECT_TRUE(verifies(n, first)) << "a receiver still on the old secret verifies " << n;
    EXPECT_TRUE(verifies(n, second)) << "a receiver already on the new secret verifies " << n;
  }

  // Rotation without overlap: only the newest signs.
  std::tie(code, out) = Cli({"endpoints", "rotate-secret", "r", "--overlap", "0", "--json"});
  ASSERT_EQ(code, 0) << out;
  const std::string third = nlohmann::json::parse(out)["secret"].get<std::string>();
  ASSERT_TRUE(WaitFor(
      [&] {
        const std::string log = relay.Stderr();
        const auto second_update =
            log.find("endpoint r updated", log.find("endpoint r updated") + 1);
        return second_update != std::string::npos &&
               log.find("1 secret(s)", second_update) != std::string::npos;
      },
      20s))
      << relay.Stderr();
  Write(11, 5, 1, {"e"});
  ASSERT_TRUE(WaitFor([&] { return DeliveredTo("r") == Range(1, 15); }, 60s));
  for (int n = 11; n <= 15; ++n) {
    EXPECT_TRUE(verifies(n, third));
    EXPECT_FALSE(verifies(n, first));
    EXPECT_FALSE(verifies(n, second));
  }
  StopGracefully(relay);
}

TEST_F(WebhookServiceTest, TheCliRefusesBadInputNamingTheFieldAndChangesNothing) {
  config_ = WriteConfig("relay.yaml", ServiceYaml());
  ASSERT_FALSE(AddEndpoint("one").empty());
  struct Case {
    std::vector<std::string> args;
    std::string says;
  };
  const std::vector<Case> cases = {
      {{"endpoints", "add", "-d", kDest, "--url", "ftp://x/y"}, "url \"ftp://x/y\""},
      {{"endpoints", "add", "-d", kDest, "--url", "https://x", "--id", "has space"},
       "endpoint id \"has space\""},
      {{"endpoints", "add", "-d", kDest, "--url", "https://x", "--id", "one"}, "already exists"},
      {{"endpoints", "add", "-d", kDest, "--url", "https://x", "--metadata", "[1]"},
       "metadata must be a JSON object"},
      {{"endpoints", "add", "-d", kDest, "--url", "https://x", "--secret", "nope"},
       "secret must be a Standard Webhooks secret"},
      {{"endpoints", "add", "-d", kDest, "--url", "https://x", "-H", "novalue"},
       "--header \"novalue\""},
      {{"endpoints", "show", "missing"}, "no endpoint has id \"missing\""},
      {{"endpoints", "update", "one"}, "nothing to update"},
      {{"endpoints", "rotate-secret", "one", "--overlap", "soon"}, "--overlap \"soon\""},
      {{"endpoints", "rotate-secret", "missing"}, "no endpoint has id \"missing\""},
  };
  for (const auto& c : cases) {
    const auto [code, out] = Cli(c.args);
    EXPECT_NE(code, 0) << c.args[1];
    EXPECT_NE(out.find(c.says), std::string::npos) << "wanted '" << c.says << "' in: " << out;
  }
  EXPECT_EQ(Scalar("SELECT count(*) FROM outbox.endpoints"), 1) << "nothing half-written";
  EXPECT_EQ(Scalar("SELECT count(*) FROM outbox.endpoint_secrets"), 1);
  // The writer role cannot read endpoints or their secrets.
  EXPECT_EQ(Scalar("SELECT count(*) FROM (VALUES (has_table_privilege('outbox_writer', "
                   "'outbox.endpoint_secrets', 'SELECT') OR has_table_privilege('outbox_writer', "
                   "'outbox.endpoints', 'SELECT'))) v(x) WHERE x"),
            0);
}

}  // namespace
}  // namespace outbox::testing
