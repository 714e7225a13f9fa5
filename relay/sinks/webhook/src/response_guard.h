// Bounds the response head cpp-httplib reads for a webhook request over TLS, and trims what
// such a request costs.
//
// cpp-httplib 0.11 (Debian 12's libcpp-httplib) reads a response's status line with no length
// limit and matches it with std::regex, whose libstdc++ matcher recurses once per character:
// a status line of ~40 KB overflows an 8 MB thread stack (measured), so one answer from a
// receiver killed the relay, every destination with it, and again after each restart while
// the message was retried. Header lines are read whole before httplib checks its 8 KB limit,
// so a line that never ends grew memory without bound. The library is compiled (no hook runs
// before the status line is parsed), so the guard sits under it: this library defines
// SSL_read(), which cpp-httplib imports (and SSL_write() and poll(), below). They call
// OpenSSL's and the C library's own; while a webhook worker thread holds a ResponseHeadGuard,
// the bytes of the response head are counted per line, and a read that would pass a limit
// fails instead (a read error to cpp-httplib, before it parses the line). Other threads and
// callers (libpq, librdkafka, the test receivers) pass straight through: one thread_local test
// per call. (Plain HTTP has a client of its own, plain_http.h, which applies the same limits
// as it parses.)
//
// Coalesce: the head's SSL_write is kept here and written with the body's, as one record and
// one segment (OpenSSL writes every SSL_write at once, and with TCP_NODELAY head and body went
// as two segments, each taken in by the receiver on its own); of cpp-httplib's polls, the
// liveness checks after the request's first are answered here (nothing to read: the
// connection was checked alive at the request's start). The waits for writable and readable
// stay the kernel's: cpp-httplib retries a TLS read or write that wants more up to 1000 times,
// a poll before each, and only a real poll's timeout ends that.
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

/// Why a response head was refused: the same words over plain HTTP (plain_http.cc) and TLS.
const std::string& StatusLineTooLong();
const std::string& HeaderLineTooLong();
const std::string& HeadTooLong();

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

  /// From now on the request's head waits for its body when one follows (the caller asks that
  /// only for a body that fits one TLS record with the head, kTlsCoalescedBody), and the
  /// liveness polls after the first are answered as described above.
  void Coalesce(bool body_follows) {
    coalesce_ = true;
    hold_head_ = body_follows;
  }
  /// The body is being written: the head goes with it.
  void BodyStarts() { hold_head_ = false; }
  bool Coalescing() const { return coalesce_; }
  /// What SSL_write(ssl, data, n) does while coalescing: the head kept, the body written
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
  bool hold_head_ = false;
  std::string kept_head_;  ///< The head kept for the body's record
  int body_bytes_ = 0;     ///< The body's share of kept_head_ once it was appended
  bool combined_ = false;  ///< kept_head_ holds head and body (retried as it is)
  bool liveness_checked_ = false;
  ResponseHeadGuard* outer_;
};

}  // namespace outbox::relay::webhook_detail
