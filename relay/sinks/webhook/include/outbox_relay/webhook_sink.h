// The webhook sink: delivers each message as one signed HTTP POST (Standard Webhooks).
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "outbox_relay/sink.h"
#include "outbox_relay/webhook_target.h"

namespace outbox::relay {

/// What a webhook sink's MaxInFlight asks the claim loop to keep in it. A destination's own
/// sink: up to three claims' worth (at most 64 per request the endpoint allows now), so the
/// next claim runs while two are still queued. A webhook service's endpoint lane, fed from the
/// service's backlog rather than by claims: up to two claims' worth (16 per request), which
/// the service sizes its lanes and its claims from.
enum class WebhookRoom { kDestination, kServiceLane };

/// `claim_connections: auto`: a webhook destination's sink asks for one claim loop per this many
/// of its max_in_flight (rounded up), at most kMaxAutoClaimLoops and one per kCpusPerAutoClaimLoop
/// CPUs the relay may use: the default 32 workers get four on 16 CPUs, two on 8, one under 8.
/// One loop's claims drained 8, 32 and 128 loopback workers alike on 16 cores (the claims, not
/// the workers, were the limit: the default 32 idled two thirds of the time, and four loops took
/// them from 0.22 to 0.47 x the HTTP ceiling); on 2 cores four loops for 128 workers drained
/// slower than one (7k against 9k msg/s, Postgres CPU 59-67 against 38 us a message:
/// docs/benchmarks.md). Only the first loop claims unless the last claim came back full.
inline constexpr int kRequestsPerAutoClaimLoop = 8;
inline constexpr int kMaxAutoClaimLoops = 4;
inline constexpr int kCpusPerAutoClaimLoop = 4;

/// The claim loops a webhook destination with `max_in_flight` workers asks for under
/// `claim_connections: auto` on a machine with `cpus` CPUs for the relay (at least 1).
int AutoClaimLoops(int max_in_flight, int cpus);

/// The CPUs this process may use: its affinity mask, lowered to its cgroup's CPU quota where
/// one is set (a container's CPU limit: cgroup v2 `cpu.max`, v1 `cpu.cfs_quota_us`), at least 1.
int UsableCpus();

/// Whole CPUs a cgroup CPU quota allows (`quota_us` per `period_us`, rounded down, at least 1);
/// nullopt without a quota (v2's "max", v1's -1) or for text that is not one. `cpu_max` is a
/// cgroup v2 `cpu.max` line ("200000 100000", "max 100000").
std::optional<int> CpusOfCpuMax(std::string_view cpu_max);
std::optional<int> CpusOfQuota(long long quota_us, long long period_us);

/// Creates the sink of one webhook destination.
///
/// Every message becomes one `POST target.url` (path and query as written in the URL) whose
/// body is the payload bytes exactly as stored, with these headers:
///   - `webhook-id`        the message's idempotency_key (stable across redeliveries);
///   - `webhook-timestamp` unix seconds when this attempt was sent;
///   - `webhook-signature` one space-separated `v1,<base64>` per configured secret (every
///                         secret signs, so a receiver knowing either side of a rotation verifies);
///   - `Idempotency-Key`   the idempotency_key again, for receivers that know that convention;
///   - `Content-Type`      application/json when payload_is_json, else application/octet-stream;
///   - `Webhook-Event-Type` the event_type, only when it is not empty;
///   - the message's own headers, then target.headers. Neither may replace the headers above
///     (nor Host, Content-Length, Connection, Transfer-Encoding): such headers are skipped with
///     a debug log. A target header wins over a message header of the same name.
///
/// Outcomes: 2xx is kDelivered. 408, 429, 5xx, timeouts and connection/TLS errors are kRetry
/// (a `Retry-After` of delta-seconds or an HTTP-date sets Outcome::retry_after). Other 4xx
/// and every 3xx (redirects are never followed) are kPermanent. reason_class is one of
/// "http_3xx", "http_4xx", "http_408", "http_429", "http_5xx", "http_other", "timeout",
/// "connection", "tls", "shutdown".
///
/// Concurrency: target.max_in_flight worker threads take messages from a queue, each with its
/// own keep-alive connection, so at most max_in_flight requests run at once and connections
/// are reused. Submit only enqueues; it never waits on the network. The sink has no per-key
/// logic: the dispatcher never submits a message while an earlier message with the same
/// ordering key is in flight, so per-key order holds with any number of workers.
///
/// Timeouts: target.connect_timeout bounds connecting (TCP and TLS handshake); target.timeout
/// bounds each send/receive wait and reading the response body, so a stalled request ends
/// after roughly target.timeout.
///
/// TLS: https URLs verify the server certificate and host name unless target.verify_tls is
/// false; target.ca_file replaces the system trust store.
///
/// Shutdown(deadline) stops accepting work, completes queued-but-unstarted messages with
/// kRetry "shutdown" at once, waits up to `deadline` for requests already sent, then completes
/// whatever is still running with kRetry "shutdown", aborts those requests and joins the
/// workers. The destructor calls Shutdown(0) when Shutdown was not called. Completions run on
/// the worker threads (or on the caller of Submit/Shutdown); they may call Submit, but must not
/// call Shutdown or destroy the sink.
///
/// Throws std::invalid_argument for an unusable url, secret, max_in_flight or ca_file (config
/// validation should have caught it first).
///
/// `room` says what its MaxInFlight asks the claim loop for (WebhookRoom).
SinkPtr MakeWebhookSink(std::string destination, const WebhookTarget& target,
                        WebhookRoom room = WebhookRoom::kDestination);

/// The webhook kind of sink (serves destinations with a `webhook:` target).
const SinkFactory& WebhookSinkFactory();

/// The checks MakeWebhookSink makes, without starting anything: url (no credentials, a host,
/// a port), secrets, max_in_flight, timeouts, ca_file. Throws std::invalid_argument naming
/// the destination. `check-config` and `run` both rely on it.
void ValidateWebhookTarget(const std::string& destination, const WebhookTarget& target);

/// Why a webhook service endpoint at `url` could never be sent to under its destination's
/// settings `defaults` (the URL unreadable, or a host the SSRF guard refuses without asking
/// DNS: an IP literal, localhost); nullopt when it may be. For `endpoints add` through the
/// management API, so such an endpoint is refused instead of dead-lettering what it is sent.
std::optional<std::string> EndpointUrlProblem(const std::string& destination,
                                              const WebhookTarget& defaults,
                                              const std::string& url);

/// The Standard Webhooks signature of one delivery: "v1," + base64(HMAC-SHA256(key,
/// msg_id + "." + timestamp_seconds + "." + body)), where key is the base64-decoded part of
/// `whsec_secret` after the "whsec_" prefix. Throws std::invalid_argument when the secret is
/// not "whsec_" followed by non-empty base64.
std::string SignStandardWebhook(const std::string& whsec_secret, const std::string& msg_id,
                                long long timestamp_seconds, const std::string& body);

/// True when one of the space-separated "v1,<base64>" entries of `signature_header` is the
/// signature of (msg_id, timestamp_seconds, body) under `whsec_secret`. Entries of other
/// versions are ignored; comparison is constant-time. It does not check that the timestamp
/// is recent: a receiver should also reject timestamps far from its clock (replay).
/// Throws std::invalid_argument for a malformed secret, like SignStandardWebhook.
bool VerifyStandardWebhook(const std::string& whsec_secret, const std::string& msg_id,
                           long long timestamp_seconds, const std::string& body,
                           const std::string& signature_header);

}  // namespace outbox::relay
