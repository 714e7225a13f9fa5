// outbox-sample-receiver: a webhook endpoint that verifies Standard Webhooks signatures,
// drops duplicates by webhook-id, and prints what it accepts. For the quickstart and for
// trying a destination by hand.
#include <httplib.h>

#include <CLI/CLI.hpp>
#include <csignal>
#include <ctime>
#include <iostream>
#include <mutex>
#include <set>
#include <thread>

#include "outbox_relay/listen_backlog.h"
#include "outbox_relay/webhook_sink.h"

int main(int argc, char** argv) {
  CLI::App app{"outbox-sample-receiver: verifies and prints webhook deliveries"};
  int port = 8088;
  std::string address = "127.0.0.1";
  std::string secret;
  long long tolerance = 300;
  app.add_option("--port,-p", port, "Port to listen on");
  app.add_option("--listen", address, "Address to listen on (0.0.0.0 in a container)")
      ->capture_default_str();
  app.add_option("--secret", secret, "whsec_... secret shared with the relay")->required();
  app.add_option("--tolerance", tolerance,
                 "Reject timestamps older or newer than this many seconds");
  CLI11_PARSE(app, argc, argv);
  // Decoded now: a secret that does not decode failed every request (500) without a word.
  try {
    outbox::relay::SignStandardWebhook(secret, "check", 0, "");
  } catch (const std::exception&) {
    std::cerr << "error: --secret is not a Standard Webhooks secret: pass the destination's "
                 "whsec_<base64> secret (the one the relay signs with)\n";
    return 2;
  }

  httplib::Server server;
  std::mutex mu;
  std::set<std::string> seen;
  server.Post(".*", [&](const httplib::Request& req, httplib::Response& res) {
    const std::string id = req.get_header_value("webhook-id");
    const std::string ts = req.get_header_value("webhook-timestamp");
    const std::string sig = req.get_header_value("webhook-signature");
    long long t = 0;
    try {
      t = std::stoll(ts);
    } catch (...) {
      t = -1;
    }
    const long long now = static_cast<long long>(std::time(nullptr));
    std::lock_guard lk(mu);
    if (t < 0 || std::llabs(now - t) > tolerance ||
        !outbox::relay::VerifyStandardWebhook(secret, id, t, req.body, sig)) {
      std::cout << "REJECTED " << id << ": bad signature or timestamp" << std::endl;
      res.status = 401;
      return;
    }
    const bool dup = !seen.insert(id).second;
    std::cout << (dup ? "duplicate (dropped) " : "verified ") << id << " "
              << req.get_header_value("webhook-event-type") << " " << req.body << std::endl;
    res.status = 204;
  });
  // Block the signals before any thread starts, so only the stopper thread takes them.
  sigset_t blocked;
  sigemptyset(&blocked);
  sigaddset(&blocked, SIGINT);
  sigaddset(&blocked, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &blocked, nullptr);
  std::thread stopper([&] {
    int sig = 0;
    sigwait(&blocked, &sig);
    server.stop();
  });
  // A relay's webhook workers connect all at once: httplib's backlog of 5 would drop some.
  const outbox::relay::ListenBacklog backlog(server);
  if (!server.bind_to_port(address, port) || !backlog.Raise()) {
    std::cerr << "error: cannot listen on " << address << ":" << port << "\n";
    std::quick_exit(1);
  }
  std::cout << "outbox-sample-receiver: listening on http://" << address << ":" << port
            << std::endl;
  if (!server.listen_after_bind()) {
    std::cerr << "error: cannot listen on " << address << ":" << port << "\n";
    std::quick_exit(1);
  }
  stopper.join();
  return 0;
}
