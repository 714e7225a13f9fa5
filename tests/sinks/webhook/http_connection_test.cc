// The webhook sink's plain-HTTP client (http_connection.h) against a loopback endpoint that answers
// from a script: every way an HTTP/1.1 answer can be framed, kept-alive connections, answers
// that are not HTTP, and what the sink writes on the request line.
#include "http_connection.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "address_policy.h"
#include "outbox_relay/webhook_sink.h"
#include "outbox_test/http_receiver.h"
#include "outbox_test/wait.h"

namespace outbox::relay::webhook_detail {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

/// One scripted answer: what is sent back for a request, and whether the endpoint closes the
/// connection after it (or, with `hang`, never answers at all).
struct Step {
  std::string answer;
  bool close = false;
  bool hang = false;
};

/// A socket listening on 127.0.0.1 (or ::1, or another IPv4 loopback address) at a free port
/// (set in *port).
int ListenOnLoopback(int* port, bool v6 = false, const char* v4 = "127.0.0.1") {
  const int fd = ::socket(v6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_storage storage{};
  auto* v4addr = reinterpret_cast<sockaddr_in*>(&storage);
  auto* v6addr = reinterpret_cast<sockaddr_in6*>(&storage);
  if (v6) {
    v6addr->sin6_family = AF_INET6;
    v6addr->sin6_addr = in6addr_loopback;
  } else {
    v4addr->sin_family = AF_INET;
    ::inet_pton(AF_INET, v4, &v4addr->sin_addr);
  }
  socklen_t len = v6 ? sizeof *v6addr : sizeof *v4addr;
  auto* addr = reinterpret_cast<sockaddr*>(&storage);
  if (fd < 0 || ::bind(fd, addr, len) != 0 || ::getsockname(fd, addr, &len) != 0 ||
      ::listen(fd, 16) != 0) {
    if (fd >= 0) ::close(fd);
    throw std::runtime_error(std::string("cannot listen on loopback") + (v6 ? " (::1)" : ""));
  }
  *port = ntohs(v6 ? v6addr->sin6_port : v4addr->sin_port);
  return fd;
}

/// The length of the whole request at the start of `in` (head and Content-Length body), or 0
/// while it has not all arrived.
std::size_t RequestLength(const std::string& in) {
  const std::size_t end = in.find("\r\n\r\n");
  if (end == std::string::npos) return 0;
  const std::size_t at = in.find("Content-Length: ");
  const std::size_t whole = end + 4 + (at < end ? std::stoul(in.substr(at + 16)) : 0);
  return in.size() >= whole ? whole : 0;
}

/// Accepts connections on 127.0.0.1; reads each request (head and Content-Length body) and
/// answers with the script's next step (the last one again once it is used up), keeping the
/// connection open unless the step closes it. Records every request as it came.
class ScriptedEndpoint {
 public:
  explicit ScriptedEndpoint(std::vector<Step> script, bool v6 = false)
      : script_(std::move(script)), fd_(ListenOnLoopback(&port_, v6)) {
    thread_ = std::thread([this] { Serve(); });
  }
  ~ScriptedEndpoint() {
    stop_ = true;
    ::shutdown(fd_, SHUT_RDWR);
    thread_.join();
    ::close(fd_);
  }
  int port() const { return port_; }
  int Connections() const { return connections_.load(); }
  std::vector<std::string> Requests() const {
    std::lock_guard lock(mu_);
    return requests_;
  }

 private:
  void Serve() {
    sigset_t pipe;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe, nullptr);
    while (!stop_) {
      const int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) return;
      ++connections_;
      std::string in;
      bool open = true;
      while (open && !stop_) {
        std::size_t length;
        while ((length = RequestLength(in)) == 0 && Read(c, &in)) {
        }
        if (length == 0) break;  // the client closed the connection
        Step step;
        {
          std::lock_guard lock(mu_);
          requests_.push_back(in.substr(0, length));
          step = script_[std::min(requests_.size(), script_.size()) - 1];
        }
        in.erase(0, length);
        if (step.hang) {
          while (Read(c, &in)) {  // until the client gives up
          }
          break;
        }
        if (::send(c, step.answer.data(), step.answer.size(), MSG_NOSIGNAL) !=
            static_cast<ssize_t>(step.answer.size())) {
          break;
        }
        open = !step.close;
      }
      ::shutdown(c, SHUT_WR);
      std::string rest;
      while (Read(c, &rest)) {  // until the client closes too: no reset loses the answer
      }
      ::close(c);
    }
  }
  bool Read(int c, std::string* into) {
    pollfd p{c, POLLIN, 0};
    while (!stop_) {
      const int ready = ::poll(&p, 1, 50);
      if (ready < 0) return false;
      if (ready == 0) continue;
      char buf[4096];
      const ssize_t n = ::recv(c, buf, sizeof buf, 0);
      if (n <= 0) return false;
      into->append(buf, static_cast<std::size_t>(n));
      return true;
    }
    return false;
  }

