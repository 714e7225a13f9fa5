// A claim loop's hand-off: what one claim leased goes to the sink on a thread of its own, so the
// loop's next claim runs in the database meanwhile. Handing 500 Kafka messages over (the
// per-message bookkeeping, the producer's copies and headers) took the claim thread ~1 ms of
// every ~8 ms claim cycle on 2 cores, with the database idle for the loop meanwhile
// (docs/benchmarks.md, session 33).
//
// One job at a time, and one waiting at most: Put waits while a job is waiting, so a loop is
// never more than one claim ahead of its sink, and jobs run in the order they were put.
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "outbox_relay/thread_name.h"

namespace outbox::relay {

template <class Job>
class Handoff {
 public:
  // `run` is called on the hand-off thread for each job, in order; `thread_name` names it.
  Handoff(std::function<void(Job&)> run, std::string thread_name)
      : run_(std::move(run)), thread_([this, name = std::move(thread_name)] {
          NameThisThread(name);
          Loop();
        }) {}
  // Runs what was put, then ends the thread.
  ~Handoff() {
    {
      std::lock_guard lk(mu_);
      closing_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  Handoff(const Handoff&) = delete;
  Handoff& operator=(const Handoff&) = delete;

  // Queues the job; first waits while another one is waiting to run.
  void Put(Job job) {
    std::unique_lock lk(mu_);
    cv_.wait(lk, [&] { return !waiting_.has_value(); });
    waiting_.emplace(std::move(job));
    cv_.notify_all();
  }

  // Waits until every job put so far has run.
  void Drain() {
    std::unique_lock lk(mu_);
    cv_.wait(lk, [&] { return !waiting_.has_value() && !running_; });
  }

 private:
  void Loop() {
    std::unique_lock lk(mu_);
    while (true) {
      cv_.wait(lk, [&] { return waiting_.has_value() || closing_; });
      if (!waiting_) return;  // closing, and nothing left
      {
        Job job = std::move(*waiting_);
        waiting_.reset();
        running_ = true;
        cv_.notify_all();  // room for the next one
        lk.unlock();
        run_(job);
      }  // the job's resources (a claim's share of the room) go before Drain can return
      lk.lock();
      running_ = false;
      cv_.notify_all();
    }
  }

  std::function<void(Job&)> run_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<Job> waiting_;
  bool running_ = false;
  bool closing_ = false;
  std::thread thread_;  // last: starts once the rest is constructed
};

}  // namespace outbox::relay
