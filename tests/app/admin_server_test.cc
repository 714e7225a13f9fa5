// The admin HTTP server on a real loopback socket: /metrics, /healthz, /readyz.
#include "outbox_relay/admin_server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "outbox_relay/listen_backlog.h"
#include "outbox_relay/request_limits.h"
#include "outbox_test/raw_http.h"

namespace outbox::relay {
namespace {

struct ReadyState {
  std::atomic<bool> ready{false};
  std::mutex mu;
  std::string detail = "database unreachable";
};

class AdminServerTest : public ::testing::Test {
 protected:
  AdminServerTest()
      : server_(
            "127.0.0.1:0", metrics_, [this] { return state_.ready.load(); },
            [this] {
              std::lock_guard lk(state_.mu);
              return state_.detail;
            }) {}
  void SetUp() override {
    server_.Start();
    ASSERT_GT(server_.port(), 0);
  }
  httplib::Client Client() {
    httplib::Client c("127.0.0.1", server_.port());
    c.set_connection_timeout(std::chrono::seconds(5));
    c.set_read_timeout(std::chrono::seconds(5));
    return c;
  }

  RelayMetrics metrics_{"9.9.9"};
  ReadyState state_;
  AdminServer server_;
};

// Scrapers that keep their connections open (a Prometheus pair, say) hold a worker each until
// the keep-alive ends: with two workers two of them made /healthz wait 5 s, and the probes
// (1 s in deploy/k8s) failed on a healthy relay (review).
TEST_F(AdminServerTest, ProbesAreAnsweredWhileScrapersKeepTheirConnectionsOpen) {
  std::vector<std::unique_ptr<httplib::Client>> scrapers;
  for (int i = 0; i < 3; ++i) {
    auto c = std::make_unique<httplib::Client>("127.0.0.1", server_.port());
    c->set_keep_alive(true);
    c->set_read_timeout(std::chrono::seconds(2));
    auto res = c->Get("/metrics");
    ASSERT_TRUE(res) << "scraper " << i << ": no answer within 2 s";
    scrapers.push_back(std::move(c));  // the connection stays open, idle
  }
  httplib::Client probe("127.0.0.1", server_.port());
  probe.set_connection_timeout(std::chrono::seconds(2));
  probe.set_read_timeout(std::chrono::seconds(2));
  auto res = probe.Get("/healthz");
  ASSERT_TRUE(res) << "no answer within 2 s: " << httplib::to_string(res.error());
  EXPECT_EQ(res->status, 200);
}

TEST_F(AdminServerTest, ServesMetricsInTheExpositionFormat) {
  metrics_.RecordClaim("orders", 5, std::chrono::milliseconds(3));
  auto c = Client();
  auto res = c.Get("/metrics");
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->get_header_value("Content-Type"), "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_EQ(res->body, metrics_.Render());
  EXPECT_NE(res->body.find("\noutbox_messages_claimed_total{destination=\"orders\"} 5\n"),
            std::string::npos);
  EXPECT_NE(res->body.find("\noutbox_relay_build_info{version=\"9.9.9\"} 1\n"), std::string::npos);

  // Each scrape sees the current values.
  metrics_.RecordClaim("orders", 2, std::chrono::milliseconds(3));
  res = c.Get("/metrics");
  ASSERT_TRUE(res);
  EXPECT_NE(res->body.find("\noutbox_messages_claimed_total{destination=\"orders\"} 7\n"),
            std::string::npos);
}

TEST_F(AdminServerTest, HealthzIsOkWhileAlive) {
  auto c = Client();
  auto res = c.Get("/healthz");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->body, "ok\n");
  // Health does not depend on readiness.
  state_.ready = false;
  res = c.Get("/healthz");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
}

TEST_F(AdminServerTest, ReadyzFollowsTheReadyCallback) {
  auto c = Client();
  auto res = c.Get("/readyz");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 503);
  EXPECT_EQ(res->body, "not ready: database unreachable\n");

