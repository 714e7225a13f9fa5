// The webhook sink: a queue drained by max_in_flight workers, each with its own keep-alive
// connection (http_connection.h, plain or TLS), posting Standard Webhooks-signed requests.
#include "outbox_relay/webhook_sink.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <deque>
#include <fstream>
#include <mutex>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "address_policy.h"
#include "endpoint_governor.h"
#include "http_connection.h"
#include "outbox_relay/cloudevents.h"
#include "outbox_relay/thread_name.h"
#include "outbox_relay/webhook_service.h"
#include "webhook_internal.h"
#include "webhook_remake.h"

namespace outbox::relay {
namespace {

using Clock = std::chrono::steady_clock;
using webhook_detail::EndpointGovernor;
using webhook_detail::ParsedUrl;
using webhook_detail::Verdict;

constexpr std::size_t kReasonBodyBytes = 200;  ///< Start of the response body kept in reasons.
constexpr std::size_t kKeptBodyBytes = 1024;   ///< Response body bytes kept; the rest is drained.
constexpr const char* kUserAgent = "outbox-relay";

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

/// Headers the sink owns (OwnedWebhookHeader): a message or target header of this name is
/// skipped.
bool IsReservedHeader(const std::string& name) { return !OwnedWebhookHeader(name).empty(); }

/// A field value that can go as it is: no CR, LF, NUL or other controls except HTAB.
bool IsValidHeaderValue(std::string_view value) {
  for (char c : value) {
    const auto u = static_cast<unsigned char>(c);
    if ((u < 0x20 && u != '\t') || u == 0x7F) return false;
  }
  return true;
}

using HeaderList = std::vector<std::pair<std::string, std::string>>;

bool ContainsHeader(const HeaderList& headers, std::string_view name) {
  return std::any_of(headers.begin(), headers.end(), [&](const auto& header) {
    return webhook_detail::EqualsNoCase(header.first, name);
  });
}

void CallCompletion(const Sink::Completion& done, Outcome outcome, const std::string& destination) {
  if (!done) return;
  try {
    done(std::move(outcome));
  } catch (const std::exception& e) {
    spdlog::error("webhook {}: completion threw: {}", destination, e.what());
  } catch (...) {
    spdlog::error("webhook {}: completion threw a non-standard exception", destination);
  }
}

/// A request target as it goes on the request line: the URL's path and query, with any byte
/// past ASCII percent-encoded (the URL was checked: no spaces or control characters).
std::string RequestTarget(const std::string& path) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (const char c : path) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x80) {
      out.push_back(c);
    } else {
      out.push_back('%');
      out.push_back(kHex[u >> 4]);
      out.push_back(kHex[u & 0xF]);
    }
  }
  return out;
}

std::string HostHeader(const webhook_detail::ParsedUrl& url) {
  const bool v6 = url.host.find(':') != std::string::npos;
  std::string host = v6 ? "[" + url.host + "]" : url.host;
  if (url.port != (url.https ? 443 : 80)) host += ":" + std::to_string(url.port);
  return host;
}

/// The URL is not echoed: webhook URLs often carry tokens.
ParsedUrl ParseTargetUrl(const std::string& destination, const std::string& url) {
  try {
    return webhook_detail::ParseUrl(url);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument("webhook " + destination + ": " + e.what());
  }
}

}  // namespace

namespace {

webhook_detail::AddressPolicy AddressPolicyOf(const std::string& destination,
                                              const WebhookTarget& target) {
  std::vector<webhook_detail::Cidr> allowed;
  for (std::size_t i = 0; i < target.allowed_networks.size(); ++i) {
    try {
      allowed.push_back(webhook_detail::ParseCidr(target.allowed_networks[i]));
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument("webhook " + destination + ": allowed_networks[" +
                                  std::to_string(i) + "]: " + e.what());
    }
  }
  return webhook_detail::AddressPolicy(target.allow_private_networks, std::move(allowed));
}

// The SSRF guard on what needs no DNS (an IP literal, localhost): refused by check-config
// and start-up, and by the management API for an endpoint, instead of at every delivery.
void CheckKnownHost(const std::string& destination, const WebhookTarget& target,
                    const ParsedUrl& url) {
  const auto policy = AddressPolicyOf(destination, target);
  if (const auto literal = webhook_detail::KnownAddressOf(url.host)) {
    if (const auto why = policy.Refuses(*literal)) {
      // A metadata address: the flag does not open it, so the fix is the allow-list alone.
      const std::string fix =
          webhook_detail::IsMetadataAddress(*literal)
              ? "If this endpoint really is there, list it in destinations." + destination +
                    ".webhook.allowed_networks"
              : "If this endpoint is meant to be on a private network, set destinations." +
                    destination + ".webhook.allow_private_networks: true, or list its network " +
                    "in destinations." + destination + ".webhook.allowed_networks";
      throw std::invalid_argument("webhook " + destination + ": url: the host " + url.host +
                                  " is refused by the SSRF guard: " + *why + ". " + fix +
                                  " (docs/webhooks.md#private-networks)");
    }
  }
}

}  // namespace

void ValidateWebhookTarget(const std::string& destination, const WebhookTarget& target) {
  const ParsedUrl url = ParseTargetUrl(destination, target.url);
  if (target.secrets.empty()) {
    throw std::invalid_argument("webhook " + destination + ": at least one secret is required");
  }
  for (const auto& secret : target.secrets) webhook_detail::DecodeSigningKey(secret);
  if (target.max_in_flight < 1) {
    throw std::invalid_argument("webhook " + destination + ": max_in_flight must be >= 1");
  }
  if (target.timeout.count() <= 0 || target.connect_timeout.count() <= 0) {
    throw std::invalid_argument("webhook " + destination + ": timeouts must be positive");
  }
  if (url.https && target.ca_file && !std::ifstream(*target.ca_file).good()) {
    throw std::invalid_argument("webhook " + destination + ": cannot read ca_file " +
                                *target.ca_file);
  }
  if (url.https && target.ca_file && target.verify_tls &&
      !webhook_detail::HoldsCertificates(*target.ca_file)) {
    // As check-config says it (webhook_config.cc), for a ca_file it never saw: an endpoint's
    // in a webhook service, or one swapped since start-up.
    throw std::invalid_argument("webhook " + destination + ": ca_file " + *target.ca_file +
                                " holds no certificate OpenSSL can read; point it at a PEM bundle "
                                "of the CA certificates to trust, or remove it to trust the "
                                "system's CAs");
  }
  CheckKnownHost(destination, target, url);
}

std::optional<std::string> EndpointUrlProblem(const std::string& destination,
                                              const WebhookTarget& defaults,
                                              const std::string& url) {
  try {
    CheckKnownHost(destination, defaults, ParseTargetUrl(destination, url));
  } catch (const std::invalid_argument& e) {
    return std::string(e.what());
  }
  return std::nullopt;
}

