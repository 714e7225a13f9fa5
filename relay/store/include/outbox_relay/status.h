// What the queue holds and how healthy its table is: the facts behind `outbox-relay status`
// and the gauges of the metrics collector. Read-only; see docs/operations.md.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "outbox_relay/target_health.h"

namespace outbox::relay {

class Store;

/// One live relay's view of a destination's target (from its heartbeat).
struct RelayTargetHealth {
  std::string instance_id;
  std::string relay;  ///< The relay's description: host and pid.
  TargetHealth health;
};

/// The queue of one destination. "Pending" means in outbox.messages and not leased.
struct DestinationStatus {
  std::string destination;
  std::int64_t depth = 0;           ///< Not leased: fresh, scheduled, blocked, waiting for a retry.
  std::int64_t in_flight = 0;       ///< Leased by a relay.
  std::int64_t retrying = 0;        ///< Not leased and failed at least once (attempts > 0).
  std::int64_t blocked = 0;         ///< Not leased, waiting behind an earlier message of its key.
  std::int64_t expired_leases = 0;  ///< Leased, lease expired: the reaper will return them.
  std::int64_t dead_letters = 0;    ///< Rows in outbox.dead_letters.
  /// Longest wait among pending messages that are due, blocked or retrying: from when a
  /// never-tried message became due, from enqueue once it was tried or blocked. Messages
  /// scheduled for later do not count. 0 when none waits.
  double oldest_pending_age_seconds = 0;
  /// When the newest dead letter of this destination arrived (Unix seconds), if any.
  std::optional<double> newest_dead_letter_epoch;
  /// Live relays that serve this destination (outbox.relay_heartbeats). 0 with messages
  /// queued: nothing delivers them (see Unserved()).
  std::int64_t relays = 0;
  /// An operator paused it (`outbox-relay pause`): relays claim nothing for it.
  bool paused = false;
  std::string paused_reason;
  /// What each live relay serving it reports of its target (webhooks: the circuit breaker,
  /// adaptive concurrency, a Retry-After pause); empty for Kafka destinations.
  std::vector<RelayTargetHealth> targets;

  /// Messages are waiting and no live relay serves the destination.
  bool Unserved() const { return relays == 0 && depth + in_flight > 0; }
};

/// outbox.messages as the statistics system sees it (pg_stat_user_tables; its counts lag
/// by up to a second or so).
struct QueueTableStatus {
  std::int64_t live_tuples = 0;
  std::int64_t dead_tuples = 0;                 ///< Growing steadily: vacuum is not keeping up.
  std::optional<double> last_vacuum_epoch;      ///< Manual VACUUM, Unix seconds.
  std::optional<double> last_autovacuum_epoch;  ///< Autovacuum, Unix seconds.
  std::int64_t vacuum_count = 0;
  std::int64_t autovacuum_count = 0;
  std::int64_t total_bytes = 0;  ///< Table, indexes and TOAST.

  /// dead / (live + dead), 0 when both are 0.
  double DeadRatio() const;
  /// The later of the two vacuums, if either ever ran.
  std::optional<double> LastAnyVacuumEpoch() const;
};

/// The transaction that has been open longest among those holding back the xmin horizon.
struct OldestTransaction {
  std::string kind;        ///< "session" or "prepared" (a two-phase-commit transaction).
  std::optional<int> pid;  ///< Sessions only.
  std::string user;
  std::string application_name;  ///< Sessions only.
  std::string state;             ///< e.g. "idle in transaction"; sessions only.
  std::string gid;               ///< Prepared transactions only.
  double age_seconds = 0;        ///< Since the transaction (or PREPARE) began.
  std::optional<std::int64_t> xmin_age_xids;
};

/// Seed 001's degradation signals plus the queue's contents, at one instant.
struct StatusSnapshot {
  double taken_at_epoch = 0;  ///< The server's clock, Unix seconds.
  /// Sorted by name: every destination with queued messages or dead letters, plus the ones
  /// passed in StatusOptions::destinations (with zeros when they have nothing).
  std::vector<DestinationStatus> destinations;
  QueueTableStatus table;
  std::int64_t lock_waiters = 0;         ///< Sessions waiting for a lock on the queue table.
  double longest_lock_wait_seconds = 0;  ///< Of those, the longest wait so far.
  std::optional<OldestTransaction> oldest_transaction;  ///< None: no other transaction open.
  /// xmax - xmin of a snapshot: transaction ids between the oldest still running and the
  /// newest finished one (+1); needs no privilege. Large and growing while others commit: a
  /// long transaction holds the xmin horizon back.
  std::int64_t xmin_lag_xids = 0;
  /// Not empty: the pass over the queue and the dead letters ran past the statement timeout
  /// (a queue of many millions of rows) and was cancelled. The destinations' counts are then
  /// not known (left at zero); everything else was read.
  std::string counts_error;

  /// The entry for `destination`, or nullptr: a pointer into this snapshot, so not asked of a
  /// temporary one (a test's `Read().Find(...)` read freed memory: ASan).
  const DestinationStatus* Find(const std::string& destination) const&;
  const DestinationStatus* Find(const std::string& destination) const&& = delete;
};

struct StatusOptions {
  /// Destinations to report even when they have no rows (the configured ones).
  std::vector<std::string> destinations;
  /// A relay whose last heartbeat is older than this no longer counts as serving its
  /// destinations (relays beat every few seconds).
  std::chrono::milliseconds relay_heartbeat_expiry{30'000};
  /// Each statement of the read is cancelled after this (the queue count is one pass over
  /// the queue table, which may be large during an incident).
  std::chrono::milliseconds statement_timeout{10'000};
};

/// Reads a snapshot in one read-only transaction. Needs only the outbox_relay role; with
/// pg_monitor (or pg_read_all_stats) it also sees other roles' sessions for lock waits and
/// the oldest transaction. Throws StoreError on database errors; a statement timeout of the
/// pass over the queue and the dead letters is reported in counts_error instead, with the rest
/// read (the oldest transaction and the lock waits matter most when the queue is that large).
StatusSnapshot ReadStatus(Store& store, const StatusOptions& options);
StatusSnapshot ReadStatus(Store& store);

}  // namespace outbox::relay
