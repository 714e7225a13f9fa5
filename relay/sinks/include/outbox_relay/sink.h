// The boundary between the dispatcher and a delivery target (Kafka, webhooks, ...).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "outbox_relay/message.h"
#include "outbox_relay/reason.h"
#include "outbox_relay/target_health.h"

namespace outbox::relay {

/// How one delivery attempt ended. Never an exception: sinks turn every failure into one.
enum class OutcomeKind {
  kDelivered,  ///< The target acknowledged the message; it leaves the queue.
  kRetry,      ///< Transient failure (network, timeout, 5xx, broker down): try again later.
  kPermanent,  ///< The target refused it for good (4xx, message too large, auth): dead-letter.
  /// Handed back unsent: the sink stopped sending to its target for a while (circuit breaker
  /// open, Retry-After pause). No attempt is counted; the message may be claimed again.
  kReturned,
  /// A webhook service sent the message to each of its endpoints: it leaves the queue, and
  /// what an endpoint did not take (Outcome::owed) stays queued for that endpoint alone.
  kFannedOut,
};

const char* ToString(OutcomeKind kind);

/// What one endpoint of a fanned-out message did with it, when it did not take it.
struct EndpointOutcome {
  std::string endpoint_id;
  /// kRetry (it failed: an attempt is counted), kPermanent (refused for good: a dead letter of
  /// the endpoint) or kReturned (not sent: breaker open, disabled, busy, or an earlier message
  /// of the key still owed to it; no attempt is counted).
  OutcomeKind kind = OutcomeKind::kReturned;
  std::string reason;
  Reason reason_class = Reason::kNone;
  /// kRetry: the endpoint asked to wait (Retry-After). kReturned: not before this long.
  std::optional<std::chrono::milliseconds> retry_after;
  /// Which endpoint of that id the copy was sent under (EndpointSpec::incarnation); 0: any.
  std::int64_t endpoint_incarnation = 0;
};

/// One HTTP request and its answer, as the delivery log records it (webhook sinks).
struct HttpExchange {
  std::chrono::system_clock::time_point at{};  ///< When the request was sent.
  int status = 0;                              ///< 0: no answer (timeout, connection, TLS).
  std::chrono::milliseconds took{0};
  std::string body;  ///< The start of the response body (at most 1 KiB, printable UTF-8).
};

struct Outcome {
  MessageId id{};
  OutcomeKind kind = OutcomeKind::kRetry;
  /// Short human-readable reason for kRetry/kPermanent ("http 503: <start of body>").
  std::string reason;
  /// Why, from the closed set in reason.h (kNone when delivered).
  Reason reason_class = Reason::kNone;
  /// The target asked to wait at least this long (HTTP Retry-After).
  std::optional<std::chrono::milliseconds> retry_after;
  /// kFannedOut: the endpoints that did not take the message.
  std::vector<EndpointOutcome> owed;
  /// kFannedOut: how many endpoints took it.
  int delivered_to = 0;
  /// The request this attempt made, when the sink speaks HTTP and tried one (status 0: no
  /// answer, also when the host's name did not resolve or resolved only to refused addresses).
  std::optional<HttpExchange> exchange;
  /// kRetry of a message that may have reached the target although the attempt failed (a
  /// Kafka transaction whose end is unknown): the attempt counts even at shutdown, when a
  /// retry is otherwise handed back uncounted, because a counted attempt is what tells the
  /// next delivery to check the target first (Kafka's exactly-once recovery).
  bool maybe_sent = false;
  /// kRetry, kReturned: the message is known not to be in the target as of this time: an
  /// exactly-once attempt that found it absent from its topic (or had no earlier attempt)
  /// and then produced nothing or aborted. The next recovery reads the topic from here
  /// (less kClockSlack, 5 minutes) instead of from the message's creation. Earlier producers
  /// of the bucket are fenced when this relay initialised its producer; one it kept from an
  /// earlier ownership of the bucket (up to a minute idle) fenced nobody, and then what
  /// covers a transaction still open elsewhere is that it ends within the transaction
  /// timeout (2 minutes at most; 30 s unless message.timeout.ms says more), well inside the
  /// slack (docs/adr/0002).
  std::optional<std::chrono::system_clock::time_point> absent_as_of = std::nullopt;
};

/// Delivers messages of one destination. Implementations are thread-safe: Submit may be
/// called from the dispatcher thread while completions run on the sink's own threads.
///
/// Per-key order is the dispatcher's job: it never submits a message while an earlier
/// message of the same ordering key is in flight, so a sink may deliver a batch in any
/// order and with any concurrency.
class Sink {
 public:
  using Completion = std::function<void(Outcome)>;

  virtual ~Sink() = default;

  /// Starts delivering `msg`. Calls `done` exactly once, from any thread, possibly before
  /// Submit returns. Never throws. After Shutdown began, completes at once with kRetry.
  virtual void Submit(Message msg, Completion done) = 0;

  /// What one claim brought, handed over at once: each as Submit would take it. A sink may take
  /// them in one step (the webhook sink: one lock, one wake-up of its workers), where one
  /// Submit each cost the claim loop a wake-up per message. By default, Submit for each.
  virtual void SubmitMany(std::vector<std::pair<Message, Completion>> batch) {
    for (auto& [msg, done] : batch) Submit(std::move(msg), std::move(done));
  }

