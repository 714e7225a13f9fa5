// The management HTTP API (relay/api) on a loopback port against a real PostgreSQL:
// authentication, every route, and bad input answered with a JSON error naming the field,
// with nothing written.
#include <gtest/gtest.h>
#include <httplib.h>
#include <yaml-cpp/yaml.h>

#include <future>
#include <set>
#include <nlohmann/json.hpp>
#include <pqxx/pqxx>
#include <string>
#include <vector>

#include "outbox_relay/management_api.h"
#include "outbox_test/pg.h"
#include "outbox_test/raw_http.h"
#include "outbox_test/wait.h"

namespace outbox::testing {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;

const std::string kToken = "test-token-0123456789abcdef";

class ManagementApiTest : public PgTest {
 protected:
  void SetUp() override {
    PgTest::SetUp();
    api_ = std::make_unique<relay::ManagementApi>("127.0.0.1:0", kToken, db_url_);
    api_->Start();
    client_ = std::make_unique<httplib::Client>("127.0.0.1", api_->port());
    client_->set_default_headers({{"Authorization", "Bearer " + kToken}});
  }
  void TearDown() override { api_->Stop(); }

  struct Answer {
    int status = 0;
    json body;
  };
  static Answer Of(const httplib::Result& r) {
    EXPECT_TRUE(r) << "no answer";
    if (!r) return {};
    return {r->status, r->body.empty() ? json() : json::parse(r->body, nullptr, false)};
  }
  Answer Get(const std::string& path) { return Of(client_->Get(path.c_str())); }
  Answer Post(const std::string& path, const std::string& body) {
    return Of(client_->Post(path.c_str(), body, "application/json"));
  }
  Answer Patch(const std::string& path, const std::string& body) {
    return Of(client_->Patch(path.c_str(), body, "application/json"));
  }
  Answer Delete(const std::string& path) { return Of(client_->Delete(path.c_str())); }
  std::int64_t Scalar(const std::string& sql) {
    pqxx::connection c(db_url_);
    pqxx::nontransaction tx(c);
    return tx.exec1(sql)[0].as<std::int64_t>();
  }
  // Expects a JSON error with this status and code, naming `field` when given.
  static void ExpectError(const Answer& a, int status, const std::string& code,
                          const std::string& field = "") {
    EXPECT_EQ(a.status, status) << a.body.dump();
    ASSERT_TRUE(a.body.is_object() && a.body.contains("error")) << a.body.dump();
    EXPECT_EQ(a.body["error"]["code"], code) << a.body.dump();
    EXPECT_FALSE(a.body["error"]["message"].get<std::string>().empty());
    if (!field.empty()) {
      EXPECT_EQ(a.body["error"].value("field", ""), field) << a.body.dump();
    }
  }

  // The error's message; empty when the answer is no error.
  static std::string ErrorMessage(const Answer& a) {
    const json& b = a.body;
    if (!b.is_object() || !b.contains("error") || !b["error"].is_object()) return "";
    const json& e = b["error"];
    return e.contains("message") && e["message"].is_string() ? e["message"].get<std::string>() : "";
  }

  // Endpoint "acme" of destination "d".
  void AddAcme() {
    ASSERT_EQ(
        Post("/v1/endpoints", R"({"id": "acme", "destination": "d", "url": "https://x"})").status,
        201);
  }

  // Three delivered messages of destination "d" in the archive (retention.archive_delivered).
  void ArchiveThree() {
    Scalar(
        "WITH a AS (INSERT INTO outbox.delivered_archive (id, destination, ordering_key,"
        "  idempotency_key, event_type, headers, payload, attempts, created_at)"
        "  SELECT nextval('outbox.messages_id_seq'), 'd', 'k' || g, gen_random_uuid(), 'e', '{}',"
        "    '1', 1, now() FROM generate_series(1, 3) g RETURNING 1) SELECT count(*) FROM a");
  }

  // A client of its own with the token, that waits `read_timeout` for an answer.
  std::unique_ptr<httplib::Client> ClientWaiting(std::chrono::seconds read_timeout) const {
    auto c = std::make_unique<httplib::Client>("127.0.0.1", api_->port());
    c->set_read_timeout(read_timeout);
    c->set_default_headers({{"Authorization", "Bearer " + kToken}});
    return c;
  }

  std::unique_ptr<relay::ManagementApi> api_;
  std::unique_ptr<httplib::Client> client_;
};

TEST_F(ManagementApiTest, EveryRequestNeedsTheBearerToken) {
  httplib::Client anonymous("127.0.0.1", api_->port());
  for (const auto& headers :
       std::vector<httplib::Headers>{{},
                                     {{"Authorization", "Bearer wrong-token-0123456789abc"}},
                                     {{"Authorization", "Bearer " + kToken + "x"}},
                                     {{"Authorization", kToken}},
                                     {{"Authorization", "Basic " + kToken}}}) {
    const auto get = Of(anonymous.Get("/v1/endpoints", headers));
    ExpectError(get, 401, "unauthorized");
    const auto post = Of(anonymous.Post(
        "/v1/endpoints", headers, R"({"destination": "hooks", "url": "https://example.com/h"})",
        "application/json"));
    ExpectError(post, 401, "unauthorized");
  }
  EXPECT_EQ(Scalar("SELECT count(*) FROM outbox.endpoints"), 0) << "nothing written unauthorized";
  EXPECT_EQ(Get("/v1/endpoints").status, 200);
}

// The auth scheme is case-insensitive (RFC 9110, 11.1): "bearer <token>" from a client that
// writes it in lower case was a 401.
TEST_F(ManagementApiTest, TheBearerSchemeIsMatchedWithoutRegardToCase) {
  for (const std::string scheme : {"bearer ", "BEARER ", "Bearer  "}) {
    httplib::Client c("127.0.0.1", api_->port());
    c.set_default_headers({{"Authorization", scheme + kToken}});
    const auto a = Of(c.Get("/v1/endpoints"));
    EXPECT_EQ(a.status, scheme == "Bearer  " ? 401 : 200) << scheme;
  }
}

// Clients that keep their connections open (a dashboard's pool, a few CLI sessions) each hold
// one of cpp-httplib's workers until the keep-alive ends: with four workers, four idle
// connections made the next request wait 5 s.
TEST_F(ManagementApiTest, RequestsAreAnsweredWhileOtherClientsKeepTheirConnectionsOpen) {
  std::vector<std::unique_ptr<httplib::Client>> idle;
  for (int i = 0; i < 6; ++i) {
    auto c = std::make_unique<httplib::Client>("127.0.0.1", api_->port());
    c->set_keep_alive(true);
    c->set_read_timeout(std::chrono::seconds(2));
    c->set_default_headers({{"Authorization", "Bearer " + kToken}});
    auto res = c->Get("/v1/endpoints");
    ASSERT_TRUE(res) << "client " << i << ": no answer within 2 s";
    idle.push_back(std::move(c));  // the connection stays open, idle
  }
  httplib::Client c("127.0.0.1", api_->port());
  c.set_connection_timeout(std::chrono::seconds(2));
  c.set_read_timeout(std::chrono::seconds(2));
  c.set_default_headers({{"Authorization", "Bearer " + kToken}});
  auto res = c.Get("/v1/endpoints");
  ASSERT_TRUE(res) << "no answer within 2 s: " << httplib::to_string(res.error());
  EXPECT_EQ(res->status, 200);
}

TEST_F(ManagementApiTest, EndpointsAreCreatedReadChangedRotatedAndDeleted) {
  auto created = Post("/v1/endpoints", R"({"id": "acme", "destination": "hooks",
      "url": "https://acme.example/hooks", "event_types": ["invoice.*"],
      "headers": {"X-Tenant": "42"}, "metadata": {"customer": "acme"}, "max_in_flight": 4,
      "description": "ACME production", "rate_limit": 20, "adaptive_concurrency": false,
      "breaker": {"failure_threshold": 5, "cooldown_ms": 2000}})");
  ASSERT_EQ(created.status, 201) << created.body.dump();
  EXPECT_EQ(created.body["id"], "acme");
  const std::string secret = created.body["secret"].get<std::string>();
  EXPECT_EQ(secret.rfind("whsec_", 0), 0u);
  EXPECT_EQ(created.body["event_types"], json::array({"invoice.*"}));
  EXPECT_EQ(created.body["headers"]["X-Tenant"], "42");
  EXPECT_EQ(created.body["metadata"]["customer"], "acme");
  EXPECT_EQ(created.body["max_in_flight"], 4);
  EXPECT_EQ(created.body["rate_limit"], 20);
  EXPECT_EQ(created.body["adaptive_concurrency"], false);
  EXPECT_EQ(created.body["breaker"]["failure_threshold"], 5);
  EXPECT_EQ(created.body["signature"], "hmac");
  EXPECT_TRUE(created.body["enabled"].get<bool>());

  auto generated = Post("/v1/endpoints", R"({"destination": "other", "url": "http://b.example"})");
  ASSERT_EQ(generated.status, 201) << generated.body.dump();
  EXPECT_EQ(generated.body["id"].get<std::string>().rfind("ep_", 0), 0u);

  auto listed = Get("/v1/endpoints?destination=hooks");
  ASSERT_EQ(listed.status, 200);
  ASSERT_EQ(listed.body["data"].size(), 1u);
  EXPECT_FALSE(listed.body["data"][0].contains("secret")) << "secrets are shown once, at creation";
  EXPECT_EQ(listed.body["data"][0]["backlog"], 0);
  EXPECT_EQ(listed.body["data"][0]["backlog_capped"], false) << "a list's counts stop at a cap";
  EXPECT_EQ(listed.body["data"][0]["dead_letters_capped"], false);
  EXPECT_EQ(Get("/v1/endpoints").body["data"].size(), 2u);

  auto patched = Patch("/v1/endpoints/acme", R"({"url": "https://new.acme.example/h",
                                                 "event_types": []})");
  ASSERT_EQ(patched.status, 200) << patched.body.dump();
  EXPECT_EQ(patched.body["url"], "https://new.acme.example/h");
  EXPECT_EQ(patched.body["event_types"], json::array());
  EXPECT_EQ(patched.body["headers"]["X-Tenant"], "42") << "what the patch leaves out stays";

