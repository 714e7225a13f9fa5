#include "endpoint_governor.h"

#include <algorithm>

namespace outbox::relay::webhook_detail {

const char* ToString(BreakerState state) {
  switch (state) {
    case BreakerState::kClosed:
      return "closed";
    case BreakerState::kHalfOpen:
      return "half_open";
    case BreakerState::kOpen:
      return "open";
  }
  return "closed";
}

EndpointGovernor::EndpointGovernor(const BreakerSettings& breaker, bool adaptive,
                                   int max_concurrency, int rate_limit)
    : breaker_(breaker),
      adaptive_(adaptive),
      max_(std::max(1, max_concurrency)),
      limit_(max_),
      cooldown_(breaker.cooldown),
      rate_(std::max(0, rate_limit)),
      tokens_(std::max(1.0, rate_)) {}

void EndpointGovernor::Refill(Time now) {
  if (refilled_ == Time{}) refilled_ = now;
  if (now <= refilled_) return;
  const double elapsed = std::chrono::duration<double>(now - refilled_).count();
  tokens_ = std::min(std::max(1.0, rate_), tokens_ + elapsed * rate_);
  refilled_ = now;
}

std::optional<EndpointGovernor::Ticket> EndpointGovernor::TryStart(Time now) {
  if (now < paused_until_) return std::nullopt;
  if (state_ == BreakerState::kHalfOpen) return std::nullopt;  // the probe is out
  if (rate_ > 0) {
    Refill(now);
    if (tokens_ < 1.0) return std::nullopt;
  }
  if (state_ == BreakerState::kOpen) {
    if (now < probe_at_) return std::nullopt;
    // The cool-down has passed: this request is the probe, and the only one until it ends.
    state_ = BreakerState::kHalfOpen;
    ++running_;
    if (rate_ > 0) tokens_ -= 1.0;
    return Ticket{next_seq_++, true};
  }
  if (running_ >= limit_) return std::nullopt;
  ++running_;
  if (rate_ > 0) tokens_ -= 1.0;
  return Ticket{next_seq_++, false};
}

Transition EndpointGovernor::Finish(Time now, const Ticket& ticket,
                                    const std::optional<Verdict>& verdict) {
  Transition t;
  running_ = std::max(0, running_ - 1);
  if (!verdict) {  // aborted (shutdown): no verdict on the endpoint; a probe may go again
    if (ticket.probe && state_ == BreakerState::kHalfOpen) state_ = BreakerState::kOpen;
    return t;
  }
  const Verdict& v = *verdict;

  // Retry-After pauses the endpoint, at most for the breaker's longest cool-down. One that
  // comes during a pause (the other requests that were in flight) makes it longer: the same
  // pause, counted and logged once.
  if (v.retry_after && v.retry_after->count() > 0) {
    const auto until = now + std::min(*v.retry_after, breaker_.max_cooldown);
    if (until > paused_until_) {
      if (now >= paused_until_) {
        ++times_paused_;
        t.paused = true;
      }
      paused_until_ = until;
    }
  }

  // Concurrency: halve once per round (requests started after the last decrease), add one
  // per round of successes of requests started after it too (those sent before say nothing
  // of the lowered limit: review).
  if (adaptive_) {
    if (v.overload && ticket.seq >= no_decrease_before_) {
      const int lowered = std::max(1, limit_ / 2);
      t.lowered = lowered < limit_;
      limit_ = lowered;
      no_decrease_before_ = next_seq_;
      successes_ = 0;
    } else if (v.success && ticket.seq >= no_decrease_before_ && limit_ < max_ &&
               ++successes_ >= limit_) {
      ++limit_;
      successes_ = 0;
      t.raised = true;
    }
  }

  if (!breaker_.enabled) return t;
  if (ticket.probe) {
    if (v.failure) {
      state_ = BreakerState::kOpen;
      cooldown_ = std::min(cooldown_ * 2, breaker_.max_cooldown);
      probe_at_ = now + cooldown_;
      t.reopened = true;
    } else {  // any answer that is not a failure: the endpoint is back
      state_ = BreakerState::kClosed;
      consecutive_failures_ = 0;
      cooldown_ = breaker_.cooldown;
      t.closed = true;
    }
    return t;
  }
  // While open, only the probe's verdict counts: requests that were running when it opened
  // say nothing newer, nor after the probe closed it (a hung endpoint's timeouts arriving
  // after a probe that succeeded reopened the breaker on an endpoint that was back).
  if (state_ != BreakerState::kClosed) return t;
  if (v.failure && ticket.seq < stale_before_) return t;
  if (!v.failure) {
    consecutive_failures_ = 0;
    return t;
  }
  if (++consecutive_failures_ >= breaker_.failure_threshold) {
    state_ = BreakerState::kOpen;
    cooldown_ = breaker_.cooldown;
    probe_at_ = now + cooldown_;
    stale_before_ = next_seq_;
    ++times_opened_;
    t.opened = true;
  }
  return t;
}

bool EndpointGovernor::Blocked(Time now) const {
  return now < paused_until_ || (state_ == BreakerState::kOpen && now < probe_at_);
}

std::size_t EndpointGovernor::Admit(Time now, std::size_t per_request) const {
  if (Blocked(now)) return 0;
  if (state_ != BreakerState::kClosed) return 1;  // the probe
  return static_cast<std::size_t>(limit_) * per_request;
}

EndpointGovernor::Time EndpointGovernor::NextTimedChange(Time now) const {
  Time next = Time::max();
  if (paused_until_ > now) next = paused_until_;
  if (state_ == BreakerState::kOpen && probe_at_ > now) next = std::min(next, probe_at_);
  if (rate_ > 0) {
    // When the bucket holds a whole request again (as of now, counting what refills).
    const double have = std::min(
        std::max(1.0, rate_),
        tokens_ + std::chrono::duration<double>(now - std::min(now, refilled_)).count() * rate_);
    if (have < 1.0) {
      next = std::min(next, now + std::chrono::duration_cast<Time::duration>(
                                      std::chrono::duration<double>((1.0 - have) / rate_)));
    }
  }
  return next;
}

GovernorState EndpointGovernor::Save(Time now) const {
  GovernorState s;
  s.breaker = state_ == BreakerState::kClosed ? BreakerState::kClosed : BreakerState::kOpen;
  s.consecutive_failures = consecutive_failures_;
  s.concurrency_limit = limit_;
  s.cooldown = cooldown_;
  s.probe_at = state_ == BreakerState::kHalfOpen ? now : probe_at_;
  s.paused_until = paused_until_;
  s.times_opened = times_opened_;
  s.times_paused = times_paused_;
  return s;
}

void EndpointGovernor::Resume(const GovernorState& s, Time now) {
  paused_until_ = std::min(s.paused_until, now + breaker_.max_cooldown);
  times_opened_ = s.times_opened;
  times_paused_ = s.times_paused;
  if (adaptive_) limit_ = std::clamp(s.concurrency_limit, 1, max_);
  if (!breaker_.enabled) return;
  consecutive_failures_ = s.consecutive_failures;
  cooldown_ =
      std::clamp(s.cooldown, breaker_.cooldown, std::max(breaker_.cooldown, breaker_.max_cooldown));
  if (s.breaker != BreakerState::kClosed) {
    state_ = BreakerState::kOpen;
    probe_at_ = std::min(s.probe_at, now + cooldown_);
  }
}

GovernorSnapshot EndpointGovernor::Snapshot(Time now) const {
  GovernorSnapshot s;
  s.breaker = ProbeDue(now) ? BreakerState::kHalfOpen : state_;
  s.consecutive_failures = consecutive_failures_;
  s.concurrency_limit = limit_;
  s.max_concurrency = max_;
  if (state_ == BreakerState::kOpen && now < probe_at_) {
    s.probe_in = std::chrono::duration_cast<Millis>(probe_at_ - now);
  }
  if (now < paused_until_) {
    s.paused_for = std::chrono::duration_cast<Millis>(paused_until_ - now);
  }
  s.cooldown = cooldown_;
  s.times_opened = times_opened_;
  s.times_paused = times_paused_;
  return s;
}

}  // namespace outbox::relay::webhook_detail