  EXPECT_NE(metrics_.Render().find("\noutbox_relay_ready 0\n"), std::string::npos);

  state_.ready = true;
  res = c.Get("/readyz");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->body, "ready\n");
  res = c.Get("/metrics");
  ASSERT_TRUE(res);
  EXPECT_NE(res->body.find("\noutbox_relay_ready 1\n"), std::string::npos)
      << "the gauge follows readiness";

  {
    std::lock_guard lk(state_.mu);
    state_.detail = "kafka sink for orders has no broker";
  }
  state_.ready = false;
  res = c.Get("/readyz");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 503);
  EXPECT_EQ(res->body, "not ready: kafka sink for orders has no broker\n");
}

TEST_F(AdminServerTest, UnknownPathsAre404AndHeadWorks) {
  auto c = Client();
  auto res = c.Get("/nope");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 404);
  res = c.Head("/healthz");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_TRUE(res->body.empty());
  res = c.Post("/metrics", "x", "text/plain");
  ASSERT_TRUE(res);
  EXPECT_NE(res->status, 200);
}

// cpp-httplib reads a request body into memory before it routes the request, even one for a
// route that does not exist: a chunked body with no limit, one without a length until the
// client closes. Anyone who could reach the admin port could grow the relay's memory until it
// was killed (review). Refused or taken as empty, as soon as the head is read.
TEST_F(AdminServerTest, ARequestBodyIsNeitherReadNorWaitedFor) {
  using std::chrono_literals::operator""s;
  EXPECT_EQ(testing::RawHttpStatus(server_.port(),
                                   "POST /metrics HTTP/1.1\r\nHost: relay\r\n"
                                   "Transfer-Encoding: chunked\r\n\r\n10000\r\n" +
                                       std::string(4096, 'x'),
                                   3s),
            411);
  EXPECT_EQ(
      testing::RawHttpStatus(server_.port(), "POST /healthz HTTP/1.1\r\nHost: relay\r\n\r\n", 3s),
      404);
  EXPECT_EQ(testing::RawHttpStatus(server_.port(),
                                   "PUT /metrics HTTP/1.1\r\nHost: relay\r\n"
                                   "Content-Length: 1073741824\r\n\r\nx",
                                   3s),
            413);
  auto c = Client();
  auto r = c.Get("/healthz");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << "the server still answers";
}

// cpp-httplib reads no body for GET or HEAD, whatever Content-Length says: a probe sent with
// a body was answered, and its body then read as the next request on the connection (400,
// and a client that pipelines got that 400 for its next request). The body is now read and
// dropped after the answer; one over the body limit is refused and the connection closed.
TEST_F(AdminServerTest, AGetWithABodyIsAnsweredAndTheBodyIsNotReadAsTheNextRequest) {
  using std::chrono_literals::operator""s;
  const auto statuses = [](const std::string& answers) {
    std::vector<std::string> out;
    for (auto at = answers.find("HTTP/1.1 "); at != std::string::npos;
         at = answers.find("HTTP/1.1 ", at + 1)) {
      out.push_back(answers.substr(at + 9, 3));
    }
    return out;
  };
  const std::string body = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";  // looks like a request
  const std::string answers = testing::RawHttpExchange(
      server_.port(),
      "GET /healthz HTTP/1.1\r\nHost: relay\r\nContent-Length: " + std::to_string(body.size()) +
          "\r\n\r\n" + body + "HEAD /healthz HTTP/1.1\r\nHost: relay\r\nContent-Length: 3\r\n\r\nabc" +
          "GET /healthz HTTP/1.1\r\nHost: relay\r\n\r\n",
      3s, [&](const std::string& got) { return statuses(got).size() >= 3; });
  EXPECT_EQ(statuses(answers), (std::vector<std::string>{"200", "200", "200"})) << answers;
  EXPECT_EQ(answers.find("# HELP"), std::string::npos) << "the body was served as a request";

  const std::string refused = testing::RawHttpExchange(
      server_.port(),
      "GET /healthz HTTP/1.1\r\nHost: relay\r\nConnection: keep-alive\r\n"
      "Content-Length: 100000\r\n\r\n" +
          std::string(1000, 'x'),
      3s);
  EXPECT_EQ(refused.rfind("HTTP/1.1 413", 0), 0u) << refused;
  EXPECT_NE(refused.find("Connection: close"), std::string::npos) << refused;
  auto c = Client();
  auto r = c.Get("/healthz");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << "the server still answers";
}

