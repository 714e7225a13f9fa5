#include "reconnect.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "tuning.h"

namespace outbox::relay {

Millis ReconnectDelay(int failures) {
  const long long first = tuning::kReconnectFirst.count();
  return Millis(
      std::min<long long>(tuning::kReconnectMax.count(), first << std::clamp(failures, 0, 6)));
}

Reconnect::Reconnect(std::string failed, std::string recovered, std::function<void()> on_error)
    : failed_(std::move(failed)),
      recovered_(std::move(recovered)),
      on_error_(std::move(on_error)) {}

Millis Reconnect::Failed(QueueStore& store, const std::exception& e) {
  if (on_error_) on_error_();
  const auto* typed = dynamic_cast<const StoreError*>(&e);
  if (typed && !typed->transient()) {
    spdlog::error(
        "{}: {} (SQLSTATE {}; this does not pass by waiting: fix the database or the "
        "relay's role, the relay keeps retrying)",
        failed_, e.what(), typed->sqlstate());
  } else if (failures_ == 0) {
    spdlog::warn("{}: {}", failed_, e.what());
  }
  ++failures_;
  store.Reset();
  return ReconnectDelay(failures_);
}

void Reconnect::Succeeded() {
  if (failures_ > 0 && !recovered_.empty()) spdlog::info("{}", recovered_);
  failures_ = 0;
}

}  // namespace outbox::relay
