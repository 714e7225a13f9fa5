#include "http_connection.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>

namespace outbox::relay::webhook_detail {
namespace {

constexpr std::size_t kReadSize = 16 * 1024;
/// A chunk-size line ("1a2b;ext=x"): hex digits and extensions, well under this.
constexpr std::size_t kMaxChunkLine = 4096;

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

/// Whether a comma-separated header value (Connection, Transfer-Encoding) lists `token`;
/// `last` asks whether it is the last one listed.
bool ListsToken(std::string_view value, std::string_view token, bool last = false) {
  bool found = false;
  while (true) {
    const std::size_t comma = value.find(',');
    const std::string_view item = Trim(value.substr(0, comma));
    if (!item.empty()) found = EqualsNoCase(item, token);
    if (found && !last) return true;
    if (comma == std::string_view::npos) return found;
    value.remove_prefix(comma + 1);
  }
}

const std::string& ChunkLineTooLong() {
  static const std::string why = "a chunk-size line of the response's body is longer than " +
                                 std::to_string(kMaxChunkLine) + " bytes; not read further";
  return why;
}

/// A header name for a reason: at most 64 bytes, anything but printable ASCII as '?'.
std::string Printable(std::string_view name) {
  std::string out(name.substr(0, 64));
  for (char& c : out) c = c >= 0x20 && c < 0x7F ? c : '?';
  return out;
}

bool IsIpAddress(const std::string& host) {
  in6_addr any{};
  return ::inet_pton(AF_INET, host.c_str(), &any) == 1 ||
         ::inet_pton(AF_INET6, host.c_str(), &any) == 1;
}

bool SetBlocking(int fd, bool blocking) {
  const int flags = ::fcntl(fd, F_GETFL);
  return flags >= 0 &&
         ::fcntl(fd, F_SETFL, blocking ? flags & ~O_NONBLOCK : flags | O_NONBLOCK) == 0;
}

int Millis(std::chrono::steady_clock::duration d) {
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(d).count();
  return static_cast<int>(std::clamp<long long>(ms, 0, 1 << 30));
}

}  // namespace

const std::string& StatusLineTooLong() {
  static const std::string why = "the response's status line is longer than " +
                                 std::to_string(kMaxStatusLine) +
                                 " bytes (not an HTTP answer); not read further";
  return why;
}
const std::string& HeaderLineTooLong() {
  static const std::string why = "a response header line is longer than " +
                                 std::to_string(kMaxHeaderLine) + " bytes; not read further";
  return why;
}
const std::string& HeadTooLong() {
  static const std::string why = "the response's headers are longer than " +
                                 std::to_string(kMaxResponseHead) + " bytes; not read further";
  return why;
}

bool EqualsNoCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    char x = a[i], y = b[i];
    if (x >= 'A' && x <= 'Z') x = static_cast<char>(x - 'A' + 'a');
    if (y >= 'A' && y <= 'Z') y = static_cast<char>(y - 'A' + 'a');
    if (x != y) return false;
  }
  return true;
}

const char* ToString(HttpFailure failure) {
  switch (failure) {
    case HttpFailure::kNone:
      return "Success";
    case HttpFailure::kConnect:
      return "Connection";
    case HttpFailure::kConnectTimeout:
      return "ConnectionTimeout";
    case HttpFailure::kWrite:
      return "Write";
    case HttpFailure::kRead:
      return "Read";
    case HttpFailure::kCanceled:
      return "Canceled";
    case HttpFailure::kBadResponse:
      return "BadResponse";
    case HttpFailure::kTls:
      return "SSLConnection";
    case HttpFailure::kTlsVerification:
      return "SSLServerVerification";
  }
  return "Unknown";
}

HttpConnection::HttpConnection(Options options) : options_(std::move(options)) {}

HttpConnection::~HttpConnection() { Close(); }

void HttpConnection::Close() {
  if (fd_ < 0) return;
  if (options_.closing) options_.closing();
  if (ssl_ != nullptr) {
    SSL_free(ssl_);  // no close_notify: it is a write that may wait, and nothing needs it
    ssl_ = nullptr;
  }
  ::close(fd_);
  fd_ = -1;
  reusable_ = false;
  begin_ = end_ = 0;
}