// A header line of 40 KiB: cpp-httplib reads a line whole before any check, so a line that
// never ends grows memory for as long as bytes come. The admin server reads heads through
// GuardedServer: 431 once the head is over 32 KiB.
TEST_F(AdminServerTest, AnOverlongRequestHeadIsRefused) {
  using std::chrono_literals::operator""s;
  EXPECT_EQ(testing::RawHttpStatus(server_.port(),
                                   "GET /healthz HTTP/1.1\r\nHost: relay\r\nX-Long: " +
                                       std::string(40 * 1024, 'a') + "\r\n\r\n",
                                   3s),
            431);
  auto c = Client();
  auto r = c.Get("/healthz");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << "the server still answers";
}

// GuardedServer on its own, with small limits.
class GuardedServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_.Get("/hi", [](const httplib::Request&, httplib::Response& res) {
      res.set_content("hi", "text/plain");
    });
    server_.Post("/size", [](const httplib::Request& req, httplib::Response& res) {
      res.set_content(std::to_string(req.body.size()), "text/plain");
    });
    server_.Post("/slow", [](const httplib::Request&, httplib::Response& res,
                             const httplib::ContentReader& read) {
      read([](const char*, std::size_t) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        return true;
      });
      res.set_content("read", "text/plain");
    });
    server_.set_read_timeout(std::chrono::seconds(5));
    server_.set_payload_max_length(1024 * 1024);
    port_ = server_.bind_to_any_port("127.0.0.1");
    ASSERT_GT(port_, 0);
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    while (!server_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  void TearDown() override {
    server_.stop();
    thread_.join();
  }

  int Connect() const {
    const int fd = testing::RawConnect(port_);
    EXPECT_GE(fd, 0);
    return fd;
  }
  // Sends `head` at once, then `trickle` one byte every 100 ms until the server answers or
  // closes (or `give_up` passes); returns what it answered and when.
  struct Answer {
    std::string text;
    std::chrono::milliseconds after{0};
    bool closed = false;
  };
  Answer Trickle(const std::string& head, const std::string& trickle,
                 std::chrono::milliseconds give_up) const {
    const int fd = Connect();
    const auto start = std::chrono::steady_clock::now();
    ::send(fd, head.data(), head.size(), MSG_NOSIGNAL);
    Answer a;
    std::size_t next = 0;
    while (std::chrono::steady_clock::now() - start < give_up) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 100) == 1) {
        char buf[512];
        const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
        if (n <= 0) {
          a.closed = true;
          break;
        }
        a.text.append(buf, static_cast<std::size_t>(n));
        continue;
      }
      if (!a.text.empty()) continue;  // answered: wait for the close
      if (next < trickle.size()) ::send(fd, &trickle[next++], 1, MSG_NOSIGNAL);
    }
    a.after = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::steady_clock::now() - start);
    ::close(fd);
    return a;
  }

  GuardedServer server_{RequestReadLimits{1024, std::chrono::milliseconds(1000)}};
  int port_ = 0;
  std::thread thread_;
};

