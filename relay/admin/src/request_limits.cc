#include "outbox_relay/request_limits.h"

#include <arpa/inet.h>
#include <httplib.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <utility>

namespace outbox::relay {
namespace {

/// Bodies up to this many times the limit are read and dropped before the 413.
constexpr std::uint64_t kDroppedBodyFactor = 64;

using Clock = std::chrono::steady_clock;

/// Set by the pre-routing handler for the request its thread is serving, read by
/// GuardedServer's loop once the request is answered: a body cpp-httplib left unread (it reads
/// none for GET, HEAD, OPTIONS...), to be read and dropped before the next request; or a
/// refusal that leaves a body unread, after which the connection closes.
thread_local std::uint64_t t_unread_body = 0;
thread_local bool t_close_after = false;
/// Whether the request reached routing (the pre-routing handler): not when cpp-httplib could
/// not parse its request line or headers, or its URI was too long.
thread_local bool t_routed = false;

/// The methods whose body cpp-httplib 0.11 reads before routing (detail::expect_content).
bool LibraryReadsBody(const std::string& method) {
  return method == "POST" || method == "PUT" || method == "PATCH" || method == "DELETE" ||
         method == "PRI";
}

/// Rounded up, so that a wait of this long reaches `t`.
int MillisUntil(Clock::time_point t) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(t - Clock::now());
  return static_cast<int>(std::clamp<long long>(left.count(), 0, 3'600'000));
}

bool Poll(socket_t sock, short events, int timeout_ms) {
  pollfd p{sock, events, 0};
  int n;
  do {
    n = ::poll(&p, 1, timeout_ms);
  } while (n < 0 && errno == EINTR);
  return n == 1 && (p.revents & (events | POLLHUP | POLLERR)) != 0;
}

void NumericAddress(const sockaddr_storage& addr, socklen_t len, std::string& ip, int& port) {
  char host[NI_MAXHOST] = "";
  char serv[NI_MAXSERV] = "";
  if (::getnameinfo(reinterpret_cast<const sockaddr*>(&addr), len, host, sizeof host, serv,
                    sizeof serv, NI_NUMERICHOST | NI_NUMERICSERV) == 0) {
    ip = host;
    port = std::atoi(serv);
  }
}

/// A connection as cpp-httplib reads it, with RequestReadLimits applied to each request from
/// BeginRequest on: the head's bytes are counted up to its empty line, and every read waits
/// at most until the request's deadline. A request over either limit is answered here (431
/// or 408) and the stream fails every later read and write, so cpp-httplib answers nothing
/// more and the connection closes.
class GuardedStream final : public httplib::Stream {
 public:
  GuardedStream(socket_t sock, RequestReadLimits limits, const RefusalWriter& refusal,
                std::chrono::microseconds read_timeout, std::chrono::microseconds write_timeout)
      : sock_(sock),
        limits_(limits),
        refusal_(refusal),
        read_timeout_ms_(Millis(read_timeout)),
        write_timeout_ms_(Millis(write_timeout)) {}

  void BeginRequest() {
    in_head_ = true;
    head_bytes_ = 0;
    line_bytes_ = 0;
    line_starts_with_cr_ = false;
    deadline_ = Clock::now() + std::min<std::chrono::milliseconds>(limits_.request_timeout,
                                                                   std::chrono::hours(24));
  }
  /// The rest of an answered request (a body cpp-httplib left unread) gets a deadline of its
  /// own: the one of the request may have passed while the handler ran, and a read past it
  /// answers 408, after the request's own answer.
  void RestartDeadline() {
    deadline_ = Clock::now() + std::min<std::chrono::milliseconds>(limits_.request_timeout,
                                                                   std::chrono::hours(24));
  }
  bool refused() const { return refused_; }
  /// Bytes read from the socket and not handed out yet: the start of a pipelined request.
  bool buffered() const { return pos_ < len_; }

  bool is_readable() const override {
    return !refused_ && (pos_ < len_ || Poll(sock_, POLLIN, WaitMillis()));
  }
  bool is_writable() const override { return !refused_ && Poll(sock_, POLLOUT, write_timeout_ms_); }

