// `outbox-relay status [--json]`: a StatusSnapshot (relay/store, status.h) as a table for
// people or as JSON for scripts. Both carry the same facts and the same warnings.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "outbox_relay/status.h"

namespace outbox::relay {

/// Thresholds behind StatusWarnings (documented in docs/operations.md).
inline constexpr double kWarnOldestTransactionSeconds = 300;
inline constexpr double kWarnDeadTupleRatio = 0.2;
inline constexpr std::int64_t kWarnDeadTupleMin = 10'000;

/// Human-readable findings that need attention: lock waits on the queue, a long transaction
/// holding xmin, dead tuples piling up, expired leases not yet reaped. Empty when healthy.
std::vector<std::string> StatusWarnings(const StatusSnapshot& s);

/// A fixed-width table, one row per destination (columns DESTINATION, PENDING, IN_FLIGHT,
/// RETRYING, BLOCKED, EXPIRED_LEASES, DEAD_LETTERS, OLDEST_PENDING), then the queue table's
/// health, lock waits, the oldest transaction, and the warnings. Ends with a newline.
std::string RenderStatusTable(const StatusSnapshot& s);

/// The same as JSON (numbers unrounded, times RFC 3339 UTC, "warnings" array).
nlohmann::json StatusToJson(const StatusSnapshot& s);

/// "0s", "4.2s", "3m07s", "2h05m", "3d04h": the ages in the table.
std::string FormatAge(double seconds);
/// Unix seconds as RFC 3339 UTC with milliseconds, e.g. "2024-05-01T12:00:00.250Z".
std::string FormatEpoch(double epoch_seconds);

}  // namespace outbox::relay
