#include "outbox_relay/admin_server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <atomic>
#include <cctype>
#include <chrono>
#include <stdexcept>
#include <thread>

#include "outbox_relay/request_limits.h"
#include "outbox_relay/thread_name.h"

namespace outbox::relay {

ListenAddress ParseListenAddress(const std::string& listen) {
  const auto bad = [&](const std::string& why) {
    return std::invalid_argument("admin listen address \"" + listen + "\": " + why +
                                 " (expected host:port, [ipv6]:port or :port)");
  };
  ListenAddress a;
  std::string port_text;
  if (!listen.empty() && listen.front() == '[') {
    const auto close = listen.find(']');
    if (close == std::string::npos) throw bad("missing ']'");
    a.host = listen.substr(1, close - 1);
    if (close + 1 >= listen.size() || listen[close + 1] != ':')
      throw bad("missing :port after ']'");
    port_text = listen.substr(close + 2);
  } else {
    const auto colon = listen.rfind(':');
    if (colon == std::string::npos) throw bad("missing :port");
    a.host = listen.substr(0, colon);
    if (a.host.find(':') != std::string::npos) throw bad("an IPv6 address needs brackets");
    port_text = listen.substr(colon + 1);
  }
  if (a.host.empty()) a.host = "0.0.0.0";
  if (port_text.empty() || port_text.size() > 5)
    throw bad("the port must be a number from 0 to 65535");
  for (const char c : port_text) {
    if (!std::isdigit(static_cast<unsigned char>(c)))
      throw bad("the port must be a number from 0 to 65535");
  }
  a.port = std::stoi(port_text);
  if (a.port > 65535) throw bad("the port must be a number from 0 to 65535");
  return a;
}

struct AdminServer::Impl {
  std::string listen;
  RelayMetrics& metrics;
  std::function<bool()> ready;
  std::function<std::string()> ready_detail;
  ListenAddress address;
  GuardedServer server;
  std::thread thread;
  std::atomic<bool> thread_done{false};
  std::atomic<int> port{0};
  bool started = false;

  Impl(std::string l, RelayMetrics& m, std::function<bool()> r, std::function<std::string()> d)
      : listen(std::move(l)), metrics(m), ready(std::move(r)), ready_detail(std::move(d)) {}

  void Routes() {
    server.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(metrics.Render(), metrics::kExpositionContentType);
    });
    server.Get("/healthz", [](const httplib::Request&, httplib::Response& res) {
      res.set_content("ok\n", "text/plain; charset=utf-8");
    });
    server.Get("/readyz", [this](const httplib::Request&, httplib::Response& res) {
      bool ok = false;
      std::string detail;
      try {
        ok = ready ? ready() : true;
        if (!ok && ready_detail) detail = ready_detail();
      } catch (const std::exception& e) {
        ok = false;
        detail = std::string("readiness check failed: ") + e.what();
      } catch (...) {
        ok = false;
        detail = "readiness check failed";
      }
      if (ok) {
        res.status = 200;
        res.set_content("ready\n", "text/plain; charset=utf-8");
      } else {
        res.status = 503;
        res.set_content("not ready: " + (detail.empty() ? std::string("starting") : detail) + "\n",
                        "text/plain; charset=utf-8");
      }
    });
  }
};

AdminServer::AdminServer(std::string listen, RelayMetrics& metrics, std::function<bool()> ready,
                         std::function<std::string()> ready_detail)
    : impl_(std::make_unique<Impl>(std::move(listen), metrics, std::move(ready),
                                   std::move(ready_detail))) {}

AdminServer::~AdminServer() { Stop(); }

void AdminServer::Start() {
  auto& d = *impl_;
  if (d.started) throw std::logic_error("AdminServer::Start called twice");
  d.address = ParseListenAddress(d.listen);
  // Scrapes and probes are rare and cheap, but cpp-httplib gives a connection a worker for
  // its whole life: a scraper keeping its connection open (a Prometheus pair: two) holds one
  // until the keep-alive ends. With two workers, two scrapers made /healthz wait 5 s and the
  // probes failed; eight leave room for them and the probes. Short timeouts keep a stuck
  // client from holding one for long.
  d.server.new_task_queue = [] { return new httplib::ThreadPool(8); };
  d.server.set_read_timeout(std::chrono::seconds(5));
  d.server.set_write_timeout(std::chrono::seconds(5));
  d.server.set_keep_alive_timeout(5);
  // Its routes take no body: a few KiB is plenty, and none is read before routing unbounded.
  LimitRequestBodies(
      d.server, 4096,
      [](httplib::Response& res, int status, const std::string&, const std::string& message) {
        res.status = status;
        res.set_content(message + "\n", "text/plain; charset=utf-8");
      });
  // httplib's default sets SO_REUSEPORT, which lets a second relay bind the same port and
  // silently share the scrapes with the first. SO_REUSEADDR alone only allows restarting
  // while old connections linger in TIME_WAIT; a port in use is an error.
  d.server.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  d.Routes();

  int port = d.address.port;
  if (port == 0) {
    port = d.server.bind_to_any_port(d.address.host);
  } else if (!d.server.bind_to_port(d.address.host, port)) {
    port = -1;
  }
  if (port <= 0) {
    throw std::runtime_error("admin server: cannot listen on " + d.listen +
                             " (address in use, or no such local address)");
  }
  d.port = port;
  d.started = true;
  d.metrics.SetReadyCallback(d.ready ? d.ready : std::function<bool()>([] { return true; }));
  d.thread = std::thread([&d] {
    NameThisThread("or-admin");
    d.server.listen_after_bind();
    d.thread_done = true;
  });
  // listen_after_bind marks the server running as it enters its accept loop; stop() before
  // that would be lost, so wait for it (it takes microseconds).
  while (!d.server.is_running() && !d.thread_done)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (d.thread_done) {
    d.thread.join();
    d.metrics.ClearReadyCallback();
    throw std::runtime_error("admin server: stopped right after binding " + d.listen);
  }
}

void AdminServer::Stop() {
  auto& d = *impl_;
  if (!d.thread.joinable()) return;
  // stop() acts only once the accept loop runs (it then closes the socket and wakes it);
  // the loop starts right after the thread does, so wait for one or the other.
  while (!d.server.is_running() && !d.thread_done)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (!d.thread_done) d.server.stop();
  d.thread.join();
  d.metrics.ClearReadyCallback();
}

int AdminServer::port() const { return impl_->port; }

const std::string& AdminServer::host() const { return impl_->address.host; }

}  // namespace outbox::relay