namespace {

Outcome Retry(MessageId id, std::string reason, Reason reason_class) {
  Outcome o;
  o.id = id;
  o.kind = OutcomeKind::kRetry;
  o.reason = std::move(reason);
  o.reason_class = reason_class;
  return o;
}

/// Handed back unsent; due again after `hold` (a message returned due at once went straight to
/// another relay, which sent it into the same pause or outage).
Outcome Returned(MessageId id, std::string reason, std::chrono::milliseconds hold) {
  Outcome o;
  o.id = id;
  o.kind = OutcomeKind::kReturned;
  o.reason = std::move(reason);
  o.retry_after = hold;
  return o;
}

/// One request's outcome for the dispatcher, and what it says about the endpoint (nullopt:
/// nothing, the request was aborted by shutdown).
struct Attempt {
  Outcome outcome;
  std::optional<Verdict> verdict;
  bool not_connected = false;  ///< No connection could be made to the address tried.
  bool not_sent = false;       ///< Handed back before the request was made (no request).
};

class WebhookSink final : public Sink {
 public:
  WebhookSink(std::string destination, const WebhookTarget& target, WebhookRoom room)
      : destination_(std::move(destination)),
        target_(target),
        room_(room),
        url_(ParseTargetUrl(destination_, target.url)),
        policy_(AddressPolicyOf(destination_, target)),
        governor_(target.breaker, target.adaptive_concurrency, target.max_in_flight,
                  target.rate_limit) {
    ValidateWebhookTarget(destination_, target_);
    for (const auto& secret : target_.secrets)
      keys_.push_back(webhook_detail::DecodeSigningKey(secret));
    for (const auto& [name, value] : target_.headers) {
      if (!IsHttpToken(name) || !IsValidHeaderValue(value)) {
        spdlog::warn("webhook {}: ignoring configured header '{}': invalid name or value",
                     destination_, name);
      } else if (IsReservedHeader(name)) {
        spdlog::warn("webhook {}: ignoring configured header {}: set by the relay", destination_,
                     name);
      } else {
        static_headers_.emplace_back(name, value);
      }
    }

    if (url_.https) tls_ = MakeTlsContext();
    workers_.reserve(static_cast<std::size_t>(target_.max_in_flight));
    for (int i = 0; i < target_.max_in_flight; ++i) {
      auto worker = std::make_unique<Worker>();
      worker->connection = MakeConnection(*worker);
      worker->signer = std::make_unique<webhook_detail::Signer>(keys_);
      workers_.push_back(std::move(worker));
    }
    try {
      for (auto& worker : workers_) {
        worker->thread = std::thread([this, w = worker.get()] {
          NameThisThread("or-hook");
          Run(*w);
        });
      }
    } catch (...) {
      {
        std::lock_guard lock(mu_);
        stopping_ = true;
      }
      work_cv_.notify_all();
      for (auto& worker : workers_) {
        if (worker->thread.joinable()) worker->thread.join();
      }
      throw;
    }
    spdlog::debug("webhook {}: {} workers posting to {}://{}:{}", destination_, workers_.size(),
                  url_.https ? "https" : "http", url_.host, url_.port);
  }

  ~WebhookSink() override { Shutdown(std::chrono::milliseconds(0)); }

  WebhookSink(const WebhookSink&) = delete;
  WebhookSink& operator=(const WebhookSink&) = delete;

  // An operator paused the destination: what is queued goes back unsent, and so does what is
  // handed over until the resume; the requests under way finish.
  void SetPaused(bool paused) override {
    std::deque<Job> queued;
    {
      std::lock_guard lock(mu_);
      operator_paused_ = paused;
      if (paused) queued.swap(queue_);
    }
    if (!queued.empty()) ReturnAll(queued, std::string(kOperatorPaused), kOperatorPauseHold);
  }

  void Submit(Message msg, Completion done) override {
    std::optional<Refusal> refused;
    {
      std::lock_guard lock(mu_);
      refused = RefusalLocked();
      if (!refused) {
        in_flight_.fetch_add(1);
        queue_.push_back(Job{std::move(msg), std::move(done)});
        work_cv_.notify_one();
        return;
      }
    }
    CallCompletion(done, Refused(msg.id, *refused), destination_);
  }

  // A claim's messages under one lock, with one wake-up for the workers (all of them when
  // there are at least as many messages): one notify per message, each waking a worker that
  // then took the lock from the claim loop, cost the claim thread 11 us a message on the
  // 16-core machine.
  void SubmitMany(std::vector<std::pair<Message, Completion>> batch) override {
    std::optional<Refusal> refused;
    {
      std::lock_guard lock(mu_);
      refused = RefusalLocked();
      if (!refused) {
        for (auto& [msg, done] : batch) queue_.push_back(Job{std::move(msg), std::move(done)});
        in_flight_.fetch_add(batch.size());
      }
    }
    if (refused) {
      for (auto& [msg, done] : batch) CallCompletion(done, Refused(msg.id, *refused), destination_);
    } else if (batch.size() >= workers_.size()) {
      work_cv_.notify_all();
    } else {
      for (std::size_t i = 0; i < batch.size(); ++i) work_cv_.notify_one();
    }
  }

  // Calls may overlap: the earliest deadline wins. (The webhook service stops a replaced
  // endpoint's sink with one request timeout from its registry thread; the service's own
  // stop then brings that forward to its deadline.)
  void Shutdown(std::chrono::milliseconds deadline) override {
    {
      std::lock_guard lock(mu_);
      const auto now = Clock::now();
      if (deadline < Clock::time_point::max() - now) stop_by_ = std::min(stop_by_, now + deadline);
    }
    idle_cv_.notify_all();
    std::lock_guard shutdown_lock(shutdown_mu_);
    if (joined_) return;

    std::deque<Job> queued;
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
      queued.swap(queue_);
    }
    work_cv_.notify_all();
    if (!queued.empty()) {
      spdlog::info("webhook {}: shutdown returns {} queued messages for retry", destination_,
                   queued.size());
    }
    for (auto& job : queued) {
      Complete(job.done,
               Retry(job.msg.id, "shutdown: not sent before the relay stopped", Reason::kShutdown));
    }

    // Let requests already sent finish; take over the completions of those that do not.
    std::vector<std::pair<MessageId, Completion>> abandoned;
    std::vector<Worker*> to_stop;
    {
      std::unique_lock lock(mu_);
      while (running_ != 0 && Clock::now() < stop_by_) idle_cv_.wait_until(lock, stop_by_);
      // From here on a request that fails was aborted by this shutdown: no verdict. Those
      // that ended while it waited were attempts like any other.
      stopping_now_ = true;
      for (auto& worker : workers_) {
        if (worker->active) {
          abandoned.emplace_back(worker->active_id, std::move(*worker->active));
          worker->active.reset();
          to_stop.push_back(worker.get());
        }
      }
    }
    if (!abandoned.empty()) {
      spdlog::warn(
          "webhook {}: {} requests still running at the shutdown deadline; they will be retried",
          destination_, abandoned.size());
    }
    for (auto& [id, done] : abandoned) {
      Complete(done, Retry(id, "shutdown: request still running at the shutdown deadline",
                           Reason::kShutdown));
    }
    // Abort the abandoned requests so the workers return promptly: a connect, handshake or
    // request in progress through its socket, and any connect started later fails at once.
    for (Worker* worker : to_stop) AbortOpening(*worker);
    for (auto& worker : workers_) {
      if (worker->thread.joinable()) worker->thread.join();
    }
    joined_ = true;
  }

  // Not ready while the endpoint cannot be reached at all: the last kUnreachableAfter
  // attempts in a row failed to connect, timed out or broke the connection. Any HTTP answer,
  // 5xx included, means it is reachable.
  bool Ready() const override { return WhyNotReady().empty(); }

  std::string WhyNotReady() const override {
    {
      std::lock_guard lock(mu_);
      if (stopping_) return "shutting down";
    }
    if (unreachable_in_a_row_.load() < kUnreachableAfter) return "";
    std::lock_guard lock(last_failure_mu_);
    return "endpoint unreachable: the last " + std::to_string(unreachable_in_a_row_.load()) +
           " attempts failed (" + last_failure_ + ")";
  }