  ssize_t read(char* ptr, size_t size) override {
    if (refused_) return -1;
    // Late is late, whether or not more bytes are ready: a client sending steadily must not
    // outlast the deadline either.
    if (Clock::now() >= deadline_)
      return Refuse(408, "Request Timeout", "request_timeout", TimeoutText());
    if (pos_ == len_) {
      const int wait = WaitMillis();
      if (!Poll(sock_, POLLIN, wait)) {
        // Waited until the deadline (not merely the read timeout): the request is late.
        if (wait < read_timeout_ms_)
          return Refuse(408, "Request Timeout", "request_timeout", TimeoutText());
        return -1;
      }
      ssize_t n;
      do {
        n = ::recv(sock_, buf_, sizeof buf_, 0);
      } while (n < 0 && errno == EINTR);
      if (n <= 0) return n;
      pos_ = 0;
      len_ = static_cast<std::size_t>(n);
    }
    const std::size_t n = std::min(size, len_ - pos_);
    if (in_head_) {
      for (std::size_t i = 0; i < n && in_head_; ++i) {
        const char c = buf_[pos_ + i];
        if (++head_bytes_ > limits_.max_head_bytes) {
          return Refuse(431, "Request Header Fields Too Large", "request_head_too_large",
                        "the request line and headers are over " +
                            std::to_string(limits_.max_head_bytes) + " bytes; send shorter ones");
        }
        // The head ends at a line that is exactly CRLF, as cpp-httplib reads it (it skips a
        // line ending in a bare LF and reads on).
        if (c == '\n') {
          if (line_bytes_ == 1 && line_starts_with_cr_) in_head_ = false;
          line_bytes_ = 0;
        } else {
          if (line_bytes_ == 0) line_starts_with_cr_ = c == '\r';
          ++line_bytes_;
        }
      }
    }
    std::copy_n(buf_ + pos_, n, ptr);
    pos_ += n;
    return static_cast<ssize_t>(n);
  }