  std::vector<Step> script_;
  int port_ = 0;
  int fd_ = -1;
  std::atomic<bool> stop_{false};
  std::atomic<int> connections_{0};
  mutable std::mutex mu_;
  std::vector<std::string> requests_;
  std::thread thread_;
};

HttpConnection::Options Quick() {
  HttpConnection::Options o;
  o.connect_timeout = 2s;
  o.timeout = 5s;
  o.keep_body = 16;
  return o;
}

HttpAnswer Post(HttpConnection& c, int port, std::string_view body = "{}",
                std::chrono::milliseconds within = 5s) {
  const std::string head =
      "POST /hook HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: " + std::to_string(body.size()) +
      "\r\n\r\n";
  return c.Exchange("127.0.0.1", port, head, body, Clock::now() + within, [] { return true; });
}

// Every framing a receiver may use, one after another on one kept-alive connection: a
// Content-Length, an interim 100 before a chunked body with extensions and trailers, a 204
// without a body, a chunked body under another coding's name. Each answer is read whole (the
// next one on the same connection starts where it ends) and its body's start kept.
TEST(HttpConnection, ReadsEveryFramingOfAnAnswerOnOneKeptAliveConnection) {
  ScriptedEndpoint endpoint({
      {"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"},
      {"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 202 Accepted\r\nTransfer-Encoding: chunked\r\n\r\n"
       "5;name=value\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n"},
      {"HTTP/1.1 204 No Content\r\nContent-Length: 7\r\n\r\n"},  // no body, whatever it says
      {"HTTP/1.1 500 Oops\r\nTransfer-Encoding: gzip, chunked\r\n\r\n4\r\nbad!\r\n0\r\n\r\n"},
      {"HTTP/1.1 429 Slow\r\nretry-after:  7 \r\nLocation: /x\r\nContent-Length: 0\r\n\r\n"},
  });
  HttpConnection c(Quick());
  HttpAnswer a = Post(c, endpoint.port());
  EXPECT_EQ(a.failure, HttpFailure::kNone) << a.refused;
  EXPECT_EQ(a.status, 200);
  EXPECT_EQ(a.body_start, "hello");
  a = Post(c, endpoint.port());
  EXPECT_EQ(a.failure, HttpFailure::kNone) << a.refused;
  EXPECT_EQ(a.status, 202);
  EXPECT_EQ(a.body_start, "hello world");
  a = Post(c, endpoint.port());
  EXPECT_EQ(a.failure, HttpFailure::kNone) << a.refused;
  EXPECT_EQ(a.status, 204);
  EXPECT_EQ(a.body_start, "");
  a = Post(c, endpoint.port());
  EXPECT_EQ(a.status, 500);
  EXPECT_EQ(a.body_start, "bad!");
  a = Post(c, endpoint.port());
  EXPECT_EQ(a.status, 429);
  EXPECT_EQ(a.retry_after, "7");
  EXPECT_EQ(a.location, "/x");
  EXPECT_EQ(endpoint.Requests().size(), 5u);
  EXPECT_EQ(endpoint.Connections(), 1);
}

