#include "outbox_relay/fresh_cursor.h"

#include <gtest/gtest.h>

namespace outbox::relay {
namespace {

// `scanned` rows up to `max_id`; a scan of kLimit rows stopped at its limit.
constexpr int kLimit = 500;
ClaimFacts Facts(std::int64_t seq, std::uint64_t xmin, std::uint64_t xmax /* own xid */,
                 std::int64_t scanned, std::optional<std::int64_t> max_id = std::nullopt) {
  ClaimFacts f;
  f.seq_value = seq;
  f.snap_xmin = xmin;
  f.own_xid = xmax;
  f.fresh_scanned = scanned;
  if (scanned >= kLimit) f.fresh_full_bound = max_id;
  return f;
}

TEST(FreshCursor, StaysAtZeroUntilACheckpointIsResolved) {
  FreshCursor c;
  c.Observe(Facts(100, 50, 60, 10, 100));  // seq 100 read; no xmax to pair with yet
  EXPECT_EQ(c.position(), 0);
  c.Observe(
      Facts(120, 55, 70, 5, 120));  // pairs (100, 70); xmin 55 < 70: transactions may still run
  EXPECT_EQ(c.position(), 0);
  EXPECT_EQ(c.pending_checkpoints(), 1u);
  c.Observe(Facts(130, 70, 80, 0));  // xmin reached 70: ids <= 100 are settled
  EXPECT_EQ(c.position(), 100);
}

TEST(FreshCursor, NeverPassesARowOfATransactionStillRunning) {
  FreshCursor c;
  // A writer with xid 57 took id 90 and has not committed: every snapshot's xmin stays <= 57.
  for (int i = 0; i < 20; ++i)
    c.Observe(Facts(200 + i, 57, 100 + static_cast<std::uint64_t>(i), 3, 200 + i));
  EXPECT_EQ(c.position(), 0);
  // It commits: xmin moves past every recorded xmax; the cursor may move up to the
  // latest resolved sequence value, which the scan of this same statement covered.
  c.Observe(Facts(300, 200, 210, 4, 300));
  EXPECT_EQ(c.position(), 218);  // (219, 210) waits: xmin 200 < 210
}

// A transaction held open for long (pg_dump, a report) holds xmin back: every claim meanwhile
// added a checkpoint, without bound (review: ~58 MB an hour at 1k claims/s). The list is
// thinned instead; dropping a checkpoint only makes the cursor wait for the next one, so it
// still never passes a value whose transactions may run.
TEST(FreshCursor, CheckpointsStayBoundedWhileXminIsHeldBackAndStaySafe) {
  FreshCursor c;
  constexpr std::uint64_t kHeld = 5;  // the long transaction's xid: xmin stays there
  for (std::int64_t i = 1; i <= 1'000'000; ++i) {
    c.Observe(Facts(i * 10, kHeld, 10 + static_cast<std::uint64_t>(i), 3, i * 10));
  }
  EXPECT_LE(c.pending_checkpoints(), FreshCursor::kMaxCheckpoints);
  EXPECT_EQ(c.position(), 0);
  // The long transaction ends; one that began 100 claims ago still runs: the cursor moves, but
  // only to a value read before an xid below that xmin. (seq (i-1)*10 pairs with xid 10 + i.)
  const std::uint64_t xmin = 10 + 999'900;
  c.Observe(Facts(10'000'010, xmin, 1'000'011, 3, 10'000'010));
  EXPECT_GT(c.position(), 0);
  EXPECT_LE(c.position(), static_cast<std::int64_t>((xmin - 10 - 1) * 10));
  // The transaction ends: everything resolves.
  c.Observe(Facts(10'000'020, 1'000'012, 1'000'012, 3, 10'000'020));
  EXPECT_EQ(c.position(), 10'000'010);
}

TEST(FreshCursor, AFullScanBoundsTheCursorToWhatItSaw) {
  FreshCursor c;
  c.Observe(Facts(10'000, 1, 2, 500, 500));
  c.Observe(Facts(10'000, 3, 3, 500, 1000));  // resolved 10000, but the scan stopped at 1000
  EXPECT_EQ(c.position(), 1000);
  c.Observe(Facts(10'000, 4, 4, 100, 10'000));  // not full: saw everything
  EXPECT_EQ(c.position(), 10'000);
}

TEST(FreshCursor, NeverMovesBackwardsExceptOnReset) {
  FreshCursor c;
  c.Observe(Facts(50, 1, 1, 0));
  c.Observe(Facts(60, 2, 2, 0));
  EXPECT_EQ(c.position(), 50);
  c.Observe(Facts(70, 3, 3, 500, 10));  // a full scan that only reached 10 does not undo 50
  EXPECT_EQ(c.position(), 50);
  c.Reset();
  EXPECT_EQ(c.position(), 0);
}

TEST(FreshCursor, ASweepTellsRowsTheLaneHadPassedFromNewOnes) {
  FreshCursor c;
  c.Observe(Facts(50, 1, 1, 0));
  c.Observe(Facts(60, 2, 2, 0));
  ASSERT_EQ(c.position(), 50);
  EXPECT_TRUE(c.Missed({MessageId{40}}).empty()) << "no sweep is on";
  c.StartSweep();
  EXPECT_EQ(c.position(), 0);
  EXPECT_EQ(c.Missed({MessageId{7}, MessageId{50}, MessageId{51}}),
            (std::vector<MessageId>{MessageId{7}, MessageId{50}}));
  // The sweep ends once the lane is back where it was: later rows are new, not misses.
  c.Observe(Facts(70, 3, 3, 0));
  EXPECT_EQ(c.position(), 60);
  EXPECT_TRUE(c.Missed({MessageId{45}}).empty());
}

TEST(FreshCursor, AResetIsNotASweep) {
  FreshCursor c;
  c.Observe(Facts(50, 1, 1, 0));
  c.Observe(Facts(60, 2, 2, 0));
  c.StartSweep();
  c.Reset();  // e.g. partitioned mode gained buckets: rows below are new to this relay
  EXPECT_TRUE(c.Missed({MessageId{10}}).empty());
}

}  // namespace
}  // namespace outbox::relay
