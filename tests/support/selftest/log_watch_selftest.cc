// LogWatch (outbox_test/log_watch.h) while other threads log: watches come and go under them.
#include "outbox_test/log_watch.h"

#include <gtest/gtest.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <thread>
#include <utility>
#include <vector>

namespace outbox::testing {
namespace {

// A watch removed while another thread logs (as a Kafka sink's librdkafka threads do after the
// step a test waited for) changes nothing that thread reads: the logger's own sink list was
// changed under it, a data race ThreadSanitizer reports (the tsan preset runs this test).
TEST(LogWatch, WatchesComeAndGoWhileOtherThreadsLog) {
  // The logger's own sinks (the console) keep quiet about the thousands of lines below; the
  // watches' sink, which the first Install attaches after them, does not.
  std::vector<std::pair<spdlog::sink_ptr, spdlog::level::level_enum>> quieted;
  for (const auto& sink : spdlog::default_logger()->sinks()) {
    quieted.emplace_back(sink, sink->level());
    sink->set_level(spdlog::level::warn);
  }
  LogWatch::Install()->Remove();
  std::atomic<bool> stop{false};
  std::atomic<int> logged{0};
  std::thread logger([&] {
    while (!stop) {
      spdlog::debug("log-watch-selftest line {}", logged.load());
      ++logged;
    }
  });
  int seen = 0;
  for (int round = 0; round < 200; ++round) {
    auto watch = LogWatch::Install();
    const int before = logged.load();
    ASSERT_TRUE(WaitFor([&] { return logged.load() > before + 1; }, std::chrono::seconds(10)));
    watch->Remove();
    seen += watch->Count("log-watch-selftest line") > 0 ? 1 : 0;
  }
  stop = true;
  logger.join();
  for (const auto& [sink, level] : quieted) sink->set_level(level);
  EXPECT_GT(seen, 0) << "no watch saw the other thread's lines";
}

}  // namespace
}  // namespace outbox::testing
