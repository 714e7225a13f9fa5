// Retention: deleting archived deliveries (outbox.delivered_archive, migration 0002) and
// dead letters once they are older than an age. Batched, each batch its own short
// transaction, so a large cleanup never holds locks or the xmin horizon for long.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace outbox::relay {

class Store;

/// Default bound on the rows one cleanup call deletes (the next call continues).
inline constexpr std::int64_t kDefaultCleanupRowCap = 1'000'000;

/// Deletes the archived deliveries of `destinations` (a relay's own: a database may hold
/// other relays' destinations, kept for their own retention) with delivered_at older than
/// now - `retention`, oldest first within each destination, `batch` rows per transaction,
/// until none is left or `max_rows` were deleted in all (the last batch is shortened so it
/// never deletes more; call again to continue). The cutoff is read from the server's clock
/// once, at the start. Returns the number of rows deleted.
/// Throws std::invalid_argument for a negative retention, batch < 1 or max_rows < 1, and
/// StoreError on database errors (batches committed before the error stay deleted).
std::int64_t CleanupArchive(Store& store, const std::vector<std::string>& destinations,
                            std::chrono::seconds retention, int batch,
                            std::int64_t max_rows = kDefaultCleanupRowCap);

/// The same for outbox.dead_letters, by dead_at: dead letters older than `max_age` are
/// deleted for good (the manual equivalent is `outbox-relay dlq purge --older-than`).
std::int64_t CleanupDeadLetters(Store& store, const std::vector<std::string>& destinations,
                                std::chrono::seconds max_age, int batch,
                                std::int64_t max_rows = kDefaultCleanupRowCap);

}  // namespace outbox::relay