// What it does not refuse works as on cpp-httplib's own server: keep-alive, bodies.
TEST_F(GuardedServerTest, ServesRequestsAndKeepsConnectionsAlive) {
  httplib::Client c("127.0.0.1", port_);
  c.set_keep_alive(true);
  for (int i = 0; i < 3; ++i) {
    auto r = c.Get("/hi");
    ASSERT_TRUE(r) << i;
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->body, "hi");
  }
  auto posted = c.Post("/size", std::string(100'000, 'x'), "application/octet-stream");
  ASSERT_TRUE(posted);
  EXPECT_EQ(posted->body, "100000") << "the limit is the head's, not the body's";
  EXPECT_EQ(
      testing::RawHttpStatus(port_, "GET /hi HTTP/1.1\r\nHost: x\r\n\r\n", std::chrono::seconds(3)),
      200);
}

// A head sent a byte at a time (slowloris): every byte arrives within the read timeout, so
// cpp-httplib's server kept the connection, and its worker, for as long as bytes came. Here
// the head has a second in all: 408, and the connection closes.
TEST_F(GuardedServerTest, AHeadThatTricklesInIsCutOffAtTheDeadline) {
  const auto a =
      Trickle("GET /hi HTTP/1.1\r\n", "X-Slow: " + std::string(200, 'z'), std::chrono::seconds(6));
  EXPECT_EQ(a.text.rfind("HTTP/1.1 408", 0), 0u) << a.text;
  EXPECT_NE(a.text.find("within 1000 ms"), std::string::npos) << a.text;
  EXPECT_TRUE(a.closed);
  EXPECT_LT(a.after, std::chrono::milliseconds(3000));
}

// A body that trickles in is cut off by the same deadline: the whole request has a second.
TEST_F(GuardedServerTest, ABodyThatTricklesInIsCutOffAtTheDeadline) {
  const auto a = Trickle("POST /size HTTP/1.1\r\nContent-Length: 200\r\n\r\n",
                         std::string(200, 'b'), std::chrono::seconds(6));
  EXPECT_EQ(a.text.rfind("HTTP/1.1 408", 0), 0u) << a.text;
  EXPECT_TRUE(a.closed);
  EXPECT_LT(a.after, std::chrono::milliseconds(3000));
}

// A request line that never ends: refused once the head passes its limit, with no more read.
TEST_F(GuardedServerTest, ALineThatNeverEndsIsRefusedAtTheHeadLimit) {
  const std::string answer = testing::RawHttpAnswer(port_, "GET /" + std::string(64 * 1024, 'a'),
                                                    std::chrono::seconds(3));  // no line end
  EXPECT_EQ(answer.rfind("HTTP/1.1 431", 0), 0u) << answer.substr(0, 200);
  EXPECT_NE(answer.find("over 1024 bytes"), std::string::npos) << answer.substr(0, 200);
}

// The head ends at a line that is exactly CRLF: a line ending in a bare LF (which cpp-httplib
// skips, reading on) did end the count, and what followed went on growing uncounted (review).
TEST_F(GuardedServerTest, ABareLineFeedDoesNotEndTheCountedHead) {
  const std::string answer = testing::RawHttpExchange(
      port_, "GET /hi HTTP/1.1\r\n\n\r\r\n" + std::string(8 * 1024, 'a'), std::chrono::seconds(3),
      [](const std::string& got) { return !got.empty(); });
  EXPECT_EQ(answer.rfind("HTTP/1.1 431", 0), 0u) << answer.substr(0, 200);
}

// A body whose bytes are always there before the server asks (it reads slowly here, 20 ms a
// chunk): the deadline was checked only when a read found nothing ready, so it never fired and
// the request took as long as the reading did (review). Now it is checked at every read.
TEST_F(GuardedServerTest, ARequestWhoseBytesAreAlwaysReadyIsCutOffAtTheDeadlineToo) {
  const int fd = Connect();
  const std::string request =
      "POST /slow HTTP/1.1\r\nContent-Length: 900000\r\n\r\n" + std::string(900'000, 'b');
  std::size_t sent = 0;
  std::string answer;
  const auto start = std::chrono::steady_clock::now();
  while (answer.empty() && std::chrono::steady_clock::now() - start < std::chrono::seconds(8)) {
    if (sent < request.size()) {
      const ssize_t n =
          ::send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) sent += static_cast<std::size_t>(n);
    }
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 5) != 1) continue;
    char buf[512];
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    answer.append(buf, static_cast<std::size_t>(n));
  }
  const auto after = std::chrono::steady_clock::now() - start;
  ::close(fd);
  EXPECT_EQ(answer.rfind("HTTP/1.1 408", 0), 0u) << answer.substr(0, 200);
  EXPECT_LT(after, std::chrono::milliseconds(3000)) << "read to its end (about 4.4 s)";
}