HttpAnswer HttpConnection::Exchange(const std::string& ip, int port, std::string_view head,
                                    std::string_view body, Clock::time_point deadline,
                                    const std::function<bool()>& may_send) {
  HttpAnswer answer;
  bool kept = false;
  if (fd_ >= 0) {
    // Kept alive: still to the same address, and not closed by the endpoint meanwhile (an idle
    // timeout).
    kept = reusable_ && ip == ip_ && port == port_ && StillOpen();
    if (!kept) Close();
  }
  while (true) {
    if (fd_ < 0) {
      answer.failure = Connect(ip, port, &answer);
      if (answer.failure != HttpFailure::kNone) {
        Close();
        return answer;
      }
    }
    if (!may_send()) {
      answer.failure = HttpFailure::kCanceled;
      return answer;  // nothing written: the connection stays as good as it was
    }
    reusable_ = false;  // until an answer says otherwise
    closed_by_peer_ = false;
    received_ = 0;
    answer.wrote = true;
    answer.failure = Write(head, body, deadline);
    if (answer.failure == HttpFailure::kNone) answer.failure = ReadAnswer(deadline, &answer);
    // A kept connection the endpoint closed as the request reached it, before a byte of the
    // answer (an idle timeout that fired meanwhile; the check before reusing it has a window):
    // the request goes once more on a new connection, as Go's and hyper's clients send again a
    // request that carries an idempotency key. The endpoint may have taken the first one in.
    // (Not one the caller gave up on: its shutdown of the socket looks the same.)
    // A connect's worth of time must be left for it.
    if (answer.failure != HttpFailure::kNone && kept && closed_by_peer_ && received_ == 0 &&
        deadline - Clock::now() > options_.connect_timeout && may_send()) {
      Close();
      kept = false;
      answer = HttpAnswer{};
      answer.wrote = true;  // the first one may have been taken in
      continue;
    }
    break;
  }
  if (answer.failure != HttpFailure::kNone || !reusable_) Close();
  if (buf_.size() > 4 * kReadSize && begin_ == end_) {
    std::vector<char>().swap(buf_);  // a large answer's buffer is not kept for small ones
    begin_ = end_ = 0;
  }
  return answer;
}

bool HttpConnection::StillOpen() {
  // Plaintext OpenSSL holds from a record read in part is bytes no request asked for.
  if (ssl_ != nullptr && SSL_pending(ssl_) > 0) return false;
  pollfd p{fd_, POLLIN, 0};
  const int ready = ::poll(&p, 1, 0);
  if (ready == 0) return true;
  // Plain: anything readable is the endpoint's FIN or bytes no request asked for. TLS: maybe
  // only a protocol message (a TLS 1.3 session ticket, a key update), which a read without
  // waiting takes in and leaves nothing.
  if (ready < 0 || ssl_ == nullptr || !SetBlocking(fd_, false)) return false;
  ERR_clear_error();
  char byte;
  const int n = SSL_read(ssl_, &byte, 1);
  const bool open = n <= 0 && SSL_get_error(ssl_, n) == SSL_ERROR_WANT_READ;
  return SetBlocking(fd_, true) && open;
}

HttpFailure HttpConnection::Connect(const std::string& ip, int port, HttpAnswer* answer) {
  sockaddr_storage address{};
  socklen_t address_len = 0;
  auto* v4 = reinterpret_cast<sockaddr_in*>(&address);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&address);
  if (::inet_pton(AF_INET, ip.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(static_cast<std::uint16_t>(port));
    address_len = sizeof *v4;
  } else if (::inet_pton(AF_INET6, ip.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(static_cast<std::uint16_t>(port));
    address_len = sizeof *v6;
  } else {
    return HttpFailure::kConnect;
  }
  fd_ = ::socket(address.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd_ < 0) return HttpFailure::kConnect;
  ip_ = ip;
  port_ = port;
  begin_ = end_ = 0;
  if (options_.opening && !options_.opening(fd_)) return HttpFailure::kConnect;
  const int one = 1;
  ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  const auto until = Clock::now() + options_.connect_timeout;
  if (::connect(fd_, reinterpret_cast<const sockaddr*>(&address), address_len) != 0) {
    if (errno != EINPROGRESS) return HttpFailure::kConnect;
    while (true) {
      pollfd p{fd_, POLLOUT, 0};
      const int ready = ::poll(&p, 1, Millis(until - Clock::now()));
      if (ready > 0) break;
      if (ready == 0) return HttpFailure::kConnectTimeout;
      if (errno != EINTR) return HttpFailure::kConnect;
    }
    int error = 0;
    socklen_t len = sizeof error;
    if (::getsockopt(fd_, SOL_SOCKET, SO_ERROR, &error, &len) != 0 || error != 0) {
      return HttpFailure::kConnect;
    }
  }
  if (options_.tls != nullptr) {
    if (const auto failure = Handshake(until, answer); failure != HttpFailure::kNone) {
      return failure;
    }
  }
  if (!SetBlocking(fd_, true)) return HttpFailure::kConnect;
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(options_.timeout).count();
  const timeval wait{static_cast<time_t>(us / 1'000'000), static_cast<suseconds_t>(us % 1'000'000)};
  ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof wait);
  ::setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &wait, sizeof wait);
  reusable_ = true;  // nothing sent on it yet
  return HttpFailure::kNone;
}