  auto disabled = Post("/v1/endpoints/acme/disable", R"({"reason": "customer asked"})");
  ASSERT_EQ(disabled.status, 200);
  EXPECT_FALSE(disabled.body["enabled"].get<bool>());
  EXPECT_EQ(disabled.body["disabled_reason"], "customer asked");
  auto enabled = Post("/v1/endpoints/acme/enable", "");
  ASSERT_EQ(enabled.status, 200);
  EXPECT_TRUE(enabled.body["enabled"].get<bool>());

  auto rotated = Post("/v1/endpoints/acme/rotate-secret", R"({"overlap_seconds": 3600})");
  ASSERT_EQ(rotated.status, 200) << rotated.body.dump();
  EXPECT_NE(rotated.body["secret"], secret);
  EXPECT_EQ(Get("/v1/endpoints/acme").body["secrets"], 2) << "both sign during the overlap";

  auto replay = Post("/v1/endpoints/acme/replay", R"({"since": "2026-01-01T00:00:00Z"})");
  ASSERT_EQ(replay.status, 202) << replay.body.dump();
  EXPECT_EQ(replay.body["queued"], 0) << "nothing archived yet";
  EXPECT_EQ(replay.body["resumed"], false) << "no replay of it stopped part-way";
  EXPECT_EQ(replay.body["queued_earlier"], 0);
  EXPECT_EQ(replay.body["began"].get<std::string>().size(), 20u) << replay.body.dump();
  auto restarted =
      Post("/v1/endpoints/acme/replay", R"({"since": "2026-01-01T00:00:00Z", "restart": true})");
  ASSERT_EQ(restarted.status, 202) << restarted.body.dump();
  EXPECT_EQ(restarted.body["resumed"], false);
  ExpectError(Post("/v1/endpoints/acme/replay", R"({"since": "2026-01-01Z", "restart": "yes"})"),
              400, "invalid_field", "restart");
  auto attempts = Get("/v1/attempts?endpoint_id=acme&limit=5");
  ASSERT_EQ(attempts.status, 200);
  EXPECT_TRUE(attempts.body["data"].empty());

