// The rule by which a sink's completions wake the claim loops waiting for room
// (relay/dispatch/src/room_wait.h): once per wait, and only when the room is worth a claim
// with what the destination's other loops are claiming counted.
#include "room_wait.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace outbox::relay