  ssize_t write(const char* ptr, size_t size) override {
    if (refused_ || !Poll(sock_, POLLOUT, write_timeout_ms_)) return -1;
    ssize_t n;
    do {
      n = ::send(sock_, ptr, size, MSG_NOSIGNAL);
    } while (n < 0 && errno == EINTR);
    return n;
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage addr{};
    socklen_t len = sizeof addr;
    if (::getpeername(sock_, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
      NumericAddress(addr, len, ip, port);
    }
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage addr{};
    socklen_t len = sizeof addr;
    if (::getsockname(sock_, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
      NumericAddress(addr, len, ip, port);
    }
  }
  socket_t socket() const override { return sock_; }

 private:
  int WaitMillis() const {
    return deadline_ == Clock::time_point::max()
               ? read_timeout_ms_
               : std::min(read_timeout_ms_, MillisUntil(deadline_));
  }
  std::string TimeoutText() const {
    return "the request did not arrive within " + std::to_string(limits_.request_timeout.count()) +
           " ms; send it at once";
  }
  static int Millis(std::chrono::microseconds d) {
    return static_cast<int>(std::clamp<long long>(d.count() / 1000, 0, 3'600'000));
  }
  ssize_t Refuse(int status, const char* reason, const char* code, const std::string& text) {
    httplib::Response res;
    if (refusal_) {
      refusal_(res, status, code, text);
    } else {
      res.set_content(text + "\n", "text/plain; charset=utf-8");
    }
    const std::string answer = "HTTP/1.1 " + std::to_string(status) + " " + reason +
                               "\r\nContent-Type: " + res.get_header_value("Content-Type") +
                               "\r\nContent-Length: " + std::to_string(res.body.size()) +
                               "\r\nConnection: close\r\n\r\n" + res.body;
    write(answer.data(), answer.size());
    refused_ = true;
    return -1;
  }

  socket_t sock_;
  RequestReadLimits limits_;
  const RefusalWriter& refusal_;
  int read_timeout_ms_;
  int write_timeout_ms_;
  char buf_[4096];
  std::size_t pos_ = 0;
  std::size_t len_ = 0;
  bool in_head_ = false;
  std::size_t head_bytes_ = 0;
  std::size_t line_bytes_ = 0;
  bool line_starts_with_cr_ = false;
  Clock::time_point deadline_ = Clock::time_point::max();
  bool refused_ = false;
};

}  // namespace

bool GuardedServer::process_and_close_socket(socket_t sock) {
  GuardedStream strm(
      sock, limits_, refusal_,
      std::chrono::seconds(read_timeout_sec_) + std::chrono::microseconds(read_timeout_usec_),
      std::chrono::seconds(write_timeout_sec_) + std::chrono::microseconds(write_timeout_usec_));
  bool ok = false;
  // As cpp-httplib's own loop: up to keep_alive_max_count_ requests, each waited for up to
  // keep_alive_timeout_sec_, until the server stops.
  for (std::size_t count = keep_alive_max_count_; count > 0; --count) {
    const auto idle_until = Clock::now() + std::chrono::seconds(keep_alive_timeout_sec_);
    bool arrived = strm.buffered();  // pipelined: already here
    while (svr_sock_ != INVALID_SOCKET && !arrived && Clock::now() < idle_until) {
      arrived = Poll(sock, POLLIN, std::min(100, MillisUntil(idle_until)));
    }
    if (!arrived || svr_sock_ == INVALID_SOCKET) break;
    bool connection_closed = false;
    strm.BeginRequest();
    t_unread_body = 0;
    t_close_after = false;
    t_routed = false;
    // Every read of a request (its head, then its body) comes before its handler runs, so
    // the deadline never cuts a handler short (a body cpp-httplib leaves unread is read after
    // the answer, under the same deadline).
    ok = process_request(strm, count == 1, connection_closed, nullptr);
    if (!ok || connection_closed || strm.refused() || t_close_after) break;
    // A request line or headers cpp-httplib could not parse (400, 414): where that request
    // ended is unknown, so what follows is not read as requests (a line of garbage got a 400
    // for each of its lines).
    if (refusal_ && !t_routed) break;
    // A GET's or HEAD's body (the pre-routing handler allowed it up to the body limit): read
    // as the next request, its bytes were answered 400, and a pipelined request after it got
    // that 400.
    char dropped[4096];
    if (t_unread_body > 0) strm.RestartDeadline();
    while (t_unread_body > 0) {
      const ssize_t n = strm.read(dropped, std::min<std::uint64_t>(sizeof dropped, t_unread_body));
      if (n <= 0) break;
      t_unread_body -= static_cast<std::uint64_t>(n);
    }
    if (t_unread_body > 0) break;
  }
  if (strm.refused() || Poll(sock, POLLIN, 0)) {
    // Answered while the client may still be sending (a refusal here, or cpp-httplib's own
    // 411/413/400 with the body unread): closing with its bytes unread would reset the
    // connection, and a client still writing could get the reset instead of the answer. Stop
    // sending, read and drop what comes for a moment (at most 64 KiB), then close.
    ::shutdown(sock, SHUT_WR);
    const auto until = Clock::now() + std::chrono::seconds(1);
    char sink[4096];
    for (std::size_t dropped = 0; dropped < 64 * 1024;) {
      if (!Poll(sock, POLLIN, MillisUntil(until))) break;
      const ssize_t n = ::recv(sock, sink, sizeof sink, 0);
      if (n <= 0) break;
      dropped += static_cast<std::size_t>(n);
    }
  }
  ::shutdown(sock, SHUT_RDWR);
  ::close(sock);
  return ok;
}

void LimitRequestBodies(GuardedServer& server, std::size_t max_body_bytes, RefusalWriter write) {
  server.refusal_ = write;
  server.set_payload_max_length(max_body_bytes);
  server.set_pre_routing_handler([max_body_bytes, write = std::move(write)](
                                     const httplib::Request& req, httplib::Response& res) {
    t_routed = true;
    const auto refuse = [&](int status, const char* code, const std::string& message) {
      // The body stays unread: the answer says the connection closes, and it does (its
      // bytes were read as the next request, which cpp-httplib answered 400).
      t_close_after = true;
      // (Headers is a multimap read by its first value: the client's own goes first.)
      auto& mutable_req = const_cast<httplib::Request&>(req);
      mutable_req.headers.erase("Connection");
      mutable_req.set_header("Connection", "close");
      write(res, status, code, message);
      return httplib::Server::HandlerResponse::Handled;
    };
    if (req.has_header("Transfer-Encoding")) {
      return refuse(411, "length_required",
                    "request bodies in chunked (or any) Transfer-Encoding are not accepted; send "
                    "the body with a Content-Length header");
    }
    if (req.has_header("Content-Length")) {
      const std::string text = req.get_header_value("Content-Length");
      std::uint64_t length = 0;
      const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), length);
      if (ec != std::errc() || end != text.data() + text.size() || text.empty()) {
        return refuse(400, "invalid_content_length",
                      "the Content-Length header is not a number of bytes; send the body's "
                      "length in bytes");
      }
      // A body somewhat over the limit is read and dropped by cpp-httplib, which then answers
      // 413 (through the server's error handler): a client still writing it gets the answer
      // instead of a failed write. One far over it is not waited for.
      const bool read_by_library = LibraryReadsBody(req.method);
      if (length / kDroppedBodyFactor > max_body_bytes ||
          (!read_by_library && length > max_body_bytes)) {
        return refuse(413, "payload_too_large",
                      "the request body is " + text + " bytes, over the limit of " +
                          std::to_string(max_body_bytes) + "; send less");
      }
      // cpp-httplib reads no body for this method: GuardedServer reads and drops it after the
      // answer (RFC 9112 frames it by Content-Length whatever the method).
      if (!read_by_library) t_unread_body = length;
      return httplib::Server::HandlerResponse::Unhandled;
    }
    if (LibraryReadsBody(req.method)) {
      // No length and no transfer coding: the request has no body. cpp-httplib would read one
      // until the client closes. The Request is the library's own non-const object, handed to
      // this handler by const reference.
      const_cast<httplib::Request&>(req).set_header("Content-Length", "0");
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
}

}  // namespace outbox::relay
