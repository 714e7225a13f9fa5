#include "outbox_relay/retry.h"

#include <gtest/gtest.h>

#include <limits>

namespace outbox::relay {
namespace {

using namespace std::chrono_literals;

RetryPolicy Policy() {
  RetryPolicy p;
  p.max_attempts = 5;
  p.initial_backoff = 1000ms;
  p.max_backoff = 10'000ms;
  return p;
}

TEST(Backoff, FullJitterUnderAnExponentialCap) {
  const auto p = Policy();
  EXPECT_EQ(BackoffDelay(p, 1, 0.0), 0ms);
  EXPECT_EQ(BackoffDelay(p, 1, 0.5), 500ms);
  EXPECT_EQ(BackoffDelay(p, 2, 0.5), 1000ms);
  EXPECT_EQ(BackoffDelay(p, 3, 0.999), 3996ms);
  EXPECT_EQ(BackoffDelay(p, 10, 0.999), 9990ms) << "capped at max_backoff";
  EXPECT_EQ(BackoffDelay(p, 1000, 1.0), 10'000ms) << "no overflow for huge attempt counts";
}

TEST(Backoff, RetryAfterIsALowerBoundStillCapped) {
  const auto p = Policy();
  EXPECT_EQ(BackoffDelay(p, 1, 0.1, 7000ms), 7000ms);
  EXPECT_EQ(BackoffDelay(p, 5, 0.9, 10ms), 9000ms);
  EXPECT_EQ(BackoffDelay(p, 1, 0.1, 60'000ms), 10'000ms);
}

Outcome Out(OutcomeKind k, std::string reason = "") {
  Outcome o;
  o.kind = k;
  o.reason = std::move(reason);
  return o;
}

TEST(Decide, MapsOutcomesToSettlements) {
  const auto p = Policy();
  const MessageId id{7};
  auto s = Decide(id, 0, Out(OutcomeKind::kDelivered), p, "tok", 0.5, false);
  EXPECT_EQ(s.kind, Settlement::Kind::kDelivered);
  EXPECT_EQ(s.lease_token, "tok");
  EXPECT_EQ(Raw(s.id), 7);

  s = Decide(id, 0, Out(OutcomeKind::kPermanent, "http 404: gone"), p, "tok", 0.5, false);
  EXPECT_EQ(s.kind, Settlement::Kind::kDead);
  EXPECT_EQ(s.error, "http 404: gone");

  s = Decide(id, 2, Out(OutcomeKind::kRetry, "timeout"), p, "tok", 0.5, false);
  EXPECT_EQ(s.kind, Settlement::Kind::kRetry);
  EXPECT_EQ(s.delay, 2000ms);  // third failure: cap 4000, u 0.5
  EXPECT_EQ(s.error, "timeout");

  s = Decide(id, 4, Out(OutcomeKind::kRetry, "timeout"), p, "tok", 0.5, false);
  EXPECT_EQ(s.kind, Settlement::Kind::kDead) << "the fifth failure is the last allowed attempt";
  EXPECT_NE(s.error.find("gave up after 5 attempts; last error: timeout"), std::string::npos)
      << s.error;

  s = Decide(id, 4, Out(OutcomeKind::kRetry, "shutdown"), p, "tok", 0.5, true);
  EXPECT_EQ(s.kind, Settlement::Kind::kRelease) << "shutting down hands back without counting";
  EXPECT_EQ(s.delay, 0ms) << "due at once, for another relay";
  // ... but not sooner than the target asked: a 429 with Retry-After during a rolling restart
  // was handed back due at once, and another relay sent it straight back to the endpoint.
  Outcome throttled = Out(OutcomeKind::kRetry, "http 429");
  throttled.retry_after = 5s;
  s = Decide(id, 1, throttled, p, "tok", 0.5, true);
  EXPECT_EQ(s.kind, Settlement::Kind::kRelease);
  EXPECT_EQ(s.delay, 5s) << "as a retry's, capped by max_backoff";

  // A retry that may have reached the target (a Kafka transaction whose end is unknown) counts
  // even at shutdown: the counted attempt makes the next delivery check the topic first.
  Outcome maybe = Out(OutcomeKind::kRetry, "transaction end unknown");
  maybe.maybe_sent = true;
  s = Decide(id, 1, maybe, p, "tok", 0.5, true);
  EXPECT_EQ(s.kind, Settlement::Kind::kRetry) << "counted, not handed back";
  EXPECT_EQ(s.error, "transaction end unknown");
}

// Exactly once's "known absent as of" (migration 0012) travels from the outcome to the settle
// of a retry, of a shutdown's hand-back and of a release; a retry without it carries none.
TEST(Decide, ALastKnownAbsentTimeReachesTheSettle) {
  const auto p = Policy();
  const MessageId id{7};
  const auto t = std::chrono::system_clock::time_point(std::chrono::seconds(1'790'000'000));
  Outcome aborted = Out(OutcomeKind::kRetry, "transaction aborted");
  aborted.maybe_sent = true;
  aborted.absent_as_of = t;
  auto s = Decide(id, 0, aborted, p, "tok", 0.5, false);
  EXPECT_EQ(s.kind, Settlement::Kind::kRetry);
  EXPECT_EQ(s.absent_as_of, t);

  Outcome never_began = Out(OutcomeKind::kRetry, "begin_transaction failed");
  never_began.absent_as_of = t;
  s = Decide(id, 0, never_began, p, "tok", 0.5, true);
  EXPECT_EQ(s.kind, Settlement::Kind::kRelease) << "at shutdown, not sent: handed back";
  EXPECT_EQ(s.absent_as_of, t);

  Outcome returned = Out(OutcomeKind::kReturned, "not sent");
  returned.absent_as_of = t;
  EXPECT_EQ(Decide(id, 0, returned, p, "tok", 0.5, false).absent_as_of, t);

  EXPECT_FALSE(Decide(id, 0, Out(OutcomeKind::kRetry, "commit timed out"), p, "tok", 0.5, false)
                   .absent_as_of.has_value());
}

TEST(Decide, EveryFailureCarriesATypedReason) {
  const auto p = Policy();
  const MessageId id{7};
  Outcome o = Out(OutcomeKind::kRetry, "http 503");
  o.reason_class = Reason::kHttp5xx;
  EXPECT_EQ(Decide(id, 0, o, p, "tok", 0.5, false).reason_class, Reason::kHttp5xx);
  EXPECT_EQ(Decide(id, 4, o, p, "tok", 0.5, false).reason_class, Reason::kAttemptsExhausted)
      << "the last allowed attempt counts as exhausted, whatever it failed with";
  o.reason_class = Reason::kNone;  // a sink that gave no reason
  EXPECT_EQ(Decide(id, 0, o, p, "tok", 0.5, false).reason_class, Reason::kOther);
  o.kind = OutcomeKind::kPermanent;
  o.reason_class = Reason::kHttp4xx;
  EXPECT_EQ(Decide(id, 0, o, p, "tok", 0.5, false).reason_class, Reason::kHttp4xx);
}

TEST(RetryHorizon, SumsEveryRetrysDelayCap) {
  EXPECT_EQ(RetryHorizon(Policy()), 15'000ms) << "1 + 2 + 4 + 8 s before the 5th attempt";
  EXPECT_EQ(AverageRetryHorizon(Policy()), 7'500ms) << "full jitter: half on average";
  // The exponential shape's defaults: 500 ms doubling, capped at 5 min, 12 attempts.
  EXPECT_EQ(RetryHorizon(RetryPolicy{}), 811'500ms) << "511.5 s + 300 s";
  RetryPolicy once;
  once.max_attempts = 1;
  EXPECT_EQ(RetryHorizon(once), 0ms) << "no retry, no wait";
  RetryPolicy forever = Policy();
  forever.max_attempts = std::numeric_limits<int>::max();
  EXPECT_GT(RetryHorizon(forever), std::chrono::hours(24 * 365)) << "no overflow, no long loop";
}

RetryPolicy Schedule() {
  RetryPolicy p;
  p.schedule = {1000ms, 10'000ms, 60'000ms};
  p.max_backoff = 60'000ms;
  p.max_attempts = 6;
  return p;
}

TEST(Backoff, AScheduleWaitsEachDelayInTurnWithinTenPercent) {
  const auto p = Schedule();
  EXPECT_EQ(BackoffDelay(p, 1, 0.5), 1000ms);
  EXPECT_EQ(BackoffDelay(p, 1, 0.0), 900ms);
  EXPECT_EQ(BackoffDelay(p, 1, 0.999), 1099ms);
  EXPECT_EQ(BackoffDelay(p, 2, 0.5), 10'000ms);
  EXPECT_EQ(BackoffDelay(p, 3, 0.5), 60'000ms);
  EXPECT_EQ(BackoffDelay(p, 5, 0.5), 60'000ms) << "the last delay repeats";
  EXPECT_EQ(BackoffDelay(p, 1000, 0.0), 54'000ms);
  EXPECT_EQ(BackoffDelay(p, 1, 0.5, 30'000ms), 30'000ms) << "Retry-After is a lower bound";
  EXPECT_EQ(BackoffDelay(p, 1, 0.5, 24h), 60'000ms) << "capped by the longest delay";
}

TEST(RetryHorizon, OfAScheduleIsItsSumWithinTheJitter) {
  // 1 + 10 + 60 + 60 + 60 s before the 6th attempt.
  EXPECT_EQ(AverageRetryHorizon(Schedule()), 191'000ms);
  EXPECT_EQ(RetryHorizon(Schedule()), 210'100ms) << "every delay at +10%";
  const RetryPolicy d = DefaultRetryPolicy();
  // 5 s + 5 min + 30 min + 2 h + 5 h + 10 h + 10 h: about 27 h 35 min.
  EXPECT_EQ(AverageRetryHorizon(d), 5s + 5min + 30min + 2h + 5h + 10h + 10h);
  EXPECT_GT(RetryHorizon(d), 30h);
  RetryPolicy forever = Schedule();
  forever.max_attempts = std::numeric_limits<int>::max();
  EXPECT_GT(RetryHorizon(forever), std::chrono::hours(24 * 365)) << "no overflow, no long loop";
}

TEST(DecideBeforeAttempt, DeadLettersOnlyWhatHasNoAttemptLeft) {
  const auto p = Policy();  // max_attempts 5
  EXPECT_FALSE(DecideBeforeAttempt(MessageId{7}, 4, p, "tok"))
      << "four failed attempts leave a fifth";
  const auto dead = DecideBeforeAttempt(MessageId{7}, 5, p, "tok");
  ASSERT_TRUE(dead);
  EXPECT_EQ(dead->kind, Settlement::Kind::kDead);
  EXPECT_FALSE(dead->counts_attempt) << "no delivery was tried";
  EXPECT_EQ(dead->reason_class, Reason::kAttemptsExhausted);
  EXPECT_EQ(dead->lease_token, "tok");
  EXPECT_NE(dead->error.find("attempts exhausted (5)"), std::string::npos) << dead->error;
}

TEST(DecideForEndpoint, AnEndpointsFirstAttemptIsDecidedLikeAnyMessagesFirst) {
  const auto p = Policy();
  auto owed = [](OutcomeKind kind, Reason cls, std::string reason = "r") {
    EndpointOutcome o;
    o.endpoint_id = "ep";
    o.kind = kind;
    o.reason = std::move(reason);
    o.reason_class = cls;
    return o;
  };
  auto failed = owed(OutcomeKind::kRetry, Reason::kHttp5xx, "http 503");
  failed.endpoint_incarnation = 1732000000123456;
  auto c = DecideForEndpoint(failed, p, 0.5, false);
  EXPECT_EQ(c.kind, Settlement::Kind::kRetry);
  EXPECT_EQ(c.endpoint_incarnation, 1732000000123456) << "the endpoint it was sent under";
  EXPECT_EQ(c.attempts, 1);
  EXPECT_EQ(c.error, "http 503");
  EXPECT_GT(c.delay.count(), 0);
  c = DecideForEndpoint(owed(OutcomeKind::kPermanent, Reason::kHttp4xx, "http 410"), p, 0.5, false);
  EXPECT_EQ(c.kind, Settlement::Kind::kDead);
  EXPECT_EQ(c.attempts, 1);
  EXPECT_EQ(c.reason_class, Reason::kHttp4xx);
  RetryPolicy once = p;
  once.max_attempts = 1;
  c = DecideForEndpoint(owed(OutcomeKind::kRetry, Reason::kTimeout), once, 0.5, false);
  EXPECT_EQ(c.kind, Settlement::Kind::kDead) << "max_attempts 1: the first failure is the last";
  EXPECT_EQ(c.reason_class, Reason::kAttemptsExhausted);
  auto held = owed(OutcomeKind::kReturned, Reason::kNone, "endpoint disabled");
  held.retry_after = 3600s;
  c = DecideForEndpoint(held, p, 0.5, false);
  EXPECT_EQ(c.kind, Settlement::Kind::kRelease);
  EXPECT_EQ(c.attempts, 0);
  EXPECT_EQ(c.delay, 3600s);
  EXPECT_EQ(c.error, "endpoint disabled") << "why it waits stays on its row";
  c = DecideForEndpoint(owed(OutcomeKind::kRetry, Reason::kShutdown), p, 0.5, false);
  EXPECT_EQ(c.kind, Settlement::Kind::kRelease) << "cut short is not a failure";
  EXPECT_EQ(c.attempts, 0);
  c = DecideForEndpoint(owed(OutcomeKind::kRetry, Reason::kHttp5xx), p, 0.5, true);
  EXPECT_EQ(c.kind, Settlement::Kind::kRelease) << "nor is a failure while the relay stops";
}

}  // namespace
}  // namespace outbox::relay