HttpFailure HttpConnection::Handshake(Clock::time_point until, HttpAnswer* answer) {
  ssl_ = SSL_new(options_.tls);
  if (ssl_ == nullptr || SSL_set_fd(ssl_, fd_) != 1) return HttpFailure::kTls;
  const std::string& name = options_.server_name;
  const bool ip = IsIpAddress(name);
  if (!ip && SSL_set_tlsext_host_name(ssl_, name.c_str()) != 1) return HttpFailure::kTls;
  if (SSL_get_verify_mode(ssl_) != SSL_VERIFY_NONE) {
    // The certificate must name the endpoint's host (its IP address when the URL gives one),
    // not only chain to a trusted CA.
    const int named = ip ? X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl_), name.c_str())
                         : SSL_set1_host(ssl_, name.c_str());
    if (named != 1) return HttpFailure::kTls;
  }
  while (true) {
    ERR_clear_error();
    const int done = SSL_connect(ssl_);
    if (done == 1) return HttpFailure::kNone;
    const int error = SSL_get_error(ssl_, done);
    short wait = error == SSL_ERROR_WANT_READ    ? POLLIN
                 : error == SSL_ERROR_WANT_WRITE ? POLLOUT
                                                 : 0;
    if (wait == 0) {
      // (With verification off the result is not looked at: the handshake failed otherwise.)
      const long verified = SSL_get_verify_mode(ssl_) != SSL_VERIFY_NONE
                                ? SSL_get_verify_result(ssl_)
                                : static_cast<long>(X509_V_OK);
      if (verified != X509_V_OK) {
        answer->refused = X509_verify_cert_error_string(verified);
        return HttpFailure::kTlsVerification;
      }
      return HttpFailure::kTls;
    }
    pollfd p{fd_, wait, 0};
    const int ready = ::poll(&p, 1, Millis(until - Clock::now()));
    if (ready == 0) return HttpFailure::kConnectTimeout;
    if (ready < 0 && errno != EINTR) return HttpFailure::kTls;
  }
}

HttpFailure HttpConnection::Write(std::string_view head, std::string_view body,
                                  Clock::time_point deadline) {
  if (ssl_ != nullptr) {
    // One SSL_write of head and body: one record (a body over 16 KiB continues in more), and
    // one segment where it fits, where two writes were two of each.
    joined_.assign(head).append(body);
    ERR_clear_error();
    if (joined_.size() > static_cast<std::size_t>(std::numeric_limits<int>::max())) {
      return HttpFailure::kWrite;
    }
    const int written = SSL_write(ssl_, joined_.data(), static_cast<int>(joined_.size()));
    if (written <= 0) {
      closed_by_peer_ = SSL_get_error(ssl_, written) == SSL_ERROR_SYSCALL &&
                        (errno == EPIPE || errno == ECONNRESET);
      return HttpFailure::kWrite;
    }
    if (Clock::now() >= deadline) return HttpFailure::kWrite;
    if (joined_.capacity() > 4 * kReadSize) std::string().swap(joined_);
    return HttpFailure::kNone;
  }
  iovec parts[2] = {{const_cast<char*>(head.data()), head.size()},
                    {const_cast<char*>(body.data()), body.size()}};
  msghdr message{};
  message.msg_iov = parts;
  message.msg_iovlen = body.empty() ? 1 : 2;
  std::size_t left = head.size() + body.size();
  while (left > 0) {
    if (Clock::now() >= deadline) return HttpFailure::kWrite;
    const ssize_t n = ::sendmsg(fd_, &message, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      closed_by_peer_ = errno == EPIPE || errno == ECONNRESET;
      return HttpFailure::kWrite;
    }
    left -= static_cast<std::size_t>(n);
    auto written = static_cast<std::size_t>(n);
    while (written > 0 && message.msg_iovlen > 0) {
      iovec& first = message.msg_iov[0];
      const std::size_t step = std::min(written, first.iov_len);
      first.iov_base = static_cast<char*>(first.iov_base) + step;
      first.iov_len -= step;
      written -= step;
      if (first.iov_len == 0) {
        ++message.msg_iov;
        --message.msg_iovlen;
      }
    }
  }
  return HttpFailure::kNone;
}

