// The store: every SQL statement and every libpqxx call of the relay lives behind this.
// The store knows nothing about Kafka or HTTP.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <pqxx/connection>
#include <string>
#include <vector>

#include "outbox_relay/fresh_cursor.h"
#include "outbox_relay/message.h"

namespace outbox::relay {

using Millis = std::chrono::milliseconds;

/// A bucket this relay owns, with the epoch (fencing token) of its assignment.
struct BucketLease {
  int bucket = 0;
  std::int64_t epoch = 0;
  bool operator==(const BucketLease&) const = default;
};

struct ClaimResult {
  std::string lease_token;        ///< Fences the settle of these messages.
  std::vector<Message> messages;  ///< Leased, in id order; at most one per ordering key.
  /// Ids of those `messages` that came from the fresh lane (never parked before), in id
  /// order: what a full sweep finds below where the cursor had been is a miss of the lane.
  std::vector<MessageId> fresh_lane;
  ClaimFacts facts;
};

struct Settlement {
  enum class Kind { kDelivered, kRetry, kDead, kRelease };
  MessageId id{};
  std::string lease_token;
  Kind kind = Kind::kDelivered;
  Millis delay{0};             ///< kRetry: wait this long before the next attempt.
  std::string error;           ///< kRetry, kDead: the reason recorded on the row.
  bool counts_attempt = true;  ///< kDead: false when no delivery was tried (exhausted, unknown).
  // Not written; what the metrics need once the settle has written it.
  std::string destination;
  std::string reason_class;  ///< kRetry, kDead: the metrics' reason ("http_5xx", ...).
  std::chrono::system_clock::time_point created_at{};
};

struct SettleCounts {
  std::int64_t delivered = 0, dead = 0, retried = 0, released = 0, woken = 0, archived = 0;
  /// Settlements whose lease had moved on (expired and reaped): nothing was written for them,
  /// and the message will be delivered again.
  std::int64_t fenced = 0;
  /// Settlements whose message was already gone: an earlier run of the same write committed
  /// although its reply was lost (a database restart), or another relay delivered it after
  /// the lease expired. Nothing to do.
  std::int64_t gone = 0;
  /// Ids this write delivered, dead-lettered or returned for a retry: what metrics count.
  std::vector<MessageId> written;
};

/// A single PostgreSQL connection and the relay's statements on it. Not thread-safe: each
/// thread owns its own Store. Connects lazily; after any exception the caller should call
/// Reset() (the next call reconnects). Methods throw pqxx exceptions on database errors.
class Store {
 public:
  explicit Store(std::string database_url);
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  /// Leases up to fresh_limit + slow_limit deliverable messages of `destination`: fresh
  /// rows above `cursor`, then parked rows that are due. Rows that are not deliverable yet
  /// (scheduled, or behind an earlier message of their key) are parked by the same statement.
  /// The first claim on a connection sets its planner settings (sql/queries/claim_session.sql:
  /// no bitmap or sequential scans, no sorts), so each claim reads on the order of its batch
  /// whatever the table's statistics say; they stay for every later statement on this
  /// connection, so give claims a Store of their own (the dispatcher's claim loops do).
  ClaimResult Claim(const std::string& destination, std::int64_t cursor, int fresh_limit,
                    int slow_limit, Millis lease);

  /// claim_mode: partitioned. Like Claim, but only from `owned` buckets, and only those the
  /// coordinator still assigns to `instance_id` at the given epochs; `per_bucket_limit`
  /// fresh rows per bucket.
  ClaimResult ClaimPartitioned(const std::string& destination, std::int64_t cursor,
                               int per_bucket_limit, int slow_limit, Millis lease,
                               const std::string& instance_id,
                               const std::vector<BucketLease>& owned);

  /// Heartbeat + failure detection + rebalancing (outbox.coordinate). Returns the buckets
  /// `instance_id` owns afterwards. `leaving`: hand every bucket back now.
  std::vector<BucketLease> Coordinate(const std::string& instance_id, Millis dead_after,
                                      bool leaving, const std::string& description);

  /// Applies outcomes in one statement, fenced by lease token. `archive`: also copy delivered
  /// messages to outbox.delivered_archive.
  SettleCounts Settle(const std::vector<Settlement>& settlements, bool archive = false);

  /// Extends to now + `lease` the leases of these (id, lease token) pairs that are still held
  /// with that token; returns how many.
  std::int64_t RenewLeases(const std::vector<std::pair<MessageId, std::string>>& held,
                           Millis lease);

  /// The lease token of the last Claim or ClaimPartitioned, set just before the statement is
  /// sent (empty when that call failed earlier): when the call throws, the claim may still
  /// have committed with its reply lost.
  const std::string& last_claim_token() const;
  /// Hands back what claims with these tokens leased (their reply never arrived); returns how
  /// many rows. Counts no attempt.
  std::int64_t ReleaseLostClaims(const std::vector<std::string>& tokens);

  /// Returns expired leases to the queue; returns the destination of each returned row.
  std::vector<std::string> Reap();
  /// Wakes rows blocked at 'infinity' whose key has no earlier message left.
  std::int64_t WakeOrphans(const std::string& destination);
  /// WakeOrphans for just these keys of `destination`; returns how many rows were woken.
  std::int64_t WakeKeys(const std::string& destination, const std::vector<std::string>& keys);
  /// Distinct destinations that have messages in the queue.
  std::vector<std::string> Destinations();
  /// This relay is alive and serves `destinations` (outbox.relay_heartbeats).
  void Heartbeat(const std::string& instance_id, const std::vector<std::string>& destinations,
                 const std::string& description);
  /// This relay stops: it no longer counts as serving its destinations.
  void Leave(const std::string& instance_id);

  /// Subscribes to wake-ups (LISTEN). Call once on a Store used only for waiting.
  void Listen();
  /// Waits up to `timeout` for a notification; true if one (or more) arrived.
  bool WaitForNotification(Millis timeout);
  /// True (once) if a relay handed its buckets back since the last call.
  bool TakeRebalance();

  /// Drops the connection; the next call reconnects.
  void Reset();
  bool Connected() const;

  /// The underlying connection (connecting if needed), for admin commands.
  pqxx::connection& Connection();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// A random uuid v4 (lease tokens).
std::string NewUuid();

}  // namespace outbox::relay