// The connection is not used again when the answer says so or cannot say where it ends: an
// HTTP/1.0 answer (no keep-alive), "Connection: close", a body that runs until the close,
// bytes after the answer that no request asked for, both Transfer-Encoding and Content-Length
// (RFC 9112 6.3: which one frames it is the endpoint's guess too). The endpoint keeps each such
// connection open (but the one whose body runs until the close): the client itself opens the
// next one. The body read until the close is whole.
TEST(HttpConnection, ANewConnectionFollowsAnAnswerThatEndsItsConnection) {
  ScriptedEndpoint endpoint({
      {"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok"},
      {"HTTP/1.1 200 OK\r\nConnection: keep-alive, close\r\nContent-Length: 0\r\n\r\n"},
      {"HTTP/1.1 503 Busy\r\n\r\nuntil the close, all of it", true},
      {"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\nJUNK"},
      {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n0\r\n\r\n"},
      {"HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\nContent-Length: 0\r\n\r\n"},
      {"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"},
  });
  HttpConnection c(Quick());
  int n = 0;
  for (const int expected : {200, 200, 503, 200, 200, 200, 200}) {
    ++n;
    const HttpAnswer a = Post(c, endpoint.port());
    EXPECT_EQ(a.failure, HttpFailure::kNone) << n << ": " << a.refused;
    EXPECT_EQ(a.status, expected) << n;
    if (expected == 503) {
      EXPECT_EQ(a.body_start, "until the close,");  // keep_body: 16 bytes
    }
  }
  // Five ended their connection; the HTTP/1.0 keep-alive one kept it for the last request.
  EXPECT_EQ(endpoint.Connections(), 6);
}

// What is not an HTTP/1.x answer, or cannot be read as one, is a bad response that says what
// is wrong; an answer cut short is a read failure. The connection is closed after each.
TEST(HttpConnection, AnswersThatAreNotHttpAreBadResponsesSayingWhy) {
  struct Case {
    std::string answer;
    HttpFailure failure;
    std::string refused;
  };
  const std::vector<Case> cases = {
      {"HTTP/2 200\r\n\r\n", HttpFailure::kBadResponse,
       "the response does not start with an HTTP/1.x status line"},
      {"SSH-2.0-OpenSSH_9.2\r\n\r\n", HttpFailure::kBadResponse,
       "the response does not start with an HTTP/1.x status line"},
      {"HTTP/1.1 2x0 OK\r\n\r\n", HttpFailure::kBadResponse,
       "the response does not start with an HTTP/1.x status line"},
      {"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok",
       HttpFailure::kBadResponse, "the response's Content-Length is not one number"},
      {"HTTP/1.1 200 OK\r\nContent-Length: -2\r\n\r\nok", HttpFailure::kBadResponse,
       "the response's Content-Length is not one number"},
      {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", HttpFailure::kBadResponse,
       "the response's chunked body has a bad chunk size"},
      {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n0\r\n\r\n",
       HttpFailure::kBadResponse, "the response's chunked body has a chunk longer than its size"},
      {"HTTP/1.1 200 OK\r\nContent-Length : 2\r\n\r\nok", HttpFailure::kBadResponse,
       "a response header name ends in whitespace (\"Content-Length \")"},
      {"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n 3\r\n\r\nok", HttpFailure::kBadResponse,
       "the response's Content-Length is folded over two lines"},
      {"HTTP/1.x 200 OK\r\n\r\n", HttpFailure::kBadResponse,
       "the response does not start with an HTTP/1.x status line"},
      {"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort", HttpFailure::kRead, ""},
      {"HTTP/1.1 200 OK\r\nContent-Le", HttpFailure::kRead, ""},
  };
  for (const Case& k : cases) {
    ScriptedEndpoint endpoint({{k.answer, true}});
    HttpConnection c(Quick());
    const HttpAnswer a = Post(c, endpoint.port());
    EXPECT_EQ(a.failure, k.failure) << k.answer;
    EXPECT_EQ(a.refused, k.refused) << k.answer;
  }
}

// An endpoint that closes a kept-alive connection just as a request reaches it (an idle timeout
// that fires as the request arrives: it answers nothing) costs the request nothing: it is sent
// once more on a new connection, as Go's and hyper's clients do for a request that carries an
// idempotency key. Not on a new connection, and only once.
TEST(HttpConnection, ARequestAKeptConnectionLostBeforeAnyAnswerIsSentOnceMoreOnANewOne) {
  ScriptedEndpoint endpoint({
      {"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"},
      {"", true},  // reads the request, closes without a byte of answer
      {"HTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n"},
      {"", true},  // and again, on the new connection
  });
  HttpConnection c(Quick());
  EXPECT_EQ(Post(c, endpoint.port()).status, 200);
  const HttpAnswer again = Post(c, endpoint.port());
  EXPECT_EQ(again.failure, HttpFailure::kNone);
  EXPECT_EQ(again.status, 201);
  EXPECT_EQ(endpoint.Requests().size(), 3u);
  EXPECT_EQ(endpoint.Connections(), 2);
  // The connection it was sent again on is new to this request: lost too, it is not sent a
  // third time.
  const HttpAnswer lost = Post(c, endpoint.port());
  EXPECT_EQ(lost.failure, HttpFailure::kRead);
  EXPECT_TRUE(lost.wrote);
  EXPECT_EQ(endpoint.Requests().size(), 5u);  // once on the kept connection, once on a new one
}

// Asked again before the request goes once more, a last check that says no (the claim ran out
// meanwhile) ends it with the first try's failure, marked written: the endpoint may have taken
// it in, so the sink counts an attempt rather than "not sent" (review).
TEST(HttpConnection, ARequestNotSentAgainStillCountsAsWritten) {
  ScriptedEndpoint endpoint({{"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"}, {"", true}});
  HttpConnection c(Quick());
  EXPECT_EQ(Post(c, endpoint.port()).status, 200);
  int asked = 0;
  const std::string head = "POST /hook HTTP/1.1\r\nContent-Length: 2\r\n\r\n";
  const HttpAnswer a = c.Exchange("127.0.0.1", endpoint.port(), head, "{}", Clock::now() + 5s,
                                  [&] { return ++asked == 1; });
  EXPECT_EQ(a.failure, HttpFailure::kRead);
  EXPECT_TRUE(a.wrote);
  EXPECT_EQ(asked, 2);
  EXPECT_EQ(endpoint.Requests().size(), 2u);
}

// A large body, with a Content-Length or in many chunks, is read to its end (only its start
// kept) and the connection serves the next request; lines may end in a bare LF.
TEST(HttpConnection, LargeBodiesAreReadThroughAndTheConnectionKept) {
  const std::string big(3 << 20, 'b');
  std::string chunked = "HTTP/1.1 500 Busy\nTransfer-Encoding: chunked\n\n";
  for (int i = 0; i < 1000; ++i) chunked += "400\r\n" + std::string(1024, 'c') + "\r\n";
  chunked += "0\r\n\r\n";
  ScriptedEndpoint endpoint({
      {"HTTP/1.1 200 OK\r\nContent-Length: " + std::to_string(big.size()) + "\r\n\r\n" + big},
      {chunked},
      {"HTTP/1.1 204 No Content\r\n\r\n"},
  });
  HttpConnection c(Quick());
  HttpAnswer a = Post(c, endpoint.port());
  EXPECT_EQ(a.failure, HttpFailure::kNone) << a.refused;
  EXPECT_EQ(a.status, 200);
  EXPECT_EQ(a.body_start, std::string(16, 'b'));
  a = Post(c, endpoint.port());
  EXPECT_EQ(a.failure, HttpFailure::kNone) << a.refused;
  EXPECT_EQ(a.status, 500);
  EXPECT_EQ(a.body_start, std::string(16, 'c'));
  EXPECT_EQ(Post(c, endpoint.port()).status, 204);
  EXPECT_EQ(endpoint.Connections(), 1);
}

// Nothing is written when the last check says no (Shutdown took the message back, its claim
// ran out while connecting), and the connection stays fit for the next request.
TEST(HttpConnection, NothingIsWrittenWhenTheLastCheckSaysNo) {
  ScriptedEndpoint endpoint({{"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"}});
  HttpConnection c(Quick());
  const std::string head = "POST /hook HTTP/1.1\r\nContent-Length: 0\r\n\r\n";
  const HttpAnswer no =
      c.Exchange("127.0.0.1", endpoint.port(), head, "", Clock::now() + 5s, [] { return false; });
  EXPECT_EQ(no.failure, HttpFailure::kCanceled);
  EXPECT_FALSE(no.wrote);
  EXPECT_EQ(Post(c, endpoint.port()).status, 200);
  EXPECT_EQ(endpoint.Requests().size(), 1u);
  EXPECT_EQ(endpoint.Connections(), 1);
}

// A connection kept alive is ended by shutdown(2) of the socket that `opening` was given (the
// sink's Shutdown does that to a request it abandons, whose last check then says no): the read
// waiting for an answer that never comes returns at once, not after the timeout, and the
// request is not sent again. `closing` comes before the socket closes.
TEST(HttpConnection, AShutdownOfTheOpenedSocketEndsAWaitOnAKeptConnection) {
  ScriptedEndpoint endpoint({{"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"}, {"", false, true}});
  std::atomic<int> socket{-1};
  int closed = 0;
  auto options = Quick();
  options.timeout = 30s;
  options.opening = [&](int fd) {
    socket = fd;
    return true;
  };
  options.closing = [&] {
    ++closed;
    EXPECT_EQ(::fcntl(socket.exchange(-1), F_GETFD) >= 0, true) << "closed before `closing`";
  };
  HttpConnection c(options);
  ASSERT_EQ(Post(c, endpoint.port()).status, 200);
  ASSERT_GE(socket.load(), 0);
  std::atomic<bool> aborted{false};
  std::thread abort([&] {
    outbox::testing::WaitFor([&] { return endpoint.Requests().size() == 2; }, 10s);
    aborted = true;
    ::shutdown(socket.load(), SHUT_RDWR);
  });
  const auto start = Clock::now();
  const std::string head = "POST /hook HTTP/1.1\r\nContent-Length: 2\r\n\r\n";
  const HttpAnswer a = c.Exchange("127.0.0.1", endpoint.port(), head, "{}", start + 30s,
                                  [&] { return !aborted.load(); });
  abort.join();
  EXPECT_EQ(a.failure, HttpFailure::kRead);
  EXPECT_LT(Clock::now() - start, 10s);
  EXPECT_EQ(closed, 1);  // the connection was closed
  EXPECT_EQ(endpoint.Connections(), 1);
}

// The sink's request line carries the URL's path and query as written (a '+' stays a '+'),
// bytes past ASCII percent-encoded; Host names the URL's host and port.
TEST(HttpConnection, TheSinksRequestLineCarriesThePathAndQueryAndHostTheUrlsAuthority) {
  ScriptedEndpoint endpoint({{"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"}});
  WebhookTarget t;
  t.url = "http://127.0.0.1:" + std::to_string(endpoint.port()) + "/h\xC3\xBCk/in?x=a+b&y=%2F";
  t.secrets = {"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"};
  t.max_in_flight = 1;
  t.allow_private_networks = true;
  auto sink = MakeWebhookSink("hooks", t);
  std::atomic<int> done{0};
  Message m;
  m.id = MessageId{1};
  m.destination = "hooks";
  m.idempotency_key = "k1";
  m.payload = "{}";
  Outcome outcome;
  sink->Submit(m, [&](Outcome o) {
    outcome = std::move(o);
    ++done;
  });
  ASSERT_TRUE(outbox::testing::WaitFor([&] { return done.load() == 1; }, 10s));
  sink->Shutdown(5s);
  EXPECT_EQ(outcome.kind, OutcomeKind::kDelivered) << outcome.reason;
  ASSERT_EQ(endpoint.Requests().size(), 1u);
  const std::string request = endpoint.Requests()[0];
  EXPECT_EQ(request.substr(0, request.find("\r\n")), "POST /h%C3%BCk/in?x=a+b&y=%2F HTTP/1.1");
  EXPECT_NE(request.find("\r\nHost: 127.0.0.1:" + std::to_string(endpoint.port()) + "\r\n"),
            std::string::npos)
      << request;
  EXPECT_NE(request.find("\r\nContent-Length: 2\r\n\r\n{}"), std::string::npos) << request;
}

/// Descriptors this process has open.
int OpenDescriptors() {
  int n = 0;
  if (DIR* dir = ::opendir("/proc/self/fd")) {
    while (const dirent* entry = ::readdir(dir)) n += entry->d_name[0] != '.' ? 1 : 0;
    ::closedir(dir);
  }
  return n;
}

Message OneMessage(int n) {
  Message m;
  m.id = MessageId{n};
  m.destination = "hooks";
  m.idempotency_key = "k" + std::to_string(n);
  m.payload = "{}";
  return m;
}

WebhookTarget TargetOf(const ScriptedEndpoint& endpoint) {
  WebhookTarget t;
  t.url = "http://127.0.0.1:" + std::to_string(endpoint.port()) + "/hook";
  t.secrets = {"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"};
  t.max_in_flight = 1;
  t.allow_private_networks = true;
  return t;
}

Outcome DeliverOneTo(const WebhookTarget& target) {
  auto sink = MakeWebhookSink("hooks", target);
  std::atomic<int> done{0};
  Outcome outcome;
  sink->Submit(OneMessage(1), [&](Outcome o) {
    outcome = std::move(o);
    ++done;
  });
  EXPECT_TRUE(outbox::testing::WaitFor([&] { return done.load() == 1; }, 10s));
  sink->Shutdown(5s);
  return outcome;
}

// An IPv6 endpoint: the sink connects to the address the URL gives, and Host carries it in
// brackets (RFC 9110 7.2), port included.
TEST(HttpConnection, AnIpv6EndpointGetsItsAddressInBracketsInHost) {
  std::unique_ptr<ScriptedEndpoint> endpoint;
  try {
    endpoint = std::make_unique<ScriptedEndpoint>(
        std::vector<Step>{{"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"}}, /*v6=*/true);
  } catch (const std::runtime_error& e) {
    GTEST_SKIP() << e.what() << ": this machine has no IPv6 loopback";
  }
  WebhookTarget t = TargetOf(*endpoint);
  t.url = "http://[::1]:" + std::to_string(endpoint->port()) + "/hook";
  const Outcome o = DeliverOneTo(t);
  EXPECT_EQ(o.kind, OutcomeKind::kDelivered) << o.reason;
  ASSERT_EQ(endpoint->Requests().size(), 1u);
  const std::string request = endpoint->Requests()[0];
  EXPECT_NE(request.find("\r\nHost: [::1]:" + std::to_string(endpoint->port()) + "\r\n"),
            std::string::npos)
      << request;
}

// A kept-alive connection costs the relay one descriptor, not two: Shutdown reaches it through
// its own socket (which it forgets under the same lock before the socket is closed), not a
// duplicate that doubled the descriptors of every idle connection (review).
TEST(HttpConnection, AKeptConnectionHoldsOneDescriptor) {
  ScriptedEndpoint endpoint({{"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"}});
  MakeWebhookSink("warm-up", TargetOf(endpoint))->Shutdown(1s);  // what a sink opens once
  const int before = OpenDescriptors();
  auto sink = MakeWebhookSink("hooks", TargetOf(endpoint));
  std::atomic<int> done{0};
  sink->Submit(OneMessage(1), [&](Outcome) { ++done; });
  ASSERT_TRUE(outbox::testing::WaitFor([&] { return done.load() == 1; }, 10s));
  ASSERT_TRUE(outbox::testing::WaitFor([&] { return endpoint.Connections() == 1; }, 10s));
  // The relay's connection and the one the endpoint accepted, both still open.
  EXPECT_EQ(OpenDescriptors() - before, 2);
  sink->Shutdown(5s);
}

// Shutdown's deadline ends a request stuck on a connection kept alive from an earlier request
// (the answer never comes), as it does one on a new connection: the sink keeps the kept
// connection's socket where Shutdown finds it.
TEST(HttpConnection, ShutdownAbandonsARequestStuckOnAKeptConnection) {
  ScriptedEndpoint endpoint({{"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"}, {"", false, true}});
  WebhookTarget t = TargetOf(endpoint);
  t.timeout = 30s;  // only the shutdown deadline can end the second request early
  auto sink = MakeWebhookSink("hooks", t);
  std::mutex mu;
  std::vector<Outcome> outcomes;
  const auto collect = [&](Outcome o) {
    std::lock_guard lock(mu);
    outcomes.push_back(std::move(o));
  };
  sink->Submit(OneMessage(1), collect);
  ASSERT_TRUE(outbox::testing::WaitFor(
      [&] {
        std::lock_guard lock(mu);
        return outcomes.size() == 1;
      },
      10s));
  sink->Submit(OneMessage(2), collect);
  ASSERT_TRUE(outbox::testing::WaitFor([&] { return endpoint.Requests().size() == 2; }, 10s));
  const auto start = Clock::now();
  sink->Shutdown(200ms);
  EXPECT_LT(Clock::now() - start, 5s);
  std::lock_guard lock(mu);
  ASSERT_EQ(outcomes.size(), 2u);
  EXPECT_EQ(outcomes[0].kind, OutcomeKind::kDelivered) << outcomes[0].reason;
  EXPECT_EQ(outcomes[1].kind, OutcomeKind::kRetry);
  EXPECT_EQ(outcomes[1].reason_class, "shutdown") << outcomes[1].reason;
  EXPECT_EQ(endpoint.Connections(), 1);
}

// An answer whose body runs until the close, cut short by Shutdown's abort, looks complete to
// the client (the read ends as at a close): the request was taken back, so it says nothing
// about the endpoint (review: a 500 counted as a failure towards the breaker).
TEST(HttpConnection, AnAnswerCutByShutdownIsNoVerdictOnTheEndpoint) {
  ScriptedEndpoint endpoint({{"HTTP/1.1 500 Oops\r\n\r\nthe body goes on until the close"}});
  WebhookTarget t = TargetOf(endpoint);
  t.timeout = 30s;
  auto sink = MakeWebhookSink("hooks", t);
  std::atomic<int> done{0};
  Outcome outcome;
  sink->Submit(OneMessage(1), [&](Outcome o) {
    outcome = std::move(o);
    ++done;
  });
  ASSERT_TRUE(outbox::testing::WaitFor([&] { return endpoint.Requests().size() == 1; }, 10s));
  sink->Shutdown(200ms);
  ASSERT_EQ(done.load(), 1);
  EXPECT_EQ(outcome.reason_class, "shutdown") << outcome.reason;
  ASSERT_TRUE(sink->Health());
  EXPECT_EQ(sink->Health()->consecutive_failures, 0);
}

/// Names resolve as the map says for the scope's life (the sink's SSRF guard resolves them).
struct FakeResolver {
  explicit FakeResolver(std::map<std::string, std::string> names) {
    SetResolverForTesting([names](const std::string& host, std::string* error) {
      std::vector<IpAddress> out;
      if (const auto it = names.find(host); it != names.end()) {
        out.push_back(*ParseIpLiteral(it->second));
      } else {
        *error = "unknown host " + host;
      }
      return out;
    });
  }
  ~FakeResolver() { SetResolverForTesting(nullptr); }
};

// TLS connections are kept alive across requests like plain ones: a TLS 1.3 endpoint's session
// tickets, which arrive after the handshake, are protocol, not a sign that the endpoint closed
// the connection or sent what no request asked for.
TEST(HttpConnectionTls, ConnectionsAreKeptAliveAcrossRequests) {
  const auto pki = outbox::testing::MakeTestPki();
  outbox::testing::HttpReceiver receiver(pki.server);
  WebhookTarget t;
  t.url = receiver.Url("/secure");
  t.secrets = {"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"};
  t.max_in_flight = 1;
  t.allow_private_networks = true;
  t.ca_file = pki.ca_cert_path;
  auto sink = MakeWebhookSink("hooks", t);
  std::atomic<int> delivered{0};
  for (int n = 1; n <= 20; ++n) {
    std::atomic<bool> done{false};
    sink->Submit(OneMessage(n), [&](Outcome o) {
      if (o.kind == OutcomeKind::kDelivered) ++delivered;
      done = true;
    });
    ASSERT_TRUE(outbox::testing::WaitFor([&] { return done.load(); }, 10s));
  }
  sink->Shutdown(5s);
  EXPECT_EQ(delivered.load(), 20);
  EXPECT_EQ(receiver.ConnectionCount(), 1u);
}

// The endpoint's certificate must name the host of the URL, not only chain to a trusted CA: the
// test certificate names 127.0.0.1 and localhost, and a name that resolves to 127.0.0.1 but is
// not in it is refused, saying so.
TEST(HttpConnectionTls, ACertificateForAnotherNameIsRefused) {
  const auto pki = outbox::testing::MakeTestPki();
  outbox::testing::HttpReceiver receiver(pki.server);
  FakeResolver dns(std::map<std::string, std::string>{{"hooks.test", "127.0.0.1"}});
  WebhookTarget t;
  t.url = "https://hooks.test:" + std::to_string(receiver.port()) + "/secure";
  t.secrets = {"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"};
  t.max_in_flight = 1;
  t.allowed_networks = {"127.0.0.0/8"};
  t.ca_file = pki.ca_cert_path;
  const Outcome refused = DeliverOneTo(t);
  EXPECT_EQ(refused.kind, OutcomeKind::kRetry);
  EXPECT_EQ(refused.reason_class, "tls");
  EXPECT_EQ(refused.reason, "connection error: SSLServerVerification (hostname mismatch)");
  EXPECT_EQ(receiver.Count(), 0u);
  t.verify_tls = false;  // as the operator may choose: then any certificate will do
  EXPECT_EQ(DeliverOneTo(t).kind, OutcomeKind::kDelivered);
}

/// A TLS endpoint on 127.0.0.1 with the test certificate: answers every request on a
/// connection with 200 and keeps it open; records each connection's SNI ("" for none); with
/// `ticket_after_answer`, sends a TLS 1.3 session ticket after each answer (a protocol message
/// that arrives while the client's connection is idle).
class TlsEndpoint {
 public:
  /// `first_answer`: the first request's answer instead, each piece one SSL_write (one record
  /// of at most 16 KiB each).
  TlsEndpoint(const outbox::testing::TestPki& pki, bool ticket_after_answer,
              const char* ip = "127.0.0.1", std::vector<std::string> first_answer = {})
      : ctx_(SSL_CTX_new(TLS_server_method()), SSL_CTX_free),
        ticket_(ticket_after_answer),
        first_answer_(std::move(first_answer)) {
    if (!ctx_ ||
        SSL_CTX_use_certificate_chain_file(ctx_.get(), pki.server.cert_pem_path.c_str()) != 1 ||
        SSL_CTX_use_PrivateKey_file(ctx_.get(), pki.server.key_pem_path.c_str(),
                                    SSL_FILETYPE_PEM) != 1) {
      throw std::runtime_error("cannot load the test certificate");
    }
    listener_ = ListenOnLoopback(&port_, false, ip);
    thread_ = std::thread([this] { Serve(); });
  }
  ~TlsEndpoint() {
    stop_ = true;
    ::shutdown(listener_, SHUT_RDWR);
    thread_.join();
    ::close(listener_);
  }
  int port() const { return port_; }
  std::vector<std::string> Names() const {
    std::lock_guard lock(mu_);
    return names_;
  }
  int Answered() const { return answered_.load(); }

 private:
  void Serve() {
    sigset_t pipe;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe, nullptr);
    while (!stop_) {
      const int c = ::accept(listener_, nullptr, nullptr);
      if (c < 0) return;
      const timeval most{10, 0};
      ::setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &most, sizeof most);
      SSL* ssl = SSL_new(ctx_.get());
      SSL_set_fd(ssl, c);
      if (SSL_accept(ssl) == 1) {
        const char* name = SSL_get_servername(ssl, TLSEXT_NAMETYPE_host_name);
        {
          std::lock_guard lock(mu_);
          names_.emplace_back(name != nullptr ? name : "");
        }
        std::string in;
        char buf[4096];
        while (!stop_) {
          if (const std::size_t length = RequestLength(in); length > 0) {
            in.erase(0, length);
            std::vector<std::string> pieces = {"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"};
            if (answered_ == 0 && !first_answer_.empty()) pieces = first_answer_;
            bool written = true;
            for (const auto& piece : pieces) {
              written = written && SSL_write(ssl, piece.data(), static_cast<int>(piece.size())) > 0;
            }
            if (!written) break;
            ++answered_;
            if (ticket_ && (SSL_new_session_ticket(ssl) != 1 || SSL_do_handshake(ssl) != 1)) break;
            continue;
          }
          const int n = SSL_read(ssl, buf, sizeof buf);
          if (n <= 0) break;
          in.append(buf, static_cast<std::size_t>(n));
        }
      }
      SSL_free(ssl);
      ::close(c);
    }
  }

  std::unique_ptr<SSL_CTX, decltype(&SSL_CTX_free)> ctx_;
  bool ticket_;
  std::vector<std::string> first_answer_;
  int listener_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> answered_{0};
  mutable std::mutex mu_;
  std::vector<std::string> names_;
  std::thread thread_;
};