HttpFailure HttpConnection::Fill(Clock::time_point deadline, bool* eof) {
  if (eof != nullptr) *eof = false;
  if (begin_ == end_) {
    begin_ = end_ = 0;
  } else if (begin_ > 0 && buf_.size() - end_ < kReadSize / 2) {
    std::memmove(buf_.data(), buf_.data() + begin_, end_ - begin_);
    end_ -= begin_;
    begin_ = 0;
  }
  if (buf_.size() - end_ < kReadSize / 2) buf_.resize(std::max(kReadSize, buf_.size() * 2));
  while (true) {
    // Each read waits at most the timeout (SO_RCVTIMEO); the answer as a whole must end by
    // the deadline: one that trickles in, a byte at a time inside the timeout, does not hold
    // the worker for as long as the endpoint likes.
    if (Clock::now() >= deadline) return HttpFailure::kRead;
    if (ssl_ != nullptr) {
      ERR_clear_error();
      const int n = SSL_read(ssl_, buf_.data() + end_,
                             static_cast<int>(std::min<std::size_t>(
                                 buf_.size() - end_, std::numeric_limits<int>::max())));
      if (n > 0) {
        received_ += static_cast<std::size_t>(n);
        if (Clock::now() >= deadline) return HttpFailure::kRead;
        end_ += static_cast<std::size_t>(n);
        return HttpFailure::kNone;
      }
      // The endpoint closed (with close_notify, or without: the context ignores an unexpected
      // EOF, which ends a body that runs until the close as a plain connection's FIN does).
      const int error = SSL_get_error(ssl_, n);
      closed_by_peer_ = error == SSL_ERROR_ZERO_RETURN ||
                        (error == SSL_ERROR_SYSCALL && (errno == ECONNRESET || errno == EPIPE));
      if (error == SSL_ERROR_ZERO_RETURN && eof != nullptr) *eof = true;
      return HttpFailure::kRead;  // a timeout (SO_RCVTIMEO) is SSL_ERROR_WANT_READ
    }
    const ssize_t n = ::recv(fd_, buf_.data() + end_, buf_.size() - end_, 0);
    if (n > 0) {
      received_ += static_cast<std::size_t>(n);
      if (Clock::now() >= deadline) return HttpFailure::kRead;
      end_ += static_cast<std::size_t>(n);
      return HttpFailure::kNone;
    }
    if (n == 0) {
      closed_by_peer_ = true;
      if (eof != nullptr) *eof = true;
      return HttpFailure::kRead;
    }
    if (errno == ECONNRESET) closed_by_peer_ = true;
    if (errno != EINTR) return HttpFailure::kRead;
  }
}

