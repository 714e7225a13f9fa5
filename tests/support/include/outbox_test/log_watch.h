// What the default logger writes while a test watches it: a test can wait for a step the code
// logs, or count how often it says something.
#pragma once

#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "outbox_test/wait.h"

namespace outbox::testing {

/// Keeps what the default logger writes while it is installed (at debug level and up). Install
/// and Remove change the logger's sinks: call them while no other thread logs.
class LogWatch : public spdlog::sinks::base_sink<std::mutex> {
 public:
  static std::shared_ptr<LogWatch> Install() {
    auto watch = std::make_shared<LogWatch>();
    watch->level_before_ = spdlog::default_logger()->level();
    spdlog::default_logger()->sinks().push_back(watch);
    spdlog::default_logger()->set_level(spdlog::level::debug);
    return watch;
  }
  void Remove() {
    auto& sinks = spdlog::default_logger()->sinks();
    sinks.erase(std::remove_if(sinks.begin(), sinks.end(),
                               [this](const auto& s) { return s.get() == this; }),
                sinks.end());
    spdlog::default_logger()->set_level(level_before_);
  }
  /// Lines that contain `text` so far.
  int Count(const std::string& text) {
    std::lock_guard lock(lines_mu_);
    return static_cast<int>(std::count_if(lines_.begin(), lines_.end(), [&](const auto& line) {
      return line.find(text) != std::string::npos;
    }));
  }
  /// Until a line contains `text` (true) or `timeout` passes (false).
  bool WaitFor(const std::string& text,
               std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
    return outbox::testing::WaitFor([&] { return Count(text) > 0; }, timeout);
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    std::lock_guard lock(lines_mu_);
    lines_.emplace_back(msg.payload.data(), msg.payload.size());
  }
  void flush_() override {}

 private:
  std::mutex lines_mu_;
  std::vector<std::string> lines_;
  spdlog::level::level_enum level_before_ = spdlog::level::info;
};

}  // namespace outbox::testing
