#include "outbox_relay/retry.h"

#include <algorithm>
#include <cmath>

namespace outbox::relay {

Millis BackoffDelay(const RetryPolicy& policy, int failures, double u01,
                    std::optional<Millis> retry_after) {
  const double cap = static_cast<double>(policy.max_backoff.count());
  const int exponent = std::clamp(failures - 1, 0, 62);
  const double ceiling = std::min(
      cap, static_cast<double>(policy.initial_backoff.count()) * std::ldexp(1.0, exponent));
  auto delay = Millis(static_cast<long long>(std::clamp(u01, 0.0, 1.0) * ceiling));
  if (retry_after) delay = std::max(delay, *retry_after);
  return std::min(delay, policy.max_backoff);
}

Millis RetryHorizon(const RetryPolicy& policy) {
  double total = 0;
  const double cap = static_cast<double>(policy.max_backoff.count());
  for (int failures = 1; failures < policy.max_attempts; ++failures) {
    const double ceiling = std::min(cap, static_cast<double>(policy.initial_backoff.count()) *
                                             std::ldexp(1.0, std::clamp(failures - 1, 0, 62)));
    if (ceiling >= cap) {  // every later retry waits up to the cap
      total += cap * static_cast<double>(policy.max_attempts - failures);
      break;
    }
    total += ceiling;
  }
  return Millis(static_cast<long long>(std::min(total, 1e17)));
}

namespace {

// A sink that gave no reason for a failure: counted as "other".
Reason Known(Reason r) { return r == Reason::kNone ? Reason::kOther : r; }

}  // namespace

std::optional<Settlement> DecideBeforeAttempt(MessageId id, int attempts, const RetryPolicy& policy,
                                              const std::string& lease_token) {
  if (attempts < policy.max_attempts) return std::nullopt;
  Settlement s;
  s.id = id;
  s.lease_token = lease_token;
  s.kind = Settlement::Kind::kDead;
  s.counts_attempt = false;
  s.error = "attempts exhausted (" + std::to_string(attempts) +
            ") before this delivery; the last ones ended by lease expiry";
  s.reason_class = Reason::kAttemptsExhausted;
  return s;
}

Settlement Decide(MessageId id, int attempts, const Outcome& outcome, const RetryPolicy& policy,
                  const std::string& lease_token, double u01, bool shutting_down) {
  Settlement s;
  s.id = id;
  s.lease_token = lease_token;
  switch (outcome.kind) {
    case OutcomeKind::kDelivered:
      s.kind = Settlement::Kind::kDelivered;
      return s;
    case OutcomeKind::kPermanent:
      s.kind = Settlement::Kind::kDead;
      s.error = outcome.reason.empty() ? "permanent failure" : outcome.reason;
      s.reason_class = Known(outcome.reason_class);
      return s;
    case OutcomeKind::kRetry:
      break;
  }
  if (shutting_down) {
    s.kind = Settlement::Kind::kRelease;
    return s;
  }
  const int failures = attempts + 1;
  if (failures >= policy.max_attempts) {
    s.kind = Settlement::Kind::kDead;
    s.error =
        "gave up after " + std::to_string(failures) + " attempts; last error: " + outcome.reason;
    s.reason_class = Reason::kAttemptsExhausted;
    return s;
  }
  s.kind = Settlement::Kind::kRetry;
  s.delay = BackoffDelay(policy, failures, u01, outcome.retry_after);
  s.error = outcome.reason;
  s.reason_class = Known(outcome.reason_class);
  return s;
}

}  // namespace outbox::relay