HttpFailure HttpConnection::NextLine(Clock::time_point deadline, std::size_t limit,
                                     const std::string& what, std::string_view* line,
                                     HttpAnswer* answer) {
  std::size_t scanned = begin_;
  while (true) {
    const char* start = buf_.data() + begin_;
    const void* nl =
        scanned < end_ ? std::memchr(buf_.data() + scanned, '\n', end_ - scanned) : nullptr;
    const std::size_t length = nl != nullptr
                                   ? static_cast<std::size_t>(static_cast<const char*>(nl) - start)
                                   : end_ - begin_;
    // A line's bytes before its LF (CR included) count against its limit, the head's bytes
    // with every LF against the head's.
    if (length > limit || head_bytes_ + length + (nl != nullptr ? 1 : 0) > kMaxResponseHead) {
      answer->refused = length > limit ? what : HeadTooLong();
      return HttpFailure::kBadResponse;
    }
    if (nl != nullptr) {
      head_bytes_ += length + 1;
      *line = std::string_view(start, length);
      if (!line->empty() && line->back() == '\r') line->remove_suffix(1);
      begin_ += length + 1;
      return HttpFailure::kNone;
    }
    scanned = end_;
    const std::size_t at = begin_;
    if (const auto failure = Fill(deadline, nullptr); failure != HttpFailure::kNone) {
      return failure;
    }
    scanned -= at - begin_;  // Fill may have moved what was unread to the buffer's start
  }
}

HttpFailure HttpConnection::ReadAnswer(Clock::time_point deadline, HttpAnswer* answer) {
  head_bytes_ = 0;
  bool http10 = false;
  while (true) {  // interim answers (1xx but 101) come before the final one; each is skipped
    std::string_view line;
    if (const auto f = NextLine(deadline, kMaxStatusLine, StatusLineTooLong(), &line, answer);
        f != HttpFailure::kNone) {
      return f;
    }
    // "HTTP/1.x SSS reason": the reason phrase may be empty, its space too.
    int status = 0;
    if (line.size() < 12 || line.compare(0, 7, "HTTP/1.") != 0 || line[7] < '0' || line[7] > '9' ||
        line[8] != ' ' ||
        std::from_chars(line.data() + 9, line.data() + 12, status).ptr != line.data() + 12 ||
        status < 100 || (line.size() > 12 && line[12] != ' ')) {
      answer->refused = "the response does not start with an HTTP/1.x status line";
      return HttpFailure::kBadResponse;
    }
    http10 = line[7] == '0';
    answer->status = status;
    answer->retry_after.reset();
    answer->location.clear();
    std::optional<std::size_t> length;
    bool chunked = false, close = false, keep_alive = false, framed_by_close = false;
    bool transfer_encoding = false;
    std::string_view framing;  // the last field, when it was one that frames or ends the answer
    while (true) {
      if (const auto f = NextLine(deadline, kMaxHeaderLine, HeaderLineTooLong(), &line, answer);
          f != HttpFailure::kNone) {
        return f;
      }
      if (line.empty()) break;
      if (line.front() == ' ' || line.front() == '\t') {
        // obs-fold: the last field's value goes on. Ignored, but where it would change how the
        // answer is framed or whether the connection ends.
        if (!framing.empty()) {
          answer->refused = "the response's " + std::string(framing) + " is folded over two lines";
          return HttpFailure::kBadResponse;
        }
        continue;
      }
      framing = {};
      const std::size_t colon = line.find(':');
      if (colon == std::string_view::npos || colon == 0) continue;  // not a field: ignored
      const std::string_view name = line.substr(0, colon);
      if (name.back() == ' ' || name.back() == '\t') {
        // "Content-Length : 5" is no Content-Length to a strict reader and one to a lenient
        // one: the answer's framing would be a guess (RFC 9112 5.1).
        answer->refused = "a response header name ends in whitespace (\"" + Printable(name) + "\")";
        return HttpFailure::kBadResponse;
      }
      const std::string_view value = Trim(line.substr(colon + 1));
      if (EqualsNoCase(name, "content-length")) {
        std::size_t n = 0;
        const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
        if (ec != std::errc() || end != value.data() + value.size() || (length && *length != n)) {
          answer->refused = "the response's Content-Length is not one number";
          return HttpFailure::kBadResponse;
        }
        length = n;
        framing = "Content-Length";
      } else if (EqualsNoCase(name, "transfer-encoding")) {
        // Chunked when it is the last coding; any other framing runs until the close.
        chunked = ListsToken(value, "chunked", true);
        framed_by_close = !chunked;
        transfer_encoding = true;
        framing = "Transfer-Encoding";
      } else if (EqualsNoCase(name, "connection")) {
        close = close || ListsToken(value, "close");
        keep_alive = keep_alive || ListsToken(value, "keep-alive");
        framing = "Connection";
      } else if (EqualsNoCase(name, "retry-after")) {
        answer->retry_after = std::string(value);
      } else if (EqualsNoCase(name, "location")) {
        answer->location = std::string(value);
      }
    }
    if (status < 200 && status != 101) continue;  // interim: the final answer follows
    const bool length_given = length.has_value();
    const bool no_body = status < 200 || status == 204 || status == 304;
    if (no_body) {
      chunked = framed_by_close = false;
      length = 0;
    } else if (chunked || framed_by_close) {
      length.reset();  // Transfer-Encoding overrides Content-Length (RFC 9112 6.3)
    } else if (!length) {
      framed_by_close = true;  // neither: the body runs until the endpoint closes
    }
    if (const auto f = ReadBody(deadline, framed_by_close ? std::nullopt : length, chunked, answer);
        f != HttpFailure::kNone) {
      return f;
    }
    // Another request may follow on this connection: HTTP/1.1 unless it said close, HTTP/1.0
    // only when it said keep-alive; a body framed, not ended by the close; nothing unasked for
    // left over (here, or in OpenSSL from a record read in part); not a 101 (the connection
    // would speak another protocol); not one that named both Transfer-Encoding and
    // Content-Length (the endpoint may have meant the other: RFC 9112 6.3).
    reusable_ = !framed_by_close && status != 101 && !close && (!http10 || keep_alive) &&
                !(transfer_encoding && length_given) && begin_ == end_ &&
                (ssl_ == nullptr || SSL_pending(ssl_) == 0);
    return HttpFailure::kNone;
  }
}

