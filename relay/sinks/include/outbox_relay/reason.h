// Why a delivery did not end in "delivered": one closed set, each with a stable label. Sinks
// classify every failure into one; the dispatcher and the reaper add their own (attempts
// exhausted, lease expired). Metrics count them by a coarser group (MetricLabel), so the
// label sets stay small whatever a target answers.
#pragma once

#include <ostream>
#include <string_view>

namespace outbox::relay {

enum class Reason {
  kNone,  ///< Delivered: no reason.
  // Webhooks (webhook_sink.h)
  kHttp3xx,  ///< Redirects are never followed: permanent.
  kHttp4xx,
  kHttp408,
  kHttp429,
  kHttp5xx,
  kHttpOther,
  kTimeout,     ///< No answer in time (HTTP), or the Kafka message timed out.
  kConnection,  ///< Refused, reset, DNS: no HTTP answer at all.
  kTls,
  kBlockedAddress,  ///< The SSRF guard refused the endpoint's address (private, loopback, ...).
  // Kafka (kafka_sink.h)
  kBroker,          ///< No broker reachable, not leader, not enough replicas, ...
  kMsgTooLarge,     ///< Permanent.
  kInvalidMessage,  ///< Permanent (corrupt, invalid record).
  kAuthorization,   ///< Permanent (topic or cluster authorization failed).
  kInvalidTopic,    ///< Permanent.
  kUnknownTopic,
  kConfig,  ///< Permanent (the producer's configuration).
  kQueueFull,
  kPurged,
  kFatal,  ///< The producer hit a fatal error and is being recreated.
  // Any sink
  kShutdown,  ///< The relay stopped before the attempt ended: handed back, not counted.
  // The relay itself
  kLeaseExpired,        ///< The reaper took the message back from a relay that stopped.
  kAttemptsExhausted,   ///< max_attempts reached.
  kUnknownDestination,  ///< No relay serves the destination (dlq bury).
  kOther,
};

/// The stable label of each reason ("http_5xx", "lease_expired", ...): what sinks and logs say.
std::string_view Label(Reason reason);
/// The group a reason counts under in the metrics' `reason` label ("http_408" counts as
/// "timeout", "tls" as "connection", the Kafka configuration errors as "topic_or_config").
std::string_view MetricLabel(Reason reason);
/// The reason with this label; kOther for anything else.
Reason ReasonFromLabel(std::string_view label);

/// Compares with a label, so `outcome.reason_class == "http_5xx"` reads as it always did.
inline bool operator==(Reason r, std::string_view label) { return Label(r) == label; }
inline std::ostream& operator<<(std::ostream& os, Reason r) { return os << Label(r); }

}  // namespace outbox::relay
