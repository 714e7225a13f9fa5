// Bounds the response head cpp-httplib reads for a webhook request.
//
// cpp-httplib 0.11 (Debian 12's libcpp-httplib) reads a response's status line with no length
// limit and matches it with std::regex, whose libstdc++ matcher recurses once per character:
// a status line of ~40 KB overflows an 8 MB thread stack (measured), so one answer from a
// receiver killed the relay, every destination with it, and again after each restart while
// the message was retried. Header lines are read whole before httplib checks its 8 KB limit,
// so a line that never ends grew memory without bound. The library is compiled (no hook runs
// before the status line is parsed), so the guard sits under it: this library defines recv()
// (plain HTTP) and SSL_read() (TLS), which cpp-httplib imports. They call the C library's and
// OpenSSL's own; while a webhook worker thread holds a ResponseHeadGuard, the bytes of the
// response head are counted per line, and a read that would pass a limit fails instead (a read
// error to cpp-httplib, before it parses the line). Other threads and callers (libpq,
// librdkafka, the test receivers) pass straight through: one thread_local test per call.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

namespace outbox::relay::webhook_detail {

/// The longest status line a receiver may send ("HTTP/1.1 200 OK" is 15 bytes).
inline constexpr std::size_t kMaxStatusLine = 4096;
/// The longest header line (cpp-httplib refuses over 8 KB once it has read it all).
inline constexpr std::size_t kMaxHeaderLine = 65536;
/// The whole head: status line and headers, with any interim (1xx) heads before it.
inline constexpr std::size_t kMaxResponseHead = 256 * 1024;

/// Armed for the scope's life on the calling thread (one request: cpp-httplib's send()).
/// Past `deadline`, every read fails (ETIMEDOUT) without reading: cpp-httplib's read timeout
/// bounds each read, not the answer, so an answer that trickles in, a byte at a time inside
/// the timeout, held the request for as long as the receiver liked.
class ResponseHeadGuard {
 public:
  using Clock = std::chrono::steady_clock;
  explicit ResponseHeadGuard(Clock::time_point deadline = Clock::time_point::max());
  ~ResponseHeadGuard();
  ResponseHeadGuard(const ResponseHeadGuard&) = delete;
  ResponseHeadGuard& operator=(const ResponseHeadGuard&) = delete;

  /// Counts bytes read for the response; false once they break a limit (then every later read
  /// fails too).
  bool Feed(const char* data, std::size_t n);
  /// Why the response was refused; empty while it was not.
  const std::string& Refused() const { return refused_; }
  /// The deadline has passed.
  bool Late() const { return Clock::now() >= deadline_; }

 private:
  bool in_head_ = true;
  bool status_line_ = true;
  std::string status_start_;  ///< The current head's first bytes: is it an interim 1xx?
  bool last_cr_ = false;
  std::size_t line_ = 0;  ///< Bytes since the last '\n'.
  std::size_t head_ = 0;
  std::string refused_;
  Clock::time_point deadline_;
  ResponseHeadGuard* outer_;
};

}  // namespace outbox::relay::webhook_detail
