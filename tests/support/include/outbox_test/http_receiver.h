// An in-process HTTP(S) receiver on 127.0.0.1 port 0 that records what it receives and
// answers as a test tells it to.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace outbox::testing {

struct ReceivedRequest {
  std::string method;
  std::string path;    ///< Percent-decoded path, without the query string.
  std::string target;  ///< Request target exactly as sent: raw path plus "?query" if any.
  std::multimap<std::string, std::string>
      headers;  ///< Names as sent (httplib compares case-insensitively).
  std::string body;
  std::string remote_addr;
  int remote_port = 0;  ///< Distinct (addr, port) pairs = distinct TCP connections.
  std::chrono::steady_clock::time_point at;
  /// First value of header `name` (case-insensitive), or "" when absent.
  std::string Header(const std::string& name) const;
};

struct Reply {
  int status = 200;
  std::string body = "ok";
  std::map<std::string, std::string> headers;
  std::chrono::milliseconds delay{0};  ///< Sleep before answering (for timeout tests).
};

struct TlsFiles {
  std::string cert_pem_path;  ///< Server certificate.
  std::string key_pem_path;   ///< Server private key.
};

class HttpReceiver {
 public:
  /// Plain HTTP on 127.0.0.1, ephemeral port.
  HttpReceiver();
  /// HTTPS with the given certificate and key.
  explicit HttpReceiver(const TlsFiles& tls);
  ~HttpReceiver();  ///< Stops the server and joins its thread.
  HttpReceiver(const HttpReceiver&) = delete;
  HttpReceiver& operator=(const HttpReceiver&) = delete;

  int port() const;
  /// "http://127.0.0.1:PORT" + path (or https:// for a TLS receiver).
  std::string Url(const std::string& path = "/") const;

  /// Decides the reply to each request (called on server threads; must be thread-safe).
  /// The request is recorded before the responder runs. Default: 200 "ok".
  void SetResponder(std::function<Reply(const ReceivedRequest&)> responder);

  std::vector<ReceivedRequest> Requests() const;  ///< Copy of everything received so far.
  std::size_t Count() const;
  /// Number of distinct TCP connections seen.
  std::size_t ConnectionCount() const;
  /// Blocks until Count() >= n or timeout; returns whether it got there.
  bool WaitForCount(std::size_t n, std::chrono::milliseconds timeout) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Writes a self-signed CA and a server certificate for 127.0.0.1/localhost signed by it
/// into a fresh temp dir (uses the openssl command line tool).
struct TestPki {
  std::string dir;
  std::string ca_cert_path;
  TlsFiles server;
};
TestPki MakeTestPki();

}  // namespace outbox::testing
