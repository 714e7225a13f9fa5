#include "outbox_relay/retry.h"

#include <algorithm>
#include <cmath>

namespace outbox::relay {

namespace {

constexpr double kScheduleJitterLow = 0.9;   // a scheduled delay is scaled by a factor in
constexpr double kScheduleJitterSpan = 0.2;  // [0.9, 1.1)

// The delay before attempt `failures + 1` at random point `u01` in [0, 1], without Retry-After.
double JitteredDelay(const RetryPolicy& policy, int failures, double u01) {
  u01 = std::clamp(u01, 0.0, 1.0);
  if (!policy.schedule.empty()) {
    const auto i = static_cast<std::size_t>(std::max(failures - 1, 0));
    const auto& delay = policy.schedule[std::min(i, policy.schedule.size() - 1)];
    return static_cast<double>(delay.count()) * (kScheduleJitterLow + kScheduleJitterSpan * u01);
  }
  const double cap = static_cast<double>(policy.max_backoff.count());
  const int exponent = std::clamp(failures - 1, 0, 62);
  return u01 * std::min(cap, static_cast<double>(policy.initial_backoff.count()) *
                                 std::ldexp(1.0, exponent));
}

Millis SumOfDelays(const RetryPolicy& policy, double u01) {
  double total = 0;
  for (int failures = 1; failures < policy.max_attempts; ++failures) {
    const double delay = JitteredDelay(policy, failures, u01);
    // Every later retry waits the same (the exponential cap, the schedule's last entry).
    const bool constant_from_here =
        policy.schedule.empty() ? delay >= u01 * static_cast<double>(policy.max_backoff.count())
                                : static_cast<std::size_t>(failures) >= policy.schedule.size();
    if (constant_from_here) {
      total += delay * static_cast<double>(policy.max_attempts - failures);
      break;
    }
    total += delay;
  }
  return Millis(static_cast<long long>(std::min(total, 1e17)));
}

}  // namespace

Millis BackoffDelay(const RetryPolicy& policy, int failures, double u01,
                    std::optional<Millis> retry_after) {
  auto delay = Millis(static_cast<long long>(JitteredDelay(policy, failures, u01)));
  if (retry_after) delay = std::max(delay, std::min(*retry_after, policy.max_backoff));
  return delay;
}

Millis RetryHorizon(const RetryPolicy& policy) { return SumOfDelays(policy, 1.0); }

Millis AverageRetryHorizon(const RetryPolicy& policy) { return SumOfDelays(policy, 0.5); }

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
    case OutcomeKind::kReturned:  // never sent: hand it back, count nothing
      s.kind = Settlement::Kind::kRelease;
      if (outcome.retry_after) s.delay = *outcome.retry_after;
      s.absent_as_of = outcome.absent_as_of;
      return s;
    case OutcomeKind::kFannedOut:
      s.kind = Settlement::Kind::kFanOut;
      s.delivered_to = outcome.delivered_to;
      for (const auto& owed : outcome.owed) {
        s.children.push_back(DecideForEndpoint(owed, policy, u01, shutting_down));
      }
      return s;
    case OutcomeKind::kRetry:
      break;
  }
  s.absent_as_of = outcome.absent_as_of;
  if (shutting_down && !outcome.maybe_sent) {
    s.kind = Settlement::Kind::kRelease;
    // Handed back for another relay, which does not know this target asked to wait.
    if (outcome.retry_after) s.delay = std::min(*outcome.retry_after, policy.max_backoff);
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

// The endpoint's own first attempt, decided as any message's (attempts 0), then kept as a row
// of that endpoint: what it failed with stays on the row, also when it was never sent.
Settlement::Child DecideForEndpoint(const EndpointOutcome& owed, const RetryPolicy& policy,
                                    double u01, bool shutting_down) {
  Outcome o;
  o.kind = owed.kind;
  o.reason = owed.reason;
  o.reason_class = owed.reason_class;
  o.retry_after = owed.retry_after;
  // Cut short (the relay stops, or the endpoint's sink was replaced), not failed.
  const bool cut_short = owed.kind == OutcomeKind::kRetry && owed.reason_class == Reason::kShutdown;
  const Settlement s = Decide(MessageId{}, 0, o, policy, "", u01, shutting_down || cut_short);
  Settlement::Child c;
  c.endpoint_id = owed.endpoint_id;
  c.endpoint_incarnation = owed.endpoint_incarnation;
  c.kind = s.kind;
  c.delay = s.delay;
  c.reason_class = s.reason_class;
  c.attempts = s.kind == Settlement::Kind::kRelease ? 0 : 1;
  c.error = s.kind == Settlement::Kind::kRelease ? owed.reason : s.error;
  return c;
}

}  // namespace outbox::relay
