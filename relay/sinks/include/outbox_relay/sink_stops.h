// Stopping several sinks at once.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "outbox_relay/sink.h"

namespace outbox::relay {

/// Stops sinks side by side, on a thread each, and joins them when it goes out of scope. A
/// sink may run past its deadline on its own (a webhook request still connecting runs to its
/// connect timeout): stopped one after another those overruns added up, and the sinks not
/// stopped yet kept taking work meanwhile. Where no thread can be started, that sink is
/// stopped in turn. What a Shutdown throws is logged.
class SideBySideStops {
 public:
  /// `budget` gives each sink's Shutdown its deadline when that stop begins.
  explicit SideBySideStops(std::function<std::chrono::milliseconds()> budget);
  ~SideBySideStops();
  SideBySideStops(const SideBySideStops&) = delete;
  SideBySideStops& operator=(const SideBySideStops&) = delete;

  /// `sink` must outlive this object.
  void Stop(Sink& sink);
  /// Kept alive until its stop ends.
  void Stop(std::shared_ptr<Sink> sink);

 private:
  void StopNow(Sink& sink) const noexcept;

  std::function<std::chrono::milliseconds()> budget_;
  std::vector<std::thread> threads_;
};

}  // namespace outbox::relay