WebhookTarget TlsTarget(const std::string& host, int port, const std::string& ca_file) {
  WebhookTarget t;
  t.url = "https://" + host + ":" + std::to_string(port) + "/hook";
  t.secrets = {"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"};
  t.max_in_flight = 1;
  t.allowed_networks = {"127.0.0.0/8"};
  t.ca_file = ca_file;
  return t;
}

// A session ticket (or any TLS protocol message) that arrives while a kept connection is idle
// leaves it fit for the next request: read without waiting, it yields nothing, where a plain
// connection's readable socket means the endpoint closed it or sent what no request asked for.
TEST(HttpConnectionTls, AProtocolMessageOnAnIdleConnectionDoesNotEndIt) {
  const auto pki = outbox::testing::MakeTestPki();
  TlsEndpoint endpoint(pki, /*ticket_after_answer=*/true);
  auto sink = MakeWebhookSink("hooks", TlsTarget("127.0.0.1", endpoint.port(), pki.ca_cert_path));
  for (int n = 1; n <= 5; ++n) {
    std::atomic<int> delivered{0};
    sink->Submit(OneMessage(n),
                 [&](Outcome o) { delivered = o.kind == OutcomeKind::kDelivered ? 1 : 2; });
    ASSERT_TRUE(outbox::testing::WaitFor([&] { return delivered.load() != 0; }, 10s));
    ASSERT_EQ(delivered.load(), 1) << "message " << n;
    // The ticket after the answer has reached the relay's socket before the next request.
    ASSERT_TRUE(outbox::testing::WaitFor([&] { return endpoint.Answered() == n; }, 10s));
    std::this_thread::sleep_for(20ms);  // an idle moment for it (no condition to wait for)
  }
  sink->Shutdown(5s);
  EXPECT_EQ(endpoint.Names().size(), 1u) << "connections made for 5 requests";
}

