#include "outbox_relay/reason.h"

#include <array>
#include <utility>

namespace outbox::relay {
namespace {

struct Entry {
  Reason reason;
  std::string_view label;
  std::string_view metric;
};

// One row per reason, in the enum's order.
constexpr std::array<Entry, 26> kReasons = {{
    {Reason::kNone, "", "other"},
    {Reason::kHttp3xx, "http_3xx", "http_other"},
    {Reason::kHttp4xx, "http_4xx", "http_4xx"},
    {Reason::kHttp408, "http_408", "timeout"},
    {Reason::kHttp429, "http_429", "http_429"},
    {Reason::kHttp5xx, "http_5xx", "http_5xx"},
    {Reason::kHttpOther, "http_other", "http_other"},
    {Reason::kTimeout, "timeout", "timeout"},
    {Reason::kConnection, "connection", "connection"},
    {Reason::kTls, "tls", "connection"},
    {Reason::kBlockedAddress, "blocked_address", "blocked_address"},
    {Reason::kBroker, "broker", "connection"},
    {Reason::kMsgTooLarge, "msg_too_large", "message_rejected"},
    {Reason::kInvalidMessage, "invalid_message", "message_rejected"},
    {Reason::kAuthorization, "authorization", "authorization"},
    {Reason::kInvalidTopic, "invalid_topic", "topic_or_config"},
    {Reason::kUnknownTopic, "unknown_topic", "topic_or_config"},
    {Reason::kConfig, "config", "topic_or_config"},
    {Reason::kQueueFull, "queue_full", "producer"},
    {Reason::kPurged, "purged", "producer"},
    {Reason::kFatal, "fatal", "producer"},
    {Reason::kShutdown, "shutdown", "shutdown"},
    {Reason::kLeaseExpired, "lease_expired", "lease_expired"},
    {Reason::kAttemptsExhausted, "attempts_exhausted", "attempts_exhausted"},
    {Reason::kUnknownDestination, "unknown_destination", "unknown_destination"},
    {Reason::kOther, "other", "other"},
}};

constexpr bool InEnumOrder() {
  for (std::size_t i = 0; i < kReasons.size(); ++i) {
    if (static_cast<std::size_t>(kReasons[i].reason) != i) return false;
  }
  return kReasons.back().reason == Reason::kOther;
}
static_assert(InEnumOrder(), "kReasons: one row per Reason, in the enum's order, kOther last");

const Entry& Find(Reason r) {
  const auto i = static_cast<std::size_t>(r);
  return i < kReasons.size() ? kReasons[i] : kReasons.back();
}

}  // namespace

std::string_view Label(Reason reason) { return Find(reason).label; }

std::string_view MetricLabel(Reason reason) { return Find(reason).metric; }

Reason ReasonFromLabel(std::string_view label) {
  for (const auto& e : kReasons) {
    if (!label.empty() && e.label == label) return e.reason;
  }
  return Reason::kOther;
}

}  // namespace outbox::relay