// Two requests in one write (pipelining): the second, already read into the stream's buffer,
// is answered at once, not after the keep-alive wait for bytes that had already come.
TEST_F(GuardedServerTest, PipelinedRequestsAreAnsweredAtOnce) {
  const auto count = [](const std::string& answers) {
    std::size_t n = 0;
    for (auto at = answers.find("HTTP/1.1 200"); at != std::string::npos;
         at = answers.find("HTTP/1.1 200", at + 1)) {
      ++n;
    }
    return n;
  };
  const auto start = std::chrono::steady_clock::now();
  const std::string answers = testing::RawHttpExchange(
      port_, "GET /hi HTTP/1.1\r\nHost: x\r\n\r\nGET /hi HTTP/1.1\r\nHost: x\r\n\r\n",
      std::chrono::seconds(4), [&](const std::string& got) { return count(got) >= 2; });
  const auto after = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(count(answers), 2u) << answers;
  EXPECT_LT(after, std::chrono::seconds(2)) << "the second waited for the keep-alive timeout";
}

// The body of a GET is dropped after the answer; it was read under the request's deadline,
// which a slow handler had used up: a 408 followed the 200 on the connection, and a client
// keeping it read that 408 as the answer to its next request (review).
TEST(GuardedServerBodies, AGetBodyDroppedAfterASlowAnswerGetsNoSecondAnswer) {
  GuardedServer server{RequestReadLimits{1024, std::chrono::milliseconds(500)}};
  LimitRequestBodies(server, 4096,
                     [](httplib::Response& res, int status, const std::string&,
                        const std::string& message) {
                       res.status = status;
                       res.set_content(message, "text/plain");
                     });
  std::atomic<bool> release{false};
  server.Get("/slow", [&](const httplib::Request&, httplib::Response& res) {
    // Longer than the request's deadline: until the test has seen the deadline pass.
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (!release && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    res.set_content("slow", "text/plain");
  });
  const int port = server.bind_to_any_port("127.0.0.1");
  ASSERT_GT(port, 0);
  std::thread t([&] { server.listen_after_bind(); });
  while (!server.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const int fd = testing::RawConnect(port);
  ASSERT_GE(fd, 0);
  // The head is read at once; the body comes after the deadline has passed.
  const std::string head = "GET /slow HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n";
  ::send(fd, head.data(), head.size(), MSG_NOSIGNAL);
  const auto sent = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - sent < std::chrono::milliseconds(700)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));  // past the 500 ms deadline
  }
  ::send(fd, "hello", 5, MSG_NOSIGNAL);
  release = true;
  const std::string answers = testing::RawRead(fd, std::chrono::seconds(3), [](const std::string&) {
    return false;  // all that comes until the server closes or 3 s pass
  });
  ::close(fd);
  server.stop();
  t.join();
  EXPECT_EQ(answers.rfind("HTTP/1.1 200", 0), 0u) << answers;
  EXPECT_EQ(answers.find("HTTP/1.1 408"), std::string::npos) << answers;
}

TEST_F(AdminServerTest, StopClosesThePortAndIsIdempotent) {
  const int port = server_.port();
  server_.Stop();
  server_.Stop();
  httplib::Client c("127.0.0.1", port);
  c.set_connection_timeout(std::chrono::seconds(2));
  EXPECT_FALSE(c.Get("/healthz")) << "nothing listens after Stop";
  EXPECT_EQ(metrics_.Render().find("\noutbox_relay_ready "), std::string::npos)
      << "no readiness without a server";
}

