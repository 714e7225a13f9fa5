// Timing of the relay's own claim and settle statements, taken around Store::Claim and
// Store::Settle as the dispatcher calls them (link-time wrapping, see bench/CMakeLists.txt).
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

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
/// False when this build could not wrap Store::Claim (its signature changed): claim timing
/// is then unavailable and the report says so.
bool ClaimProbeLinked();
/// The same for Store::Settle.
bool SettleProbeLinked();

/// Writes one line per claim (time, thread, cursor, sequence value, leased ids) to `path`:
/// the raw material for checking the fresh-lane cursor. False if the file cannot be opened.
bool TraceClaimsTo(const std::string& path);

}  // namespace outbox::bench
