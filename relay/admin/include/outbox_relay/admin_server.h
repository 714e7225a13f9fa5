// The admin HTTP listener: /metrics, /healthz, /readyz on its own threads, off the delivery
// path (a slow or stuck scraper costs nothing but its own connection).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "outbox_relay/metrics.h"

namespace outbox::relay {

/// "host:port", "[v6addr]:port" or ":port" (all interfaces) split into host and port;
/// port 0 asks for an ephemeral port. Throws std::invalid_argument naming the problem.
struct ListenAddress {
  std::string host;
  int port = 0;
};
ListenAddress ParseListenAddress(const std::string& listen);

/// Serves, for GET (and HEAD):
///   /metrics  200, Content-Type "text/plain; version=0.0.4; charset=utf-8", RelayMetrics::Render()
///   /healthz  200 "ok" while the process is alive (the server answering is the signal)
///   /readyz   200 "ready" when ready() returns true, else 503 "not ready: <ready_detail()>"
/// Anything else: 404. ready and ready_detail run on the server's threads (must be
/// thread-safe; an exception counts as not ready). While running, the server also backs
/// the gauge outbox_relay_ready with `ready`.
class AdminServer {
 public:
  AdminServer(std::string listen, RelayMetrics& metrics, std::function<bool()> ready,
              std::function<std::string()> ready_detail);
  ~AdminServer();  ///< Stop().
  AdminServer(const AdminServer&) = delete;
  AdminServer& operator=(const AdminServer&) = delete;

  /// Binds and starts serving; returns once the server accepts connections. Throws
  /// std::invalid_argument for a malformed address and std::runtime_error when it cannot
  /// bind (address in use, no such interface). Call once.
  void Start();
  /// Stops accepting, finishes the requests in progress, joins the threads. Idempotent.
  void Stop();
  /// The bound port (the real one when started with port 0); 0 before Start().
  int port() const;
  /// The host it listens on, as given (e.g. "0.0.0.0").
  const std::string& host() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace outbox::relay
