#include "outbox_relay/clock.h"

namespace outbox::relay {
namespace {

class RealClockImpl final : public Clock {
 public:
  Steady::time_point Now() const override { return Steady::now(); }
  System::time_point WallNow() const override { return System::now(); }
};

}  // namespace

const Clock& RealClock() {
  static const RealClockImpl clock;
  return clock;
}

}  // namespace outbox::relay