std::size_t HttpConnection::TakeBody(std::size_t n, HttpAnswer* answer) {
  n = std::min(n, end_ - begin_);
  if (answer->body_start.size() < options_.keep_body) {
    answer->body_start.append(buf_.data() + begin_,
                              std::min(n, options_.keep_body - answer->body_start.size()));
  }
  begin_ += n;
  return n;
}

HttpFailure HttpConnection::ReadBody(Clock::time_point deadline, std::optional<std::size_t> length,
                                     bool chunked, HttpAnswer* answer) {
  if (!chunked) {
    if (!length) {  // until the endpoint closes the connection
      while (true) {
        TakeBody(end_ - begin_, answer);
        bool eof = false;
        const auto f = Fill(deadline, &eof);
        if (eof) return HttpFailure::kNone;
        if (f != HttpFailure::kNone) return f;
      }
    }
    std::size_t left = *length;
    while (true) {
      left -= TakeBody(left, answer);
      if (left == 0) return HttpFailure::kNone;
      if (const auto f = Fill(deadline, nullptr); f != HttpFailure::kNone) return f;
    }
  }
  // Chunked: "size[;extensions]" CRLF, the chunk, CRLF; a chunk of size 0 ends it, then any
  // trailer fields up to an empty line. Chunk lines count as head bytes do (they are bounded).
  while (true) {
    std::string_view line;
    head_bytes_ = 0;
    if (const auto f = NextLine(deadline, kMaxChunkLine, ChunkLineTooLong(), &line, answer);
        f != HttpFailure::kNone) {
      return f;
    }
    line = Trim(line.substr(0, line.find(';')));
    std::size_t size = 0;
    const auto [end, ec] = std::from_chars(line.data(), line.data() + line.size(), size, 16);
    if (line.empty() || ec != std::errc() || end != line.data() + line.size()) {
      answer->refused = "the response's chunked body has a bad chunk size";
      return HttpFailure::kBadResponse;
    }
    if (size == 0) break;
    while (size > 0) {
      size -= TakeBody(size, answer);
      if (size > 0) {
        if (const auto f = Fill(deadline, nullptr); f != HttpFailure::kNone) return f;
      }
    }
    if (const auto f = NextLine(deadline, kMaxChunkLine, ChunkLineTooLong(), &line, answer);
        f != HttpFailure::kNone) {
      return f;
    }
    if (!line.empty()) {
      answer->refused = "the response's chunked body has a chunk longer than its size";
      return HttpFailure::kBadResponse;
    }
  }
  while (true) {  // trailer fields, bounded as header lines are
    std::string_view line;
    if (const auto f = NextLine(deadline, kMaxHeaderLine, HeaderLineTooLong(), &line, answer);
        f != HttpFailure::kNone) {
      return f;
    }
    if (line.empty()) return HttpFailure::kNone;
  }
}

}  // namespace outbox::relay::webhook_detail