  std::size_t InFlight() const override { return in_flight_.load(); }
  // claim_connections auto: enough claims for the workers. One for a service's endpoint lane
  // (the service's own claims feed it) and for a rate-limited endpoint (its room stays under a
  // claim, which more loops do not add to: claim_loop.cc).
  int ClaimLoops() const override {
    if (room_ == WebhookRoom::kServiceLane || target_.rate_limit > 0) return 1;
    return AutoClaimLoops(target_.max_in_flight, UsableCpus());
  }
  std::string_view Kind() const override { return "webhook"; }
  // Enough queued work that no worker waits while the next claim runs; 0 while the breaker is
  // open or the endpoint asked for a pause (the dispatcher claims nothing), 1 for the probe.
  // A destination's own sink holds up to three claims' worth (or two per request), but no more
  // than 64 messages per request (16 while the governor keeps the concurrency lowered): the
  // claim loop claims again once a claim's worth of room is free, with two still queued.
  // At 16 per request, capped at two
  // claims (512 for 32 connections with claims of 500), the claim began with 256 queued, which
  // 32 connections sent in ~2 ms of a ~11 ms claim on the 16-core machine: the workers idled
  // 67-80% of the drain and one relay reached 17-26k msg/s against 35-41k to Kafka
  // (docs/benchmarks.md, session 28). A webhook service's endpoint lane is fed from the
  // service's backlog, not by claims: it keeps 16 per request, two claims' worth at most (the
  // service sizes its lanes and its claims from that). Measured on 2 cores (docs/benchmarks.md):
  // at 4 per request the workers idled between claims and each claim and settle carried 30-70
  // rows; at 16, 260 and 200, and the drain rose from 0.42 to 0.60 x the HTTP ceiling.
  std::size_t MaxInFlight(int claim_batch) const override {
    const bool lane = room_ == WebhookRoom::kServiceLane;
    const std::size_t claims = lane ? 2 : 3;
    std::size_t per_request;
    std::size_t admit;
    {
      std::lock_guard lock(mu_);
      const auto now = Clock::now();
      // An endpoint whose concurrency was lowered (it answered 429, 503 or timed out) gets 16
      // per request, as a lane does: the claim loop then sees a room under a claim, a sink
      // throttling on purpose, and its other claim connections add none to it (review: at 64,
      // a limit halved to 8 still asked for 512, and four claim loops leased 2,012 for it).
      const auto s = governor_.Snapshot(now);
      per_request = lane || s.concurrency_limit < s.max_concurrency ? 16 : 64;
      admit = governor_.Admit(now, per_request);
    }
    if (admit <= 1) return admit;
    const std::size_t requests = admit / per_request;
    std::size_t bound =
        std::max(claims * static_cast<std::size_t>(std::max(claim_batch, 1)), 2 * requests);
    // A rate limit caps what may be held to two seconds of it: claimed at the concurrency's
    // pace, a 1 request/s endpoint held 200 leased messages for 200 s, which no other relay
    // could take meanwhile.
    if (target_.rate_limit > 0) {
      bound = std::min(bound, 2 * static_cast<std::size_t>(target_.rate_limit));
    }
    return std::max<std::size_t>(std::min(admit, bound), 8);
  }

  // What the service's RemakeWebhookSink carries from this sink to its replacement.
  webhook_detail::GovernorState SaveGovernor() const {
    std::lock_guard lock(mu_);
    return governor_.Save(Clock::now());
  }
  // Before the sink's first request.
  void ResumeGovernor(const webhook_detail::GovernorState& state) {
    std::lock_guard lock(mu_);
    governor_.Resume(state, Clock::now());
  }

  std::optional<TargetHealth> Health() const override {
    webhook_detail::GovernorSnapshot s;
    {
      std::lock_guard lock(mu_);
      s = governor_.Snapshot(Clock::now());
    }
    TargetHealth h;
    h.breaker = webhook_detail::ToString(s.breaker);
    h.consecutive_failures = s.consecutive_failures;
    h.concurrency_limit = s.concurrency_limit;
    h.max_concurrency = s.max_concurrency;
    h.probe_in = s.probe_in;
    h.paused_for = s.paused_for;
    h.times_opened = s.times_opened;
    h.times_paused = s.times_paused;
    return h;
  }
  bool OutcomesAreResponses() const override { return true; }

  // Whether the workers wait for the endpoint or for work: `requests` finished, the time they
  // took (`request_us`, the HTTP exchange: connect, write, answer), and the time workers
  // waited with nothing queued (`idle_us`, counted while they wait). With every worker busy
  // and little idle time the endpoint (or the network) is the limit; with idle workers and a
  // backlog in the database, the claims are (more claim_connections).
  std::map<std::string, std::int64_t> EventCounts() const override {
    std::int64_t requests = 0, request_ns = 0, idle_ns = 0;
    for (const auto& w : workers_) {
      requests += w->requests.load(std::memory_order_relaxed);
      request_ns += w->request_ns.load(std::memory_order_relaxed);
    }
    {
      // Under mu_, which a worker holds when it ends a wait: a wait is counted either as it
      // goes or as finished, never neither, so the count never steps back.
      std::lock_guard lock(mu_);
      const std::int64_t now = Clock::now().time_since_epoch().count();
      for (const auto& w : workers_) {
        idle_ns += w->idle_ns.load(std::memory_order_relaxed);
        const std::int64_t since = w->idle_since_ns.load(std::memory_order_relaxed);
        if (since != 0 && now > since) idle_ns += now - since;
      }
    }
    const auto us = [](std::int64_t ns) {
      return std::chrono::duration_cast<std::chrono::microseconds>(Clock::duration(ns)).count();
    };
    return {{"requests", requests},
            {"request_us", us(request_ns)},
            {"idle_us", us(idle_ns)},
            {"claim_ran_out", claims_ran_out_.load()}};
  }

 private:
  struct Job {
    Message msg;
    Completion done;
  };

  struct Worker {
    /// Keep-alive connection of this worker.
    std::unique_ptr<webhook_detail::HttpConnection> connection;
    std::string head;  ///< The request head, its capacity kept across requests.
    std::string connect_ip;                       ///< The checked address client connects to.
    std::vector<std::string> addresses;           ///< Every checked address, connect_ip among them.
    std::size_t address_index = 0;                ///< connect_ip's place in addresses.
    Clock::time_point resolved_until{};           ///< When to resolve the host again.
    Clock::time_point resolved_at{};              ///< When the host last resolved.
    std::optional<Completion> active;             ///< Guarded by mu_; set while sending.
    MessageId active_id{};                        ///< Guarded by mu_.
    /// This thread's signing contexts (one per key, reused for every message).
    std::unique_ptr<webhook_detail::Signer> signer;
    std::thread thread;
    // Written by this worker only (EventCounts reads them); steady-clock nanoseconds.
    std::atomic<std::int64_t> requests{0};
    std::atomic<std::int64_t> request_ns{0};
    std::atomic<std::int64_t> idle_ns{0};        ///< Finished waits with nothing queued.
    std::atomic<std::int64_t> idle_since_ns{0};  ///< Start of the current such wait, or 0.
    /// The socket of the worker's connection (-1: none), so Shutdown can abort a connect, a
    /// handshake or a request from its thread (shutdown(2) ends any wait on it). The
    /// connection forgets it here, under opening_mu, before it closes it: the number is
    /// never one reused meanwhile.
    mutable std::mutex opening_mu;
    mutable int opening_fd = -1;  ///< Guarded by opening_mu.
    bool aborted = false;         ///< Guarded by opening_mu: Shutdown gave up on its request.
    // The connection closes (telling Closing, under opening_mu) before opening_mu is gone.
    ~Worker() { connection.reset(); }
  };

  // The socket `worker`'s connection opens now, before it connects; false when Shutdown gave
  // up on the worker's request before it opened its connection: that connect fails at once.
  static bool Opening(Worker& worker, int fd) {
    std::lock_guard lock(worker.opening_mu);
    if (worker.aborted) return false;
    worker.opening_fd = fd;
    return true;
  }

  // The connection's socket is about to close.
  static void Closing(const Worker& worker) {
    std::lock_guard lock(worker.opening_mu);
    worker.opening_fd = -1;
  }

