// The fresh-lane cursor of one destination: how far the relay may skip ahead in id order
// without ever stepping over a row whose transaction has not committed yet.
// Pure logic, no I/O; see docs/adr/0001-claim-path.md for the argument.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "outbox_relay/message.h"

namespace outbox::relay {

/// A key rows wait behind: the ordering key within its endpoint. An endpoint's row is keyed
/// "<endpoint>:<key>", and an application may key a message with the same text; they are
/// different keys.
struct BlockedKey {
  std::string key;
  std::optional<std::string> endpoint;  ///< None for the application's messages.
  auto operator<=>(const BlockedKey&) const = default;
};

/// Facts one claim statement returns about its own snapshot and scan.
struct ClaimFacts {
  std::int64_t seq_value = 0;   ///< Highest id handed out, read after the snapshot was taken.
  std::uint64_t snap_xmin = 0;  ///< Oldest transaction still running at the snapshot.
  /// The statement's own xid, assigned during the statement (so after the previous
  /// statement read its seq_value). Not the snapshot's xmax: that is latestCompletedXid + 1,
  /// and a transaction can hold a larger xid that the snapshot then knows nothing about.
  std::uint64_t own_xid = 0;
  std::int64_t fresh_scanned = 0;
  /// Set when the fresh scan stopped at its limit (in any bucket): the cursor may not pass
  /// this id, since rows above it were not looked at.
  std::optional<std::int64_t> fresh_full_bound;
  /// The slow scan stopped at its limit (a partitioned claim's: in any bucket), so more
  /// parked rows may be due. Not told by the count leased: a partitioned claim stops at one
  /// bucket's share with fewer rows than it asked for.
  bool slow_full = false;
  std::int64_t held = 0;  ///< Rows parked by the statement.
  /// Keys of the rows it parked behind an earlier message (at 'infinity').
  std::vector<BlockedKey> blocked_keys;
  /// A partitioned claim: the buckets it scanned ("3,7,12"), its own and those of owners that
  /// do not serve the destination. nullopt for a skip_locked claim (every bucket).
  std::optional<std::string> scanned_buckets;
};

/// Not thread-safe; one per destination loop.
class FreshCursor {
 public:
  /// Rows with id <= position() never need the fresh scan again.
  std::int64_t position() const { return low_; }

  /// Feeds the facts of the claim statement that scanned from position().
  void Observe(const ClaimFacts& facts);

  /// Back to the start of the lane: the next scan starts from the lowest id. After an
  /// error, or when the rows the lane covers change (partitioned mode gained buckets).
  void Reset() {
    low_ = 0;
    sweep_below_ = 0;
  }

  /// The periodic safety net: back to the start of the lane like Reset(), remembering how
  /// far the lane had got. Fresh rows the sweep then claims below that point are rows the
  /// lane passed without claiming (Missed), which by design never happens.
  void StartSweep() {
    sweep_below_ = low_;
    low_ = 0;
  }

  /// Of these fresh-lane ids, claimed by a scan from position(), the ones a sweep found below
  /// where the lane had got before it started. Call before Observe() of the same claim.
  std::vector<MessageId> Missed(const std::vector<MessageId>& fresh_ids) const;

  /// Checkpoints waiting for their transactions to finish (for tests and metrics).
  std::size_t pending_checkpoints() const { return checkpoints_.size(); }
  /// Past this many, every other one is dropped (a long transaction holds xmin back while
  /// each claim adds one); the cursor then waits for the next, which only ever delays it.
  /// Old ones thin out fastest; when the long transaction ends, xmin moves to the oldest one
  /// still running, most often a recent one, where the checkpoints are densest.
  static constexpr std::size_t kMaxCheckpoints = 4096;

 private:
  std::int64_t low_ = 0;
  std::int64_t sweep_below_ = 0;  // a sweep is on until low_ passes this (0: none)
  std::optional<std::int64_t> unpaired_seq_;
  // (seq value, an xid assigned after it was read), both non-decreasing.
  std::deque<std::pair<std::int64_t, std::uint64_t>> checkpoints_;
};

}  // namespace outbox::relay
