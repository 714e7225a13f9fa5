// A gate that holds test threads (a receiver's handlers, say) until the test opens it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

namespace outbox::testing {

/// Holds the threads that Wait() until Open() (or until a safety bound passes).
class Gate {
 public:
  void Wait(std::chrono::milliseconds at_most = std::chrono::seconds(15)) {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, at_most, [&] { return open_; });
  }
  void Open() {
    {
      std::lock_guard lock(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

/// Opens a gate when the scope ends: declared after the receiver whose handlers wait on it,
/// it lets them go before the receiver joins its threads.
struct OpenOnExit {
  Gate& gate;
  ~OpenOnExit() { gate.Open(); }
};

}  // namespace outbox::testing