  // Shutdown: a connect in progress fails at once (a connected socket's request fails too),
  // and so does any this worker starts from now on.
  //
  // A socket whose connect() has not begun yet (the hook ran, connect comes next) refuses the
  // shutdown (ENOTCONN) and then connects all the same, reporting itself connected: over TLS
  // the handshake then spun until the SYN gave up (~2 min). Shut down again once its connect
  // began (a connecting socket is reset), trying for a few milliseconds.
  static void AbortOpening(Worker& worker) {
    std::lock_guard lock(worker.opening_mu);
    worker.aborted = true;
    const int fd = worker.opening_fd;
    if (fd < 0) return;
    for (int tries = 0; tries < kAbortTries; ++tries) {
      if (::shutdown(fd, SHUT_RDWR) == 0 || errno != ENOTCONN) return;
      tcp_info info{};
      socklen_t len = sizeof info;
      if (::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) != 0 ||
          info.tcpi_state != TCP_CLOSE) {
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  // https://: the context every connection's TLS starts from: TLS 1.2 or later, the
  // endpoint's certificate verified against ca_file or the system's CAs (unless verify_tls is
  // off), an EOF without close_notify read as the close it is.
  std::shared_ptr<SSL_CTX> MakeTlsContext() const {
    std::shared_ptr<SSL_CTX> ctx(SSL_CTX_new(TLS_client_method()), SSL_CTX_free);
    if (!ctx || SSL_CTX_set_min_proto_version(ctx.get(), TLS1_2_VERSION) != 1) {
      throw std::invalid_argument("webhook " + destination_ + ": cannot create a TLS context");
    }
    SSL_CTX_set_options(ctx.get(), SSL_OP_IGNORE_UNEXPECTED_EOF);
    SSL_CTX_set_verify(ctx.get(), target_.verify_tls ? SSL_VERIFY_PEER : SSL_VERIFY_NONE, nullptr);
    if (target_.verify_tls) {
      const bool loaded = target_.ca_file ? SSL_CTX_load_verify_locations(
                                                ctx.get(), target_.ca_file->c_str(), nullptr) == 1
                                          : SSL_CTX_set_default_verify_paths(ctx.get()) == 1;
      if (!loaded) {
        char why[256] = "";
        ERR_error_string_n(ERR_get_error(), why, sizeof why);
        throw std::invalid_argument(
            "webhook " + destination_ + ": cannot load " +
            (target_.ca_file ? "ca_file " + *target_.ca_file : std::string("the system's CAs")) +
            " (" + why + "); point ca_file at a PEM file of CA certificates");
      }
    }
    return ctx;
  }

  std::unique_ptr<webhook_detail::HttpConnection> MakeConnection(Worker& worker) const {
    webhook_detail::HttpConnection::Options options;
    options.connect_timeout = target_.connect_timeout;
    options.timeout = target_.timeout;
    options.keep_body = kKeptBodyBytes;
    options.opening = [&worker](int fd) { return Opening(worker, fd); };
    options.closing = [&worker] { Closing(worker); };
    options.tls = tls_.get();
    options.server_name = url_.host;
    return std::make_unique<webhook_detail::HttpConnection>(std::move(options));
  }

  void Run(Worker& worker) {
    // A peer that closes the connection while we write must give EPIPE, not kill the process
    // (OpenSSL writes with write(2)). Blocked here, SIGPIPE stays with this thread.
    sigset_t pipe;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe, nullptr);

    // Kept across requests: a std::deque allocates its map and a node when constructed.
    std::deque<Job> returned;
    std::deque<Job> ran_out;  // claims that ran out while queued
    while (true) {
      Job job;
      EndpointGovernor::Ticket ticket;
      std::string why_returned;
      std::chrono::milliseconds hold_returned{0};
      {
        std::unique_lock lock(mu_);
        while (true) {
          if (stopping_) return;  // Shutdown completes whatever is still queued.
          const auto now = Clock::now();
          if (!queue_.empty() && governor_.Blocked(now)) {
            // The breaker opened or the endpoint asked for a pause: what waits goes back.
            returned.swap(queue_);
            why_returned = BlockedReason(now);
            hold_returned = BlockedHold(now);
            break;
          }
          // What waited here past its claim goes back before it takes a request's place.
          while (!queue_.empty() && RanOut(queue_.front().msg, now)) {
            ran_out.push_back(std::move(queue_.front()));
            queue_.pop_front();
          }
          if (!ran_out.empty()) break;
          if (!queue_.empty()) {
            if (auto t = governor_.TryStart(now)) {
              ticket = *t;
              break;
            }
          }
          const auto next = governor_.NextTimedChange(now);
          const bool idle = queue_.empty();  // not a wait for the governor: no work
          if (idle) worker.idle_since_ns.store(now.time_since_epoch().count());
          if (next == Clock::time_point::max()) {
            work_cv_.wait(lock);
          } else {
            work_cv_.wait_until(lock, next);
          }
          if (idle) {
            worker.idle_since_ns.store(0);
            worker.idle_ns.fetch_add((Clock::now() - now).count(), std::memory_order_relaxed);
          }
        }
        if (returned.empty() && ran_out.empty()) {
          job = std::move(queue_.front());
          queue_.pop_front();
          worker.active = std::move(job.done);
          worker.active_id = job.msg.id;
          ++running_;
        }
      }
      if (!returned.empty()) {
        ReturnAll(returned, why_returned, hold_returned);
        continue;
      }
      if (!ran_out.empty()) {
        for (auto& expired : ran_out) Complete(expired.done, HandBackRanOut(expired.msg).outcome);
        ran_out.clear();
        continue;
      }
      if (ticket.probe) {
        spdlog::info("webhook {}: circuit breaker half-open: probing the endpoint with message {}",
                     destination_, Raw(job.msg.id));
      }
      Attempt attempt;
      if (auto refused = CheckAddress(worker, job.msg.id)) {
        attempt = std::move(*refused);
      } else if (RanOut(job.msg, Clock::now())) {  // while the host's name was looked up
        attempt = HandBackRanOut(job.msg);
      } else if (Abandoned(worker)) {
        // Shutdown took this message back while the address was resolved: sending it now
        // would deliver a message the dispatcher already released. (Checked again right
        // before the body is written, see Deliver.)
        attempt.outcome =
            Retry(job.msg.id, "shutdown: not sent before the relay stopped", Reason::kShutdown);
      } else {
        const auto started = Clock::now();
        attempt = Deliver(worker, job.msg);
        if (!attempt.not_sent) {
          worker.request_ns.fetch_add((Clock::now() - started).count(), std::memory_order_relaxed);
          worker.requests.fetch_add(1, std::memory_order_relaxed);
        }
        if (attempt.not_connected) PassOverAddress(worker);
      }
      std::optional<Completion> done;
      webhook_detail::Transition change;
      webhook_detail::GovernorSnapshot after;
      bool idle = false;
      {
        std::lock_guard lock(mu_);
        const auto now = Clock::now();
        change = governor_.Finish(now, ticket, attempt.verdict);
        if (change.Any()) after = governor_.Snapshot(now);
        done = std::move(worker.active);
        worker.active.reset();
        idle = --running_ == 0;
      }
      // This worker takes the next job itself (and hands the queue back if the endpoint is
      // now blocked); the others need waking only when the breaker closed, since they wait
      // for the probe's verdict. Waking them all after every request costs a context switch
      // per idle worker per message.
      if (change.closed) {
        work_cv_.notify_all();
      } else if (change.raised) {
        work_cv_.notify_one();  // one more request may run now
      }
      if (idle) idle_cv_.notify_all();  // Shutdown waits for running_ == 0
      if (change.Any()) LogTransition(change, after, attempt.outcome);
      if (done) {
        Complete(*done, std::move(attempt.outcome));
      } else {
        spdlog::debug("webhook {}: message {} finished ({}) after shutdown had returned it",
                      destination_, Raw(job.msg.id), ToString(attempt.outcome.kind));
      }
    }
  }

  // A message whose claim would run out before its request ended (the dispatcher could not
  // renew its lease: the database away, a stall) is not sent: another relay's reaper may take
  // it back and send it while this request still runs. A request ends by its deadline (the
  // timeout from its start), and its claim must last until then (its renewals keep a whole
  // attempt covered in normal operation: RelayConfig::renew_every; the cover is counted from
  // before each renewal's statement, so it ends no later than the lease in the database).
  // Checked when a worker takes it, after the host's name was looked up, and right before
  // anything is written.
  // (A bucket's claim, under bucket leases, need only hold when the request starts: see
  // ClaimCover::Kind.)
  static bool Outlasts(const Message& msg, Clock::time_point now, Clock::time_point end) {
    const auto runs_out = ClaimRunsOut(msg);
    if (!runs_out) return false;
    if (msg.claim_cover && msg.claim_cover->kind() == ClaimCover::Kind::kBucket) {
      return now >= *runs_out;
    }
    return end > *runs_out;
  }
  bool RanOut(const Message& msg, Clock::time_point now) const {
    return Outlasts(msg, now, now + target_.timeout);
  }

  // Handed back, no attempt counted and no verdict on the endpoint (it was not asked); counted,
  // and logged at warn once a minute at most.
  Attempt HandBackRanOut(const Message& msg) const {
    const std::string why =
        "the claim ran out (lease_ms) before the request was sent, or would before it ended "
        "(timeout_ms): not sent, another relay may take the message over";
    claims_ran_out_.fetch_add(1);
    const auto now = Clock::now().time_since_epoch().count();
    auto last = last_ran_out_warning_.load();
    const auto quiet = std::chrono::duration_cast<Clock::duration>(std::chrono::minutes(1)).count();
    if ((last == 0 || now - last >= quiet) &&
        last_ran_out_warning_.compare_exchange_strong(last, now)) {
      spdlog::warn(
          "webhook {}: message {} not sent: {}; the relay could not renew its leases "
          "(outbox_sink_events_total{{event=\"claim_ran_out\"}} counts such messages)",
          destination_, Raw(msg.id), why);
    } else {
      spdlog::debug("webhook {}: message {} not sent: {}", destination_, Raw(msg.id), why);
    }
    Attempt a;
    a.outcome = Returned(msg.id, why, std::chrono::milliseconds(0));
    a.not_sent = true;
    return a;
  }

  // The SSRF guard: resolves the host (again every ResolveEvery()), checks the addresses and
  // points the worker's client at the checked one, so it connects to exactly what was
  // checked (the host name stays in Host and SNI). An attempt that failed when the endpoint
  // has no acceptable address; nullopt when the request may go.
  std::optional<Attempt> CheckAddress(Worker& worker, MessageId id) {
    const auto asked = Clock::now();
    if (!worker.connect_ip.empty() && asked < worker.resolved_until) return std::nullopt;
    const auto asked_at = std::chrono::system_clock::now();
    const auto looked_up = LookUp(worker);
    if (!looked_up) {
      Attempt a;  // Shutdown took the message back while the name was looked up
      a.outcome = Retry(id, "shutdown: not sent before the relay stopped", Reason::kShutdown);
      return a;
    }
    const auto& r = *looked_up;
    // Times count from the answer: a lookup that timed out took seconds (a resolver that stops
    // answering), and counted from the question, the next retry was already due when it
    // returned, so every request waited out a lookup of its own (review).
    const auto now = Clock::now();
    if (!r.address && !r.refused && !worker.connect_ip.empty() &&
        now - worker.resolved_at < 10 * webhook_detail::ResolveEvery()) {
      // The name did not resolve this time (a DNS restart, a timeout): the addresses checked
      // before still stand, as a client's cache would keep them; asked again a little later.
      // (Failing here failed every request to a healthy endpoint while DNS was away.) A name
      // that now resolves only to refused addresses is refused below, whatever came before.
      spdlog::debug("webhook {}: {}; keeps {} for now", destination_, r.error, worker.connect_ip);
      worker.resolved_until =
          now + std::min<std::chrono::milliseconds>(webhook_detail::ResolveEvery(), kResolveRetry);
      return std::nullopt;
    }
    if (!r.address) {
      worker.connect_ip.clear();  // try again on the next request
      Attempt a;
      a.outcome = r.refused ? Retry(id,
                                    "blocked by the SSRF guard: " + r.error +
                                        (r.metadata ? std::string()
                                                    : "; if the endpoint is meant to be private, "
                                                      "set allow_private_networks or "
                                                      "allowed_networks"),
                                    Reason::kBlockedAddress)
                            : Retry(id, "connection error: " + r.error, Reason::kConnection);
      a.verdict = Verdict{false, true, false, std::nullopt};
      // An attempt with no answer, as a refused connection is: the delivery log and the
      // endpoint's health count it (a webhook service disables an endpoint whose name stopped
      // resolving once it has failed for auto_disable_after; without this, never).
      a.outcome.exchange = HttpExchange{
          asked_at, 0, std::chrono::duration_cast<std::chrono::milliseconds>(now - asked), ""};
      {
        std::lock_guard lock(last_failure_mu_);
        last_failure_ = a.outcome.reason;
      }
      unreachable_in_a_row_.fetch_add(1);
      spdlog::debug("webhook {}: message {} not sent: {}", destination_, Raw(id), a.outcome.reason);
      return a;
    }
    worker.addresses.clear();
    for (const auto& a : r.allowed) worker.addresses.push_back(a.ToString());
    ConnectTo(worker, 0);
    worker.resolved_until = now + webhook_detail::ResolveEvery();
    worker.resolved_at = now;
    return std::nullopt;
  }

  // The host's name looked up on a thread of its own, so that Shutdown need not wait for it (a
  // resolver that stopped answering takes seconds per try, and a stopping relay waited that
  // long past shutdown_timeout_ms); nullopt when Shutdown took the worker's message back
  // meanwhile. The lookup then ends on its own and its answer is dropped.
  std::optional<webhook_detail::Resolution> LookUp(const Worker& worker) const {
    if (webhook_detail::LiteralAddressOf(url_.host)) {
      return webhook_detail::ResolveChecked(url_.host, policy_);  // nothing to look up
    }
    struct Lookup {
      std::mutex mu;
      std::condition_variable cv;
      bool answered = false;
      std::vector<webhook_detail::IpAddress> found;
      std::string error;
    };
    auto lookup = std::make_shared<Lookup>();
    // Taken here: the thread, which may outlive this sink and main() too, touches nothing but
    // what it owns (the policy is applied below, on this thread).
    const webhook_detail::Resolver resolve = webhook_detail::CurrentResolver();
    try {
      std::thread([lookup, resolve, host = url_.host] {
        std::string error;
        auto found = resolve(host, &error);
        std::lock_guard lock(lookup->mu);
        lookup->found = std::move(found);
        lookup->error = std::move(error);
        lookup->answered = true;
        lookup->cv.notify_all();
      }).detach();
    } catch (const std::exception&) {
      return webhook_detail::ResolveChecked(url_.host, policy_);  // no thread to spare
    }
    std::unique_lock lock(lookup->mu);
    while (!lookup->cv.wait_for(lock, kLookUpCheckEvery, [&] { return lookup->answered; })) {
      lock.unlock();
      const bool abandoned = Abandoned(worker);
      lock.lock();
      if (abandoned && !lookup->answered) return std::nullopt;
    }
    return webhook_detail::CheckResolved(url_.host, lookup->found, lookup->error, policy_);
  }

  void ConnectTo(Worker& worker, std::size_t index) {
    worker.address_index = index;
    worker.connect_ip = worker.addresses[index];
  }

  // The connection could not be made: the next request goes to the host's next checked
  // address (a load balancer with one address down); after the last one, the host is
  // resolved again.
  void PassOverAddress(Worker& worker) {
    const std::size_t next = worker.address_index + 1;
    if (next < worker.addresses.size()) {
      ConnectTo(worker, next);
    } else {
      worker.resolved_until = {};
    }
  }

  bool Abandoned(const Worker& worker) const {
    std::lock_guard lock(mu_);
    return !worker.active.has_value();
  }

  // Why nothing is sent now (mu_ held, Blocked(now) true).
  // Why what is handed over now is not taken: an open breaker or a pause (`blocked`, due
  // again after `hold`: returned unsent), or shutting down (`blocked` empty: a retry).
  struct Refusal {
    std::string blocked;
    std::chrono::milliseconds hold{0};
  };
  // Nothing when the sink takes work now. mu_ held.
  std::optional<Refusal> RefusalLocked() const {
    if (stopping_) return Refusal{};
    if (operator_paused_) return Refusal{std::string(kOperatorPaused), kOperatorPauseHold};
    const auto now = Clock::now();
    if (!governor_.Blocked(now)) return std::nullopt;
    return Refusal{BlockedReason(now), BlockedHold(now)};
  }
  Outcome Refused(MessageId id, const Refusal& r) const {
    if (r.blocked.empty()) {
      return Retry(id, "shutdown: the webhook sink is stopping", Reason::kShutdown);
    }
    return Returned(id, r.blocked, r.hold);
  }

  std::string BlockedReason(Clock::time_point now) const {
    const auto snap = governor_.Snapshot(now);
    if (snap.paused_for.count() > 0) {
      return "endpoint paused for " + std::to_string(snap.paused_for.count()) +
             "ms at its request (Retry-After); not sent";
    }
    return "circuit breaker open after " + std::to_string(snap.consecutive_failures) +
           " consecutive failures; next probe in " + std::to_string(snap.probe_in.count()) +
           "ms; not sent";
  }

  // How long what is handed back while nothing is sent waits: the pause or the time to the
  // probe, at least a second (mu_ held).
  std::chrono::milliseconds BlockedHold(Clock::time_point now) const {
    const auto snap = governor_.Snapshot(now);
    return std::max({std::chrono::milliseconds(1'000), snap.paused_for, snap.probe_in});
  }

  void ReturnAll(std::deque<Job>& jobs, const std::string& why, std::chrono::milliseconds hold) {
    spdlog::debug("webhook {}: {} queued message(s) handed back unsent: {}", destination_,
                  jobs.size(), why);
    for (auto& job : jobs) Complete(job.done, Returned(job.msg.id, why, hold));
    jobs.clear();
  }

  void LogTransition(const webhook_detail::Transition& t, const webhook_detail::GovernorSnapshot& s,
                     const Outcome& last) const {
    if (t.opened) {
      spdlog::warn(
          "webhook {}: circuit breaker OPEN after {} consecutive failures (last: {}); nothing is "
          "sent for {}ms, then one probe",
          destination_, s.consecutive_failures, last.reason, s.probe_in.count());
    }
    if (t.reopened) {
      spdlog::warn("webhook {}: probe failed ({}); circuit breaker open again for {}ms",
                   destination_, last.reason, s.probe_in.count());
    }
    if (t.closed) {
      spdlog::info("webhook {}: probe succeeded; circuit breaker closed, sending again",
                   destination_);
    }
    if (t.paused) {
      spdlog::warn("webhook {}: the endpoint asked to wait ({}); pausing it for {}ms", destination_,
                   last.reason, s.paused_for.count());
    }
    if (t.lowered) {
      spdlog::info("webhook {}: endpoint overloaded ({}); concurrency lowered to {} of {}",
                   destination_, last.reason, s.concurrency_limit, s.max_concurrency);
    }
  }

  // The message leaves the count before its completion runs, so a completion that reads
  // InFlight() sees the room it left: the webhook service pumps an endpoint's backlog from
  // there, and with the finished request still counted a delivery it had just queued behind
  // a full lane waited until it aged out.
  void Complete(Completion& done, Outcome outcome) {
    in_flight_.fetch_sub(1);
    CallCompletion(done, std::move(outcome), destination_);
  }

  // The request's headers, appended to `head` once each: the Standard Webhooks signature
  // headers, the idempotency key, the content type, CloudEvents attributes, the target's
  // configured headers, then the message's own (those the relay sets or cannot send skipped),
  // and a User-Agent unless one was given. Exchange adds Host and Content-Length.
  void AppendHeaders(std::string& head, webhook_detail::Signer& signer, const Message& msg,
                     long long timestamp) const {
    const auto add = [&head](std::string_view name, std::string_view value) {
      head.append(name).append(": ").append(value).append("\r\n");
    };
    const std::string signatures = signer.Signatures(msg.idempotency_key, timestamp, msg.payload);
    add("webhook-id", msg.idempotency_key);
    add("webhook-timestamp", std::to_string(timestamp));
    add("webhook-signature", signatures);
    add("Idempotency-Key", msg.idempotency_key);
    add("Content-Type", msg.payload_is_json ? "application/json" : "application/octet-stream");
    if (!msg.event_type.empty()) {
      if (IsValidHeaderValue(msg.event_type)) {
        add("Webhook-Event-Type", msg.event_type);
      } else {
        spdlog::warn("webhook {}: message {}: event_type has control characters; not sent",
                     destination_, Raw(msg.id));
      }
    }
    if (target_.cloudevents) {
      for (auto& [attribute, value] : CloudEventAttributes(msg, target_.cloudevents_source)) {
        if (IsValidHeaderValue(value)) add("ce-" + attribute, value);
      }
    }
    bool user_agent = ContainsHeader(static_headers_, "User-Agent");
    for (const auto& [name, value] : static_headers_) add(name, value);
    std::vector<std::string_view> sent;  // the message's own names sent so far
    for (const auto& [name, value] : msg.headers) {
      if (IsReservedHeader(name) || (target_.cloudevents && Lower(name).starts_with("ce-"))) {
        spdlog::debug("webhook {}: message {}: skipping header {}: set by the relay", destination_,
                      Raw(msg.id), name);
      } else if (!IsHttpToken(name) || !IsValidHeaderValue(value)) {
        spdlog::debug("webhook {}: message {}: skipping header '{}': invalid name or value",
                      destination_, Raw(msg.id), name);
      } else if (ContainsHeader(static_headers_, name)) {
        spdlog::debug("webhook {}: message {}: skipping header {}: configured for the target",
                      destination_, Raw(msg.id), name);
      } else if (std::any_of(sent.begin(), sent.end(), [&](std::string_view s) {
                   return webhook_detail::EqualsNoCase(s, name);
                 })) {
        // Names compare without case: a second X-Trace would reach the receiver as one
        // combined field. The message's first one is sent.
        spdlog::debug(
            "webhook {}: message {}: skipping header {}: the message names it twice "
            "(header names ignore case)",
            destination_, Raw(msg.id), name);
      } else {
        sent.push_back(name);
        user_agent = user_agent || webhook_detail::EqualsNoCase(name, "User-Agent");
        add(name, value);
      }
    }
    if (!user_agent) add("User-Agent", kUserAgent);
  }

  // The last moment before anything of the request is written (connected by then: opening
  // the connection can outlast the shutdown deadline or the claim): false when Shutdown has
  // handed this message back meanwhile (asked under mu_, so either Shutdown took the message
  // before, and nothing is sent, or the request counts as running when it does), or when its
  // claim ran out (`ran_out` set). A request whose body never comes is not one the endpoint
  // acts on.
  struct LastCheck {
    const WebhookSink* sink;
    const Worker* worker;
    const Message* msg;
    Clock::time_point deadline;
    bool* ran_out;
    bool MaySend() const {
      if (sink->Abandoned(*worker)) return false;
      if (Outlasts(*msg, Clock::now(), deadline)) {
        *ran_out = true;
        return false;
      }
      return true;
    }
  };

  Attempt Deliver(Worker& worker, const Message& msg) const {
    // Right before the request (and again once connected: LastCheck).
    if (RanOut(msg, Clock::now())) return HandBackRanOut(msg);
    const long long timestamp = std::chrono::duration_cast<std::chrono::seconds>(
                                    std::chrono::system_clock::now().time_since_epoch())
                                    .count();
    const auto start = Clock::now();
    const auto sent_at = std::chrono::system_clock::now();
    const auto deadline = start + target_.timeout;
    bool ran_out = false;
    const webhook_detail::HttpAnswer x = Exchange(worker, msg, timestamp, deadline, &ran_out);
    const bool answered = x.failure == webhook_detail::HttpFailure::kNone;
    const auto elapsed =
        std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);

    if (ran_out) return HandBackRanOut(msg);
    Attempt attempt;
    Outcome& outcome = attempt.outcome;
    if (!answered) {
      outcome = TransportFailure(msg.id, x, elapsed);
      attempt.not_connected = x.failure == webhook_detail::HttpFailure::kConnect ||
                              x.failure == webhook_detail::HttpFailure::kConnectTimeout;
      if (!stopping_now_.load()) {  // shutdown's aborted requests are no verdict
        std::lock_guard lock(last_failure_mu_);
        last_failure_ = outcome.reason;
        unreachable_in_a_row_.fetch_add(1);
        Verdict v;
        v.failure = true;
        v.overload = outcome.reason_class == Reason::kTimeout;
        attempt.verdict = v;
      }
    } else {
      outcome = FromStatus(msg.id, x);
      // An answer whose body ran until the close, cut by Shutdown's abort, looks whole: a
      // request Shutdown took back is no verdict (review).
      if (!stopping_now_.load() || !Abandoned(worker)) {
        unreachable_in_a_row_.store(0);
        attempt.verdict = VerdictOf(x.status, outcome);
      }
    }
    if (!stopping_now_.load() || answered) {
      outcome.exchange = HttpExchange{sent_at, answered ? x.status : 0, elapsed,
                                      webhook_detail::Snippet(x.body_start, kKeptBodyBytes)};
    }
    if (outcome.kind == OutcomeKind::kDelivered) {
      spdlog::trace("webhook {}: message {} delivered ({} in {}ms)", destination_, Raw(msg.id),
                    x.status, elapsed.count());
    } else {
      spdlog::debug("webhook {}: message {} {}: {} ({}ms)", destination_, Raw(msg.id),
                    ToString(outcome.kind), outcome.reason, elapsed.count());
    }
    return attempt;
  }

  // The head written into the worker's buffer, head and body sent at once over its kept
  // connection (http_connection.h). `ran_out`: not sent, the claim ran out while connecting.
  webhook_detail::HttpAnswer Exchange(Worker& worker, const Message& msg, long long timestamp,
                                      Clock::time_point deadline, bool* ran_out) const {
    std::string& head = worker.head;
    head.clear();
    head.append("POST ").append(request_target_).append(" HTTP/1.1\r\nHost: ");
    head.append(host_header_).append("\r\n");
    AppendHeaders(head, *worker.signer, msg, timestamp);
    head.append("Content-Length: ").append(std::to_string(msg.payload.size())).append("\r\n\r\n");

    const LastCheck check{this, &worker, &msg, deadline, ran_out};
    // One pointer captured: std::function keeps it inline, with no allocation per request.
    const std::function<bool()> may_send = [&check] { return check.MaySend(); };
    auto answer = worker.connection->Exchange(worker.connect_ip, url_.port, head, msg.payload,
                                              deadline, may_send);
    // The last check's "claim ran out" means "not sent" only when nothing was written: asked
    // again before a request lost with its kept connection goes once more, it comes after
    // the endpoint may have taken the first one in (review).
    if (answer.wrote) *ran_out = false;
    return answer;
  }

  // What an HTTP answer says about the endpoint: 5xx are failures (the breaker), 429, 503 and
  // 408 overload (the concurrency), and a 429's or 503's Retry-After pauses it.
  static Verdict VerdictOf(int status, const Outcome& outcome) {
    Verdict v;
    v.success = status >= 200 && status <= 299;
    v.failure = status >= 500 && status <= 599;
    v.overload = status == 429 || status == 503 || status == 408;
    if (status == 429 || status == 503) v.retry_after = outcome.retry_after;
    return v;
  }

  Outcome TransportFailure(MessageId id, const webhook_detail::HttpAnswer& x,
                           std::chrono::milliseconds elapsed) const {
    using webhook_detail::HttpFailure;
    const std::string what = webhook_detail::ToString(x.failure);
    switch (x.failure) {
      case HttpFailure::kBadResponse:
        return Retry(id, "bad response: " + x.refused, Reason::kConnection);
      case HttpFailure::kConnectTimeout:
        return Retry(id,
                     "timeout: could not connect within " +
                         std::to_string(target_.connect_timeout.count()) + "ms",
                     Reason::kTimeout);
      case HttpFailure::kTls:
        return Retry(id, "connection error: " + what, Reason::kTls);
      case HttpFailure::kTlsVerification:
        return Retry(id, "connection error: " + what + " (" + x.refused + ")", Reason::kTls);
      case HttpFailure::kRead:
      case HttpFailure::kWrite:
      case HttpFailure::kCanceled:
        if (elapsed >= target_.timeout) {
          return Retry(id,
                       "timeout: no complete response within " +
                           std::to_string(target_.timeout.count()) + "ms (" + what + ")",
                       Reason::kTimeout);
        }
        return Retry(id, "connection error: " + what, Reason::kConnection);
      default:
        return Retry(id, "connection error: " + what, Reason::kConnection);
    }
  }

  Outcome FromStatus(MessageId id, const webhook_detail::HttpAnswer& x) const {
    Outcome outcome;
    outcome.id = id;
    const int status = x.status;
    const std::string& body = x.body_start;
    if (status >= 200 && status <= 299) {
      outcome.kind = OutcomeKind::kDelivered;
      return outcome;
    }
    const std::string head = "http " + std::to_string(status);
    const std::string snippet = webhook_detail::Snippet(body, kReasonBodyBytes);
    outcome.reason = snippet.empty() ? head : head + ": " + snippet;
    if (status >= 300 && status <= 399) {
      outcome.kind = OutcomeKind::kPermanent;
      outcome.reason_class = Reason::kHttp3xx;
      outcome.reason = head + ": redirects are not followed";
      const std::string location = webhook_detail::Snippet(x.location, kReasonBodyBytes);
      if (!location.empty()) outcome.reason += " (Location: " + location + ")";
      return outcome;
    }
    if (status == 408) {
      outcome.kind = OutcomeKind::kRetry;
      outcome.reason_class = Reason::kHttp408;
    } else if (status == 429) {
      outcome.kind = OutcomeKind::kRetry;
      outcome.reason_class = Reason::kHttp429;
    } else if (status >= 500 && status <= 599) {
      outcome.kind = OutcomeKind::kRetry;
      outcome.reason_class = Reason::kHttp5xx;
    } else if (status >= 400 && status <= 499) {
      outcome.kind = OutcomeKind::kPermanent;
      outcome.reason_class = Reason::kHttp4xx;
    } else {
      outcome.kind = OutcomeKind::kRetry;  // 1xx as final answer or outside 100..599
      outcome.reason_class = Reason::kHttpOther;
    }
    if (outcome.kind == OutcomeKind::kRetry && x.retry_after) {
      outcome.retry_after =
          webhook_detail::ParseRetryAfter(*x.retry_after, std::chrono::system_clock::now());
    }
    return outcome;
  }

  const std::string destination_;
  const WebhookTarget target_;
  const WebhookRoom room_;  ///< How much it asks the claim loop to keep in it (MaxInFlight).
  const ParsedUrl url_;
  const webhook_detail::AddressPolicy policy_;    ///< The SSRF guard.
  std::vector<webhook_detail::SigningKey> keys_;  ///< One per secret (HMAC or ed25519).
  HeaderList static_headers_;                     ///< Valid, non-reserved target.headers.
  std::shared_ptr<SSL_CTX> tls_;  ///< https://: what every connection's TLS starts from.
  /// The request line's target (url_.path, bytes past ASCII percent-encoded) and the Host
  /// header (port included unless it is the scheme's; an IPv6 address in brackets).
  const std::string request_target_ = RequestTarget(url_.path);
  const std::string host_header_ = HostHeader(url_);

  mutable std::mutex mu_;
  std::condition_variable work_cv_;  ///< Workers wait for jobs or stopping_.
  std::condition_variable idle_cv_;  ///< Shutdown waits for running_ == 0.
  std::deque<Job> queue_;
  bool stopping_ = false;
  std::size_t running_ = 0;  ///< Workers between taking a job and finishing its request.
  /// Guarded by mu_: when Shutdown stops waiting for running requests (the earliest deadline
  /// of its calls).
  Clock::time_point stop_by_ = Clock::time_point::max();
  std::atomic<std::size_t> in_flight_{0};
  static constexpr int kUnreachableAfter = 3;
  /// How many milliseconds Shutdown tries to abort a connect that has not begun yet.
  static constexpr int kAbortTries = 20;
  /// A worker waiting for a name lookup asks this often whether Shutdown took its message.
  static constexpr std::chrono::milliseconds kLookUpCheckEvery{20};
  /// A name that did not resolve while earlier addresses stand (for at most 10 x
  /// ResolveEvery(), 5 minutes, after it last did): asked again after this.
  static constexpr std::chrono::seconds kResolveRetry{5};
  EndpointGovernor governor_;  ///< Guarded by mu_.
  // Written by Deliver (const: it changes no configuration, only this record of the endpoint).
  mutable std::atomic<int> unreachable_in_a_row_{0};  ///< Attempts without any HTTP answer.
  std::atomic<bool> stopping_now_{false};  ///< Shutdown's aborted requests are no verdict.
  mutable std::atomic<std::int64_t> claims_ran_out_{0};  ///< Not sent: their claim ran out.
  bool operator_paused_ = false;  ///< outbox-relay pause (SetPaused); guarded by mu_.
  static constexpr std::string_view kOperatorPaused =
      "destination paused by an operator (outbox-relay pause); not sent";
  static constexpr std::chrono::milliseconds kOperatorPauseHold{1'000};
  mutable std::atomic<Clock::rep> last_ran_out_warning_{0};
  mutable std::mutex last_failure_mu_;
  mutable std::string last_failure_;  ///< Guarded by last_failure_mu_.
  std::vector<std::unique_ptr<Worker>> workers_;

  std::mutex shutdown_mu_;  ///< Serializes Shutdown calls.
  bool joined_ = false;     ///< Guarded by shutdown_mu_.
};

}  // namespace

// What a webhook service checks before it has endpoints: the settings every endpoint shares.
static void ValidateServiceDefaults(const std::string& destination, const WebhookTarget& target) {
  if (target.max_in_flight < 1) {
    throw std::invalid_argument("webhook " + destination + ": max_in_flight must be >= 1");
  }
  if (target.timeout.count() <= 0 || target.connect_timeout.count() <= 0) {
    throw std::invalid_argument("webhook " + destination + ": timeouts must be positive");
  }
  if (target.ca_file && !std::ifstream(*target.ca_file).good()) {
    throw std::invalid_argument("webhook " + destination + ": cannot read ca_file " +
                                *target.ca_file);
  }
  AddressPolicyOf(destination, target);
}

int AutoClaimLoops(int max_in_flight, int cpus) {
  const int for_workers =
      (std::max(max_in_flight, 1) + kRequestsPerAutoClaimLoop - 1) / kRequestsPerAutoClaimLoop;
  const int for_cpus = std::max(cpus, 1) / kCpusPerAutoClaimLoop;
  return std::max(1, std::min({for_workers, for_cpus, kMaxAutoClaimLoops}));
}

std::optional<int> CpusOfQuota(long long quota_us, long long period_us) {
  if (quota_us <= 0 || period_us <= 0) return std::nullopt;
  return static_cast<int>(std::max<long long>(1, quota_us / period_us));
}

std::optional<int> CpusOfCpuMax(std::string_view cpu_max) {
  std::istringstream in{std::string(cpu_max)};
  std::string quota;
  long long period = 0;
  if (!(in >> quota >> period) || quota == "max") return std::nullopt;
  try {
    std::size_t used = 0;
    const long long q = std::stoll(quota, &used);
    if (used != quota.size()) return std::nullopt;
    return CpusOfQuota(q, period);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

namespace {

std::optional<std::string> FirstLineOf(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) return std::nullopt;
  return line;
}

// The CPU quota of this process's cgroup: v2 (its own cgroup's cpu.max, as /proc/self/cgroup
// names it, or the root of a container's namespace), else v1's cpu controller.
std::optional<int> CgroupCpus() {
  std::vector<std::string> v2 = {"/sys/fs/cgroup/cpu.max"};
  if (std::ifstream self("/proc/self/cgroup"); self) {
    for (std::string line; std::getline(self, line);) {
      if (line.rfind("0::", 0) == 0 && line.size() > 3 && line.substr(3) != "/") {
        v2.insert(v2.begin(), "/sys/fs/cgroup" + line.substr(3) + "/cpu.max");
      }
    }
  }
  for (const auto& path : v2) {
    if (const auto line = FirstLineOf(path)) return CpusOfCpuMax(*line);
  }
  const auto quota = FirstLineOf("/sys/fs/cgroup/cpu/cpu.cfs_quota_us");
  const auto period = FirstLineOf("/sys/fs/cgroup/cpu/cpu.cfs_period_us");
  if (!quota || !period) return std::nullopt;
  try {
    return CpusOfQuota(std::stoll(*quota), std::stoll(*period));
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

}  // namespace

int UsableCpus() {
  int cpus = static_cast<int>(std::thread::hardware_concurrency());
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) cpus = CPU_COUNT(&set);
  if (const auto quota = CgroupCpus()) cpus = std::min(cpus, *quota);
  return std::max(1, cpus);
}

SinkPtr MakeWebhookSink(std::string destination, const WebhookTarget& target, WebhookRoom room) {
  return std::make_unique<WebhookSink>(std::move(destination), target, room);
}

SinkPtr webhook_detail::RemakeWebhookSink(std::string destination, const WebhookTarget& target,
                                          const Sink& previous) {
  auto sink =
      std::make_unique<WebhookSink>(std::move(destination), target, WebhookRoom::kServiceLane);
  if (const auto* old = dynamic_cast<const WebhookSink*>(&previous)) {
    sink->ResumeGovernor(old->SaveGovernor());
  }
  return sink;
}

const SinkFactory& WebhookSinkFactory() {
  static const SinkFactory factory{
      WebhookTarget::kKind,
      WebhookTargetKind,
      [](const Destination& d) {
        const auto& target = d.target.Get<WebhookTarget>();
        if (target.endpoints_from_database) return ValidateServiceDefaults(d.name, target);
        ValidateWebhookTarget(d.name, target);
      },
      [](const Destination& d) {
        const auto& target = d.target.Get<WebhookTarget>();
        return target.endpoints_from_database ? MakeWebhookServiceSink(d.name, target)
                                              : MakeWebhookSink(d.name, target);
      },
      nullptr,  // a receiver keeps nothing the relay can read back
      nullptr,
  };
  return factory;
}

}  // namespace outbox::relay
