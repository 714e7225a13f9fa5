// What the default logger writes while a test watches it: a test can wait for a step the code
// logs, or count how often it says something.
#pragma once

#include <spdlog/sinks/base_sink.h>
#include <spdlog/sinks/dist_sink.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "outbox_test/wait.h"

namespace outbox::testing {

/// Keeps what the default logger writes while it is installed (at debug level and up). Watches
/// come and go through one distributing sink (spdlog's dist_sink, which adds and removes its
/// sinks under its own lock), so Remove is safe while other threads log (a Kafka sink's
/// librdkafka threads still logging after the step a test waited for: the logger's own sink
/// list, changed under them, was a data race). The first Install in a process attaches that
/// sink to the default logger: make it before threads that log start.
class LogWatch : public spdlog::sinks::base_sink<std::mutex>,
                 public std::enable_shared_from_this<LogWatch> {
 public:
  static std::shared_ptr<LogWatch> Install() {
    auto watch = std::make_shared<LogWatch>();
    watch->level_before_ = spdlog::default_logger()->level();
    Watches()->add_sink(watch);
    spdlog::default_logger()->set_level(spdlog::level::debug);
    return watch;
  }
  void Remove() {
    Watches()->remove_sink(shared_from_this());
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
  /// The default logger's sink for every watch, attached once.
  static std::shared_ptr<spdlog::sinks::dist_sink_mt> Watches() {
    static const auto watches = std::make_shared<spdlog::sinks::dist_sink_mt>();
    auto& sinks = spdlog::default_logger()->sinks();  // a default logger set since: attached too
    if (std::find(sinks.begin(), sinks.end(), watches) == sinks.end()) sinks.push_back(watches);
    return watches;
  }

  std::mutex lines_mu_;
  std::vector<std::string> lines_;
  spdlog::level::level_enum level_before_ = spdlog::level::info;
};

}  // namespace outbox::testing
