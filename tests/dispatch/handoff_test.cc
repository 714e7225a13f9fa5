// Handoff (relay/dispatch/src/handoff.h): a claim loop's jobs run on a thread of their own, in
// order, at most one waiting; Drain and the destructor run what was put.
#include "handoff.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace outbox::relay {
namespace {

using namespace std::chrono_literals;

template <class Pred>
bool Eventually(Pred pred, std::chrono::milliseconds deadline = 10s) {
  const auto until = std::chrono::steady_clock::now() + deadline;
  while (std::chrono::steady_clock::now() < until) {
    if (pred()) return true;
    std::this_thread::sleep_for(1ms);
  }
  return pred();
}

TEST(HandoffTest, RunsJobsInTheOrderTheyWerePutOnAnotherThread) {
  std::mutex mu;
  std::vector<int> ran;
  std::vector<std::thread::id> threads;
  {
    Handoff<int> handoff(
        [&](int& job) {
          std::lock_guard lk(mu);
          ran.push_back(job);
          threads.push_back(std::this_thread::get_id());
        },
        "test-handoff");
    for (int i = 0; i < 100; ++i) handoff.Put(i);
    handoff.Drain();
    std::lock_guard lk(mu);
    ASSERT_EQ(ran.size(), 100u) << "Drain returned before every job ran";
  }
  for (int i = 0; i < 100; ++i) EXPECT_EQ(ran[i], i);
  for (const auto& t : threads) EXPECT_NE(t, std::this_thread::get_id());
}

// A loop is never more than one claim ahead of its sink: while a job runs and another waits,
// Put waits.
TEST(HandoffTest, PutWaitsWhileAJobIsAlreadyWaiting) {
  std::promise<void> release;
  auto released = release.get_future().share();
  std::atomic<int> started{0};
  Handoff<int> handoff(
      [&](int&) {
        ++started;
        released.wait();
      },
      "test-handoff");
  handoff.Put(1);  // runs, and blocks
  ASSERT_TRUE(Eventually([&] { return started.load() == 1; }));
  handoff.Put(2);  // waits
  auto third = std::async(std::launch::async, [&] { handoff.Put(3); });
  EXPECT_EQ(third.wait_for(200ms), std::future_status::timeout)
      << "a third job was taken while one ran and another waited";
  release.set_value();
  third.get();
  handoff.Drain();
  EXPECT_EQ(started.load(), 3);
}

// Drain waits for the job that is running, and for its resources (a claim's share of the room)
// to be let go of.
TEST(HandoffTest, DrainWaitsForTheRunningJobAndItsResources) {
  struct Job {
    std::shared_ptr<int> resource;
  };
  auto resource = std::make_shared<int>(0);
  std::weak_ptr<int> watch = resource;
  std::atomic<bool> go{false};
  Handoff<Job> handoff([&](Job&) { Eventually([&] { return go.load(); }, 5s); }, "test-handoff");
  handoff.Put(Job{std::move(resource)});
  auto drained = std::async(std::launch::async, [&] { handoff.Drain(); });
  EXPECT_EQ(drained.wait_for(100ms), std::future_status::timeout) << "Drain did not wait";
  go = true;
  drained.get();
  EXPECT_TRUE(watch.expired()) << "the job's resources outlived Drain";
}

TEST(HandoffTest, TheDestructorRunsWhatWasPut) {
  std::atomic<int> ran{0};
  {
    Handoff<int> handoff(
        [&](int&) {
          std::this_thread::sleep_for(20ms);
          ++ran;
        },
        "test-handoff");
    handoff.Put(1);
    handoff.Put(2);
  }
  EXPECT_EQ(ran.load(), 2);
}

}  // namespace
}  // namespace outbox::relay
