// Where the dispatcher reads the time: intervals, deadlines and lease schedules come from a
// Clock it is given, so tests move time forward instead of sleeping (tests/dispatch).
#pragma once

#include <chrono>

namespace outbox::relay {

class Clock {
 public:
  using Steady = std::chrono::steady_clock;
  using System = std::chrono::system_clock;
  virtual ~Clock() = default;
  /// Monotonic time: intervals and deadlines.
  virtual Steady::time_point Now() const = 0;
  /// Wall-clock time: ages of messages.
  virtual System::time_point WallNow() const = 0;
};

/// The real clocks (std::chrono::steady_clock and system_clock).
const Clock& RealClock();

}  // namespace outbox::relay