  EXPECT_EQ(Delete("/v1/endpoints/acme").status, 204);
  ExpectError(Get("/v1/endpoints/acme"), 404, "not_found");
  ExpectError(Delete("/v1/endpoints/acme"), 404, "not_found");
  EXPECT_EQ(Scalar("SELECT count(*) FROM outbox.endpoint_secrets WHERE endpoint_id = 'acme'"), 0);
}

// The delivery log pages back in time: each page's next_before is where the next one starts,
// null on the last. Only the newest `limit` (at most 1000) could be read before: an
// endpoint's older attempts were out of the API's reach (review; Svix pages with iterators).
TEST_F(ManagementApiTest, TheDeliveryLogIsReadPageByPage) {
  Scalar(
      "WITH i AS (INSERT INTO outbox.delivery_attempts (destination, endpoint_id, delivery_id,"
      "  attempted_at, status, outcome, latency_ms) "
      "  SELECT 'd', 'acme', gen_random_uuid(), now() - make_interval(secs => 10 - g), 500, "
      "         'retry', g FROM generate_series(1, 5) g ORDER BY g RETURNING 1) "
      "SELECT count(*) FROM i");
  std::vector<int> latencies;  // generate_series' g: 5 is the newest
  std::string before;
  for (int page = 0; page < 5; ++page) {
    auto r = Get("/v1/attempts?endpoint_id=acme&limit=2" +
                 (before.empty() ? std::string() : "&before=" + before));
    ASSERT_EQ(r.status, 200) << r.body.dump();
    for (const auto& a : r.body["data"]) latencies.push_back(a["latency_ms"].get<int>());
    ASSERT_TRUE(r.body.contains("next_before")) << r.body.dump();
    if (r.body["next_before"].is_null()) break;
    before = std::to_string(r.body["next_before"].get<std::int64_t>());
  }
  EXPECT_EQ(latencies, (std::vector<int>{5, 4, 3, 2, 1}));
  ExpectError(Get("/v1/attempts?before=x"), 400, "invalid_field", "before");
  ExpectError(Get("/v1/attempts?before=0"), 400, "invalid_field", "before");
}

// A destination of thousands of endpoints was one answer counting each one's backlog and dead
// letters: the list is read page by page, as the delivery log is, in the order of
// (destination, id), and a cursor still works after the endpoint it names is deleted.
TEST_F(ManagementApiTest, EndpointsAreListedPageByPage) {
  const std::vector<std::pair<std::string, std::string>> all = {
      {"alpha", "a1"}, {"alpha", "a2"}, {"alpha", "a3"}, {"beta@x", "b1"}, {"beta@x", "b2"}};
  for (const auto& [destination, id] : all) {
    ASSERT_EQ(
        Post("/v1/endpoints",
             json{{"id", id}, {"destination", destination}, {"url", "https://example.com/" + id}}
                 .dump())
            .status,
        201);
  }
  // Every page of two, following next_after: each endpoint once, in order.
  const auto walk = [&](const std::string& query, bool delete_after_first_page) {
    std::vector<std::string> ids;
    std::string after;
    for (int page = 0; page < 10; ++page) {
      std::string path = "/v1/endpoints?limit=2" + query;
      if (!after.empty()) path += "&after=" + httplib::detail::encode_query_param(after);
      auto r = Get(path);
      EXPECT_EQ(r.status, 200) << r.body.dump();
      if (r.status != 200) break;
      EXPECT_LE(r.body["data"].size(), 2u);
      for (const auto& e : r.body["data"]) ids.push_back(e["id"].get<std::string>());
      EXPECT_TRUE(r.body.contains("next_after")) << r.body.dump();
      if (!r.body.contains("next_after") || r.body["next_after"].is_null()) break;
      after = r.body["next_after"].get<std::string>();
      if (delete_after_first_page && page == 0) {
        EXPECT_EQ(Delete("/v1/endpoints/" + ids.back()).status, 204);
      }
    }
    return ids;
  };
  EXPECT_EQ(walk("", false), (std::vector<std::string>{"a1", "a2", "a3", "b1", "b2"}));
  EXPECT_EQ(walk("&destination=beta%40x", false), (std::vector<std::string>{"b1", "b2"}));
  // The last page is not followed by an empty one: b2 ends it with next_after null.
  auto last =
      Get("/v1/endpoints?limit=1&after=" + httplib::detail::encode_query_param("b1@beta@x"));
  ASSERT_EQ(last.status, 200) << last.body.dump();
  ASSERT_EQ(last.body["data"].size(), 1u);
  EXPECT_EQ(last.body["data"][0]["id"], "b2");
  EXPECT_TRUE(last.body["next_after"].is_null()) << last.body.dump();
  // a2, the first page's last, is deleted before the second page is read.
  EXPECT_EQ(walk("", true), (std::vector<std::string>{"a1", "a2", "a3", "b1", "b2"}));
  // Without a limit a page holds 50; more than 1000 are refused.
  for (int i = 0; i < 55; ++i) {
    ASSERT_EQ(Post("/v1/endpoints", json{{"id", "many" + std::to_string(100 + i)},
                                         {"destination", "many"},
                                         {"url", "https://example.com/m"}}
                                        .dump())
                  .status,
              201);
  }
  auto first = Get("/v1/endpoints?destination=many");
  ASSERT_EQ(first.status, 200) << first.body.dump();
  EXPECT_EQ(first.body["data"].size(), 50u);
  EXPECT_EQ(first.body["next_after"], "many149@many");
  for (const std::string bad : {"0", "1001", "x", "5x", ""}) {
    ExpectError(Get("/v1/endpoints?limit=" + bad), 400, "invalid_field", "limit");
  }
  for (const std::string bad : {"a1", "@alpha", "a%20b@alpha", ""}) {
    ExpectError(Get("/v1/endpoints?after=" + bad), 400, "invalid_field", "after");
  }
}

TEST_F(ManagementApiTest, BadInputIsA4xxNamingTheFieldAndWritesNothing) {
  ASSERT_EQ(
      Post("/v1/endpoints", R"({"id": "one", "destination": "d", "url": "https://x"})").status,
      201);
  struct Case {
    std::string body;
    int status;
    std::string code;
    std::string field;
  };
  const std::vector<Case> cases = {
      {"{not json", 400, "invalid_json", ""},
      {"[1, 2]", 400, "invalid_json", ""},
      {R"({"url": "https://x"})", 400, "invalid_field", "destination"},
      {R"({"destination": "d"})", 400, "invalid_field", "url"},
      {R"({"destination": "d", "url": "ftp://x"})", 400, "invalid_field", "url"},
      {R"({"destination": 7, "url": "https://x"})", 400, "invalid_field", "destination"},
      {R"({"destination": "d", "url": "https://x", "id": "has space"})", 400, "invalid_field",
       "id"},
      {R"({"destination": "d", "url": "https://x", "id": "one"})", 409, "conflict", "id"},
      {R"({"destination": "d", "url": "https://x", "event_types": "a"})", 400, "invalid_field",
       "event_types"},
      {R"({"destination": "d", "url": "https://x", "event_types": [""]})", 400, "invalid_field",
       "event_types"},
      {R"({"destination": "d", "url": "https://x", "headers": {"X": 1}})", 400, "invalid_field",
       "headers"},
      {R"({"destination": "d", "url": "https://x", "headers": {"Bad Name": "v"}})", 400,
       "invalid_field", "headers"},
      // One header twice (names are case-insensitive): both were sent.
      {R"({"destination": "d", "url": "https://x", "headers": {"X-A": "1", "x-a": "2"}})", 400,
       "invalid_field", "headers"},
      {R"({"destination": "d", "url": "https://x", "metadata": [1]})", 400, "invalid_field",
       "metadata"},
      {R"({"destination": "d", "url": "https://x", "max_in_flight": 5000})", 400, "invalid_field",
       "max_in_flight"},
      {R"({"destination": "d", "url": "https://x", "max_in_flight": "8"})", 400, "invalid_field",
       "max_in_flight"},
      {R"({"destination": "d", "url": "https://x", "secret": "plain"})", 400, "invalid_field",
       "secret"},
      // A 16-byte HMAC key: Standard Webhooks keys are 24 to 64 bytes (review).
      {R"({"destination": "d", "url": "https://x", "secret": "whsec_c2l4dGVlbiBieXRlIGtleQ=="})",
       400, "invalid_field", "secret"},
      {R"({"destination": "d", "url": "https://x", "colour": "red"})", 400, "invalid_field",
       "colour"},
      {R"({"destination": "d", "url": "https://x", "breaker": {"failure_threshold": 0}})", 400,
       "invalid_field", "breaker"},
      {R"({"destination": "d", "url": "https://x", "breaker": {"cooldown": 5}})", 400,
       "invalid_field", "breaker"},
      {R"({"destination": "d", "url": "https://x", "adaptive_concurrency": "yes"})", 400,
       "invalid_field", "adaptive_concurrency"},
      {R"({"destination": "d", "url": "https://x", "rate_limit": -1})", 400, "invalid_field",
       "rate_limit"},
      {R"({"destination": "d", "url": "https://x", "signature": "rsa"})", 400, "invalid_field",
       "signature"},
      // Accepted, they matched only an event type spelt so, and the endpoint silently received
      // nothing (review): '*' alone, or as the last part after a dot.
      {R"({"destination": "d", "url": "https://x", "event_types": ["*.created"]})", 400,
       "invalid_field", "event_types"},
      {R"({"destination": "d", "url": "https://x", "event_types": ["invoice*"]})", 400,
       "invalid_field", "event_types"},
      {R"({"destination": "d", "url": "https://x", "event_types": ["a.*.b"]})", 400,
       "invalid_field", "event_types"},
      // An id no HTTP client keeps in a path (review).
      {R"({"destination": "d", "url": "https://x", "id": ".."})", 400, "invalid_field", "id"},
      {R"({"destination": "d", "url": "https://x", "id": "."})", 400, "invalid_field", "id"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.body);
    ExpectError(Post("/v1/endpoints", c.body), c.status, c.code, c.field);
  }
  // A secret or a header name of 200 KB: std::regex matched them recursing once per character
  // and overflowed the thread's stack, which killed the relay (found in review).
  const std::string big(200'000, 'A');
  ExpectError(Post("/v1/endpoints",
                   R"({"destination": "d", "url": "https://x", "secret": "whsec_)" + big + R"("})"),
              400, "invalid_field", "secret");
  ExpectError(Post("/v1/endpoints/one/rotate-secret", R"({"secret": "whsec_)" + big + R"("})"), 400,
              "invalid_field", "secret");
  ExpectError(Post("/v1/endpoints", R"({"destination": "d", "url": "https://x", "headers": {")" +
                                        big + R"(": "v"}})"),
              400, "invalid_field", "headers");
  ExpectError(Patch("/v1/endpoints/one", R"({"headers": {")" + big + R"(": "v"}})"), 400,
              "invalid_field", "headers");
  // A header value of 200 KB: receivers answer 431, which is permanent, so every message went
  // to the dead letters (review).
  ExpectError(
      Post("/v1/endpoints",
           R"({"destination": "d", "url": "https://x", "headers": {"X-Big": ")" + big + R"("}})"),
      400, "invalid_field", "headers");
  // What is allowed still is.
  EXPECT_EQ(Patch("/v1/endpoints/one", R"({"event_types": ["*", "invoice.*", "a.b"]})").status,
            200);
  // A key of the other kind: the HMAC endpoint silently became an ed25519 one, and once the
  // overlap ended its receivers' HMAC checks failed (found in review).
  ExpectError(Post("/v1/endpoints/one/rotate-secret",
                   R"({"secret": "whsk_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="})"),
              400, "invalid_field", "secret");
  // Headers the relay or the HTTP client sets: accepted and stored, then skipped by the sink at
  // every delivery, so the caller was told it worked (found in review). The config refused them.
  for (const char* owned : {"Host", "webhook-signature", "Content-Length", "idempotency-key"}) {
    SCOPED_TRACE(owned);
    ExpectError(Post("/v1/endpoints", R"({"destination": "d", "url": "https://x", "headers": {")" +
                                          std::string(owned) + R"(": "v"}})"),
                400, "invalid_field", "headers");
    ExpectError(
        Patch("/v1/endpoints/one", R"({"headers": {")" + std::string(owned) + R"(": "v"}})"), 400,
        "invalid_field", "headers");
  }
  ExpectError(Patch("/v1/endpoints/one", R"({"url": "nope"})"), 400, "invalid_field", "url");
  // null was read as "absent": a PATCH setting a field to null answered 200 and changed
  // nothing (review). Only the fields whose null means "the destination's" take it.
  for (const std::string field : {"url", "description", "destination"}) {
    SCOPED_TRACE(field);
    ExpectError(Patch("/v1/endpoints/one", "{\"" + field + "\": null}"), 400, "invalid_field",
                field);
  }
  ExpectError(Post("/v1/endpoints", R"({"destination": "d", "url": "https://x", "id": null})"), 400,
              "invalid_field", "id");
  ExpectError(Patch("/v1/endpoints/one", R"({"secret": "whsec_AAAA"})"), 400, "invalid_field",
              "secret");
  ExpectError(Patch("/v1/endpoints/one", "{}"), 400, "invalid_json");
  ExpectError(Patch("/v1/endpoints/missing", R"({"url": "https://y"})"), 404, "not_found");
  ExpectError(Post("/v1/endpoints/one/rotate-secret", R"({"overlap_seconds": -1})"), 400,
              "invalid_field", "overlap_seconds");
  ExpectError(Post("/v1/endpoints/missing/rotate-secret", "{}"), 404, "not_found");
  // Secrets the webhook sink cannot decode: accepted, they made the endpoint unusable and its
  // messages dead letters, though the old secret was still in its overlap (review).
  for (const char* secret : {"whsec_AAAAA", "whsec_AA=", "whsec_A===", "whsec_AAA=A"}) {
    SCOPED_TRACE(secret);
    ExpectError(
        Post("/v1/endpoints/one/rotate-secret", std::string(R"({"secret": ")") + secret + R"("})"),
        400, "invalid_field", "secret");
    ExpectError(Post("/v1/endpoints", std::string(R"({"destination": "d", "url": "https://x", )") +
                                          R"("id": "two", "secret": ")" + secret + R"("})"),
                400, "invalid_field", "secret");
  }
  EXPECT_EQ(Scalar("SELECT count(*) FROM outbox.endpoints WHERE id = 'two'"), 0);
  ExpectError(Post("/v1/endpoints/one/replay", R"({"since": "soon"})"), 400, "invalid_field",
              "since");
  ExpectError(Post("/v1/endpoints/one/replay", "{}"), 400, "invalid_field", "since");
  ExpectError(Get("/v1/attempts?limit=0"), 400, "invalid_field", "limit");
  ExpectError(Get("/v1/attempts?message=x"), 400, "invalid_field", "message");
  ExpectError(Get("/v1/nothing"), 404, "not_found");
  // Text the database cannot store, or that is not UTF-8, is the client's error, not a 500
  // a client would retry forever; and a path that is not UTF-8 aborted the whole relay (the
  // 404's JSON could not be written, outside cpp-httplib's catch) before any token check.
  ExpectError(Post("/v1/endpoints",
                   R"({"destination": "d", "url": "https://x", "description": "a\u0000b"})"),
              400, "invalid_input");
  ExpectError(Patch("/v1/endpoints/one", R"({"metadata": {"k": "\u0000"}})"), 400, "invalid_input");
  ExpectError(Get("/v1/endpoints?destination=%FF"), 400, "invalid_input");
  ExpectError(Get("/v1/attempts?message=%FF"), 400, "invalid_field", "message");
  {
    httplib::Client anonymous("127.0.0.1", api_->port());
    const auto crash = anonymous.Get("/v1/%FF");
    ASSERT_TRUE(crash) << "no answer";
    EXPECT_EQ(crash->status, 404);
    EXPECT_EQ(Get("/v1/endpoints").status, 200) << "the server still answers";
  }

  EXPECT_EQ(Scalar("SELECT count(*) FROM outbox.endpoints"), 1);
  EXPECT_EQ(Scalar("SELECT count(*) FROM outbox.endpoint_secrets"), 1);
  EXPECT_EQ(Scalar("SELECT count(*) FROM outbox.endpoints WHERE url = 'https://x'"), 1)
      << "the refused patches changed nothing";
}

// JSON integers are 64-bit (and beyond); an int field takes only what fits its range, and a
// number that does not is refused naming the field, never cut to its low bits.
// A destination is up to 255 characters, as outbox.messages counts them: a non-ASCII name of
// 128-255 characters (more than 255 bytes) was refused, though writers may use it.
TEST_F(ManagementApiTest, ADestinationIsMeasuredInCharactersAsTheDatabaseDoes) {
  std::string name;
  for (int i = 0; i < 255; ++i) name += "\u00e9";
  const auto added =
      Post("/v1/endpoints", R"({"destination": ")" + name + R"(", "url": "https://x"})");
  EXPECT_EQ(added.status, 201) << added.body;
  ExpectError(Post("/v1/endpoints", R"({"destination": ")" + name + R"(x", "url": "https://x"})"),
              400, "invalid_field", "destination");
  EXPECT_EQ(Scalar("SELECT count(*) FROM outbox.endpoints"), 1);
}

TEST_F(ManagementApiTest, IntegersOutsideAFieldsRangeAreRefusedNamingTheFieldAndWriteNothing) {
  ASSERT_EQ(Post("/v1/endpoints", R"({"id": "one", "destination": "d", "url": "https://x",
                                       "max_in_flight": 4, "rate_limit": 20})")
                .status,
            201);
  for (const std::string field : {"max_in_flight", "rate_limit"}) {
    for (const std::string value :
         {"4294967297", "4294967296", "-4294967296", "9223372036854775807", "18446744073709551615",
          "99999999999999999999", "1.5", "2.0", "1e3", "true", "null"}) {
      SCOPED_TRACE(field + ": " + value);
      const auto added = Post("/v1/endpoints", R"({"destination": "d", "url": "https://y", ")" +
                                                   field + "\": " + value + "}");
      ExpectError(added, 400, "invalid_field", field);
      const auto patched = Patch("/v1/endpoints/one", "{\"" + field + "\": " + value + "}");
      ExpectError(patched, 400, "invalid_field", field);
      EXPECT_NE(ErrorMessage(patched).find(field), std::string::npos) << patched.body.dump();
    }
  }
  const auto max_message = Patch("/v1/endpoints/one", R"({"max_in_flight": 4294967297})");
  EXPECT_NE(ErrorMessage(max_message).find("1 to 1024"), std::string::npos)
      << max_message.body.dump();
  EXPECT_EQ(Scalar("SELECT count(*) FROM outbox.endpoints"), 1);
  EXPECT_EQ(Scalar("SELECT coalesce(max_in_flight, -1) FROM outbox.endpoints WHERE id = 'one'"), 4);
  EXPECT_EQ(Scalar("SELECT coalesce(rate_limit, -1) FROM outbox.endpoints WHERE id = 'one'"), 20);
  // The edges are taken.
  auto edges = Patch("/v1/endpoints/one", R"({"max_in_flight": 1024, "rate_limit": 1000000})");
  ASSERT_EQ(edges.status, 200) << edges.body.dump();
  EXPECT_EQ(edges.body["max_in_flight"], 1024);
  EXPECT_EQ(edges.body["rate_limit"], 1000000);
}

// An overlap past what a timestamp holds is bad input, not a database error.
TEST_F(ManagementApiTest, AnOverlapOutOfRangeIsRefusedNamingTheRangeAndWritesNothing) {
  ASSERT_EQ(
      Post("/v1/endpoints", R"({"id": "one", "destination": "d", "url": "https://x"})").status,
      201);
  for (const std::string value : {"100000000000000", "31536001", "9223372036854775807",
                                  "18446744073709551615", "1.5", "\"3600\""}) {
    SCOPED_TRACE(value);
    const auto a = Post("/v1/endpoints/one/rotate-secret", "{\"overlap_seconds\": " + value + "}");
    ExpectError(a, 400, "invalid_field", "overlap_seconds");
    EXPECT_NE(ErrorMessage(a).find("0 to 31536000"), std::string::npos) << a.body.dump();
  }
  EXPECT_EQ(Scalar("SELECT count(*) FROM outbox.endpoint_secrets"), 1) << "nothing rotated";
  const auto year = Post("/v1/endpoints/one/rotate-secret", R"({"overlap_seconds": 31536000})");
  ASSERT_EQ(year.status, 200) << year.body.dump();
  EXPECT_EQ(Scalar("SELECT count(*) FROM outbox.endpoint_secrets"), 2);
}

// docs/openapi.yaml and the server agree: every documented operation is a route (with the
// token it is never answered "no such route"), and an undocumented one is not.
// An endpoint deleted (by another replica, or the CLI) between an update and its read-back
// is a 404: the read-back dereferenced an empty optional, and the relay crashed (review;
// the read-back is held at its lock on outbox.dead_letters while the delete commits).
TEST_F(ManagementApiTest, AnEndpointDeletedBeforeItsUpdateIsReadBackIsA404) {
  ASSERT_EQ(
      Post("/v1/endpoints", R"({"id": "one", "destination": "d", "url": "https://x"})").status,
      201);
  for (const std::string path : {"/v1/endpoints/one", "/v1/endpoints/one/disable"}) {
    SCOPED_TRACE(path);
    if (path.ends_with("disable")) {
      ASSERT_EQ(
          Post("/v1/endpoints", R"({"id": "one", "destination": "d", "url": "https://x"})").status,
          201);
    }
    pqxx::connection x(db_url_);
    pqxx::work hold(x);
    hold.exec("LOCK TABLE outbox.dead_letters IN ACCESS EXCLUSIVE MODE");
    auto answer = std::async(std::launch::async, [&] {
      httplib::Client c("127.0.0.1", api_->port());
      c.set_default_headers({{"Authorization", "Bearer " + kToken}});
      return path.ends_with("disable")
                 ? c.Post(path.c_str(), "{}", "application/json")
                 : c.Patch(path.c_str(), R"({"description": "x"})", "application/json");
    });
    ASSERT_TRUE(WaitFor(
        [&] {
          return Scalar(
                     "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                     "AND query LIKE '%endpoint_secrets%'") > 0;
        },
        10s));
    hold.exec("DELETE FROM outbox.endpoints WHERE id = 'one'");
    hold.commit();
    const auto r = answer.get();
    ASSERT_TRUE(r) << "no answer";
    EXPECT_EQ(r->status, 404) << r->body;
    EXPECT_EQ(Get("/v1/endpoints").status, 200) << "the server still answers";
  }
}

// Stop waited for every request running, and a request can wait on a lock for as long as it
// is held (an endpoint's, a table's): the relay's shutdown, which stopped the API first,
// hung until SIGKILL with its claims still running (review). Stop now cuts a request still
// running a second after the server stopped (it is answered 503).
TEST_F(ManagementApiTest, StopEndsARequestWaitingOnALock) {
  ASSERT_EQ(
      Post("/v1/endpoints", R"({"id": "one", "destination": "d", "url": "https://x"})").status,
      201);
  pqxx::connection x(db_url_);
  pqxx::work hold(x);
  hold.exec("LOCK TABLE outbox.dead_letters IN ACCESS EXCLUSIVE MODE");
  const auto patch = [&] {
    httplib::Client c("127.0.0.1", api_->port());
    c.set_default_headers({{"Authorization", "Bearer " + kToken}});
    return c.Patch("/v1/endpoints/one", R"({"description": "x"})", "application/json");
  };
  auto answer = std::async(std::launch::async, patch);
  ASSERT_TRUE(WaitFor(
      [&] {
        return Scalar("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                      "AND query LIKE '%endpoint_secrets%'") > 0;
      },
      10s));
  // A second request waits for the first's database connection: cut, the first gave it up,
  // and the second ran into the same lock on a new one (review).
  auto second = std::async(std::launch::async, patch);
  std::this_thread::sleep_for(200ms);  // (no state to wait on: it waits on a mutex)
  auto stopped = std::async(std::launch::async, [&] { api_->Stop(); });
  const bool in_time = stopped.wait_for(10s) == std::future_status::ready;
  hold.abort();  // lets a Stop that waited finish
  stopped.get();
  EXPECT_TRUE(in_time) << "Stop waited for the lock";
  for (auto* a : {&answer, &second}) {
    const auto r = a->get();
    if (r) {
      EXPECT_EQ(r->status, 503) << r->body;
    }
  }
}

// A replay of a large archive runs for minutes, in parts. On the API's one database connection
// it held every other request (a list, an endpoint's change) until it was done; it runs on a
// connection of its own, which Stop cuts short like the shared one.
TEST_F(ManagementApiTest, AReplayRunsBesideTheOtherRequests) {
  ASSERT_NO_FATAL_FAILURE(AddAcme());
  ArchiveThree();
  // A move of the endpoint under way holds its lock: the replay's first part waits for it.
  pqxx::connection x(db_url_);
  pqxx::work mover(x);
  mover.exec("SELECT pg_advisory_xact_lock(outbox.endpoint_lock_key('acme'))");
  const auto replay = [&] {
    auto client = ClientWaiting(60s);
    auto& c = *client;
    return c.Post("/v1/endpoints/acme/replay", R"({"since": "2020-01-01T00:00:00Z"})",
                  "application/json");
  };
  auto first = std::async(std::launch::async, replay);
  auto beside = std::async(std::launch::async, replay);  // the same replay, asked again
  const auto replays_wait = [&](int n) {
    return WaitFor(
        [&] {
          return Scalar(
                     "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                     "AND query LIKE '%pg_advisory_xact_lock_shared%'") >= n;
        },
        10s);
  };
  ASSERT_TRUE(replays_wait(2));
  auto client = ClientWaiting(5s);
  auto& c = *client;
  // Two run at a time, each on a connection: a third is refused, not given a third.
  const auto third = c.Post("/v1/endpoints/acme/replay", R"({"since": "2020-01-01T00:00:00Z"})",
                            "application/json");
  ASSERT_TRUE(third);
  ExpectError(Of(third), 429, "too_many_requests");
  EXPECT_EQ(third->get_header_value("Retry-After"), "5");
  const auto list = Of(c.Get("/v1/endpoints"));
  EXPECT_EQ(list.status, 200) << "the list waited for the replay";
  const auto changed =
      Of(c.Patch("/v1/endpoints/acme", R"({"description": "during"})", "application/json"));
  EXPECT_EQ(changed.status, 200) << "the change waited for the replay";
  mover.commit();
  const auto done = Of(first.get());
  const auto done_beside = Of(beside.get());
  EXPECT_EQ(done.status, 202) << done.body.dump();
  EXPECT_EQ(done_beside.status, 202) << done_beside.body.dump();
  EXPECT_EQ(done.body.value("queued", -1) + done_beside.body.value("queued", -1), 3)
      << "queued once between them: " << done.body.dump() << done_beside.body.dump();

  // Stop cuts a replay that waits short (503), as it does any other request.
  pqxx::work again(x);
  again.exec("SELECT pg_advisory_xact_lock(outbox.endpoint_lock_key('acme'))");
  auto second = std::async(std::launch::async, replay);
  ASSERT_TRUE(replays_wait(1));
  auto stopped = std::async(std::launch::async, [&] { api_->Stop(); });
  const bool in_time = stopped.wait_for(10s) == std::future_status::ready;
  again.abort();
  stopped.get();
  EXPECT_TRUE(in_time) << "Stop waited for the replay";
  if (const auto r = second.get()) {
    EXPECT_EQ(r->status, 503) << r->body;
  }
}

// A replay of a large archive runs for minutes, longer than many clients wait for an answer.
// Asked with `Prefer: respond-async` (RFC 7240), it is answered 202 as soon as it has begun,
// with where to follow it (Location: /v1/replays/{id}), and runs on in the background; the
// replay's resource says whether it runs, what it queued, and when it finished.
TEST_F(ManagementApiTest, AReplayAskedToRespondAsyncRunsInTheBackground) {
  ASSERT_NO_FATAL_FAILURE(AddAcme());
  ArchiveThree();
  // A move of the endpoint under way holds its lock: the replay's first part waits for it.
  pqxx::connection x(db_url_);
  pqxx::work mover(x);
  mover.exec("SELECT pg_advisory_xact_lock(outbox.endpoint_lock_key('acme'))");
  const httplib::Headers async = {{"Prefer", "wait=10, respond-async"}};
  const auto begun = client_->Post("/v1/endpoints/acme/replay", async,
                                   R"({"since": "2020-01-01T00:00:00Z"})", "application/json");
  ASSERT_TRUE(begun);
  ASSERT_EQ(begun->status, 202) << begun->body;
  EXPECT_EQ(begun->get_header_value("Preference-Applied"), "respond-async");
  const json b = json::parse(begun->body);
  ASSERT_TRUE(b.contains("id")) << b.dump();
  const std::string where = "/v1/replays/" + std::to_string(b["id"].get<std::int64_t>());
  EXPECT_EQ(begun->get_header_value("Location"), where);
  EXPECT_EQ(b["status"], "running");
  EXPECT_EQ(b["endpoint_id"], "acme");
  EXPECT_FALSE(b["resumed"].get<bool>());

  const auto running = Get(where);
  ASSERT_EQ(running.status, 200) << running.body.dump();
  EXPECT_EQ(running.body["status"], "running") << running.body.dump();
  EXPECT_EQ(running.body["since"], "2020-01-01T00:00:00Z");
  EXPECT_TRUE(running.body["message"].is_null());
  EXPECT_TRUE(running.body["finished_at"].is_null());
  EXPECT_EQ(running.body["queued"], 0);
  mover.commit();
  EXPECT_TRUE(WaitFor([&] { return Get(where).body.value("status", "") == "finished"; }, 30s))
      << Get(where).body.dump();
  const auto finished = Get(where);
  EXPECT_EQ(finished.body["queued"], 3) << finished.body.dump();
  EXPECT_TRUE(finished.body["finished_at"].is_string());
  EXPECT_TRUE(finished.body["error"].is_null());
  EXPECT_EQ(Scalar("SELECT count(*) FROM outbox.messages WHERE endpoint_id = 'acme'"), 3);

  // The endpoint's replays, newest first; a synchronous one names its id too.
  const auto sync = Post("/v1/endpoints/acme/replay", R"({"since": "2020-01-01T00:00:00Z"})");
  ASSERT_EQ(sync.status, 202) << sync.body.dump();
  EXPECT_EQ(sync.body["status"], "finished");
  const auto list = Get("/v1/endpoints/acme/replays");
  ASSERT_EQ(list.status, 200) << list.body.dump();
  ASSERT_EQ(list.body["data"].size(), 2u) << list.body.dump();
  EXPECT_EQ(list.body["data"][0]["id"], sync.body["id"]);
  EXPECT_EQ(list.body["data"][1]["id"], b["id"]);
  ExpectError(Get("/v1/endpoints/nobody/replays"), 404, "not_found");
  ExpectError(Get("/v1/replays/999999"), 404, "not_found");
  ExpectError(Get("/v1/replays/abc"), 404, "not_found");
  // Without the token, nothing is said of a replay.
  httplib::Client anonymous("127.0.0.1", api_->port());
  ExpectError(Of(anonymous.Get(where.c_str())), 401, "unauthorized");
}

// Asked to respond async, a replay is still refused at once for bad input or an unknown
// endpoint; one that fails in the background says so, and why.
TEST_F(ManagementApiTest, ABackgroundReplayThatFailsSaysWhy) {
  const httplib::Headers async = {{"Prefer", "respond-async"}};
  const auto unknown = Of(client_->Post("/v1/endpoints/nobody/replay", async,
                                        R"({"since": "2020-01-01Z"})", "application/json"));
  ExpectError(unknown, 404, "not_found");
  ASSERT_NO_FATAL_FAILURE(AddAcme());
  ExpectError(Of(client_->Post("/v1/endpoints/acme/replay", async, R"({"since": "soon"})",
                               "application/json")),
              400, "invalid_field", "since");
  EXPECT_EQ(Scalar("SELECT count(*) FROM outbox.endpoint_replays"), 0) << "nothing begun";

  ArchiveThree();
  pqxx::connection admin(db_url_);
  pqxx::nontransaction(admin).exec(R"(
    CREATE FUNCTION public.fail_k2() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      IF NEW.ordering_key = 'acme:k2' THEN RAISE EXCEPTION 'injected failure at k2'; END IF;
      RETURN NEW;
    END $$;
    CREATE TRIGGER fail_k2 BEFORE INSERT ON outbox.messages
      FOR EACH ROW EXECUTE FUNCTION public.fail_k2();
  )");
  const auto begun = Of(client_->Post("/v1/endpoints/acme/replay", async,
                                      R"({"since": "2020-01-01T00:00:00Z"})", "application/json"));
  ASSERT_EQ(begun.status, 202) << begun.body.dump();
  const std::string where = "/v1/replays/" + std::to_string(begun.body["id"].get<std::int64_t>());
  EXPECT_TRUE(WaitFor([&] { return Get(where).body.value("status", "") == "failed"; }, 30s))
      << Get(where).body.dump();
  const auto failed = Get(where);
  ASSERT_TRUE(failed.body["error"].is_string()) << failed.body.dump();
  EXPECT_NE(failed.body["error"].get<std::string>().find("injected failure at k2"),
            std::string::npos)
      << failed.body.dump();
  EXPECT_EQ(failed.body["queued"], 0) << "its one part failed whole";
  EXPECT_TRUE(WaitFor(
      [&] {
        return Scalar(
                   "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                   "AND pid <> pg_backend_pid() AND query LIKE "
                   "'%pg_advisory_unlock_shared(7080%'") == 0;
      },
      10s))
      << "the background replay's connection stays open after it ended";
}

// A run of a replay holds its row while its part waits for a key's lock (an application's
// transaction left open): the same replay asked again meanwhile, to be answered at once, waited
// as long. It is answered within kEndpointLockWait: 503 endpoint_busy, with where to follow it.
TEST_F(ManagementApiTest, AReplayAskedAgainWhileItsRunWaitsIsAnsweredInTime) {
  ASSERT_NO_FATAL_FAILURE(AddAcme());
  ArchiveThree();
  pqxx::connection app(db_url_);
  pqxx::work open(app);
  open.exec("SELECT pg_advisory_xact_lock(hashtextextended('d' || chr(31) || 'acme:k1', 7079))");
  const httplib::Headers async = {{"Prefer", "respond-async"}};
  const auto first = Of(client_->Post("/v1/endpoints/acme/replay", async,
                                      R"({"since": "2020-01-01T00:00:00Z"})", "application/json"));
  ASSERT_EQ(first.status, 202) << first.body.dump();
  ASSERT_TRUE(WaitFor(
      [&] {
        return Scalar(
                   "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                   "AND datname = current_database()") == 1;
      },
      10s));
  auto client = ClientWaiting(60s);
  const auto again = Of(client->Post("/v1/endpoints/acme/replay", async,
                                     R"({"since": "2020-01-01T00:00:00Z"})", "application/json"));
  open.abort();
  ExpectError(again, 503, "endpoint_busy");
  EXPECT_NE(ErrorMessage(again).find("/v1/replays/"), std::string::npos) << again.body.dump();
  const std::string where = "/v1/replays/" + std::to_string(first.body["id"].get<std::int64_t>());
  EXPECT_TRUE(WaitFor([&] { return Get(where).body.value("status", "") == "finished"; }, 30s))
      << Get(where).body.dump();
  EXPECT_EQ(Get(where).body["queued"], 3);
}

// A recovery waiting for a key's lock (an application's transaction left open) holds its
// endpoint's move lock. Stop cuts its connection, and its session ends within a second with
// the locks it holds: it went on waiting, and the endpoint could not be moved or deleted for as
// long as the application's transaction stayed open (review).
TEST_F(ManagementApiTest, StopEndsARecoveryWaitingOnALockWithItsSession) {
  ASSERT_NO_FATAL_FAILURE(AddAcme());
  Scalar(
      "WITH d AS (INSERT INTO outbox.dead_letters (id, destination, ordering_key,"
      "  idempotency_key, event_type, headers, payload, attempts, reason, created_at,"
      "  endpoint_id) VALUES (nextval('outbox.messages_id_seq'), 'd', 'acme:k',"
      "  gen_random_uuid(), 'e', '{}', '1', 1, 'http 422', now(), 'acme') RETURNING 1) "
      "SELECT count(*) FROM d");
  pqxx::connection app(db_url_);
  pqxx::work open(app);
  open.exec("SELECT pg_advisory_xact_lock(hashtextextended('d' || chr(31) || 'acme:k', 7079))");
  auto recovery = std::async(std::launch::async, [&] {
    auto client = ClientWaiting(60s);
    return client->Post("/v1/endpoints/acme/recover", R"({"since": "2020-01-01T00:00:00Z"})",
                        "application/json");
  });
  ASSERT_TRUE(WaitFor(
      [&] {
        return Scalar(
                   "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                   "AND datname = current_database()") == 1;
      },
      10s));
  auto stopped = std::async(std::launch::async, [&] { api_->Stop(); });
  if (stopped.wait_for(10s) != std::future_status::ready) {
    open.abort();
    stopped.get();
    FAIL() << "Stop waited for the recovery";
  }
  stopped.get();
  EXPECT_TRUE(WaitFor(
      [&] {
        return Scalar(
                   "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                   "AND datname = current_database()") == 0;
      },
      15s))
      << "the stopped recovery's session still waits, holding the endpoint's move lock";
  open.abort();
  if (const auto r = recovery.get()) {
    EXPECT_EQ(r->status, 503) << r->body;
  }
  EXPECT_EQ(Scalar("SELECT count(*) FROM outbox.dead_letters"), 1) << "nothing recovered";
}

// Stop ends a replay running in the background (it is resumable): the relay's shutdown does
// not wait for a replay of hours. Its resource then says it failed and why, and the same
// replay asked again goes on from where it stopped, under the same id. Replays in the
// background count against the two a relay runs at a time.
TEST_F(ManagementApiTest, StopEndsABackgroundReplayWhichResumesWhenAskedAgain) {
  ASSERT_NO_FATAL_FAILURE(AddAcme());
  pqxx::connection x(db_url_);
  pqxx::work mover(x);
  mover.exec("SELECT pg_advisory_xact_lock(outbox.endpoint_lock_key('acme'))");
  const httplib::Headers async = {{"Prefer", "respond-async"}};
  std::vector<std::int64_t> ids;
  for (const char* since : {"2020-01-01T00:00:00Z", "2021-01-01T00:00:00Z"}) {
    const auto begun =
        client_->Post("/v1/endpoints/acme/replay", async,
                      std::string(R"({"since": ")") + since + R"("})", "application/json");
    ASSERT_TRUE(begun);
    ASSERT_EQ(begun->status, 202) << begun->body;
    ids.push_back(json::parse(begun->body)["id"].get<std::int64_t>());
  }
  const auto third = Post("/v1/endpoints/acme/replay", R"({"since": "2022-01-01T00:00:00Z"})");
  ExpectError(third, 429, "too_many_requests");

  auto stopped = std::async(std::launch::async, [&] { api_->Stop(); });
  if (stopped.wait_for(10s) != std::future_status::ready) {
    mover.abort();  // lets a Stop that waited finish
    stopped.get();
    FAIL() << "Stop waited for the background replays";
  }
  stopped.get();

  api_ = std::make_unique<relay::ManagementApi>("127.0.0.1:0", kToken, db_url_);
  api_->Start();
  client_ = std::make_unique<httplib::Client>("127.0.0.1", api_->port());
  client_->set_default_headers({{"Authorization", "Bearer " + kToken}});
  const std::string where = "/v1/replays/" + std::to_string(ids[0]);
  // The stopped relay's sessions end though their parts wait on a lock (the server found the
  // connection gone): they held the replay's row and the endpoint's lock, and the replay
  // read "running", until the lock's holder let their parts run (review).
  for (const auto id : ids) {
    const std::string replay = "/v1/replays/" + std::to_string(id);
    EXPECT_TRUE(WaitFor([&] { return Get(replay).body.value("status", "") == "failed"; }, 15s))
        << Get(replay).body.dump();
  }
  EXPECT_TRUE(WaitFor(
      [&] {
        return Scalar(
                   "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                   "AND datname = current_database()") == 0;
      },
      15s))
      << "a part of the stopped relay still waits";
  mover.commit();
  const auto failed = Get(where);
  ASSERT_EQ(failed.status, 200) << failed.body.dump();
  EXPECT_EQ(failed.body["status"], "failed") << failed.body.dump();
  ASSERT_TRUE(failed.body["error"].is_string()) << failed.body.dump();
  EXPECT_NE(failed.body["error"].get<std::string>().find("ask for the same replay again"),
            std::string::npos)
      << failed.body.dump();
  EXPECT_TRUE(failed.body["finished_at"].is_null());
  const auto again = Post("/v1/endpoints/acme/replay", R"({"since": "2020-01-01T00:00:00Z"})");
  ASSERT_EQ(again.status, 202) << again.body.dump();
  EXPECT_EQ(again.body["id"], ids[0]) << again.body.dump();
  EXPECT_EQ(again.body["resumed"], true);
  EXPECT_EQ(Get(where).body["status"], "finished");
}

// An endpoint's dead letters are read a page at a time, the last to die first, and recovered
// (Svix's "recover"): those that died since a time go back to its queue with their delivery
// ids. Older ones, another endpoint's, and those of a deleted endpoint of its id stay.
TEST_F(ManagementApiTest, AnEndpointsDeadLettersAreListedAndRecovered) {
  for (const char* id : {"acme", "other"}) {
    ASSERT_EQ(Post("/v1/endpoints", std::string(R"({"id": ")") + id +
                                        R"(", "destination": "d", "url": "https://x"})")
                  .status,
              201);
  }
  Scalar(
      "WITH u AS (UPDATE outbox.endpoints SET created_at = now() - interval '3 days' "
      "WHERE id = 'acme' RETURNING 1) SELECT count(*) FROM u");
  // One dead letter per row, in id order: (endpoint, reason, dead how long ago, payload or
  // bytes). Ids are when a message was written; dead_at is when it died.
  Scalar(R"(
    WITH d AS (INSERT INTO outbox.dead_letters (id, destination, ordering_key, idempotency_key,
        event_type, headers, payload, payload_bytes, attempts, reason, last_error, created_at,
        endpoint_id, dead_at)
      SELECT nextval('outbox.messages_id_seq'), 'd', v.endpoint || ':k', gen_random_uuid(),
        'order.created', '{"X-A": "1"}', v.payload::jsonb, decode(v.bytes, 'hex'), 3, v.reason,
        'http 422: no', now(), v.endpoint, now() - v.ago::interval
      FROM (VALUES (1, 'acme', 'http 422', '2 days', '{"n": 1}', NULL),
                   (2, 'acme', 'http 422', '0 s', '{"n": 2}', NULL),
                   (3, 'acme', 'endpoint acme was deleted', '0 s', '{"n": 3}', NULL),
                   (4, 'other', 'http 422', '0 s', '{"n": 4}', NULL),
                   (5, 'acme', 'http 410', '0 s', NULL, '0102'),
                   (6, 'acme', 'http 422', '1 hour', '{"n": 6}', NULL),
                   (7, 'acme', 'http 422', '4 days', '{"n": 7}', NULL),
                   (8, 'acme', 'http 422', '0 s', '{"big": 1e400}', NULL),
                   (9, 'acme', 'http 422', '0 s', '"' || repeat('x', 70000) || '"', NULL))
        AS v(n, endpoint, reason, ago, payload, bytes)
      ORDER BY v.n RETURNING 1)
    SELECT count(*) FROM d)");

  // Its own (not 3, a deleted endpoint's copy; not 7, dead before it was created), the last
  // to die first: 9, 8, 5 and 2 died together (the higher id first), then 6, then 1.
  std::vector<json> listed;
  std::string before;
  for (int pages = 0; pages < 10; ++pages) {
    const auto page = Get("/v1/endpoints/acme/dead-letters?limit=2" +
                          (before.empty() ? std::string() : "&before=" + before));
    ASSERT_EQ(page.status, 200) << page.body.dump();
    for (const auto& d : page.body["data"]) listed.push_back(d);
    if (page.body["next_before"].is_null()) break;
    before = page.body["next_before"].get<std::string>();
  }
  std::vector<std::string> order;
  for (const auto& d : listed) {
    order.push_back(d.contains("payload") && d["payload"].is_object() && d["payload"].contains("n")
                        ? std::to_string(d["payload"]["n"].get<int>())
                    : d.contains("payload_base64")      ? "bytes"
                    : d.contains("payload_text")        ? "big"
                    : d.value("payload_omitted", false) ? "omitted"
                                                        : "?");
  }
  EXPECT_EQ(order, (std::vector<std::string>{"omitted", "big", "bytes", "2", "6", "1"}));
  ASSERT_EQ(listed.size(), 6u);
  const json& huge = listed[0];
  EXPECT_EQ(huge["payload_size"], 70002) << "left out of a list, its size said";
  EXPECT_EQ(listed[1]["payload_text"].get<std::string>().substr(0, 9), "{\"big\": 1")
      << "a number JSON parsers cannot hold is given as the stored text";
  const json& bytes = listed[2];
  EXPECT_EQ(bytes["payload_base64"], "AQI=") << bytes.dump();
  EXPECT_EQ(bytes["reason"], "http 410");
  const json& two = listed[3];
  EXPECT_EQ(two["headers"]["X-A"], "1");
  EXPECT_EQ(two["last_error"], "http 422: no");
  EXPECT_EQ(two["attempts"], 3);
  EXPECT_EQ(two["event_type"], "order.created");
  EXPECT_EQ(two["delivery_id"].get<std::string>().size(), 36u);
  // One dead letter, whole.
  const auto whole =
      Get("/v1/endpoints/acme/dead-letters/" + std::to_string(huge["id"].get<std::int64_t>()));
  ASSERT_EQ(whole.status, 200);
  EXPECT_EQ(whole.body["payload"].get<std::string>().size(), 70000u);
  ExpectError(
      Get("/v1/endpoints/other/dead-letters/" + std::to_string(huge["id"].get<std::int64_t>())),
      404, "not_found");
  ExpectError(Get("/v1/endpoints/acme/dead-letters/x"), 404, "not_found");
  ExpectError(Get("/v1/endpoints/nobody/dead-letters"), 404, "not_found");
  ExpectError(Get("/v1/endpoints/acme/dead-letters?before=12"), 400, "invalid_field", "before");
  ExpectError(Get("/v1/endpoints/acme/dead-letters?before=2026-02-30T00:00:00.000000Z@1"), 400,
              "invalid_field", "before");
  ExpectError(Get("/v1/endpoints/acme/dead-letters?limit=101"), 400, "invalid_field", "limit");

  ExpectError(Post("/v1/endpoints/acme/recover", "{}"), 400, "invalid_field", "since");
  ExpectError(Post("/v1/endpoints/acme/recover", R"({"since": "soon"})"), 400, "invalid_field",
              "since");
  ExpectError(Post("/v1/endpoints/acme/recover", R"({"since": 5})"), 400, "invalid_field", "since");
  ExpectError(Post("/v1/endpoints/acme/recover", R"({"since": "yesterday", "x": 1})"), 400,
              "invalid_field", "x");
  ExpectError(Post("/v1/endpoints/nobody/recover", R"({"since": "yesterday"})"), 404, "not_found");
  EXPECT_EQ(Scalar("SELECT count(*) FROM outbox.dead_letters"), 9) << "nothing moved yet";

  // 'yesterday' is read once: the midnight before the last, after the one dead two days ago.
  const auto recovered = Post("/v1/endpoints/acme/recover", R"({"since": "yesterday"})");
  ASSERT_EQ(recovered.status, 200) << recovered.body.dump();
  EXPECT_EQ(recovered.body["replayed"], 5) << recovered.body.dump();
  EXPECT_EQ(recovered.body["held_back"], 0);
  EXPECT_EQ(recovered.body["of_deleted_endpoint"], 1);
  EXPECT_EQ(Scalar("SELECT count(*) FROM outbox.messages m WHERE m.endpoint_id = 'acme' AND "
                   "m.idempotency_key::text IN ('" +
                   two["delivery_id"].get<std::string>() + "', '" +
                   bytes["delivery_id"].get<std::string>() + "')"),
            2)
      << "queued for the endpoint with their delivery ids";
  EXPECT_EQ(Scalar("SELECT count(*) FROM outbox.dead_letters"), 4);
  EXPECT_EQ(Get("/v1/endpoints/acme/dead-letters").body["data"].size(), 1u);
}

// Svix's "send example": a test event for one endpoint alone, whatever its event types, queued
// as a row of that endpoint with a delivery id to follow in the delivery log.
TEST_F(ManagementApiTest, ATestEventIsQueuedForTheEndpointAlone) {
  ASSERT_EQ(Post("/v1/endpoints", R"({"id": "acme", "destination": "d", "url": "https://x",
                                       "event_types": ["invoice.paid"]})")
                .status,
            201);
  const auto sent = Post("/v1/endpoints/acme/test", "");
  ASSERT_EQ(sent.status, 202) << sent.body.dump();
  EXPECT_EQ(sent.body["event_type"], "webhook.test");
  const std::string delivery = sent.body["delivery_id"].get<std::string>();
  EXPECT_EQ(Scalar("SELECT count(*) FROM outbox.messages WHERE endpoint_id = 'acme' AND parked "
                   "AND destination = 'd' AND event_type = 'webhook.test' AND "
                   "payload->>'type' = 'webhook.test' AND payload->>'endpoint_id' = 'acme' AND "
                   "idempotency_key::text = '" +
                   delivery + "'"),
            1);
  const auto custom = Post("/v1/endpoints/acme/test",
                           R"({"event_type": "order.created", "payload": {"order": 7}})");
  ASSERT_EQ(custom.status, 202) << custom.body.dump();
  EXPECT_EQ(Scalar("SELECT count(*) FROM outbox.messages WHERE endpoint_id = 'acme' AND "
                   "event_type = 'order.created' AND payload = '{\"order\": 7}'"),
            1)
      << "sent though the endpoint takes only invoice.paid";

  ExpectError(Post("/v1/endpoints/nobody/test", ""), 404, "not_found");
  ExpectError(Post("/v1/endpoints/acme/test", R"({"event_type": 7})"), 400, "invalid_field",
              "event_type");
  ExpectError(
      Post("/v1/endpoints/acme/test", R"({"event_type": ")" + std::string(300, 'e') + R"("})"), 400,
      "invalid_field", "event_type");
  ExpectError(Post("/v1/endpoints/acme/test", R"({"x": 1})"), 400, "invalid_field", "x");
  Scalar(
      "WITH u AS (UPDATE outbox.settings SET max_payload_bytes = 100 RETURNING 1) "
      "SELECT count(*) FROM u");
  ExpectError(Post("/v1/endpoints/acme/test", R"({"payload": ")" + std::string(200, 'p') + R"("})"),
              400, "invalid_field", "payload");
  // The destination guard, on, with relay configs naming another destination but not "d".
  Scalar(
      "WITH u AS (UPDATE outbox.settings SET max_payload_bytes = 1048576, "
      "refuse_unknown_destinations = true RETURNING 1), "
      "r AS (INSERT INTO outbox.destinations (name) VALUES ('elsewhere') RETURNING 1), "
      "d AS (DELETE FROM outbox.destinations WHERE name = 'd' RETURNING 1) "
      "SELECT count(*) FROM u");
  ExpectError(Post("/v1/endpoints/acme/test", ""), 400, "invalid_field", "destination");
  Scalar(
      "WITH u AS (UPDATE outbox.settings SET refuse_unknown_destinations = false "
      "RETURNING 1) SELECT count(*) FROM u");

  // A move of the endpoint that holds its lock: the test event waits 5 s, then is refused,
  // and the API's connection is free again.
  {
    pqxx::connection x(db_url_);
    pqxx::work mover(x);
    mover.exec("SELECT pg_advisory_xact_lock(outbox.endpoint_lock_key('acme'))");
    auto client = ClientWaiting(60s);
    ExpectError(Of(client->Post("/v1/endpoints/acme/test", "", "application/json")), 503,
                "endpoint_busy");
  }
  EXPECT_EQ(Scalar("SELECT count(*) FROM outbox.messages"), 2) << "nothing written when refused";

  // An endpoint whose destination this relay delivers elsewhere (a Kafka topic): its test
  // event would go out as an application message of the topic.
  ASSERT_EQ(
      Post("/v1/endpoints", R"({"id": "k", "destination": "orders", "url": "https://x"})").status,
      201);
  api_->Stop();
  api_ = std::make_unique<relay::ManagementApi>("127.0.0.1:0", kToken, db_url_);
  api_->SetDestinationCheck([](const std::string& destination) -> std::optional<std::string> {
    if (destination == "orders") return "orders is a Kafka topic of this relay";
    return std::nullopt;
  });
  api_->Start();
  client_ = std::make_unique<httplib::Client>("127.0.0.1", api_->port());
  client_->set_default_headers({{"Authorization", "Bearer " + kToken}});
  ExpectError(Post("/v1/endpoints/k/test", ""), 400, "invalid_field", "destination");
  EXPECT_EQ(Post("/v1/endpoints/acme/test", "").status, 202);
  EXPECT_EQ(Scalar("SELECT count(*) FROM outbox.messages WHERE destination = 'orders'"), 0);
}

// A replay part holds its endpoint's move lock while it waits for its keys' locks, which an
// application's transaction left open holds for as long as it stays open. A delete or a move
// of that endpoint waited as long, on the API's one connection, and every request behind it
// with it. It waits 5 s, then answers 503 endpoint_busy, changing nothing.
TEST_F(ManagementApiTest, ADeleteOrMoveOfAnEndpointHeldByAReplayIsRefusedAfterAWhile) {
  ASSERT_NO_FATAL_FAILURE(AddAcme());
  pqxx::connection x(db_url_);
  pqxx::work replay(x);
  replay.exec("SELECT pg_advisory_xact_lock_shared(outbox.endpoint_lock_key('acme'))");
  auto client = ClientWaiting(30s);
  auto& c = *client;
  const auto deleted = c.Delete("/v1/endpoints/acme");
  ASSERT_TRUE(deleted) << "no answer within 30 s";
  ExpectError(Of(deleted), 503, "endpoint_busy");
  EXPECT_EQ(deleted->get_header_value("Retry-After"), "5");
  EXPECT_NE(ErrorMessage(Of(deleted)).find("try again"), std::string::npos);
  // (On the client that waits 30 s: the default one gives up after 5, as long as the wait.)
  ExpectError(Of(c.Patch("/v1/endpoints/acme", R"({"destination": "d2"})", "application/json")),
              503, "endpoint_busy");
  EXPECT_EQ(Scalar("SELECT count(*) FROM outbox.endpoints WHERE id = 'acme' AND "
                   "destination = 'd'"),
            1)
      << "nothing changed";
  EXPECT_EQ(Patch("/v1/endpoints/acme", R"({"description": "not a move"})").status, 200);
  // Adding its id again is a conflict, said at once (it waited for the lock, then said "busy").
  ExpectError(
      Of(c.Post("/v1/endpoints", R"({"id": "acme", "destination": "d", "url": "https://y"})",
                "application/json")),
      409, "conflict", "id");
  replay.commit();
  EXPECT_EQ(Delete("/v1/endpoints/acme").status, 204);
}

// A body over the 1 MiB limit is a JSON error like every other refusal (cpp-httplib answered
// an empty 413 that clients could not parse).
TEST_F(ManagementApiTest, ABodyOverTheLimitIsA413NamingTheLimit) {
  const std::string big = R"({"destination": "d", "url": "https://x", "description": ")" +
                          std::string(2 << 20, 'x') + "\"}";
  ExpectError(Post("/v1/endpoints", big), 413, "payload_too_large");
  EXPECT_EQ(Scalar("SELECT count(*) FROM outbox.endpoints"), 0);
}

// cpp-httplib reads a request body before it routes the request and before the token is
// checked: a chunked body with no limit at all (its payload limit checks only Content-Length),
// and a body with no length until the client closes. Anyone who could reach the port could
// grow the relay's memory until it was killed (review). A chunked body is now refused as soon
// as its head is read, and a request with neither header has no body, as HTTP says.
TEST_F(ManagementApiTest, ABodyWithoutContentLengthIsNeitherReadNorWaitedFor) {
  // A chunked body that has not ended: answered 411 at once, without the token.
  EXPECT_EQ(RawHttpStatus(api_->port(),
                          "POST /v1/endpoints HTTP/1.1\r\nHost: relay\r\n"
                          "Transfer-Encoding: chunked\r\nContent-Type: application/json\r\n"
                          "\r\n10000\r\n" +
                              std::string(4096, ' '),
                          3s),
            411);
  // Neither Content-Length nor Transfer-Encoding (curl's DELETE): no body, answered at once.
  EXPECT_EQ(RawHttpStatus(api_->port(),
                          "DELETE /v1/endpoints/nope HTTP/1.1\r\nHost: relay\r\n"
                          "Authorization: Bearer " +
                              kToken + "\r\n\r\n",
                          3s),
            404);
  EXPECT_EQ(RawHttpStatus(api_->port(),
                          "POST /v1/endpoints HTTP/1.1\r\nHost: relay\r\n"
                          "Content-Length: 99999999999\r\n\r\n{",
                          3s),
            413);
  // cpp-httplib's client streams a chunked body. The 411 comes before the body is read, and
  // the server then finds the chunks where the next request should be and closes: a client
  // still writing them may fail its write before it reads the answer (cpp-httplib then reports
  // Error::Write, about one run in two here). Either way it is answered at once, not kept
  // waiting; the raw request above reads the 411 every time.
  const auto started = std::chrono::steady_clock::now();
  const auto streamed = client_->Post(
      "/v1/endpoints",
      [](std::size_t, httplib::DataSink& sink) {
        sink.write("{}", 2);
        sink.done();
        return true;
      },
      "application/json");
  EXPECT_LT(std::chrono::steady_clock::now() - started, 3s);
  if (streamed) {
    ExpectError(Of(streamed), 411, "length_required");
  } else {
    EXPECT_EQ(streamed.error(), httplib::Error::Write) << httplib::to_string(streamed.error());
  }
  EXPECT_EQ(Get("/v1/endpoints").status, 200) << "the server still answers";
}

// The API reads request heads through GuardedServer: a head over 32 KiB is refused with 431
// before the token is looked at (cpp-httplib reads a line whole, whatever its length), as a
// JSON error like the API's others.
TEST_F(ManagementApiTest, AnOverlongRequestHeadIsRefused) {
  const std::string answer = outbox::testing::RawHttpAnswer(
      api_->port(),
      "GET /v1/endpoints HTTP/1.1\r\nHost: relay\r\nX-Long: " + std::string(40 * 1024, 'a') +
          "\r\n\r\n",
      3s);
  ASSERT_EQ(answer.rfind("HTTP/1.1 431 ", 0), 0u) << answer.substr(0, 300);
  EXPECT_NE(answer.find("Content-Type: application/json"), std::string::npos) << answer;
  const auto body = json::parse(answer.substr(answer.find("\r\n\r\n") + 4), nullptr, false);
  ASSERT_TRUE(body.is_object()) << answer;
  EXPECT_EQ(body["error"]["code"], "request_head_too_large") << answer;
  EXPECT_NE(body["error"]["message"].get<std::string>().find("32768 bytes"), std::string::npos)
      << answer;
  EXPECT_EQ(Get("/v1/endpoints").status, 200) << "the server still answers";
}

// A body nested 200,000 levels deep (well under 1 MiB): nlohmann parses it without recursion,
// but writing it back out (dump) recursed once per level and overflowed the worker's stack,
// killing the relay and every destination with it (review). Refused as bad JSON now.
TEST_F(ManagementApiTest, ADeeplyNestedBodyIsRefusedNotWrittenOut) {
  const int levels = 200000;
  const std::string nested = std::string(levels, '[') + std::string(levels, ']');
  ExpectError(
      Post("/v1/endpoints",
           R"({"destination": "d", "url": "https://x", "metadata": {"a": )" + nested + "}}"),
      400, "invalid_json");
  ExpectError(Post("/v1/endpoints",
                   R"({"destination": "d", "url": "https://x", "breaker": {"a": )" + nested + "}}"),
              400, "invalid_json");
  EXPECT_EQ(Scalar("SELECT count(*) FROM outbox.endpoints"), 0);
  // Ordinary nesting still goes through.
  EXPECT_EQ(Post("/v1/endpoints", R"({"id": "n", "destination": "d", "url": "https://x", )"
                                  R"("metadata": {"a": {"b": [[1, {"c": 2}]]}}})")
                .status,
            201);
}

TEST_F(ManagementApiTest, TheOpenApiDocumentDescribesTheRoutes) {
  ASSERT_EQ(
      Post("/v1/endpoints", R"({"id": "doc", "destination": "d", "url": "https://x"})").status,
      201);
  const YAML::Node doc = YAML::LoadFile(std::string(OUTBOX_SOURCE_DIR) + "/docs/openapi.yaml");
  int operations = 0;
  for (const auto& path : doc["paths"]) {
    std::string route = path.first.as<std::string>();
    if (auto at = route.find("{id}"); at != std::string::npos) route.replace(at, 4, "doc");
    for (const auto& op : path.second) {
      const std::string method = op.first.as<std::string>();
      if (method == "parameters") continue;
      ++operations;
      httplib::Result r =
          method == "get"     ? client_->Get(route.c_str())
          : method == "post"  ? client_->Post(route.c_str(), "{}", "application/json")
          : method == "patch" ? client_->Patch(route.c_str(), "{}", "application/json")
                              : client_->Delete(route.c_str());
      ASSERT_TRUE(method == "get" || method == "post" || method == "patch" || method == "delete")
          << method;
      ASSERT_TRUE(r) << method << " " << route;
      EXPECT_EQ(r->body.find("no such route"), std::string::npos) << method << " " << route;
      EXPECT_TRUE(doc["paths"][path.first.as<std::string>()][method]["responses"]
                     [std::to_string(r->status)])
          << method << " " << route << " answered " << r->status
          << ", which the document does not list";
      const auto responses = doc["paths"][path.first.as<std::string>()][method]["responses"];
      if (method == "post" || method == "patch") {
        // A body that is not JSON, and one over 1 MiB: whatever the route answers is listed
        // (the enable and disable routes read an optional body, and answered 400 and 413 that
        // the document did not list).
        for (const std::string& body : {std::string("{not json"), std::string(2 << 20, ' ')}) {
          httplib::Result bad = method == "post"
                                    ? client_->Post(route.c_str(), body, "application/json")
                                    : client_->Patch(route.c_str(), body, "application/json");
          ASSERT_TRUE(bad) << method << " " << route;
          EXPECT_TRUE(responses[std::to_string(bad->status)])
              << method << " " << route << " answered " << bad->status << " to a body of "
              << body.size() << " bytes, which the document does not list";
        }
      }
      // What any route may answer: the database is away (503), a bug (500), and for a body
      // over 1 MiB, 413.
      EXPECT_TRUE(responses["503"] && responses["500"]) << method << " " << route;
      EXPECT_EQ(
          static_cast<bool>(responses["413"]),
          static_cast<bool>(doc["paths"][path.first.as<std::string>()][method]["requestBody"]))
          << method << " " << route;
    }
  }
  EXPECT_EQ(operations, 16);
  EXPECT_NE(Get("/v1/endpoints/doc/undocumented").body.dump().find("no such route"),
            std::string::npos);

  // The answers any request may get before it reaches a route are JSON errors too, with a
  // code the document's enum lists: a malformed request line and a URI over 8 KiB got an
  // empty body; request_head_too_large was missing from the enum.
  std::set<std::string> codes;
  for (const auto& code : doc["components"]["schemas"]["Error"]["properties"]["error"]
                             ["properties"]["code"]["enum"]) {
    codes.insert(code.as<std::string>());
  }
  const std::string auth = "Authorization: Bearer " + kToken + "\r\n";
  for (const auto& [request, status] : std::vector<std::pair<std::string, int>>{
           {"NOT-HTTP\r\n\r\n", 400},
           {"GET /v1/endpoints/" + std::string(9000, 'a') + " HTTP/1.1\r\nHost: x\r\n" + auth +
                "\r\n",
            414},
           {"GET /v1/endpoints HTTP/1.1\r\nHost: x\r\n" + auth +
                "X-Long: " + std::string(40 * 1024, 'a') + "\r\n\r\n",
            431},
           {"POST /v1/endpoints HTTP/1.1\r\nHost: x\r\n" + auth +
                "Transfer-Encoding: chunked\r\n\r\n",
            411},
           {"POST /v1/endpoints HTTP/1.1\r\nHost: x\r\n" + auth +
                "Content-Length: 12x\r\n\r\n",
            400}}) {
    SCOPED_TRACE(request.substr(0, 40));
    const std::string answer =
        RawHttpExchange(api_->port(), request, std::chrono::seconds(5), [](const std::string& got) {
          const auto head_end = got.find("\r\n\r\n");
          return head_end != std::string::npos && got.find('}', head_end) != std::string::npos;
        });
    ASSERT_EQ(answer.rfind("HTTP/1.1 " + std::to_string(status), 0), 0u) << answer;
    const auto head_end = answer.find("\r\n\r\n");
    ASSERT_NE(head_end, std::string::npos) << answer;
    const auto body = nlohmann::json::parse(answer.substr(head_end + 4), nullptr, false);
    ASSERT_TRUE(body.is_object()) << answer;
    const std::string code = body["error"]["code"].get<std::string>();
    EXPECT_TRUE(codes.count(code)) << code << " is not in the document's enum";
    EXPECT_FALSE(body["error"]["message"].get<std::string>().empty()) << answer;
  }
  for (const char* code : {"request_timeout", "request_head_too_large"}) {
    EXPECT_TRUE(codes.count(code)) << code << " is not in the document's enum";
  }
}

}  // namespace
}  // namespace outbox::testing
