#include "outbox_relay/fresh_cursor.h"

#include <algorithm>
#include <limits>

namespace outbox::relay {

void FreshCursor::Observe(const ClaimFacts& facts) {
  // The sequence value read by the previous statement pairs with this statement's own xid:
  // it was assigned after that read, and every transaction that had taken an id up to that
  // value had its xid before (enqueue takes the xid first), so all of theirs are smaller.
  if (unpaired_seq_) checkpoints_.emplace_back(*unpaired_seq_, facts.own_xid);
  unpaired_seq_ = facts.seq_value;
  if (checkpoints_.size() > kMaxCheckpoints) {
    // Keep every other one and the newest: a dropped (value, xid) pair only means the cursor
    // moves at the next kept one, whose xid is larger and value no smaller.
    const std::size_t n = checkpoints_.size();
    std::size_t kept = 0;
    for (std::size_t i = 1; i < n; i += 2) checkpoints_[kept++] = checkpoints_[i];
    if (n % 2 == 1) checkpoints_[kept++] = checkpoints_[n - 1];
    checkpoints_.resize(kept);
  }

  // A checkpoint is resolved once this snapshot's xmin reached its xid: then no transaction
  // with a smaller xid is running, so every id up to its value is committed (and visible to
  // this statement) or gone for good.
  std::optional<std::int64_t> resolved;
  while (!checkpoints_.empty() && checkpoints_.front().second <= facts.snap_xmin) {
    resolved = checkpoints_.front().first;
    checkpoints_.pop_front();
  }
  if (!resolved) return;

  // The scan saw every visible fresh row above low_ unless it stopped at its limit.
  const std::int64_t bound =
      facts.fresh_full_bound.value_or(std::numeric_limits<std::int64_t>::max());
  low_ = std::max(low_, std::min(*resolved, bound));
  if (low_ >= sweep_below_) sweep_below_ = 0;  // the sweep has covered the lane
}

std::vector<MessageId> FreshCursor::Missed(const std::vector<MessageId>& fresh_ids) const {
  std::vector<MessageId> out;
  for (const auto id : fresh_ids) {
    if (Raw(id) <= sweep_below_) out.push_back(id);
  }
  return out;
}

}  // namespace outbox::relay
