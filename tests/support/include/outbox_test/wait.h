// Waiting on conditions with a deadline: tests never sleep for a fixed time.
#pragma once

#include <chrono>
#include <functional>
#include <thread>

namespace outbox::testing {

/// Polls `condition` every few milliseconds until it is true (returns true) or `timeout`
/// passes (returns false).
inline bool WaitFor(const std::function<bool()>& condition, std::chrono::milliseconds timeout,
                    std::chrono::milliseconds poll = std::chrono::milliseconds(5)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    if (condition()) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(poll);
  }
}

}  // namespace outbox::testing
