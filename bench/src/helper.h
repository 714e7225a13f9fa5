// Helper processes. Everything that is not the relay — the Kafka mock cluster and its
// consumer, the webhook receiver, the producers — runs in a child process (this same binary
// with --helper ROLE), so the benchmark process's CPU time and memory are the relay's own.
//
// Protocol: the parent writes one command per line on the child's stdin; the child answers
// each with one line, "OK [text]" or "ERR message". The child exits when its stdin closes,
// so it never outlives the benchmark.
#pragma once

#include <sys/types.h>

#include <nlohmann/json.hpp>

#include <functional>
#include <cstdint>
#include <string>
#include <vector>

namespace outbox::bench {

class Helper {
 public:
  /// Starts `/proc/self/exe --helper role`. Throws std::runtime_error if it cannot.
  explicit Helper(const std::string& role);
  /// Closes the child's stdin and waits for it to exit.
  ~Helper();
  Helper(const Helper&) = delete;
  Helper& operator=(const Helper&) = delete;

  /// Sends `command` and waits up to `timeout_s` for the answer; returns the text after
  /// "OK ". Throws std::runtime_error on "ERR", a timeout or a dead child. Not thread-safe:
  /// one call at a time.
  std::string Call(const std::string& command, double timeout_s = 60);

  pid_t pid() const { return pid_; }
  const std::string& role() const { return role_; }

 private:
  std::string role_;
  pid_t pid_ = -1;
  int to_child_ = -1;
  int from_child_ = -1;
  std::string buffer_;
};

/// Entry point of a child: runs `role` ("kafka", "http", "producer") until stdin closes.
int RunHelper(const std::string& role);

// The roles, one per file.
int RunKafkaHelper();
int RunHttpHelper();
int RunProducerHelper();

/// Enqueue-to-delivery latencies as the helpers report them: count, p50/p95/p99/max in ms,
/// and how many took longer than 20 ms, 100 ms and 1 s (the tail a percentile hides).
nlohmann::json LatencySummary(std::vector<std::int64_t> latencies_us);

/// A helper's command loop: reads lines from stdin until EOF and answers each with
/// "OK " + handler(words), or "ERR <what>" when the handler throws.
int ServeCommands(const std::function<std::string(const std::vector<std::string>&)>& handler);

}  // namespace outbox::bench
