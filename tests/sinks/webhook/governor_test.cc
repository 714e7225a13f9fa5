// The webhook endpoint's governor (circuit breaker, adaptive concurrency, Retry-After pause)
// on a fake timeline: no sleeps.
#include <gtest/gtest.h>

#include <vector>

#include "endpoint_governor.h"

namespace outbox::relay::webhook_detail {
namespace {

using namespace std::chrono_literals;
using Time = EndpointGovernor::Time;

const Time kT0 = Time{} + 1h;

Verdict Ok() { return Verdict{true, false, false, std::nullopt}; }
Verdict Failed() { return Verdict{false, true, false, std::nullopt}; }  // connect error, 500
Verdict TimedOut() { return Verdict{false, true, true, std::nullopt}; }
Verdict TooMany(std::optional<Millis> retry_after = std::nullopt) {
  return Verdict{false, false, true, retry_after};
}
Verdict NotFound() { return Verdict{}; }  // answered, neither success nor failure

BreakerSettings Breaker(int threshold = 3) {
  BreakerSettings b;
  b.failure_threshold = threshold;
  b.cooldown = 1s;
  b.max_cooldown = 4s;
  return b;
}

// Starts and finishes one request at `now`.
Transition Once(EndpointGovernor& g, Time now, const Verdict& v) {
  const auto ticket = g.TryStart(now);
  EXPECT_TRUE(ticket.has_value());
  return ticket ? g.Finish(now, *ticket, v) : Transition{};
}

TEST(EndpointGovernor, ConsecutiveFailuresOpenTheBreakerAndNothingIsSentWhileOpen) {
  EndpointGovernor g(Breaker(3), true, 8);
  EXPECT_FALSE(Once(g, kT0, Failed()).opened);
  EXPECT_FALSE(Once(g, kT0, Failed()).opened);
  EXPECT_FALSE(Once(g, kT0, Ok()).opened) << "a success resets the count";
  EXPECT_FALSE(Once(g, kT0, Failed()).opened);
  EXPECT_FALSE(Once(g, kT0, NotFound()).opened) << "any answer that is no failure resets it";
  Once(g, kT0, Failed());
  Once(g, kT0, Failed());
  EXPECT_TRUE(Once(g, kT0, Failed()).opened) << "the third in a row";
  EXPECT_TRUE(g.Blocked(kT0));
  EXPECT_FALSE(g.TryStart(kT0 + 999ms));
  EXPECT_EQ(g.Admit(kT0 + 999ms, 4), 0u) << "the dispatcher claims nothing for it";
  const auto s = g.Snapshot(kT0 + 400ms);
  EXPECT_EQ(s.breaker, BreakerState::kOpen);
  EXPECT_EQ(s.probe_in, 600ms);
  EXPECT_EQ(s.times_opened, 1);
  EXPECT_EQ(g.NextTimedChange(kT0), kT0 + 1s) << "workers wake for the probe";
}

// Requests that were running when the breaker opened (a hung endpoint: they time out after
// timeout_ms, longer than the cool-down) say nothing newer once a probe closed it: their
// failures reopened the breaker on an endpoint that was back (review).
TEST(EndpointGovernor, FailuresOfRequestsStartedBeforeTheBreakerOpenedDoNotReopenIt) {
  EndpointGovernor g(Breaker(2), false, 8);
  const auto a = g.TryStart(kT0), b = g.TryStart(kT0), c = g.TryStart(kT0), d = g.TryStart(kT0);
  ASSERT_TRUE(a && b && c && d);
  g.Finish(kT0, *a, TimedOut());
  EXPECT_TRUE(g.Finish(kT0, *b, TimedOut()).opened);
  const auto probe = g.TryStart(kT0 + 1s);
  ASSERT_TRUE(probe && probe->probe);
  EXPECT_TRUE(g.Finish(kT0 + 1s, *probe, Ok()).closed);
  EXPECT_FALSE(g.Finish(kT0 + 2s, *c, TimedOut()).opened);
  EXPECT_FALSE(g.Finish(kT0 + 2s, *d, TimedOut()).opened) << "stale failures reopened it";
  EXPECT_FALSE(g.Blocked(kT0 + 2s));
  // Failures of requests started after the close count as before.
  Once(g, kT0 + 3s, Failed());
  EXPECT_TRUE(Once(g, kT0 + 3s, Failed()).opened);
}

TEST(EndpointGovernor, OneProbeAfterTheCooldownItsFailureDoublesTheCooldownUpToTheCap) {
  EndpointGovernor g(Breaker(1), true, 8);
  EXPECT_TRUE(Once(g, kT0, Failed()).opened);
  Time now = kT0 + 1s;
  EXPECT_FALSE(g.Blocked(now));
  EXPECT_EQ(g.Admit(now, 4), 1u) << "room for the probe only";
  EXPECT_EQ(g.Snapshot(now).breaker, BreakerState::kHalfOpen);
  const auto probe = g.TryStart(now);
  ASSERT_TRUE(probe);
  EXPECT_TRUE(probe->probe);
  EXPECT_FALSE(g.TryStart(now)) << "one probe at a time";
  EXPECT_TRUE(g.Finish(now, *probe, TimedOut()).reopened);
  EXPECT_EQ(g.Snapshot(now).probe_in, 2s) << "doubled";
  std::vector<Millis> cooldowns;
  for (int i = 0; i < 3; ++i) {
    now += g.Snapshot(now).probe_in;
    const auto p = g.TryStart(now);
    ASSERT_TRUE(p);
    g.Finish(now, *p, Failed());
    cooldowns.push_back(g.Snapshot(now).probe_in);
  }
  EXPECT_EQ(cooldowns, (std::vector<Millis>{4s, 4s, 4s})) << "capped at max_cooldown";
  EXPECT_EQ(g.Snapshot(now).times_opened, 1) << "reopening is not a new opening";
}

TEST(EndpointGovernor, ASuccessfulProbeClosesTheBreakerAndResetsTheCooldown) {
  EndpointGovernor g(Breaker(1), true, 8);
  Once(g, kT0, Failed());
  const auto probe = g.TryStart(kT0 + 1s);
  ASSERT_TRUE(probe);
  EXPECT_TRUE(g.Finish(kT0 + 1s, *probe, Ok()).closed);
  EXPECT_EQ(g.Snapshot(kT0 + 1s).breaker, BreakerState::kClosed);
  EXPECT_GE(g.Admit(kT0 + 1s, 4), 8u);
  EXPECT_TRUE(Once(g, kT0 + 2s, Failed()).opened);
  EXPECT_EQ(g.Snapshot(kT0 + 2s).probe_in, 1s) << "back to the first cooldown";
}

TEST(EndpointGovernor, RequestsRunningWhenItOpenedDoNotCloseIt) {
  EndpointGovernor g(Breaker(2), true, 8);
  const auto slow = g.TryStart(kT0);
  ASSERT_TRUE(slow);
  Once(g, kT0, Failed());
  EXPECT_TRUE(Once(g, kT0, Failed()).opened);
  EXPECT_FALSE(g.Finish(kT0 + 10ms, *slow, Ok()).closed) << "only the probe decides";
  EXPECT_TRUE(g.Blocked(kT0 + 10ms));
}

TEST(EndpointGovernor, ADisabledBreakerNeverOpens) {
  BreakerSettings off = Breaker(1);
  off.enabled = false;
  EndpointGovernor g(off, true, 8);
  for (int i = 0; i < 20; ++i) Once(g, kT0, Failed());
  EXPECT_FALSE(g.Blocked(kT0));
  EXPECT_EQ(g.Snapshot(kT0).breaker, BreakerState::kClosed);
}

TEST(EndpointGovernor, OverloadHalvesConcurrencyOncePerRoundSuccessesAddOnePerRound) {
  EndpointGovernor g(Breaker(100), true, 16);
  std::vector<EndpointGovernor::Ticket> round;
  for (int i = 0; i < 16; ++i) round.push_back(*g.TryStart(kT0));
  EXPECT_FALSE(g.TryStart(kT0)) << "max_in_flight reached";
  // Every request of the round answers 429: one decrease, not sixteen.
  EXPECT_TRUE(g.Finish(kT0, round[0], TooMany()).lowered);
  for (int i = 1; i < 16; ++i) EXPECT_FALSE(g.Finish(kT0, round[i], TooMany()).lowered);
  EXPECT_EQ(g.Snapshot(kT0).concurrency_limit, 8);
  // A request started after the decrease may lower it again.
  EXPECT_TRUE(Once(g, kT0, TimedOut()).lowered);
  EXPECT_EQ(g.Snapshot(kT0).concurrency_limit, 4);
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(g.TryStart(kT0));
  }
  EXPECT_FALSE(g.TryStart(kT0)) << "the lowered limit holds";
}

// Successes of requests sent before a decrease say nothing about the lowered limit: 32 in
// flight, one 503 halves it to 16, and 16 of the other 31 answering 2xx raised it to 17 before
// a single request had gone at 16 (review). Only what started after the decrease counts.
TEST(EndpointGovernor, SuccessesOfRequestsSentBeforeADecreaseDoNotRaiseTheLimit) {
  EndpointGovernor g(Breaker(100), true, 32);
  std::vector<EndpointGovernor::Ticket> round;
  for (int i = 0; i < 32; ++i) round.push_back(*g.TryStart(kT0));
  EXPECT_TRUE(g.Finish(kT0, round[0], TooMany()).lowered);
  EXPECT_EQ(g.Snapshot(kT0).concurrency_limit, 16);
  for (int i = 1; i < 32; ++i) EXPECT_FALSE(g.Finish(kT0, round[i], Ok()).raised) << i;
  EXPECT_EQ(g.Snapshot(kT0).concurrency_limit, 16);
  for (int i = 0; i < 15; ++i) Once(g, kT0, Ok());
  EXPECT_TRUE(Once(g, kT0, Ok()).raised) << "a round of 16 sent at the lowered limit";
  EXPECT_EQ(g.Snapshot(kT0).concurrency_limit, 17);
}

TEST(EndpointGovernor, SuccessesRaiseTheLimitBackToMaxInFlight) {
  EndpointGovernor g(Breaker(100), true, 4);
  Once(g, kT0, TooMany());
  Once(g, kT0, TooMany());
  EXPECT_EQ(g.Snapshot(kT0).concurrency_limit, 1);
  for (int i = 0; i < 100; ++i) Once(g, kT0, Ok());
  EXPECT_EQ(g.Snapshot(kT0).concurrency_limit, 4) << "never above max_in_flight";
}

TEST(EndpointGovernor, WithoutAdaptiveConcurrencyTheLimitStays) {
  EndpointGovernor g(Breaker(100), false, 4);
  Once(g, kT0, TooMany());
  EXPECT_EQ(g.Snapshot(kT0).concurrency_limit, 4);
}

TEST(EndpointGovernor, RetryAfterPausesTheWholeEndpointCappedByMaxCooldown) {
  EndpointGovernor g(Breaker(100), true, 4);
  EXPECT_TRUE(Once(g, kT0, TooMany(2s)).paused);
  EXPECT_TRUE(g.Blocked(kT0 + 1s));
  EXPECT_FALSE(g.TryStart(kT0 + 1s));
  EXPECT_EQ(g.Admit(kT0 + 1s, 4), 0u);
  EXPECT_EQ(g.Snapshot(kT0 + 500ms).paused_for, 1500ms);
  EXPECT_EQ(g.NextTimedChange(kT0), kT0 + 2s);
  EXPECT_FALSE(g.Blocked(kT0 + 2s));
  EXPECT_EQ(g.NextTimedChange(kT0 + 2s), Time::max()) << "no wake-up in the past";
  EXPECT_TRUE(Once(g, kT0 + 2s, TooMany(1h)).paused);
  EXPECT_EQ(g.Snapshot(kT0 + 2s).paused_for, 4s) << "max_cooldown caps a pause";
  EXPECT_EQ(g.Snapshot(kT0 + 2s).times_paused, 2);
}

// The requests in flight when an endpoint starts throttling each come back with Retry-After:
// one pause, made longer by each, counted and logged once (review: each answer counted a pause
// of its own, up to max_in_flight of them in outbox_webhook_pauses_total and the log).
TEST(EndpointGovernor, RetryAftersOfRequestsInFlightTogetherAreOnePause) {
  EndpointGovernor g(Breaker(100), true, 4);
  const auto a = g.TryStart(kT0);
  const auto b = g.TryStart(kT0);
  const auto c = g.TryStart(kT0);
  ASSERT_TRUE(a && b && c);
  EXPECT_TRUE(g.Finish(kT0, *a, TooMany(2s)).paused);
  EXPECT_FALSE(g.Finish(kT0 + 1ms, *b, TooMany(3s)).paused) << "the same pause, longer";
  EXPECT_FALSE(g.Finish(kT0 + 2ms, *c, TooMany(1s)).paused) << "shorter: changes nothing";
  EXPECT_EQ(g.Snapshot(kT0 + 2ms).paused_for, 3s - 1ms);
  EXPECT_EQ(g.Snapshot(kT0 + 2ms).times_paused, 1);
  // Once it is over, the next Retry-After is a pause of its own.
  EXPECT_TRUE(Once(g, kT0 + 4s, TooMany(1s)).paused);
  EXPECT_EQ(g.Snapshot(kT0 + 4s).times_paused, 2);
}

TEST(EndpointGovernor, RetryAfterZeroIsNoPause) {
  EndpointGovernor g(Breaker(100), true, 4);
  EXPECT_FALSE(Once(g, kT0, TooMany(0ms)).paused);
  EXPECT_FALSE(g.Blocked(kT0));
  EXPECT_EQ(g.Snapshot(kT0).times_paused, 0);
}

TEST(EndpointGovernor, ARaisedLimitIsReportedSoAnotherWorkerStarts) {
  EndpointGovernor g(Breaker(100), true, 4);
  Once(g, kT0, TooMany());  // 4 -> 2
  EXPECT_FALSE(Once(g, kT0, Ok()).raised) << "one success of a round of 2";
  EXPECT_TRUE(Once(g, kT0, Ok()).raised) << "a round of 2 successes: 2 -> 3";
}

TEST(EndpointGovernor, AnAbortedProbeLetsAnotherGo) {
  EndpointGovernor g(Breaker(1), true, 4);
  Once(g, kT0, Failed());
  const auto probe = g.TryStart(kT0 + 1s);
  ASSERT_TRUE(probe);
  g.Finish(kT0 + 1s, *probe, std::nullopt);  // shutdown aborted it
  EXPECT_TRUE(g.TryStart(kT0 + 1s)) << "still half-open: the next request probes";
}

TEST(EndpointGovernor, ARateLimitPacesRequestsWithABurstOfOneSecond) {
  EndpointGovernor g(Breaker(100), false, 100, 4);  // 4 requests per second
  // A burst of one second's worth, then nothing until the bucket refills.
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(g.TryStart(kT0).has_value()) << i;
  EXPECT_FALSE(g.TryStart(kT0).has_value());
  EXPECT_FALSE(g.Blocked(kT0)) << "rate-limited work stays queued: it is not blocked";
  // The next one may go a quarter second later, and the sink is told when.
  EXPECT_EQ(g.NextTimedChange(kT0), kT0 + 250ms);
  EXPECT_FALSE(g.TryStart(kT0 + 200ms).has_value());
  EXPECT_TRUE(g.TryStart(kT0 + 250ms).has_value());
  EXPECT_FALSE(g.TryStart(kT0 + 260ms).has_value());
  // Over ten seconds, at most 4 per second (plus the first burst).
  int started = 0;
  for (auto t = kT0 + 260ms; t < kT0 + 10s + 260ms; t += 10ms) started += g.TryStart(t) ? 1 : 0;
  EXPECT_GE(started, 39);
  EXPECT_LE(started, 41);
  // An idle endpoint saves up at most one second's worth.
  const Time later = kT0 + 1h;
  int burst = 0;
  while (g.TryStart(later)) ++burst;
  EXPECT_EQ(burst, 4);
}

TEST(EndpointGovernor, NoRateLimitMeansNoPacing) {
  EndpointGovernor g(Breaker(100), false, 1000);
  for (int i = 0; i < 1000; ++i) ASSERT_TRUE(g.TryStart(kT0).has_value()) << i;
  EXPECT_EQ(g.NextTimedChange(kT0), Time::max());
}

// A sink made again for the same endpoint (a new secret) goes on from the old governor's state,
// within its own settings (webhook_service.cc, RemakeWebhookSink).
TEST(EndpointGovernor, ANewGovernorResumesTheOldOnesStateWithinItsSettings) {
  EndpointGovernor old(Breaker(1), true, 8);
  Once(old, kT0, TimedOut());  // opens (threshold 1) and halves the limit to 4
  ASSERT_TRUE(old.Blocked(kT0));
  const auto saved = old.Save(kT0);
  EXPECT_EQ(saved.breaker, BreakerState::kOpen);
  EXPECT_EQ(saved.concurrency_limit, 4);

  EndpointGovernor same(Breaker(1), true, 8);
  same.Resume(saved, kT0);
  EXPECT_TRUE(same.Blocked(kT0 + 999ms)) << "still open until its probe";
  EXPECT_EQ(same.Snapshot(kT0).concurrency_limit, 4);
  EXPECT_EQ(same.Snapshot(kT0).times_opened, 1);
  const auto probe = same.TryStart(kT0 + 1s);
  ASSERT_TRUE(probe.has_value());
  EXPECT_TRUE(probe->probe) << "the probe goes when the old one's would have";

  EndpointGovernor smaller(Breaker(1), true, 2);
  smaller.Resume(saved, kT0);
  EXPECT_EQ(smaller.Snapshot(kT0).concurrency_limit, 2) << "up to the new max_in_flight";

  BreakerSettings off = Breaker(1);
  off.enabled = false;
  EndpointGovernor unbroken(off, true, 8);
  Once(old, kT0 + 1s, TooMany(30s));  // the probe: an answer, and a Retry-After pause
  unbroken.Resume(old.Save(kT0 + 1s), kT0 + 1s);
  EXPECT_TRUE(unbroken.Blocked(kT0 + 2s)) << "a pause the endpoint asked for is kept";
  EXPECT_FALSE(unbroken.Blocked(kT0 + 1s + 4s)) << "the pause is capped by max_cooldown (4 s)";
  EXPECT_EQ(unbroken.Snapshot(kT0 + 5s).breaker, BreakerState::kClosed);

  // A probe that is out when the sink is replaced: the new governor may probe at once (the
  // old one's verdict reaches only the old one).
  EndpointGovernor probing(Breaker(1), true, 8);
  Once(probing, kT0, Failed());
  ASSERT_TRUE(probing.TryStart(kT0 + 1s).has_value());
  EndpointGovernor next(Breaker(1), true, 8);
  next.Resume(probing.Save(kT0 + 1500ms), kT0 + 1500ms);
  const auto again = next.TryStart(kT0 + 1500ms);
  ASSERT_TRUE(again.has_value());
  EXPECT_TRUE(again->probe);

  // A shorter cool-down in the new settings (an operator wants the endpoint probed sooner):
  // the probe is due within it, not when the old, longer one would have let it go.
  EndpointGovernor slow(Breaker(1), true, 8);
  Once(slow, kT0, Failed());
  const auto slow_probe = slow.TryStart(kT0 + 1s);
  ASSERT_TRUE(slow_probe.has_value());
  slow.Finish(kT0 + 1s, *slow_probe, Failed());  // the probe fails: open for 2 s more
  ASSERT_TRUE(slow.Blocked(kT0 + 2900ms));
  BreakerSettings quick = Breaker(1);
  quick.cooldown = 500ms;
  quick.max_cooldown = 500ms;
  EndpointGovernor sooner(quick, true, 8);
  sooner.Resume(slow.Save(kT0 + 1100ms), kT0 + 1100ms);
  EXPECT_FALSE(sooner.Blocked(kT0 + 1600ms)) << "the probe is due within the new cool-down";
  // And a Retry-After pause longer than the new max_cooldown is cut to it, as Finish cuts one.
  EndpointGovernor paused(Breaker(1), true, 8);
  Once(paused, kT0, TooMany(4s));
  EndpointGovernor capped(quick, true, 8);
  capped.Resume(paused.Save(kT0), kT0);
  EXPECT_FALSE(capped.Blocked(kT0 + 600ms)) << "paused past the new max_cooldown (500 ms)";
}

}  // namespace
}  // namespace outbox::relay::webhook_detail
