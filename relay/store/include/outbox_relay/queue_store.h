// What the dispatcher needs from the database, and nothing about how it is reached: claim,
// settle, reap, wake, coordinate, listen, and the maintenance reads. The PostgreSQL
// implementation is `Store` (store.h); tests drive the dispatcher with an in-memory one
// (tests/dispatch/fake_store.h). No libpqxx type appears here or in any header of this module.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "outbox_relay/fresh_cursor.h"
#include "outbox_relay/message.h"
#include "outbox_relay/reason.h"
#include "outbox_relay/status.h"

namespace outbox::relay {

using Millis = std::chrono::milliseconds;

/// A bucket this relay owns, with the epoch (fencing token) of its assignment.
struct BucketLease {
  int bucket = 0;
  std::int64_t epoch = 0;
  /// Bucket leases: a rebalance gives the bucket to another relay once this one has settled
  /// what it handed its sinks from it (migration 0035): claim nothing more from it, and name it
  /// in Coordinate's `released` once that is done.
  bool handing = false;
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

/// What a page of the orphan sweep (QueueStore::WakeOrphans) did.
struct OrphanPage {
  std::int64_t woken = 0;
  /// Where the next page starts: the page's last id, or 0 when the page reached the end of the
  /// blocked rows (the next page starts the sweep over).
  std::int64_t next_after = 0;
  /// The highest id in the queue when the page ran: a pass that began with this page ends
  /// there, even while claims keep parking rows above it.
  std::int64_t top = 0;
};

struct Settlement {
  enum class Kind { kDelivered, kRetry, kDead, kRelease, kFanOut };
  /// kFanOut: what one endpoint did not take; it stays queued (or dead) for that endpoint.
  struct Child {
    std::string endpoint_id;
    Kind kind = Kind::kRelease;  ///< kRetry, kDead or kRelease.
    Millis delay{0};             ///< Not before this long.
    std::string error;
    int attempts = 0;  ///< Attempts already made for this endpoint (1 after a failure).
    Reason reason_class = Reason::kNone;
    /// Which endpoint of that id the copy was sent under (EndpointSpec::incarnation); 0: any.
    /// Deleted since (added again, maybe), it is owed nothing: a dead letter of the deleted one.
    std::int64_t endpoint_incarnation = 0;
  };
  MessageId id{};
  std::string lease_token;
  Kind kind = Kind::kDelivered;
  Millis delay{0};              ///< kRetry: wait this long before the next attempt.
  std::string error;            ///< kRetry, kDead: the reason recorded on the row.
  bool counts_attempt = true;   ///< kDead: false when no delivery was tried (exhausted, unknown).
  std::vector<Child> children;  ///< kFanOut.
  int delivered_to = 0;         ///< kFanOut: endpoints that took the message.
  /// kRetry, kRelease: the message is known not to be in its target as of this time
  /// (Outcome::absent_as_of); written to the row for the next exactly-once recovery.
  std::optional<std::chrono::system_clock::time_point> absent_as_of = std::nullopt;
  // Not written; what the metrics need once the settle has written it.
  std::string destination;
  Reason reason_class = Reason::kNone;  ///< kRetry, kDead: why (reason.h), for the metrics.
  std::chrono::system_clock::time_point created_at{};
};

struct SettleCounts {
  std::int64_t delivered = 0, dead = 0, retried = 0, released = 0, woken = 0, archived = 0;
  /// Rows and dead letters written for endpoints that did not take a fanned-out message.
  std::int64_t spawned = 0, endpoint_dead = 0;
  /// Settlements whose lease had moved on (expired and reaped): nothing was written for them,
  /// and the message will be delivered again.
  std::int64_t fenced = 0;
  /// Settlements whose message was already gone: an earlier run of the same write committed
  /// although its reply was lost (a database restart), or another relay delivered it after
  /// the lease expired. Nothing to do.
  std::int64_t gone = 0;
  /// Ids this write delivered, dead-lettered, returned for a retry or released: what the
  /// metrics count.
  std::vector<MessageId> written;
  /// Fan-outs not written this time: a lock their endpoint rows take was held elsewhere, a
  /// key's (outbox.insert_message's, by an uncommitted writer of the key), the bucket count's
  /// (while set_bucket_count runs) or an endpoint's registry row (by a transaction changing the
  /// endpoint, e.g. moving it). The locks are tried, never waited for. Nothing of
  /// them was written; they still hold their lease. Write them again later.
  std::vector<MessageId> deferred;
};

/// Every failure of a store call. `transient()`: the database could not be reached or asked
/// to try again (connection lost, server shutting down or starting, serialization failure,
/// deadlock, out of connections or resources, statement or lock timeout); the call may
/// succeed after Reset() and a pause. Otherwise permanent: the statement itself is wrong for
/// this database (a missing migration, a permission, a constraint), and repeating it does not
/// help; what() says what to fix.
class StoreError : public std::runtime_error {
 public:
  enum class Kind { kTransient, kPermanent };
  StoreError(Kind kind, std::string sqlstate, const std::string& what)
      : std::runtime_error(what), kind_(kind), sqlstate_(std::move(sqlstate)) {}
  Kind kind() const { return kind_; }
  bool transient() const { return kind_ == Kind::kTransient; }
  /// The SQLSTATE the server sent, empty when the failure was not the server's answer.
  const std::string& sqlstate() const { return sqlstate_; }