TEST(AdminServer, ReadyCallbackThatThrowsIsNotReady) {
  RelayMetrics m("dev");
  AdminServer s(
      "127.0.0.1:0", m, []() -> bool { throw std::runtime_error("boom"); }, nullptr);
  s.Start();
  httplib::Client c("127.0.0.1", s.port());
  auto res = c.Get("/readyz");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 503);
  EXPECT_EQ(res->body, "not ready: readiness check failed: boom\n");
}

TEST(AdminServer, PortInUseIsAnError) {
  RelayMetrics m("dev");
  AdminServer first(
      "127.0.0.1:0", m, [] { return true; }, nullptr);
  first.Start();
  AdminServer second(
      "127.0.0.1:" + std::to_string(first.port()), m, [] { return true; }, nullptr);
  EXPECT_THROW(second.Start(), std::runtime_error);
  // The first one is unaffected.
  httplib::Client c("127.0.0.1", first.port());
  auto res = c.Get("/healthz");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
}

TEST(AdminServer, ParsesListenAddresses) {
  auto a = ParseListenAddress("0.0.0.0:9090");
  EXPECT_EQ(a.host, "0.0.0.0");
  EXPECT_EQ(a.port, 9090);
  a = ParseListenAddress(":9102");
  EXPECT_EQ(a.host, "0.0.0.0");
  EXPECT_EQ(a.port, 9102);
  a = ParseListenAddress("[::1]:0");
  EXPECT_EQ(a.host, "::1");
  EXPECT_EQ(a.port, 0);
  a = ParseListenAddress("localhost:65535");
  EXPECT_EQ(a.host, "localhost");
  EXPECT_EQ(a.port, 65535);
  for (const char* bad : {"", "9090", "host:", "host:65536", "host:-1", "host:9o", "::1:9090",
                          "[::1]9090", "[::1", "host:123456"}) {
    EXPECT_THROW(ParseListenAddress(bad), std::invalid_argument) << bad;
  }
  RelayMetrics m("dev");
  AdminServer s("no-port", m, nullptr, nullptr);
  EXPECT_THROW(s.Start(), std::invalid_argument);
}

// Clients that connect to a bound server whose accept loop has not taken them in yet: how many
// finish their handshake within `deadline` (the kernel queues at most backlog + 1).
int ConnectedWhileNobodyAccepts(int port, int clients, std::chrono::milliseconds deadline) {
  std::vector<int> fds;
  for (int i = 0; i < clients; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<std::uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));  // EINPROGRESS
    fds.push_back(fd);
  }
  std::vector<bool> done(fds.size(), false);
  int connected = 0;
  const auto until = std::chrono::steady_clock::now() + deadline;
  while (connected < clients && std::chrono::steady_clock::now() < until) {
    for (std::size_t i = 0; i < fds.size(); ++i) {
      if (done[i]) continue;
      pollfd p{fds[i], POLLOUT, 0};
      if (::poll(&p, 1, 0) == 1 && (p.revents & POLLOUT)) {
        int err = 0;
        socklen_t len = sizeof(err);
        ::getsockopt(fds[i], SOL_SOCKET, SO_ERROR, &err, &len);
        done[i] = true;
        if (err == 0) ++connected;
      }
    }
    ::usleep(10'000);
  }
  for (int fd : fds) ::close(fd);
  return connected;
}

// The webhook workers of a relay connect all at once; cpp-httplib 0.11 as packaged listens with
// a backlog of 5, so all but 6 of them would wait for a SYN retransmit or fail.
TEST(ListenBacklog, ABoundServerQueuesEveryClientThatConnectsAtOnce) {
  httplib::Server server;
  ListenBacklog backlog(server);
  const int port = server.bind_to_any_port("127.0.0.1");
  ASSERT_GT(port, 0);
  ASSERT_TRUE(backlog.Raise(128));
  // Nobody accepts: each client that completes its handshake waits in the kernel's queue.
  EXPECT_EQ(ConnectedWhileNobodyAccepts(port, 32, std::chrono::seconds(10)), 32);
}

}  // namespace
}  // namespace outbox::relay
