// The store: every SQL statement and every libpqxx call of the relay lives behind this.
// The store knows nothing about Kafka or HTTP, and its headers name no libpqxx type.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "outbox_relay/queue_store.h"

namespace pqxx {
class transaction_base;
}

namespace outbox::relay {

/// The PostgreSQL QueueStore: a single connection and the relay's statements on it. Not
/// thread-safe: each thread owns its own Store. Connects lazily; after any exception the
/// caller should call Reset() (the next call reconnects). Methods throw StoreError.
class Store final : public QueueStore {
 public:
  explicit Store(std::string database_url);
  ~Store() override;
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  /// The first claim on a connection sets its planner settings (sql/queries/claim_session.sql:
  /// no bitmap or sequential scans, no sorts), so each claim reads on the order of its batch
  /// whatever the table's statistics say; they stay for every later statement on this
  /// connection, so give claims a Store of their own (the dispatcher's claim loops do). The
  /// other statements on the queue's rows (Settle, RenewLeases, Reap, WakeOrphans, WakeKeys,
  /// ReleaseLostClaims) plan without sequential and bitmap scans (queue_session.sql); ReadStatus
  /// plans its counts with PostgreSQL's defaults whatever the connection has set.
  ClaimResult Claim(const std::string& destination, std::int64_t cursor, int fresh_limit,
                    int slow_limit, Millis lease) override;
  ClaimResult ClaimPartitioned(const std::string& destination, std::int64_t cursor,
                               int fresh_limit, int slow_limit, Millis lease,
                               const std::string& instance_id,
                               const std::vector<BucketLease>& owned) override;
  const std::string& last_claim_token() const override;
  std::int64_t ReleaseLostClaims(const std::vector<std::string>& tokens) override;

  /// Bucket leases (docs/adr/0003-bucket-leases.md): claim_owned.sql, the ready rows of the
  /// buckets `instance_id` owns at the epochs of `owned`, the fresh lane read from `cursor`,
  /// nothing locked or written; then, only when there is any, claim_owned_hold.sql parks what
  /// was not ready and holds the slow lane's rows a `lease` ahead. No lease token
  /// (ClaimResult::lease_token is empty). For one claim loop per destination: two loops could
  /// both take a slow-lane row before either held it.
  ClaimResult ClaimOwned(const std::string& destination, std::int64_t cursor, int fresh_limit,
                         int slow_limit, Millis lease, const std::string& instance_id,
                         const std::vector<BucketLease>& owned) override;
  /// The application_name of the connection SettleOwned writes on, whose backend it registers
  /// (outbox.register_bucket_lease_settler, migration 0038). Its transactions write no queue
  /// rows, so claim_owned.sql's cursor facts pass over those of registered backends (the
  /// snapshot's oldest transaction that may still commit rows below the cursor is another's).
  static constexpr const char* kOwnedSettlerName = "outbox-relay bucket-lease settler";
  /// settle_owned_delivered.sql: deletes the delivered `ids` that lie in buckets `instance_id`
  /// still owns at the epochs of `owned`, and wakes their keys' next messages. `fenced`
  /// counts those of other buckets (still queued), `gone` those already deleted.
  SettleCounts SettleOwnedDelivered(const std::vector<MessageId>& ids,
                                    const std::string& instance_id,
                                    const std::vector<BucketLease>& owned);

  /// Bucket leases: every outcome of `settlements` (their lease tokens unused) in the buckets
  /// `instance_id` still owns at the epochs of `owned`, all or nothing. A batch of plain
  /// deliveries (and no `archive`) is one statement, SettleOwnedDelivered's; any other batch is
  /// one transaction: those deliveries, then the rest given a token of its own
  /// (settle_owned_adopt.sql, fenced by the epochs) and written with settle.sql. A fan-out
  /// that leaves endpoints rows is refused (std::invalid_argument): not for bucket leases yet.
  SettleCounts SettleOwned(const std::vector<Settlement>& settlements, bool archive,
                           const std::string& instance_id,
                           const std::vector<BucketLease>& owned) override;

  /// One statement (sql/queries/settle.sql; settle_delivered.sql for nothing but plain
  /// deliveries without the archive). `archive`: also copy delivered messages to
  /// outbox.delivered_archive.
  SettleCounts Settle(const std::vector<Settlement>& settlements, bool archive = false,
                      const std::string& instance_id = "") override;
  /// Endpoint rows a fan-out's settle writes in one statement at most (each takes a lock);
  /// Settle splits a batch with more into several statements.
  static constexpr std::size_t kMaxChildrenPerSettle = 256;
  std::vector<MessageId> RenewLeases(const std::vector<std::pair<MessageId, std::string>>& held,
                           Millis lease) override;

  std::vector<std::string> Reap(Millis queue_scan_every) override;
  /// Wakes rows blocked at 'infinity' whose key has no earlier message left.
  OrphanPage WakeOrphans(const std::string& destination, std::int64_t after, int rows) override;
  std::int64_t WakeKeys(const std::string& destination,
                        const std::vector<BlockedKey>& keys) override;
  void Interrupt() override;

  /// outbox.coordinate.
  std::vector<BucketLease> Coordinate(const std::string& instance_id, Millis dead_after,
                                      bool leaving, const std::string& description,
                                      bool exactly_once = false, bool bucket_leases = false,
                                      const std::vector<int>& released = {},
                                      Millis hand_over_within = Millis{10'000}) override;
  /// outbox.relay_heartbeats.
  void Heartbeat(const std::string& instance_id, const std::vector<std::string>& destinations,
                 const std::string& description, const std::map<std::string, TargetHealth>& targets,
                 bool bucket_leases = false) override;
  void Leave(const std::string& instance_id) override;
  std::vector<std::string> Destinations() override;
  std::map<std::string, std::int64_t> LiveRelays(Millis expiry) override;
  std::map<std::string, std::string> PausedDestinations() override;

  /// LISTEN on the wake-up channel.
  void Listen() override;
  bool WaitForNotification(Millis timeout) override;
  bool TakeRebalance() override;

  StatusSnapshot ReadStatus(const StatusOptions& options) override;
  std::int64_t CleanupArchive(const std::vector<std::string>& destinations,
                              std::chrono::seconds retention, int batch,
                              std::int64_t max_rows) override;
  std::int64_t CleanupDeadLetters(const std::vector<std::string>& destinations,
                                  std::chrono::seconds max_age, int batch,
                                  std::int64_t max_rows) override;

  void Reset() override;
  bool Connected() const override;

 private:
  SettleCounts SettleStatement(std::span<const Settlement> settlements, bool archive,
                               const std::string& instance_id);
  SettleCounts SettleIn(pqxx::transaction_base& tx, std::span<const Settlement> settlements,
                        bool archive, const std::string& instance_id);
  friend struct StoreAccess;  // the store module's own functions (src/store_access.h)
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// The store the relay runs on: a new Store for `database_url` per call.
StoreFactory PostgresStores(std::string database_url);

}  // namespace outbox::relay