 private:
  Kind kind_;
  std::string sqlstate_;
};

/// Whether a SQLSTATE means "try again" (see StoreError).
bool IsTransientSqlState(const std::string& sqlstate);

/// One connection's worth of the relay's statements. Not thread-safe: each dispatcher thread
/// owns its own. Connects lazily; every method throws StoreError on failure, after which the
/// caller calls Reset() (the next call reconnects).
class QueueStore {
 public:
  virtual ~QueueStore() = default;

  /// Leases up to fresh_limit + slow_limit deliverable messages of `destination`: fresh
  /// rows above `cursor`, then parked rows that are due. Rows that are not deliverable yet
  /// (scheduled, or behind an earlier message of their key) are parked by the same call.
  virtual ClaimResult Claim(const std::string& destination, std::int64_t cursor, int fresh_limit,
                            int slow_limit, Millis lease) = 0;
  /// claim_mode: partitioned. Like Claim, but only from `owned` buckets, and only those the
  /// coordinator still assigns to `instance_id` at the given epochs; at most `fresh_limit`
  /// fresh rows in all (an even share from each bucket, rounded up, the lowest ids kept).
  virtual ClaimResult ClaimPartitioned(const std::string& destination, std::int64_t cursor,
                                       int fresh_limit, int slow_limit, Millis lease,
                                       const std::string& instance_id,
                                       const std::vector<BucketLease>& owned) = 0;
  /// RelayConfig::bucket_leases (docs/adr/0003-bucket-leases.md): the ready rows of the
  /// `owned` buckets that `instance_id` still owns at their epochs, fresh rows above `cursor`
  /// and due parked ones, read and not leased (no lease token: ClaimResult::lease_token is
  /// empty). What is not deliverable yet is parked, and the slow lane's rows are held a
  /// `lease` ahead, by a second statement. One claim loop per destination.
  virtual ClaimResult ClaimOwned(const std::string& destination, std::int64_t cursor,
                                 int fresh_limit, int slow_limit, Millis lease,
                                 const std::string& instance_id,
                                 const std::vector<BucketLease>& owned) = 0;
  /// The lease token of the last Claim or ClaimPartitioned, set just before the statement is
  /// sent (empty when that call failed earlier): when the call throws, the claim may still
  /// have committed with its reply lost.
  virtual const std::string& last_claim_token() const = 0;
  /// Hands back what claims with these tokens leased (their reply never arrived); returns how
  /// many rows. Counts no attempt.
  virtual std::int64_t ReleaseLostClaims(const std::vector<std::string>& tokens) = 0;

  /// Applies outcomes in one write, fenced by lease token. `archive`: also copy delivered
  /// messages to the archive. `instance_id`: a partitioned relay's own id; a key's next message
  /// woken in a bucket another relay owns then wakes the relays (empty: no buckets).
  virtual SettleCounts Settle(const std::vector<Settlement>& settlements, bool archive,
                              const std::string& instance_id) = 0;
  /// RelayConfig::bucket_leases: writes outcomes of messages read by ClaimOwned, fenced by the
  /// buckets `instance_id` still owns at the epochs of `owned` instead of by lease tokens (a
  /// message of another bucket counts as fenced and stays queued). A fan-out that leaves its
  /// endpoints rows is refused (std::invalid_argument).
  virtual SettleCounts SettleOwned(const std::vector<Settlement>& settlements, bool archive,
                                   const std::string& instance_id,
                                   const std::vector<BucketLease>& owned) = 0;
  /// Extends to now + `lease` the leases of these (id, lease token) pairs that are still held
  /// with that token; returns their ids (a row another transaction holds is passed over).
  virtual std::vector<MessageId> RenewLeases(const std::vector<std::pair<MessageId, std::string>>& held,
                                   Millis lease) = 0;