// A URL that gives an IP address needs a certificate for that address: the test certificate
// names 127.0.0.1, and the same endpoint at 127.0.0.2 (loopback too) is refused.
TEST(HttpConnectionTls, ACertificateForAnotherAddressIsRefused) {
  const auto pki = outbox::testing::MakeTestPki();
  TlsEndpoint endpoint(pki, /*ticket_after_answer=*/false, "127.0.0.2");
  const Outcome o = DeliverOneTo(TlsTarget("127.0.0.2", endpoint.port(), pki.ca_cert_path));
  EXPECT_EQ(o.reason_class, "tls") << o.reason;
  EXPECT_EQ(o.reason, "connection error: SSLServerVerification (IP address mismatch)");
  EXPECT_EQ(endpoint.Answered(), 0);
}

// Bytes an answer did not frame that OpenSSL still holds (its record was read in part) end the
// connection as bytes left in the relay's own buffer do: read as the next request's answer,
// they would be taken for it (review). Built to the client's buffer: its first read takes the
// first record (9000 bytes, ending in 10 bytes of an unfinished header line), its second 16374
// bytes of the second (16384: the rest of the head, then 10 bytes no request asked for).
TEST(HttpConnectionTls, BytesOpenSslStillHoldsAfterAnAnswerEndTheConnection) {
  const std::string first =
      "HTTP/1.1 200 OK\r\nX-Pad: " + std::string(8964, 'p') + "\r\nX-Tail: ab";
  const std::string second =
      "cd\r\nX-Fill: " + std::string(16339, 'f') + "\r\nContent-Length: 0\r\n\r\n" + "JUNKJUNKJU";
  ASSERT_EQ(first.size(), 9000u);
  ASSERT_EQ(second.size(), 16384u);
  const auto pki = outbox::testing::MakeTestPki();
  TlsEndpoint endpoint(pki, /*ticket_after_answer=*/false, "127.0.0.1", {first, second});
  auto sink = MakeWebhookSink("hooks", TlsTarget("127.0.0.1", endpoint.port(), pki.ca_cert_path));
  for (int n = 1; n <= 2; ++n) {
    std::mutex mu;
    std::optional<Outcome> outcome;
    sink->Submit(OneMessage(n), [&](Outcome o) {
      std::lock_guard lock(mu);
      outcome = std::move(o);
    });
    ASSERT_TRUE(outbox::testing::WaitFor(
        [&] {
          std::lock_guard lock(mu);
          return outcome.has_value();
        },
        10s));
    std::lock_guard lock(mu);
    EXPECT_EQ(outcome->kind, OutcomeKind::kDelivered) << "message " << n << ": " << outcome->reason;
  }
  sink->Shutdown(5s);
  EXPECT_EQ(endpoint.Names().size(), 2u) << "the second request went on a connection of its own";
}

