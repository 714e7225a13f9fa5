// What cpp-httplib 0.11 reads of a request body before any handler (or the token check) runs.
//
// The library reads a POST, PUT, PATCH or DELETE body into memory before it routes the
// request: a body in chunked transfer encoding with no limit at all (set_payload_max_length
// checks only Content-Length), and a body with neither header until the client closes the
// connection. Anyone who could reach the admin or management port, with or without the
// token, could grow the relay's memory until the kernel killed it; and a DELETE sent without
// Content-Length (curl's) waited for the read timeout before it was answered. This installs
// a pre-routing handler, which runs after the request head and before the body is read:
// - Transfer-Encoding of any kind: 411 (send Content-Length);
// - Content-Length over max_body_bytes: 413 (a body up to 64 times the limit is read and
//   dropped first, so that a client still writing it gets the answer; a larger one is not);
// - a method that may carry a body, with no Content-Length: no body (RFC 9112 section 6.3),
//   as if it said Content-Length: 0.
// - a GET, HEAD or other method cpp-httplib reads no body for, with a Content-Length: its
//   body is read and dropped after the answer (up to max_body_bytes; over it, 413), so that
//   it is not read as the next request.
// A refused request's body is not read: the answer says `Connection: close` and the
// connection closes (its bytes used to be read as the next request, and answered 400).
//
// And what it reads of a request head: a request line or header line is read whole, whatever
// its length, before any check (memory grows as long as the client sends bytes without a line
// end), and a connection keeps its worker as long as bytes trickle in, each read waiting up to
// the read timeout (slowloris: a few such connections take every worker). GuardedServer bounds
// both.
#pragma once

#include <httplib.h>

#include <chrono>
#include <cstddef>
#include <functional>
#include <string>

namespace outbox::relay {

/// How much of a request GuardedServer waits for.
struct RequestReadLimits {
  /// The request line and headers, line ends included: over it, 431 and the connection closes.
  std::size_t max_head_bytes = 32 * 1024;
  /// From its first byte, the whole request (head and body) must arrive within this: else 408
  /// and the connection closes.
  std::chrono::milliseconds request_timeout{10'000};
};

/// Writes a refusal (status, a short machine-readable code, a message naming the fix) in the
/// server's own format.
using RefusalWriter = std::function<void(httplib::Response& res, int status,
                                         const std::string& code, const std::string& message)>;

/// A cpp-httplib server that reads requests through RequestReadLimits; otherwise the same
/// (keep-alive, timeouts, routes, handlers). Its connections are read by its own loop and
/// stream, the way cpp-httplib's TLS server wraps its own. Its 431 and 408 are written by the
/// RefusalWriter LimitRequestBodies was given (plain text before that).
class GuardedServer : public httplib::Server {
 public:
  explicit GuardedServer(RequestReadLimits limits = {}) : limits_(limits) {}

 private:
  friend void LimitRequestBodies(GuardedServer&, std::size_t, RefusalWriter);
  bool process_and_close_socket(socket_t sock) override;

  RequestReadLimits limits_;
  RefusalWriter refusal_;  ///< Set before the server listens; read-only after.
};

/// Also sets the server's payload limit to max_body_bytes, and has `write` answer the
/// server's own refusals (431, 408). Call before the server listens, and install no other
/// pre-routing handler.
void LimitRequestBodies(GuardedServer& server, std::size_t max_body_bytes, RefusalWriter write);

}  // namespace outbox::relay