  /// Stops accepting work and waits up to `deadline` for in-flight deliveries; whatever is
  /// still in flight then completes with kRetry ("shutdown"). Idempotent.
  virtual void Shutdown(std::chrono::milliseconds deadline) = 0;

  /// True while the sink can deliver (e.g. the Kafka producer reached a broker, the webhook
  /// endpoint answers).
  virtual bool Ready() const = 0;

  /// Why the sink is not ready, for /readyz and logs ("no broker reachable"); empty when
  /// Ready().
  virtual std::string WhyNotReady() const { return Ready() ? std::string() : "not ready"; }

  /// Messages accepted by Submit whose completion has not run yet.
  virtual std::size_t InFlight() const = 0;

  /// The kind of sink ("kafka", "webhook"): the `sink` label of the metrics.
  virtual std::string_view Kind() const = 0;

  /// How many messages the dispatcher may have in this sink at once when it claims
  /// `claim_batch` at a time: enough to keep the target busy while the next claim runs.
  /// Asked before every claim: a sink that stopped sending for a while (an open circuit
  /// breaker) answers 0, and the dispatcher claims nothing for it.
  virtual std::size_t MaxInFlight(int claim_batch) const {
    return static_cast<std::size_t>(claim_batch) * 4;
  }

  /// How many claim loops keep this sink fed where `claim_connections` is `auto` (the
  /// default): one claim loop drains at most what one Postgres backend claims, so a sink that
  /// takes more at once (a webhook sink with a high max_in_flight) asks for more. 1 by default.
  virtual int ClaimLoops() const { return 1; }

  /// Messages the sink's client library still holds (Kafka: the producer queue), published
  /// as a gauge; nullopt when the sink has no such queue.
  virtual std::optional<std::size_t> ClientQueueLength() const { return std::nullopt; }

  /// True when each outcome is a response of the target (an HTTP status, a timeout), counted
  /// per response class in outbox_webhook_responses_total.
  virtual bool OutcomesAreResponses() const { return false; }

  /// True when starting to deliver a bucket fences the relay that delivered it before (the
  /// exactly-once Kafka sink: init_transactions aborts the previous producer's open
  /// transaction). A stopping relay then keeps its buckets (claim_mode partitioned) until this
  /// sink has shut down, so its last transactions commit rather than being fenced.
  virtual bool FencesOthersWhenItStarts() const { return false; }

  /// An operator paused the destination (`outbox-relay pause`), or resumed it: the claim loops
  /// claim nothing meanwhile. A sink that queues messages before it sends them hands back what
  /// has not started (kReturned: no attempt counted) and what it is handed while paused, and
  /// lets what is under way finish, as the webhook sinks do. The default does nothing (a Kafka
  /// producer's queue goes out within its linger).
  virtual void SetPaused(bool /*paused*/) {}

  /// What the sink knows of its target's health: the circuit breaker and the concurrency it
  /// allows (webhooks); nullopt for a sink that keeps none. Published as metrics and in the
  /// relay's heartbeat, which `outbox-relay status` shows.
  virtual std::optional<TargetHealth> Health() const { return std::nullopt; }

  /// How often each of the sink's own events happened since it started, by event name:
  /// published as outbox_sink_events_total{destination,event} (the exactly-once Kafka sink:
  /// its transactions, recoveries and producers). Names are a small fixed set per sink; empty
  /// for a sink that counts none.
  virtual std::map<std::string, std::int64_t> EventCounts() const { return {}; }
};

using SinkPtr = std::unique_ptr<Sink>;

struct Destination;      // outbox_relay/config.h
struct TargetKind;       // outbox_relay/config.h
struct ReadBackOptions;  // outbox_relay/read_back.h
struct ReadBackResult;

/// One kind of sink: how its destinations are read from the config, checked and served. Each
/// kind defines its factory in its own folder (relay/sinks/<kind>); relay/sinks/src/registry.cc
/// lists them, and nothing else in the relay names a kind of sink (docs/architecture.md,
/// "Adding a sink").
struct SinkFactory {
  /// As Sink::Kind() of the sinks it makes, the key of the config section it reads and
  /// Destination::target.kind() of the destinations it serves.
  std::string_view kind;
  /// Reads and completes that section (the config loader calls it; config names no kind).
  const TargetKind& (*target_kind)();
  /// What the sink would refuse, checked without connecting (check-config and run both call
  /// it); throws std::invalid_argument naming the property and the fix.
  void (*validate)(const Destination& destination);
  /// Creates the sink; throws std::invalid_argument like validate.
  SinkPtr (*make)(const Destination& destination);
  /// Reads back what the destination's target holds (read_back.h), for `outbox-relay
  /// verify`; throws std::runtime_error naming what failed. Null: the kind cannot be read
  /// back (a webhook receiver keeps nothing the relay can ask for).
  ReadBackResult (*read_back)(const Destination& destination,
                              const ReadBackOptions& options) = nullptr;
  /// What `check-config` adds after the kind ("exactly once"); empty or null: nothing.
  std::string (*describe)(const Destination& destination) = nullptr;
};

}  // namespace outbox::relay
