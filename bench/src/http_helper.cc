// The webhook receiver, in its own process: a cpp-httplib server on 127.0.0.1 that answers
// every POST with 200 at once and timestamps its arrival. Both the relay's webhook sink and
// the HTTP-ceiling client (a plain keep-alive loop) talk to this same receiver.
//
// Commands:
//   LISTEN threads [cert key]
//                       -> OK <port>   (one worker thread per keep-alive connection, so
//                                      `threads` must cover every client connection; with a
//                                      certificate and its key, HTTPS)
//   RECORD              -> OK          (forget what was received; start counting again)
//   COUNT               -> OK <requests since RECORD>
//   FINISH expected timeout_s db_url|- ref_us
//       waits for `expected` requests (or the timeout), answers OK <json>: counts, duplicate
//       webhook-ids, connections used and the enqueue-to-delivery latency (start: created_at
//       from bench.created looked up by webhook-id = idempotency key, or ref_us when > 0).
#include <httplib.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>
#include <thread>
#include <unordered_set>
#include <vector>

#include "common.h"
#include "helper.h"
#include "outbox_relay/listen_backlog.h"
#include "workload.h"

namespace outbox::bench {
// Named, so that its helpers do not meet those of the files built beside it in one unity
// translation unit (CMakeLists.txt).
namespace http_helper {
namespace {

struct Arrival {
  std::string webhook_id;
  std::int64_t at_us = 0;
};

class Receiver {
 public:
  Receiver(int threads, const std::string& cert, const std::string& key)
      : server_(cert.empty() ? std::make_unique<httplib::Server>()
                             : std::make_unique<httplib::SSLServer>(cert.c_str(), key.c_str())) {
    if (!server_->is_valid()) throw std::runtime_error("cannot load the certificate " + cert);
    httplib::Server& server = *server_;
    server.new_task_queue = [threads] {
      return new httplib::ThreadPool(static_cast<std::size_t>(threads));
    };
    // Real receivers keep connections open for many requests (nginx: 1000); httplib's
    // default of 5 would make every client reconnect all the time.
    server.set_keep_alive_max_count(1'000'000);
    server.set_keep_alive_timeout(60);
    server.set_tcp_nodelay(true);
    server.Post(".*", [this](const httplib::Request& req, httplib::Response& res) {
      const std::int64_t at = WallMicros();
      {
        std::lock_guard lk(mu_);
        arrivals_.push_back({req.get_header_value("webhook-id"), at});
        connections_.insert(req.remote_port);
      }
      ++count_;
      res.set_content("ok", "text/plain");
    });
    // The relay's workers (and the ceiling's clients) connect all at once: with httplib's
    // backlog of 5 some handshakes were dropped and the first requests failed after ~1 s.
    const relay::ListenBacklog backlog(server);
    port_ = server.bind_to_any_port("127.0.0.1");
    if (port_ <= 0) throw std::runtime_error("cannot bind 127.0.0.1");
    if (!backlog.Raise()) throw std::runtime_error("cannot raise the listen backlog");
    thread_ = std::thread([this] { server_->listen_after_bind(); });
  }

  ~Receiver() {
    server_->stop();
    if (thread_.joinable()) thread_.join();
  }

  int port() const { return port_; }
  std::size_t count() const { return count_.load(); }

  void Reset() {
    std::lock_guard lk(mu_);
    arrivals_.clear();
    connections_.clear();
    count_ = 0;
  }

  nlohmann::json Summary(const std::string& db_url, std::int64_t ref_us) {
    std::vector<Arrival> arrivals;
    std::size_t connections = 0;
    {
      std::lock_guard lk(mu_);
      arrivals = arrivals_;
      connections = connections_.size();
    }
    const auto created = LoadCreatedAt(db_url);
    std::vector<std::int64_t> latencies;
    std::unordered_set<std::string> distinct;
    for (const auto& a : arrivals) {
      distinct.insert(a.webhook_id);
      std::int64_t start = ref_us;
      if (ref_us > 0 && a.at_us < ref_us) continue;  // a warm-up, delivered before the instant
      if (start <= 0) {
        const auto it = created.by_key.find(a.webhook_id);
        if (it != created.by_key.end()) start = it->second;
      }
      if (start > 0) latencies.push_back(a.at_us - start);
    }
    nlohmann::json j;
    j["received"] = arrivals.size();
    j["distinct"] = distinct.size();
    j["duplicates"] = arrivals.size() - distinct.size();
    j["connections"] = connections;
    j["latency_source"] =
        ref_us > 0 ? "deliver_after (burst instant)" : "created_at (exact, bench.created)";
    j["latency"] = LatencySummary(std::move(latencies));
    return j;
  }

 private:
  std::unique_ptr<httplib::Server> server_;
  int port_ = 0;
  std::thread thread_;
  std::mutex mu_;
  std::vector<Arrival> arrivals_;
  std::set<int> connections_;  // client ports: loopback, so one per TCP connection
  std::atomic<std::size_t> count_{0};
};

}  // namespace
}  // namespace http_helper

int RunHttpHelper() {
  using namespace http_helper;
  std::unique_ptr<Receiver> receiver;
  const int rc = ServeCommands([&](const std::vector<std::string>& w) -> std::string {
    const std::string& cmd = w[0];
    if (cmd == "LISTEN" && (w.size() == 2 || w.size() == 4) && !receiver) {
      receiver = std::make_unique<Receiver>(std::stoi(w[1]), w.size() == 4 ? w[2] : "",
                                            w.size() == 4 ? w[3] : "");
      return std::to_string(receiver->port());
    }
    if (cmd == "RECORD" && receiver) {
      receiver->Reset();
      return "";
    }
    if (cmd == "COUNT" && receiver) return std::to_string(receiver->count());
    if (cmd == "FINISH" && w.size() == 5 && receiver) {
      const auto expected = static_cast<std::size_t>(std::stoll(w[1]));
      WaitUntil([&] { return receiver->count() >= expected; }, std::stod(w[2]), 20);
      return receiver->Summary(w[3] == "-" ? "" : w[3], std::stoll(w[4])).dump();
    }
    throw std::runtime_error("bad command");
  });
  receiver.reset();
  return rc;
}

}  // namespace outbox::bench
