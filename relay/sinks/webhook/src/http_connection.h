// The webhook sink's HTTP/1.1 client: one keep-alive connection, plain or over TLS (OpenSSL),
// blocking, owned by one worker thread.
//
// Why not cpp-httplib, which served every endpoint until session 37: per request it builds a
// std::multimap of headers compared without case (a locale tolower() per character), formats
// each header with snprintf, constructs a stream, a DataSink with a std::ostream and a Response,
// polls the socket up to six times and parses the status line with std::regex (which recursed
// once per character: a long status line overflowed the stack, and a guard had to interpose
// the C library's recv() and OpenSSL's SSL_read() under it). Measured on 2 cores
// (docs/benchmarks.md, session 37) its user-space share was ~10 us of the ~34 us a worker spent
// per message, as much as everything the relay adds (signing, headers, queue, completion)
// together. Here a request is its head (written by the sink into a buffer the worker keeps)
// and its body, written with one sendmsg() (over TLS, one SSL_write of both); the answer is
// read into a buffer the connection keeps and parsed in place, with the response head's limits
// below and the request's deadline checked as it is read.
#pragma once

#include <openssl/types.h>

#include <chrono>
#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace outbox::relay::webhook_detail {

/// The longest status line an endpoint may send ("HTTP/1.1 200 OK" is 15 bytes).
inline constexpr std::size_t kMaxStatusLine = 4096;
/// The longest header line.
inline constexpr std::size_t kMaxHeaderLine = 65536;
/// The whole head: status line and headers, with any interim (1xx) heads before it.
inline constexpr std::size_t kMaxResponseHead = 256 * 1024;

/// Why a response head was refused.
const std::string& StatusLineTooLong();
const std::string& HeaderLineTooLong();
const std::string& HeadTooLong();

/// How an exchange failed; kNone when an answer came.
enum class HttpFailure {
  kNone,
  kConnect,          ///< No connection to the address (refused, unreachable, aborted).
  kConnectTimeout,   ///< The connect did not finish within the connect timeout.
  kWrite,            ///< Writing the request failed or timed out.
  kRead,             ///< Reading the answer failed, timed out or ended before the answer did.
  kCanceled,         ///< The last check before writing said no: nothing was sent.
  kBadResponse,      ///< Not an HTTP/1.x answer, or past a limit: `refused` says why.
  kTls,              ///< The TLS handshake failed.
  kTlsVerification,  ///< The endpoint's certificate was not verified: `refused` says why.
};

/// ASCII letters compared without case (header names, tokens).
bool EqualsNoCase(std::string_view a, std::string_view b);

/// The word for a failure in reasons ("connection error: Read"), as cpp-httplib named them.
const char* ToString(HttpFailure failure);

/// What one exchange gave: the answer's status and what the sink reads of it.
struct HttpAnswer {
  HttpFailure failure = HttpFailure::kNone;
  std::string refused;  ///< kBadResponse, kTlsVerification: why.
  int status = 0;
  std::optional<std::string> retry_after;  ///< The Retry-After header, when there was one.
  std::string location;                    ///< The Location header.
  std::string body_start;                  ///< The body's first bytes (Options::keep_body).
  bool wrote = false;  ///< The request (some of it at least) was written: the endpoint may have it.
};

class HttpConnection {
 public:
  using Clock = std::chrono::steady_clock;
  struct Options {
    /// Bounds connecting, the TLS handshake included.
    std::chrono::milliseconds connect_timeout{10'000};
    /// Bounds each read and write (SO_RCVTIMEO, SO_SNDTIMEO); the request's deadline bounds
    /// the whole answer.
    std::chrono::milliseconds timeout{30'000};
    std::size_t keep_body = 1024;
    /// A socket this connection opens, before it connects (the sink keeps it to abort a request
    /// from another thread: shutdown(2) of the socket ends any wait on it); false fails the
    /// connect at once (kConnect).
    std::function<bool(int fd)> opening;
    /// The connection's socket is about to be closed.
    std::function<void()> closing;
    /// TLS: the context (verification settings and trusted CAs; the caller's, shared by its
    /// connections), and the name the endpoint's certificate must carry (also sent as SNI
    /// unless it is an IP address). Null: plain HTTP. The caller blocks SIGPIPE on the
    /// calling thread (OpenSSL writes with write(2)).
    SSL_CTX* tls = nullptr;
    std::string server_name;
  };

  explicit HttpConnection(Options options);
  ~HttpConnection();
  HttpConnection(const HttpConnection&) = delete;
  HttpConnection& operator=(const HttpConnection&) = delete;

  /// Sends `head` (request line and headers, through the empty line) and `body` to ip:port,
  /// over the connection kept from the last exchange when it is to the same address and the
  /// endpoint has not closed it meanwhile, else over a new one, and reads the answer until
  /// `deadline`. `may_send` is asked once connected, right before anything is written: false
  /// sends nothing (kCanceled).
  HttpAnswer Exchange(const std::string& ip, int port, std::string_view head, std::string_view body,
                      Clock::time_point deadline, const std::function<bool()>& may_send);

  /// Closes the kept connection, if any.
  void Close();

 private:
  HttpFailure Connect(const std::string& ip, int port, HttpAnswer* answer);
  HttpFailure Handshake(Clock::time_point until, HttpAnswer* answer);
  /// Whether the kept connection may carry another request: the endpoint has not closed it
  /// and sent nothing unasked for (over TLS, protocol messages such as session tickets aside).
  bool StillOpen();
  HttpFailure Write(std::string_view head, std::string_view body, Clock::time_point deadline);
  /// Reads more of the answer into the buffer; kNone when bytes came.
  HttpFailure Fill(Clock::time_point deadline, bool* eof);
  /// The next line of the answer's head (without CR LF), at most `limit` bytes long.
  HttpFailure NextLine(Clock::time_point deadline, std::size_t limit, const std::string& what,
                       std::string_view* line, HttpAnswer* answer);
  HttpFailure ReadAnswer(Clock::time_point deadline, HttpAnswer* answer);
  HttpFailure ReadBody(Clock::time_point deadline, std::optional<std::size_t> length, bool chunked,
                       HttpAnswer* answer);
  /// Hands up to `n` body bytes from the buffer to the answer (kept up to keep_body).
  std::size_t TakeBody(std::size_t n, HttpAnswer* answer);

  Options options_;
  int fd_ = -1;
  SSL* ssl_ = nullptr;
  std::string joined_;  ///< TLS: head and body, written as one SSL_write.
  std::string ip_;      ///< The address fd_ is connected to.
  int port_ = 0;
  bool reusable_ = false;
  /// This request's: the endpoint closed the connection (EOF, reset, broken pipe), and how
  /// many bytes of the answer came before.
  bool closed_by_peer_ = false;
  std::size_t received_ = 0;  ///< Fit for a request: new, or the last answer left it so.
  std::vector<char> buf_;     ///< What was read and not yet parsed: [begin_, end_).
  std::size_t begin_ = 0;
  std::size_t end_ = 0;
  std::size_t head_bytes_ = 0;  ///< Bytes of the answer's head (interim heads included).
};

}  // namespace outbox::relay::webhook_detail
