#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>

#include "outbox_test/http_receiver.h"

namespace outbox::testing {
namespace {

using namespace std::chrono_literals;

TEST(HttpReceiverTest, RecordsPostedRequest) {
  HttpReceiver rx;
  ASSERT_GT(rx.port(), 0);
  EXPECT_EQ(rx.Url("/hooks/a"), "http://127.0.0.1:" + std::to_string(rx.port()) + "/hooks/a");
  EXPECT_EQ(rx.Url(), "http://127.0.0.1:" + std::to_string(rx.port()) + "/");

  httplib::Client cli("http://127.0.0.1:" + std::to_string(rx.port()));
  const auto res = cli.Post("/hooks/a?token=t%201", httplib::Headers{{"X-Outbox-Id", "42"}},
                            R"({"a":1})", "application/json");
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->body, "ok");

  ASSERT_EQ(rx.Count(), 1u);
  const auto reqs = rx.Requests();
  ASSERT_EQ(reqs.size(), 1u);
  const ReceivedRequest& r = reqs[0];
  EXPECT_EQ(r.method, "POST");
  EXPECT_EQ(r.path, "/hooks/a");
  EXPECT_EQ(r.target, "/hooks/a?token=t%201");
  EXPECT_EQ(r.body, R"({"a":1})");
  EXPECT_EQ(r.Header("x-outbox-id"), "42");
  EXPECT_EQ(r.Header("Content-Type"), "application/json");
  EXPECT_EQ(r.Header("REMOTE_ADDR"), "");  // httplib's pseudo headers are not recorded
  EXPECT_EQ(r.Header("absent"), "");
  EXPECT_EQ(r.remote_addr, "127.0.0.1");
  EXPECT_GT(r.remote_port, 0);
}

TEST(HttpReceiverTest, CountsConnectionsForKeepAliveAndFreshClients) {
  HttpReceiver rx;
  const std::string base = "http://127.0.0.1:" + std::to_string(rx.port());
  httplib::Client keep(base);
  keep.set_keep_alive(true);
  keep.set_tcp_nodelay(true);
  // More than httplib's default of 5 requests per connection.
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(keep.Post("/k", "x", "text/plain"));
  EXPECT_EQ(rx.ConnectionCount(), 1u);

  httplib::Client other(base);
  other.set_keep_alive(true);
  ASSERT_TRUE(other.Put("/k", "y", "text/plain"));
  ASSERT_TRUE(other.Get("/k"));
  EXPECT_EQ(rx.ConnectionCount(), 2u);

  httplib::Client closing(base);  // httplib closes after each request by default
  ASSERT_TRUE(closing.Post("/c", "z", "text/plain"));
  ASSERT_TRUE(closing.Post("/c", "z", "text/plain"));
  EXPECT_EQ(rx.ConnectionCount(), 4u);
  EXPECT_EQ(rx.Count(), 12u);
  const auto reqs = rx.Requests();
  EXPECT_EQ(reqs[8].method, "PUT");
  EXPECT_EQ(reqs[9].method, "GET");
}

TEST(HttpReceiverTest, ResponderControlsStatusHeadersAndBody) {
  HttpReceiver rx;
  rx.SetResponder([](const ReceivedRequest& req) {
    Reply reply;
    if (req.path == "/fail") {
      reply.status = 503;
      reply.body = "busy";
      reply.headers["Retry-After"] = "3";
    } else {
      reply.status = 201;
      reply.body = R"({"ok":true})";
      reply.headers["Content-Type"] = "application/json";
    }
    return reply;
  });
  httplib::Client cli("http://127.0.0.1:" + std::to_string(rx.port()));
  auto res = cli.Post("/fail", "x", "text/plain");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 503);
  EXPECT_EQ(res->body, "busy");
  EXPECT_EQ(res->get_header_value("Retry-After"), "3");
  res = cli.Post("/fine", "x", "text/plain");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 201);
  EXPECT_EQ(res->get_header_value("Content-Type"), "application/json");
  EXPECT_EQ(rx.Count(), 2u);  // failed requests are recorded too
}

TEST(HttpReceiverTest, DelayMakesAClientTimeOutButTheRequestIsRecorded) {
  HttpReceiver rx;
  rx.SetResponder([](const ReceivedRequest& req) {
    Reply reply;
    reply.delay = req.path == "/slow" ? 600ms : 200ms;
    return reply;
  });
  httplib::Client cli("http://127.0.0.1:" + std::to_string(rx.port()));
  cli.set_read_timeout(0, 200 * 1000);
  const auto res = cli.Post("/slow", "x", "text/plain");
  ASSERT_FALSE(res);
  EXPECT_EQ(res.error(), httplib::Error::Read);
  EXPECT_TRUE(rx.WaitForCount(1, 5s));

  httplib::Client patient("http://127.0.0.1:" + std::to_string(rx.port()));
  patient.set_read_timeout(10s);
  const auto start = std::chrono::steady_clock::now();
  const auto ok = patient.Post("/medium", "x", "text/plain");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
  EXPECT_GE(std::chrono::steady_clock::now() - start, 200ms);
}

TEST(HttpReceiverTest, WaitForCountSeesRequestsFromOtherThreads) {
  HttpReceiver rx;
  std::thread sender([port = rx.port()] {
    httplib::Client cli("http://127.0.0.1:" + std::to_string(port));
    for (int i = 0; i < 5; ++i) cli.Post("/t", std::to_string(i), "text/plain");
  });
  EXPECT_TRUE(rx.WaitForCount(5, 10s));
  sender.join();
  EXPECT_FALSE(rx.WaitForCount(6, 50ms));
}

TEST(HttpReceiverTest, TlsWorksWhenClientTrustsTheTestCa) {
  const TestPki pki = MakeTestPki();
  ASSERT_TRUE(std::filesystem::exists(pki.ca_cert_path));
  ASSERT_TRUE(std::filesystem::exists(pki.server.cert_pem_path));
  ASSERT_TRUE(std::filesystem::exists(pki.server.key_pem_path));
  HttpReceiver rx(pki.server);
  const std::string base = "https://127.0.0.1:" + std::to_string(rx.port());
  EXPECT_EQ(rx.Url("/x"), base + "/x");

  httplib::Client trusting(base);
  trusting.set_ca_cert_path(pki.ca_cert_path);
  trusting.enable_server_certificate_verification(true);
  const auto res = trusting.Post("/secure", "hello", "text/plain");
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  EXPECT_EQ(res->status, 200);
  ASSERT_EQ(rx.Count(), 1u);
  EXPECT_EQ(rx.Requests()[0].body, "hello");

  httplib::Client untrusting(base);
  untrusting.enable_server_certificate_verification(true);
  const auto refused = untrusting.Post("/secure", "hello", "text/plain");
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error(), httplib::Error::SSLServerVerification);
  EXPECT_EQ(rx.Count(), 1u);
}

}  // namespace
}  // namespace outbox::testing
