#include "outbox_relay/fresh_cursor.h"

#include <algorithm>
#include <limits>

namespace outbox::relay {

void FreshCursor::Observe(const ClaimFacts& facts, int fresh_limit) {
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
  const bool full = facts.fresh_scanned >= fresh_limit;
  std::int64_t bound = std::numeric_limits<std::int64_t>::max();
  if (full && facts.fresh_max_id) bound = *facts.fresh_max_id;
  low_ = std::max(low_, std::min(*resolved, bound));
}

}  // namespace outbox::relay