// The host's name goes to the endpoint as SNI (a CDN or a shared load balancer picks the
// certificate and the site by it); an IP address does not (RFC 6066).
TEST(HttpConnectionTls, TheHostsNameIsSentAsSni) {
  const auto pki = outbox::testing::MakeTestPki();
  TlsEndpoint endpoint(pki, /*ticket_after_answer=*/false);
  FakeResolver dns(std::map<std::string, std::string>{{"hooks.test", "127.0.0.1"}});
  WebhookTarget named = TlsTarget("hooks.test", endpoint.port(), pki.ca_cert_path);
  named.verify_tls = false;  // the certificate does not name hooks.test
  EXPECT_EQ(DeliverOneTo(named).kind, OutcomeKind::kDelivered);
  EXPECT_EQ(DeliverOneTo(TlsTarget("127.0.0.1", endpoint.port(), pki.ca_cert_path)).kind,
            OutcomeKind::kDelivered);
  EXPECT_EQ(endpoint.Names(), (std::vector<std::string>{"hooks.test", ""}));
}

// The TLS handshake is part of connecting: an endpoint that takes the connection but never
// answers the handshake (here, one that speaks plain HTTP and waits for a request) fails the
// attempt after connect_timeout, not timeout.
TEST(HttpConnectionTls, AHandshakeThatNeverEndsIsAConnectTimeout) {
  ScriptedEndpoint endpoint({{"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"}});
  WebhookTarget t = TargetOf(endpoint);
  t.url = "https://127.0.0.1:" + std::to_string(endpoint.port()) + "/hook";
  t.connect_timeout = 300ms;
  t.timeout = 20s;
  const auto start = Clock::now();
  const Outcome o = DeliverOneTo(t);
  EXPECT_LT(Clock::now() - start, 10s);
  EXPECT_EQ(o.reason_class, "timeout") << o.reason;
  EXPECT_EQ(o.reason, "timeout: could not connect within 300ms");
  EXPECT_TRUE(endpoint.Requests().empty());
}

}  // namespace
}  // namespace outbox::relay::webhook_detail
