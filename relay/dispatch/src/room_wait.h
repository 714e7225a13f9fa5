// A destination's sink room as its claim loops and the sink's completions share it
// (dispatcher_impl.h: Dispatcher::Impl::RoomWait). Its own header so the wake-up rule is tested
// on its own (tests/dispatch/room_wait_test.cc).
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>

#include "outbox_relay/config.h"

namespace outbox::relay {

struct RoomWait {
  RoomWait() {
    for (auto& at : wake_at_or_below) at = -1;
    for (auto& at : bytes_wake_at_or_below) at = -1;
  }
  // What each claim loop waiting for room waits for: wake it once the sink's in-flight count
  // plus what the destination's other loops are claiming falls to this (-1: not waiting).
  // A loop arms it before it looks at the room and waits (Arm, Wait), the completion that
  // finds it due takes it (TakeWake) and wakes the loops (WakeLoops), so a wait costs one
  // wake-up, not one per completion.
  std::array<std::atomic<long>, kMaxClaimConnections> wake_at_or_below;

  // Loop `index` is about to check the room and wait for `at_or_below`.
  void Arm(int index, long at_or_below) {
    wake_at_or_below.at(static_cast<std::size_t>(index)).store(at_or_below);
  }
  // Loop `index` stopped waiting.
  void Disarm(int index) { wake_at_or_below.at(static_cast<std::size_t>(index)).store(-1); }

  // A completion left `in_flight` in the sink (which may still count the message that
  // completed: one more is close enough). True when it took the wake-up of at least one
  // waiting loop, whose room is now worth a claim: the caller wakes the loops. A loop whose
  // room the other loops' claims still fill is not woken (their claims' end wakes it,
  // RoomShare::Release), nor one another completion already woke. Waking every waiting loop
  // on each completion past the mark cost, on two cores with two claim loops, about 0.8 ms of
  // a webhook worker's time per message (docs/benchmarks.md, session 32).
  bool TakeWake(long in_flight) {
    const long busy = in_flight + static_cast<long>(reserved.load());
    bool took = false;
    for (auto& at : wake_at_or_below) {
      long v = at.load();
      if (v >= 0 && busy <= v + 1 && at.compare_exchange_strong(v, -1)) took = true;
    }
    return took;
  }
  // Wakes the destination's loops waiting in Wait. `wake_mu` is taken for the count alone (no
  // other lock under it), so a sink may complete while it holds a lock of its own.
  void WakeLoops() {
    {
      std::lock_guard lk(wake_mu);
      ++wakes;
    }
    wake_cv.notify_all();
  }
  // One wait of a claim loop for room (or bytes): returns at once when `ready()` holds or
  // `stopping` is set, else after the next WakeLoops or `poll`, whichever comes first; the
  // loop then looks again. A wake-up given after the wait began, even before `ready()` was
  // asked, ends it: none is missed between the look and the sleep. `ready` runs without
  // `wake_mu` (it asks the sink, which takes its own lock).
  template <class Ready>
  void Wait(std::chrono::milliseconds poll, const std::atomic<bool>& stopping, Ready ready) {
    std::uint64_t seen;
    {
      std::lock_guard lk(wake_mu);
      seen = wakes;
    }
    if (stopping.load() || ready()) return;
    std::unique_lock lk(wake_mu);
    wake_cv.wait_for(lk, poll, [&] { return wakes != seen || stopping.load(); });
  }
  bool AnyWaiting() const {
    for (const auto& at : wake_at_or_below) {
      if (at.load() >= 0) return true;
    }
    for (const auto& at : bytes_wake_at_or_below) {
      if (at.load() >= 0) return true;
    }
    return false;
  }
  // Rows the loops are claiming right now (asked for, not in the sink yet): a loop takes its
  // share of the room under `mu`, so loops side by side claim no more than the room (the
  // sink's, plus a claim's worth per loop after the first: claim_loop.cc).
  std::mutex mu;
  std::atomic<int> reserved{0};
  // The last claim of the destination stopped at its limit (a backlog): loops other than the
  // first claim only then, so a quiet destination costs one claim per wake-up, not one per
  // loop.
  std::atomic<bool> backlog{false};
  // Bytes of the payloads handed to the sink whose completion has not come yet: the claim
  // loops claim only while it is under the destination's max_in_flight_bytes.
  std::atomic<std::int64_t> payload_bytes{0};
  // Bytes the loops' claims under way may bring (rows asked for x the payload they expect),
  // taken under `mu` like `reserved`: loops side by side claim no more than the budget.
  std::atomic<std::int64_t> reserved_bytes{0};
  // Under max_in_flight_bytes `budget`, the loops claim again once the sink holds at most this
  // (half of it), as they wait for half their room in messages.
  static std::int64_t BytesResumeAt(std::int64_t budget) { return budget - budget / 2; }
  // The most the sink may hold (payload_bytes plus reserved_bytes) for a loop that expects
  // payloads of `estimate` bytes to claim under `budget`: half the budget, less where one such
  // payload would not fit beside it; and a loop claims whenever nothing is held (a payload
  // larger than the budget goes alone).
  static std::int64_t BytesMark(std::int64_t budget, std::int64_t estimate) {
    return std::max<std::int64_t>(0, std::min(BytesResumeAt(budget), budget - estimate));
  }
  bool BytesAllowAClaim(std::int64_t budget, std::int64_t estimate) const {
    return budget <= 0 ||
           payload_bytes.load() + reserved_bytes.load() <= BytesMark(budget, estimate);
  }
  // What each claim loop waiting for bytes waits for, as wake_at_or_below is for room: wake it
  // once the bytes held and being claimed fall to this (BytesMark; -1: not waiting). Woken only
  // when the bytes crossed half the budget, a loop that expected a payload over half of it
  // found the sink under half and yet too full, and its next look came from its poll: up to
  // 50 ms a claim (review, session 32).
  std::array<std::atomic<std::int64_t>, kMaxClaimConnections> bytes_wake_at_or_below;
  void ArmBytes(int index, std::int64_t at_or_below) {
    bytes_wake_at_or_below.at(static_cast<std::size_t>(index)).store(at_or_below);
  }
  void DisarmBytes(int index) {
    bytes_wake_at_or_below.at(static_cast<std::size_t>(index)).store(-1);
  }
  // A completion took its payload's bytes out of payload_bytes: true when it took the wake-up
  // of at least one loop waiting for bytes whose claim now fits; the caller wakes the loops.
  // Once per wait, as TakeWake.
  bool TakeBytesWake() {
    const std::int64_t used = payload_bytes.load() + reserved_bytes.load();
    bool took = false;
    for (auto& at : bytes_wake_at_or_below) {
      std::int64_t v = at.load();
      if (v >= 0 && used <= v && at.compare_exchange_strong(v, -1)) took = true;
    }
    return took;
  }

 private:
  std::mutex wake_mu;
  std::condition_variable wake_cv;
  std::uint64_t wakes = 0;  // guarded by wake_mu
};

}  // namespace outbox::relay
