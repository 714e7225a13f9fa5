#include "outbox_relay/fresh_cursor.h"

#include <algorithm>
#include <limits>

namespace outbox::relay {

void FreshCursor::Observe(const ClaimFacts& facts) {
  // The sequence value read by the previous statement pairs with this statement's xmax:
  // this snapshot was taken after that read, so every transaction that had taken an id up
  // to that value had its xid by then (enqueue takes the xid first) and is below xmax.
  if (unpaired_seq_) checkpoints_.emplace_back(*unpaired_seq_, facts.snap_xmax);
  unpaired_seq_ = facts.seq_value;

  // A checkpoint is resolved once every transaction below its xmax has finished, i.e. the
  // snapshot's xmin passed it: then every id up to its value is committed (and visible to
  // this statement) or gone for good.
  std::optional<std::int64_t> resolved;
  while (!checkpoints_.empty() && checkpoints_.front().second <= facts.snap_xmin) {
    resolved = checkpoints_.front().first;
    checkpoints_.pop_front();
  }
  if (!resolved) return;

  // The scan saw every visible fresh row above low_ unless it stopped at its limit.
  const std::int64_t bound = facts.fresh_full_bound.value_or(std::numeric_limits<std::int64_t>::max());
  low_ = std::max(low_, std::min(*resolved, bound));
}

}  // namespace outbox::relay
