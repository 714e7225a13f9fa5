// Timing of the relay's own claim and settle statements, taken around Store::Claim and
// Store::Settle as the dispatcher calls them: a decorator of its store (TimedStores).
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "outbox_relay/queue_store.h"

namespace outbox::bench {

/// Durations and row counts of one kind of call since the last Take(). Thread-safe.
class CallProbe {
 public:
  struct Batch {
    std::vector<std::int64_t> durations_us;
    std::int64_t rows = 0;  ///< Messages leased (claim) or settlements written (settle).
  };

  void Record(std::int64_t duration_us, std::int64_t rows);
  /// Everything recorded since the previous Take().
  Batch Take();

 private:
  std::mutex mu_;
  Batch batch_;
};

/// Calls of Store::Claim / Store::ClaimPartitioned made by the dispatcher (the poll cycle's
/// database part).
CallProbe& ClaimProbe();
/// Calls of Store::Settle made by the settler.
CallProbe& SettleProbe();
/// The PostgreSQL stores of `database_url`, each wrapped so that its Claim, ClaimPartitioned
/// and Settle calls are recorded in ClaimProbe() / SettleProbe() (and traced, TraceClaimsTo).
/// For DispatcherEnv::stores.
relay::StoreFactory TimedStores(std::string database_url);

/// Writes one line per claim (time, thread, cursor, sequence value, leased ids) to `path`:
/// the raw material for checking the fresh-lane cursor. False if the file cannot be opened.
bool TraceClaimsTo(const std::string& path);

}  // namespace outbox::bench
