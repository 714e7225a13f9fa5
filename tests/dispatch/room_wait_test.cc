// The rule by which a sink's completions wake the claim loops waiting for room
// (relay/dispatch/src/room_wait.h): once per wait, and only when the room is worth a claim
// with what the destination's other loops are claiming counted.
#include "room_wait.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>

namespace outbox::relay {
namespace {

TEST(RoomWaitTest, NoLoopWaitingNoWakeUp) {
  RoomWait room;
  EXPECT_FALSE(room.TakeWake(0));
  EXPECT_FALSE(room.AnyWaiting());
}

TEST(RoomWaitTest, AWaitingLoopIsWokenOnceTheRoomIsWorthAClaim) {
  RoomWait room;
  room.Arm(0, 10);
  EXPECT_TRUE(room.AnyWaiting());
  EXPECT_FALSE(room.TakeWake(20)) << "20 in flight: no room worth a claim yet";
  EXPECT_TRUE(room.TakeWake(11)) << "the sink may still count the message that completed";
}

// Every completion past the mark woke every waiting loop (and, through the dispatcher's
// shared condition variable, its other threads): one wake-up per message, where one per
// wait does.
TEST(RoomWaitTest, EachWaitIsWokenOnceNotByEveryCompletionAfterTheMark) {
  RoomWait room;
  room.Arm(0, 10);
  ASSERT_TRUE(room.TakeWake(10));
  EXPECT_FALSE(room.TakeWake(9)) << "the loop was woken already";
  EXPECT_FALSE(room.TakeWake(8));
  EXPECT_FALSE(room.AnyWaiting());
  room.Arm(0, 10);  // it found the room taken meanwhile and waits again
  EXPECT_TRUE(room.TakeWake(7));
}

// With claim_connections 2, one loop's claim holds its share of the room while the other
// waits: completions that leave less than a claim's worth beside that share wake nobody.
TEST(RoomWaitTest, RoomAnotherLoopIsClaimingDoesNotWakeAWaitingLoop) {
  RoomWait room;
  room.reserved = 10;
  room.Arm(1, 20);
  for (long in_flight = 20; in_flight > 11; --in_flight) {
    EXPECT_FALSE(room.TakeWake(in_flight)) << in_flight << " in flight, 10 being claimed";
  }
  EXPECT_TRUE(room.TakeWake(11));
}

TEST(RoomWaitTest, EachWaitingLoopIsWokenForItsOwnMark) {
  RoomWait room;
  room.Arm(0, 10);
  room.Arm(3, 5);
  EXPECT_TRUE(room.TakeWake(10));
  EXPECT_TRUE(room.AnyWaiting()) << "loop 3 waits for less";
  EXPECT_FALSE(room.TakeWake(8));
  EXPECT_TRUE(room.TakeWake(6));
  EXPECT_FALSE(room.AnyWaiting());
}

TEST(RoomWaitTest, DisarmedLoopsAreNotWoken) {
  RoomWait room;
  room.Arm(2, 10);
  room.Disarm(2);
  EXPECT_FALSE(room.TakeWake(0));
}

using namespace std::chrono_literals;

// The waits below poll only every 30 s: each must end through its wake-up, long before that.
constexpr auto kLongPoll = std::chrono::milliseconds(30'000);

// A wake-up given after the wait began and before it sleeps (between the loop's look at the
// room and its sleep) ends it: none is lost in that gap.
TEST(RoomWaitTest, AWakeUpGivenWhileTheLoopLooksEndsTheWait) {
  RoomWait room;
  std::atomic<bool> stopping{false};
  auto waited = std::async(std::launch::async, [&] {
    room.Wait(kLongPoll, stopping, [&] {
      room.Arm(0, 10);
      EXPECT_TRUE(room.TakeWake(10));
      room.WakeLoops();  // a completion, right after the look
      return false;
    });
  });
  EXPECT_EQ(waited.wait_for(10s), std::future_status::ready) << "the wake-up was lost";
}

TEST(RoomWaitTest, AWakeUpEndsAWaitInProgress) {
  RoomWait room;
  std::atomic<bool> stopping{false};
  std::atomic<bool> looked{false};
  auto waited = std::async(std::launch::async, [&] {
    room.Wait(kLongPoll, stopping, [&] {
      looked = true;
      return false;
    });
  });
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (!looked && std::chrono::steady_clock::now() < until) std::this_thread::yield();
  room.WakeLoops();
  EXPECT_EQ(waited.wait_for(10s), std::future_status::ready);
}

TEST(RoomWaitTest, StoppingEndsTheWait) {
  RoomWait room;
  std::atomic<bool> stopping{false};
  auto waited =
      std::async(std::launch::async, [&] { room.Wait(kLongPoll, stopping, [] { return false; }); });
  stopping = true;
  room.WakeLoops();  // as Dispatcher::Stop does for every destination's room
  EXPECT_EQ(waited.wait_for(10s), std::future_status::ready);
}

TEST(RoomWaitTest, ARoomAlreadyWorthAClaimIsNoWait) {
  RoomWait room;
  std::atomic<bool> stopping{false};
  auto waited =
      std::async(std::launch::async, [&] { room.Wait(kLongPoll, stopping, [] { return true; }); });
  EXPECT_EQ(waited.wait_for(10s), std::future_status::ready);
}

// max_in_flight_bytes: a loop claims while the sink holds at most half the budget and the
// payload it expects fits beside what it holds; whatever it expects, it claims when nothing is
// held.
TEST(RoomWaitTest, BytesAllowAClaimUnderHalfTheBudgetWhenTheExpectedPayloadFits) {
  RoomWait room;
  EXPECT_TRUE(room.BytesAllowAClaim(0, 1 << 20)) << "no budget";
  room.payload_bytes = 400;
  EXPECT_TRUE(room.BytesAllowAClaim(1000, 100));
  EXPECT_TRUE(room.BytesAllowAClaim(1000, 600)) << "400 + 600 fit";
  EXPECT_FALSE(room.BytesAllowAClaim(1000, 601));
  room.reserved_bytes = 101;  // another loop's claim
  EXPECT_FALSE(room.BytesAllowAClaim(1000, 100)) << "501 held or claimed: over half";
  room.payload_bytes = 0;
  room.reserved_bytes = 0;
  EXPECT_TRUE(room.BytesAllowAClaim(1000, 5000)) << "nothing held: a large payload goes alone";
}

// A loop that expects a payload over half the budget waits until the sink holds no more than
// the budget less that payload. Its wake-up came only when the bytes crossed half the budget,
// so with 450 of 1000 held and 600 expected, the completion that freed the 450 woke nobody and
// the loop's next look came from its poll (50 ms a claim: review, session 32).
TEST(RoomWaitTest, ALoopWaitingForBytesIsWokenByTheCompletionThatMakesItsClaimFit) {
  RoomWait room;
  const std::int64_t budget = 1000, expected = 600;
  room.payload_bytes = 450;
  ASSERT_FALSE(room.BytesAllowAClaim(budget, expected));
  std::atomic<bool> stopping{false};
  std::atomic<bool> looked{false};
  auto waited = std::async(std::launch::async, [&] {
    room.Wait(kLongPoll, stopping, [&] {
      room.ArmBytes(0, RoomWait::BytesMark(budget, expected));
      looked = true;
      return room.BytesAllowAClaim(budget, expected);
    });
    room.DisarmBytes(0);
  });
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (!looked && std::chrono::steady_clock::now() < until) std::this_thread::yield();
  ASSERT_TRUE(looked.load());
  room.payload_bytes -= 450;  // what a completion does, then:
  if (room.TakeBytesWake()) room.WakeLoops();
  EXPECT_EQ(waited.wait_for(10s), std::future_status::ready)
      << "the completion that made the claim fit did not wake the loop";
}

TEST(RoomWaitTest, ALoopWaitingForBytesIsWokenOncePerWaitAndNotBeforeItsClaimFits) {
  RoomWait room;
  room.payload_bytes = 900;
  room.ArmBytes(2, RoomWait::BytesMark(1000, 300));  // 500: half the budget
  room.payload_bytes = 600;
  EXPECT_FALSE(room.TakeBytesWake()) << "600 held: over half";
  room.payload_bytes = 500;
  EXPECT_TRUE(room.TakeBytesWake());
  EXPECT_FALSE(room.TakeBytesWake()) << "woken already";
  EXPECT_FALSE(room.AnyWaiting());
}

}  // namespace
}  // namespace outbox::relay