  /// Returns expired leases to the queue; returns the destination of each returned row. Also
  /// scans the whole queue for expired leases without a lease record when no relay has begun
  /// that scan for `queue_scan_every` (this call then takes the turn).
  virtual std::vector<std::string> Reap(Millis queue_scan_every) = 0;
  /// One page of the orphan sweep: of `destination`'s rows blocked behind their key (parked at
  /// 'infinity'), the first `rows` with an id above `after`; wakes those whose key has no
  /// earlier message left. A sweep starts at 0 and goes on from each page's next_after.
  virtual OrphanPage WakeOrphans(const std::string& destination, std::int64_t after,
                                 int rows) = 0;
  /// WakeOrphans for just these keys of `destination`; returns how many rows were woken.
  virtual std::int64_t WakeKeys(const std::string& destination,
                                const std::vector<BlockedKey>& keys) = 0;

  /// Heartbeat + failure detection + rebalancing of buckets. Returns the buckets
  /// `instance_id` owns afterwards. `leaving`: hand every bucket back now. `exactly_once`: this
  /// relay fences by bucket (an exactly-once Kafka destination), so outbox.set_bucket_count
  /// refuses while it lives (migration 0017). `bucket_leases`: this relay holds its buckets'
  /// rows by owning them (RelayConfig::bucket_leases): a live relay of the other mode makes the
  /// call fail (StoreError, permanent), and a bucket a rebalance moves away from it comes back
  /// `handing` until it names it in `released`, or for `hand_over_within` (migration 0035).
  virtual std::vector<BucketLease> Coordinate(const std::string& instance_id, Millis dead_after,
                                              bool leaving, const std::string& description,
                                              bool exactly_once = false, bool bucket_leases = false,
                                              const std::vector<int>& released = {},
                                              Millis hand_over_within = Millis{10'000}) = 0;
  /// This relay is alive and serves `destinations`; `targets` is what its sinks know of their
  /// targets' health (Sink::Health), shown by `outbox-relay status`. `bucket_leases`: it holds
  /// its rows by bucket leases. Refused (a permanent StoreError, nothing written) while a live
  /// relay of the other lease mode serves one of `destinations` (migration 0037).
  virtual void Heartbeat(const std::string& instance_id,
                         const std::vector<std::string>& destinations,
                         const std::string& description,
                         const std::map<std::string, TargetHealth>& targets,
                         bool bucket_leases = false) = 0;
  /// This relay stops: it no longer counts as serving its destinations.
  virtual void Leave(const std::string& instance_id) = 0;
  /// Distinct destinations that have messages in the queue.
  virtual std::vector<std::string> Destinations() = 0;
  /// Live relays (heartbeat within `expiry`) per destination they serve.
  virtual std::map<std::string, std::int64_t> LiveRelays(Millis expiry) = 0;
  /// Destinations an operator paused, with the reason given (outbox-relay pause).
  virtual std::map<std::string, std::string> PausedDestinations() = 0;

  /// Subscribes to wake-ups. Call once on a store used only for waiting.
  virtual void Listen() = 0;
  /// Waits up to `timeout` for a wake-up; true if one (or more) arrived.
  virtual bool WaitForNotification(Millis timeout) = 0;
  /// True (once) if a relay handed its buckets back since the last call.
  virtual bool TakeRebalance() = 0;

  /// The queue status the metrics collector publishes.
  virtual StatusSnapshot ReadStatus(const StatusOptions& options) = 0;
  /// Retention: deletes the archived deliveries / dead letters of `destinations` older than
  /// the age, `batch` rows per statement and at most `max_rows`; returns how many (see
  /// retention.h).
  virtual std::int64_t CleanupArchive(const std::vector<std::string>& destinations,
                                      std::chrono::seconds retention, int batch,
                                      std::int64_t max_rows) = 0;
  virtual std::int64_t CleanupDeadLetters(const std::vector<std::string>& destinations,
                                          std::chrono::seconds max_age, int batch,
                                          std::int64_t max_rows) = 0;

  /// Drops the connection; the next call reconnects.
  virtual void Reset() = 0;
  /// From another thread: cuts the statement in progress, which fails as if the connection had
  /// broken, and makes every later call fail at once. For a stopping relay whose thread is
  /// stuck in a statement (a lock held elsewhere, a database that stopped answering).
  virtual void Interrupt() {}
  virtual bool Connected() const = 0;
};

/// Makes one store per dispatcher thread.
using StoreFactory = std::function<std::unique_ptr<QueueStore>()>;

/// A random uuid v4 (lease tokens).
std::string NewUuid();

}  // namespace outbox::relay
