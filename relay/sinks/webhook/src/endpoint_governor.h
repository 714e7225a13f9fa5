// Internal: how much the webhook sink may send to its endpoint, and when. One per endpoint:
//   - a circuit breaker: consecutive failures (connect errors, timeouts, 5xx) open it; while
//     open nothing is sent; after a cool-down one probe goes, and its success closes the
//     breaker while its failure reopens it with the cool-down doubled (up to a cap);
//   - adaptive concurrency (AIMD): 429, 503 and timeouts halve the number of concurrent
//     requests (once per round of requests), successes raise it by one per round, up to
//     max_in_flight;
//   - Retry-After on a 429 or 503 pauses the whole endpoint, not only that message;
//   - a rate limit (requests per second, a token bucket holding one second's worth) paces
//     the requests it starts.
// Not thread-safe: the sink calls it under its own mutex. Time is passed in, so unit tests
// drive it without sleeping.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "outbox_relay/webhook_target.h"

namespace outbox::relay::webhook_detail {

enum class BreakerState { kClosed, kHalfOpen, kOpen };
const char* ToString(BreakerState state);

/// What one request's end says about the endpoint.
struct Verdict {
  bool success = false;   ///< 2xx.
  bool failure = false;   ///< Connect error, timeout, 5xx: counts toward opening the breaker.
  bool overload = false;  ///< 429, 503, timeout: lowers the concurrency.
  std::optional<Millis> retry_after;  ///< From a 429 or 503: pause the endpoint this long.
};

/// What a Finish changed, for logs and metrics.
struct Transition {
  bool opened = false;    ///< Closed -> open (the threshold was reached).
  bool reopened = false;  ///< The probe failed: open again, longer.
  bool closed = false;    ///< The probe succeeded.
  bool paused = false;    ///< A Retry-After paused the endpoint (or extended the pause).
  bool lowered = false;   ///< The concurrency limit was halved.
  bool raised = false;    ///< The concurrency limit grew by one: another worker may start.
  bool Any() const { return opened || reopened || closed || paused || lowered; }
};

struct GovernorSnapshot {
  BreakerState breaker = BreakerState::kClosed;
  int consecutive_failures = 0;
  int concurrency_limit = 0;
  int max_concurrency = 0;
  Millis probe_in{0};    ///< Open: until the probe may go.
  Millis paused_for{0};  ///< Retry-After pause left.
  Millis cooldown{0};    ///< The current cool-down.
  std::int64_t times_opened = 0;
  std::int64_t times_paused = 0;
};

/// What a governor knows of its endpoint beyond its settings, for the governor of a sink made
/// again for the same URL (a new secret, new headers or limits): EndpointGovernor::Save and
/// Resume.
struct GovernorState {
  BreakerState breaker = BreakerState::kClosed;  ///< Never kHalfOpen (see Save).
  int consecutive_failures = 0;
  int concurrency_limit = 0;
  Millis cooldown{0};
  std::chrono::steady_clock::time_point probe_at{};
  std::chrono::steady_clock::time_point paused_until{};
  std::int64_t times_opened = 0;
  std::int64_t times_paused = 0;
};

class EndpointGovernor {
 public:
  using Time = std::chrono::steady_clock::time_point;

  /// `rate_limit`: requests per second, 0 for none.
  EndpointGovernor(const BreakerSettings& breaker, bool adaptive, int max_concurrency,
                   int rate_limit = 0);

  struct Ticket {
    std::uint64_t seq = 0;
    bool probe = false;
  };

  /// A request may start now: it is counted as running until Finish. nullopt when the
  /// concurrency limit is reached, the breaker is open (or its probe is out), a Retry-After
  /// pause runs or the rate limit has no request left for now.
  std::optional<Ticket> TryStart(Time now);

  /// The end of the request that `ticket` started (nullopt verdict: aborted, no verdict).
  Transition Finish(Time now, const Ticket& ticket, const std::optional<Verdict>& verdict);

  /// Nothing may be sent until some time passes: open before its probe is due, or paused.
  /// Queued work should go back to the queue then, unattempted.
  bool Blocked(Time now) const;

  /// How many messages the dispatcher may keep in the sink now: 0 while blocked, 1 while a
  /// probe is due, otherwise `per_request` for each request the limit allows.
  std::size_t Admit(Time now, std::size_t per_request) const;

  /// The next time after `now` at which Blocked, the probe or the rate limit changes with
  /// time alone; Time::max() when nothing waits.
  Time NextTimedChange(Time now) const;

  GovernorSnapshot Snapshot(Time now) const;

  /// The endpoint's state as of `now`. A probe that is out is saved as open with its probe
  /// due: its verdict reaches only this governor (whose sink is being replaced).
  GovernorState Save(Time now) const;
  /// Takes `state` over at `now` (a new governor, before any request), within this
  /// governor's settings: the concurrency limit up to max_concurrency (all of it without
  /// adaptive concurrency), the cool-down between the breaker's bounds and the probe due
  /// within it, a Retry-After pause up to max_cooldown from now (as Finish cuts one); the
  /// breaker stays closed when it is disabled here.
  void Resume(const GovernorState& state, Time now);

 private:
  BreakerSettings breaker_;
  bool adaptive_;
  int max_;
  int limit_;
  int running_ = 0;
  std::uint64_t next_seq_ = 1;
  std::uint64_t no_decrease_before_ = 0;  ///< Requests started before the last decrease.
  /// Requests started before the breaker last opened: their failures say nothing newer than
  /// what opened it, also once a probe has closed it.
  std::uint64_t stale_before_ = 0;
  int successes_ = 0;  ///< Since the last increase.
  BreakerState state_ = BreakerState::kClosed;
  int consecutive_failures_ = 0;
  Millis cooldown_;
  Time probe_at_{};  ///< Open: when the probe may go. kHalfOpen: the probe is out.
  Time paused_until_{};
  std::int64_t times_opened_ = 0;
  std::int64_t times_paused_ = 0;
  double rate_ = 0;    ///< Requests per second; 0: no limit.
  double tokens_ = 0;  ///< Requests the rate limit allows now (up to max(1, rate_)).
  Time refilled_{};    ///< When tokens_ was last brought up to date.

  void Refill(Time now);
  bool ProbeDue(Time now) const { return state_ == BreakerState::kOpen && now >= probe_at_; }
};

}  // namespace outbox::relay::webhook_detail
