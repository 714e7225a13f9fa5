// Retry policy: exponential backoff with full jitter, capped, bounded attempts.
// Pure functions; randomness is passed in so tests need no sleeps and no seeds.
#pragma once

#include <optional>
#include <string>

#include "outbox_relay/config.h"
#include "outbox_relay/queue_store.h"
#include "outbox_relay/sink.h"

namespace outbox::relay {

/// Delay before attempt number `failures + 1`, where `failures` >= 1 attempts have failed
/// (the shapes are described at RetryPolicy); `u01` is a uniform random number in [0, 1).
/// Exponential: u01 * min(max_backoff, initial_backoff * 2^(failures-1)). Schedule:
/// schedule[failures-1] (the last entry repeating) * (0.9 + 0.2 * u01). A target's
/// Retry-After raises it to at least that, capped by max_backoff.
Millis BackoffDelay(const RetryPolicy& policy, int failures, double u01,
                    std::optional<Millis> retry_after = std::nullopt);

/// The longest a message can spend waiting between its attempts before it is dead-lettered:
/// the sum of every retry's longest delay (BackoffDelay with u01 -> 1), without Retry-After
/// (which can stretch each delay up to max_backoff).
Millis RetryHorizon(const RetryPolicy& policy);

/// The same sum with each delay at its average (u01 = 0.5): about half the horizon with full
/// jitter, the nominal total of a schedule.
Millis AverageRetryHorizon(const RetryPolicy& policy);

/// Before an attempt: a message claimed with `attempts` >= max_attempts (its last attempts
/// ended by lease expiry, counted by the reaper) goes to the dead letters without another
/// delivery; nullopt otherwise. With Decide, the one place that decides a message is dead.
std::optional<Settlement> DecideBeforeAttempt(MessageId id, int attempts, const RetryPolicy& policy,
                                              const std::string& lease_token);

/// Turns a sink's outcome for message `id` into what the store records:
///   delivered -> delete; permanent -> dead letter; retry -> retry later, or dead letter when
///   this was the last allowed attempt; retry while shutting down (unless Outcome::maybe_sent),
///   and returned -> release
///   (not counted), after the outcome's retry_after when it gives one; fanned out -> the
///   message leaves the queue and each endpoint that did not take it gets a child
///   (DecideForEndpoint).
/// `attempts` is the number of failed attempts before this one (Message::attempts).
Settlement Decide(MessageId id, int attempts, const Outcome& outcome, const RetryPolicy& policy,
                  const std::string& lease_token, double u01, bool shutting_down);

/// What an endpoint that did not take a fanned-out message gets: a retry row after the first
/// backoff delay (attempts 1), a dead letter (refused for good, or max_attempts is 1), or a row
/// handed back without an attempt counted (not sent, or cut short by shutdown).
Settlement::Child DecideForEndpoint(const EndpointOutcome& owed, const RetryPolicy& policy,
                                    double u01, bool shutting_down);

}  // namespace outbox::relay
