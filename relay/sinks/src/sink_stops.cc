#include "outbox_relay/sink_stops.h"

#include <spdlog/spdlog.h>

#include <exception>
#include <string>
#include <utility>

namespace outbox::relay {

SideBySideStops::SideBySideStops(std::function<std::chrono::milliseconds()> budget)
    : budget_(std::move(budget)) {}

SideBySideStops::~SideBySideStops() {
  for (auto& t : threads_) t.join();
}

void SideBySideStops::Stop(Sink& sink) {
  try {
    threads_.emplace_back([this, &sink] { StopNow(sink); });
  } catch (...) {  // no thread (or no memory for one) to be had: this one in turn
    StopNow(sink);
  }
}

void SideBySideStops::Stop(std::shared_ptr<Sink> sink) {
  try {
    threads_.emplace_back([this, sink] { StopNow(*sink); });
  } catch (...) {
    StopNow(*sink);
  }
}

void SideBySideStops::StopNow(Sink& sink) const noexcept {
  try {
    sink.Shutdown(budget_());
  } catch (const std::exception& e) {
    spdlog::error("stopping a {} sink failed: {}", std::string(sink.Kind()), e.what());
  } catch (...) {
    spdlog::error("stopping a {} sink failed", std::string(sink.Kind()));
  }
}

}  // namespace outbox::relay
