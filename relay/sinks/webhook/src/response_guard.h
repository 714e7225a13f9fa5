// Bounds the response head cpp-httplib reads for a webhook request.
//
// cpp-httplib 0.11 (Debian 12's libcpp-httplib) reads a response's status line with no length
// limit and matches it with std::regex, whose libstdc++ matcher recurses once per character:
// a status line of ~40 KB overflows an 8 MB thread stack (measured), so one answer from a
// receiver killed the relay, every destination with it, and again after each restart while
// the message was retried. Header lines are read whole before httplib checks its 8 KB limit,
// so a line that never ends grew memory without bound. The library is compiled (no hook runs
// before the status line is parsed), so the guard sits under it: this library defines recv()
// (plain HTTP) and SSL_read() (TLS), which cpp-httplib imports (and send(), poll() and
// SSL_write(), below). They call the C library's and
// OpenSSL's own; while a webhook worker thread holds a ResponseHeadGuard, the bytes of the
// response head are counted per line, and a read that would pass a limit fails instead (a read
// error to cpp-httplib, before it parses the line). Other threads and callers (libpq,
// librdkafka, the test receivers) pass straight through: one thread_local test per call.
//
// The same seam trims what a plain-HTTP request costs in system calls (Coalesce): cpp-httplib
// writes the head and the body with a send() each, and before every send it polls the socket
// twice (writable? closed by the peer?) and before every read once more: six polls, two sends
// and a receive per request, and with TCP_NODELAY two segments, each taken in by the receiver
// on its own. Armed, this library also defines send() and poll(): the head goes with MSG_MORE
// (it waits in the socket for the body, and both leave as one segment), and of the polls only
// the request's first liveness check is asked of the kernel. The others cannot change what
// happens: the socket is blocking with cpp-httplib's read and write timeouts (SO_RCVTIMEO,
// SO_SNDTIMEO), so the send or receive that follows waits exactly as long as the poll would
// have, and fails the same way (and a receive that returns past the request's deadline fails,
// as the poll's wait ended there), and a peer that closed the connection since the check fails
// the write or the read instead of the poll. The connect's poll (POLLIN|POLLOUT) is the
// kernel's.
//
// Over TLS (OpenSSL writes with write(), a record per SSL_write) the head's SSL_write is kept
// here and written with the body's, as one record and one segment; of the polls only the
// liveness checks after the first are answered here. The waits for writable and readable stay
// the kernel's: cpp-httplib retries a TLS read or write that wants more up to 1000 times, a
// poll before each, and only a real poll's timeout ends that.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <utility>

struct ssl_st;
using SSL = ssl_st;

namespace outbox::relay::webhook_detail {

/// The longest status line a receiver may send ("HTTP/1.1 200 OK" is 15 bytes).
inline constexpr std::size_t kMaxStatusLine = 4096;
/// The longest header line (cpp-httplib refuses over 8 KB once it has read it all).
inline constexpr std::size_t kMaxHeaderLine = 65536;
/// TLS: the largest body whose request head waits for it, both in one record (16 KiB at most;
/// a larger one is split into records anyway, and copying it to join the head gains nothing).
inline constexpr std::size_t kTlsCoalescedBody = 8192;
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

  /// From now on the request's head waits for its body when one follows (MSG_MORE over plain
  /// HTTP, kept here over TLS: the caller asks that only for a body that fits one TLS record
  /// with the head, kTlsCoalescedBody), and readiness polls are answered as described above.
  void Coalesce(bool body_follows, bool tls) {
    coalesce_ = true;
    tls_ = tls;
    hold_head_ = body_follows;
  }
  /// The body is being written: the head goes with it.
  void BodyStarts() { hold_head_ = false; }
  bool Coalescing() const { return coalesce_; }
  bool Tls() const { return tls_; }
  bool HoldingHead() const { return hold_head_; }
  /// TLS: what SSL_write(ssl, data, n) does while coalescing: the head kept, the body written
  /// with it (`write` is OpenSSL's own SSL_write).
  int WriteTls(SSL* ssl, const void* data, int n, int (*write)(SSL*, const void*, int));
  /// The first liveness check (a poll for input with no wait) is the kernel's; true for it.
  bool FirstLivenessCheck() { return !std::exchange(liveness_checked_, true); }

 private:
  bool in_head_ = true;
  bool status_line_ = true;
  std::string status_start_;  ///< The current head's first bytes: is it an interim 1xx?
  bool last_cr_ = false;
  std::size_t line_ = 0;  ///< Bytes since the last '\n'.
  std::size_t head_ = 0;
  std::string refused_;
  Clock::time_point deadline_;
  bool coalesce_ = false;
  bool tls_ = false;
  bool hold_head_ = false;
  std::string kept_head_;  ///< TLS: the head kept for the body's record
  int body_bytes_ = 0;     ///< TLS: the body's share of kept_head_ once it was appended
  bool combined_ = false;  ///< TLS: kept_head_ holds head and body (retried as it is)
  bool liveness_checked_ = false;
  ResponseHeadGuard* outer_;
};

}  // namespace outbox::relay::webhook_detail
