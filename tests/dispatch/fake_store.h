// An in-memory QueueStore with the semantics of the relay's SQL (sql/queries/claim.sql and its
// fragment, settle.sql, reap.sql, renew_leases.sql, release_lost_claims.sql, wake_*.sql), and
// a clock the test moves: the dispatcher's unit tests run on these, without PostgreSQL and
// without waiting for leases or retries to come due. Every store a FakeDatabase makes shares
// its rows; one mutex makes each call atomic, as one statement is.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "outbox_relay/clock.h"
#include "outbox_relay/queue_store.h"

namespace outbox::relay::testing {

/// Starts at the real time of its construction and moves only when told to.
class FakeClock final : public Clock {
 public:
  Steady::time_point Now() const override { return steady_base_ + Offset(); }
  System::time_point WallNow() const override {
    return std::chrono::time_point_cast<System::duration>(system_base_ + Offset());
  }
  void Advance(std::chrono::nanoseconds d) { offset_ns_ += d.count(); }

 private:
  std::chrono::nanoseconds Offset() const { return std::chrono::nanoseconds(offset_ns_.load()); }
  const Steady::time_point steady_base_ = Steady::now();
  const System::time_point system_base_ = System::now();
  std::atomic<std::int64_t> offset_ns_{0};
};

class FakeDatabase {
 public:
  using Time = Clock::System::time_point;
  static constexpr Time kInfinity = Time::max();  // 'infinity': blocked behind its key

  struct Row {
    std::int64_t id = 0;
    std::string destination;
    std::optional<std::string> key;
    std::optional<std::string> endpoint;  ///< endpoint_id: a row a webhook service fanned out
    std::string payload;
    bool parked = false;
    Time deliver_after{};
    std::optional<std::string> lease_owner;
    Time lease_until{};
    int attempts = 0;
  };

  explicit FakeDatabase(const FakeClock& clock) : clock_(clock) {}

  /// outbox.enqueue: a committed message, due now (or after `delay`: then parked, like a
  /// message scheduled more than a second ahead).
  std::int64_t Enqueue(const std::string& destination, std::optional<std::string> key,
                       std::chrono::milliseconds delay = {}) {
    std::int64_t id;
    {
      std::lock_guard lk(mu_);
      id = ++seq_;
      Insert(id, destination, std::move(key), delay);
    }
    Notify();
    return id;
  }
  /// A message with this payload (parked, as Enqueue, with a `delay` over a second).
  std::int64_t EnqueuePayload(const std::string& destination, std::string payload,
                              std::chrono::milliseconds delay = {}) {
    std::int64_t id;
    {
      std::lock_guard lk(mu_);
      id = ++seq_;
      Insert(id, destination, std::nullopt, delay);
      rows_.at(id).payload = std::move(payload);
    }
    Notify();
    return id;
  }
  /// A row a fan-out wrote for one of its webhook service's endpoints (endpoint_id set).
  std::int64_t EnqueueForEndpoint(const std::string& destination, const std::string& endpoint,
                                  const std::string& key) {
    std::int64_t id;
    {
      std::lock_guard lk(mu_);
      id = ++seq_;
      Insert(id, destination, endpoint + ":" + key, {});
      rows_.at(id).endpoint = endpoint;
    }
    Notify();
    return id;
  }
  /// A row a claim parked behind its key (at 'infinity'), as if its predecessor were in flight.
  std::int64_t EnqueueBlocked(const std::string& destination, const std::string& key) {
    std::lock_guard lk(mu_);
    const auto id = ++seq_;
    Insert(id, destination, key, {});
    rows_.at(id).parked = true;
    rows_.at(id).deliver_after = kInfinity;
    return id;
  }
  /// A message whose id was taken long before it committed: below where the fresh lane's
  /// cursor may already be (what only the full sweep can find).
  std::int64_t EnqueueLate(const std::string& destination, std::int64_t id) {
    {
      std::lock_guard lk(mu_);
      Insert(id, destination, std::nullopt, {});
    }
    Notify();
    return id;
  }

  /// outbox.set_bucket_count's (or a leaving relay's) NOTIFY 'rebalance'.
  void NotifyRebalance() {
    {
      std::lock_guard lk(notify_mu_);
      rebalance_ = true;
    }
    Notify();
  }

  /// Another transaction holds every row (outbox.set_bucket_count rewriting the queue): a
  /// renewal passes over them (renew_leases.sql takes them FOR UPDATE SKIP LOCKED).
  void LockRowsForRenewals(bool locked) {
    std::lock_guard lk(mu_);
    rows_locked_ = locked;
  }
  /// The same for one row.
  void LockRowForRenewals(std::int64_t id, bool locked) {
    std::lock_guard lk(mu_);
    if (locked) {
      locked_for_renewals_.insert(id);
    } else {
      locked_for_renewals_.erase(id);
    }
  }
  /// Runs `hook` once, at the start of the next lease renewal (before it reads the rows).
  void BeforeRenew(std::function<void()> hook) {
    std::lock_guard lk(mu_);
    before_renew_ = std::move(hook);
  }

  /// A settle that committed after a claim's snapshot (the race wake_keys.sql heals): the row
  /// leaves the queue, and the next row of its key, which that claim parked, is not woken.
  void RemoveWithoutWaking(std::int64_t id) {
    std::lock_guard lk(mu_);
    rows_.erase(id);
  }

  /// The next `n` calls of `op` ("claim", "settle", "reap", "renew", ...) fail with a
  /// transient StoreError before doing anything.
  void FailNext(const std::string& op, int n) {
    std::lock_guard lk(mu_);
    failures_[op] += n;
  }
  /// The failures FailNext injects into a paused read from now on lose the store's connection
  /// (Connected() false until Reset), as a database that went away does.
  void FailuresLoseTheConnection() {
    std::lock_guard lk(mu_);
    failures_lose_connection_ = true;
  }
  /// Calls of `op` stop failing (what FailNext still owed is dropped).
  void Heal(const std::string& op) {
    std::lock_guard lk(mu_);
    failures_[op] = 0;
    refusals_.erase(op);
  }
  /// Every call `op` fails with a permanent error saying `why` (the database refuses it), until
  /// Heal(op).
  void Refuse(const std::string& op, const std::string& why) {
    std::lock_guard lk(mu_);
    refusals_[op] = why;
  }
  /// outbox-relay pause / resume.
  void Pause(const std::string& destination, const std::string& reason) {
    std::lock_guard lk(mu_);
    paused_[destination] = reason;
  }
  void Resume(const std::string& destination) {
    {
      std::lock_guard lk(mu_);
      paused_.erase(destination);
    }
    Notify();
  }

  /// claim_mode partitioned: the buckets Coordinate says this relay owns (all four at first).
  /// A row's bucket is its id % kBuckets.
  static constexpr int kBuckets = 4;
  void OwnBuckets(std::vector<int> buckets) {
    std::lock_guard lk(mu_);
    owned_buckets_ = std::move(buckets);
  }
  /// Bucket leases: a rebalance gives `bucket` to another relay once this one releases it
  /// (Coordinate returns it handing until then).
  void HandOver(int bucket) {
    std::lock_guard lk(mu_);
    handing_.insert(bucket);
  }
  /// While held, every claim says a transaction older than it is running: the claim loop's
  /// cursor does not move past what it read.
  void HoldCursor(bool held) {
    std::lock_guard lk(mu_);
    cursor_held_ = held;
  }
  /// The buckets the relay released, in order (Coordinate's `released`).
  std::vector<int> Released() const {
    std::lock_guard lk(mu_);
    return released_;
  }
  std::vector<int> OwnedBuckets() const {
    std::lock_guard lk(mu_);
    return owned_buckets_;
  }
  /// Runs once, at the start of the next ReleaseLostClaims, without the store's lock.
  void BeforeReleaseLostClaims(std::function<void()> hook) {
    std::lock_guard lk(mu_);
    before_release_lost_claims_ = std::move(hook);
  }

  /// Runs once, at the start of the next ReadStatus, without the store's lock: a status read
  /// of a large queue.
  void BeforeReadStatus(std::function<void()> hook) {
    std::lock_guard lk(mu_);
    before_read_status_ = std::move(hook);
  }

  /// Runs once, at the start of the `nth` claim from now on (of any store), without the store's
  /// lock: a claim that takes that long in the database.
  void BeforeClaim(int nth, std::function<void()> hook) {
    std::lock_guard lk(mu_);
    claims_until_hook_ = nth;
    before_claim_ = std::move(hook);
  }

  /// Runs once, when the next ClaimOwned that reads from the start of the lane (cursor 0) has
  /// read its rows and before it returns them, without the store's lock: what is written
  /// meanwhile came after the claim's snapshot.
  void AfterOwnedClaimFromTheStart(std::function<void()> hook) {
    std::lock_guard lk(mu_);
    after_owned_claim_from_start_ = std::move(hook);
  }

  /// Runs once, at the start of the next settle, without the store's lock (a settle that takes
  /// that long in the database); that settle wakes no key's next message, as one whose
  /// snapshot was taken before the claim that parked it committed.
  void BeforeSettleMissingItsWakes(std::function<void()> hook) {
    std::lock_guard lk(mu_);
    before_settle_ = std::move(hook);
  }

  /// While held, a settle defers each fan-out that leaves rows for endpoints (their keys' locks
  /// held by another transaction, SettleCounts::deferred) and writes the rest.
  void HoldKeyLocks(bool held) {
    std::lock_guard lk(mu_);
    key_locks_held_ = held;
  }

  /// The next claim leases its rows and then fails as if its reply was lost.
  void LoseNextClaimReply() {
    std::lock_guard lk(mu_);
    lose_claim_reply_ = true;
  }

  // What the queue holds now.
  std::size_t Queued() const {
    std::lock_guard lk(mu_);
    return rows_.size();
  }
  std::size_t Leased() const {
    std::lock_guard lk(mu_);
    return static_cast<std::size_t>(std::count_if(rows_.begin(), rows_.end(), [](const auto& r) {
      return r.second.lease_owner.has_value();
    }));
  }
  std::optional<Row> Find(std::int64_t id) const {
    std::lock_guard lk(mu_);
    const auto it = rows_.find(id);
    if (it == rows_.end()) return std::nullopt;
    return it->second;
  }
  /// Ids in the order their delivery was settled.
  std::vector<std::int64_t> Delivered() const {
    std::lock_guard lk(mu_);
    return delivered_;
  }
  std::vector<std::int64_t> DeadLetters() const {
    std::lock_guard lk(mu_);
    return dead_;
  }
  /// The relay ids settles named (QueueStore::Settle's instance_id), and the one the
  /// coordinator last beat as.
  std::set<std::string> SettledAs() const {
    std::lock_guard lk(mu_);
    return settled_as_;
  }
  std::string CoordinatedAs() const {
    std::lock_guard lk(mu_);
    return coordinated_as_;
  }

  /// Every key QueueStore::WakeKeys was asked to wake, in order.
  std::vector<BlockedKey> KeysAskedToWake() const {
    std::lock_guard lk(mu_);
    return keys_asked_to_wake_;
  }

  /// The queue_scan_every of every QueueStore::Reap, in order.
  std::vector<Millis> QueueScanIntervals() const {
    std::lock_guard lk(mu_);
    return queue_scan_intervals_;
  }

  /// Every store call, in the order they were made.
  std::vector<std::string> CallOrder() const {
    std::lock_guard lk(mu_);
    return call_order_;
  }

  std::int64_t Calls(const std::string& op) const {
    std::lock_guard lk(mu_);
    const auto it = calls_.find(op);
    return it == calls_.end() ? 0 : it->second;
  }
  /// From now on the archive has rows to clean without end, each taking `per_row`.
  void SetCleanupBacklog(std::chrono::microseconds per_row) {
    std::lock_guard lk(mu_);
    cleanup_per_row_ = per_row;
  }
  std::int64_t RenewedLeases() const {
    std::lock_guard lk(mu_);
    return renewed_;
  }
  /// The next reap takes this long (real time) before it starts, holding up the thread that
  /// called it as a reap of a large queue does; the other connections go on meanwhile.
  void StallNextReap(std::chrono::milliseconds stall) {
    std::lock_guard lk(mu_);
    reap_stall_ = stall;
  }
  /// Whether a stalled reap is under way.
  bool ReapStalled() const {
    std::lock_guard lk(mu_);
    return reap_stalled_;
  }

  StoreFactory Stores();

 private:
  friend class FakeStore;

  void Insert(std::int64_t id, const std::string& destination, std::optional<std::string> key,
              std::chrono::milliseconds delay) {
    Row r;
    r.id = id;
    r.destination = destination;
    r.key = std::move(key);
    r.payload = "{\"n\":" + std::to_string(id) + "}";
    r.deliver_after = clock_.WallNow() + delay;
    r.parked = delay > std::chrono::seconds(1);
    rows_[id] = std::move(r);
  }

  void Notify() {
    {
      std::lock_guard lk(notify_mu_);
      ++notifications_;
    }
    notify_cv_.notify_all();
  }

  // Called with mu_ held at the start of every operation.
  void Enter(const std::string& op) {
    ++calls_[op];
    call_order_.push_back(op);
    if (auto it = refusals_.find(op); it != refusals_.end()) {
      throw StoreError(StoreError::Kind::kPermanent, "55000", it->second);
    }
    if (auto it = failures_.find(op); it != failures_.end() && it->second > 0) {
      --it->second;
      throw StoreError(StoreError::Kind::kTransient, "08006", "injected: " + op + " failed");
    }
  }

  bool HasEarlierOfKey(const Row& r) const {
    if (!r.key) return false;
    for (const auto& [id, other] : rows_) {
      if (id >= r.id) break;
      if (other.destination == r.destination && other.key == r.key) return true;
    }
    return false;
  }

  // A keyed message left the queue: its key's next message, if blocked, may go now.
  std::int64_t WakeSuccessor(const Row& gone) {
    if (!gone.key) return 0;
    for (auto& [id, r] : rows_) {
      if (id <= gone.id || r.destination != gone.destination || r.key != gone.key) continue;
      if (r.parked && r.deliver_after == kInfinity && !HasEarlierOfKey(r)) {
        r.deliver_after = clock_.WallNow();
        return 1;
      }
      return 0;
    }
    return 0;
  }

  // One page of the orphan sweep: the first `rows` blocked rows above `after`.
  OrphanPage WakeBlockedPage(const std::string& destination, std::int64_t after, int rows) {
    OrphanPage page;
    int scanned = 0;
    std::int64_t last = 0;
    for (auto it = rows_.upper_bound(after); it != rows_.end() && scanned < rows; ++it) {
      auto& r = it->second;
      if (r.destination != destination || !r.parked || r.deliver_after != kInfinity) continue;
      ++scanned;
      last = it->first;
      if (!HasEarlierOfKey(r)) {
        r.deliver_after = clock_.WallNow();
        ++page.woken;
      }
    }
    if (scanned >= rows) page.next_after = last;
    page.top = rows_.empty() ? 0 : rows_.rbegin()->first;
    return page;
  }

  std::int64_t WakeBlocked(const std::string& destination, const std::set<std::string>* keys) {
    std::int64_t woken = 0;
    for (auto& [id, r] : rows_) {
      if (r.destination != destination || !r.parked || r.deliver_after != kInfinity) continue;
      if (keys && (!r.key || !keys->count(*r.key))) continue;
      if (!HasEarlierOfKey(r)) {
        r.deliver_after = clock_.WallNow();
        ++woken;
      }
    }
    return woken;
  }

  const FakeClock& clock_;
  mutable std::mutex mu_;
  std::map<std::int64_t, Row> rows_;
  std::int64_t seq_ = 0;
  std::uint64_t xid_ = 100;
  std::vector<std::int64_t> delivered_, dead_;
  std::vector<BlockedKey> keys_asked_to_wake_;
  std::vector<Millis> queue_scan_intervals_;
  std::map<std::string, int> failures_;
  std::map<std::string, std::int64_t> calls_;
  std::vector<std::string> call_order_;
  std::int64_t renewed_ = 0;
  std::map<std::string, std::string> paused_;
  bool lose_claim_reply_ = false;
  bool key_locks_held_ = false;
  std::vector<int> owned_buckets_ = {0, 1, 2, 3};
  std::set<int> handing_;
  bool cursor_held_ = false;
  std::map<std::string, std::string> refusals_;
  std::vector<int> released_;
  std::set<std::string> settled_as_;
  std::string coordinated_as_;
  std::function<void()> before_release_lost_claims_;
  int claims_until_hook_ = 0;
  std::function<void()> before_claim_;
  std::function<void()> before_settle_;
  std::function<void()> after_owned_claim_from_start_;
  std::function<void()> before_renew_;
  std::set<std::int64_t> locked_for_renewals_;
  std::function<void()> before_read_status_;

  std::mutex notify_mu_;
  std::condition_variable notify_cv_;
  std::uint64_t notifications_ = 0;
  bool rebalance_ = false;                        // guarded by notify_mu_
  bool failures_lose_connection_ = false;         // guarded by mu_
  bool rows_locked_ = false;                      // guarded by mu_
  std::chrono::microseconds cleanup_per_row_{0};  // guarded by mu_
  std::chrono::milliseconds reap_stall_{0};       // guarded by mu_
  bool reap_stalled_ = false;                     // guarded by mu_
};

class FakeStore final : public QueueStore {
 public:
  explicit FakeStore(FakeDatabase& db) : db_(db) {}

  ClaimResult Claim(const std::string& destination, std::int64_t cursor, int fresh_limit,
                    int slow_limit, Millis lease) override {
    std::function<void()> hook;
    {
      std::lock_guard lk(db_.mu_);
      if (db_.before_claim_ && --db_.claims_until_hook_ == 0) hook.swap(db_.before_claim_);
    }
    if (hook) hook();
    std::lock_guard lk(db_.mu_);
    last_token_.clear();
    db_.Enter("claim");
    if (!reads_only_) last_token_ = NewUuid();
    const auto now = db_.clock_.WallNow();
    std::vector<std::int64_t> fresh, slow;
    const auto in_scope = [&](std::int64_t id) {
      const int bucket = static_cast<int>(id % FakeDatabase::kBuckets);
      // Bucket leases: only the buckets this relay still owns (claim_owned.sql's fence).
      if (reads_only_ && std::find(db_.owned_buckets_.begin(), db_.owned_buckets_.end(), bucket) ==
                             db_.owned_buckets_.end())
        return false;
      return !only_buckets_ ||
             std::find(only_buckets_->begin(), only_buckets_->end(), bucket) !=
                 only_buckets_->end();
    };
    for (const auto& [id, r] : db_.rows_) {
      if (static_cast<int>(fresh.size()) >= fresh_limit) break;
      if (r.destination == destination && id > cursor && !r.parked && !r.lease_owner &&
          in_scope(id))
        fresh.push_back(id);
    }
    std::vector<const FakeDatabase::Row*> due_parked;
    for (const auto& [id, r] : db_.rows_) {
      if (r.destination == destination && r.parked && !r.lease_owner && r.deliver_after <= now &&
          in_scope(id))
        due_parked.push_back(&r);
    }
    std::sort(due_parked.begin(), due_parked.end(), [](const auto* a, const auto* b) {
      return std::tie(a->deliver_after, a->id) < std::tie(b->deliver_after, b->id);
    });
    for (const auto* r : due_parked) {
      if (static_cast<int>(slow.size()) >= slow_limit) break;
      slow.push_back(r->id);
    }

    ClaimResult out;
    out.lease_token = last_token_;
    std::set<BlockedKey> blocked;
    std::vector<std::int64_t> candidates = fresh;
    candidates.insert(candidates.end(), slow.begin(), slow.end());
    std::vector<std::int64_t> leased;
    for (const auto id : candidates) {
      auto& r = db_.rows_.at(id);
      const bool due = r.deliver_after <= now;
      if (due && !db_.HasEarlierOfKey(r)) {
        if (!reads_only_) {
          r.lease_owner = last_token_;
          r.lease_until = now + lease;
        } else if (r.parked) {
          r.deliver_after = now + lease;  // the slow lane's hold (claim_owned_hold.sql)
        }
        leased.push_back(id);
        if (!r.parked) out.fresh_lane.push_back(MessageId{id});
      } else {
        r.parked = true;
        if (due) {
          r.deliver_after = FakeDatabase::kInfinity;
          if (r.key) blocked.insert({*r.key, std::nullopt});
        }
        ++out.facts.held;
      }
    }
    std::sort(leased.begin(), leased.end());
    std::sort(out.fresh_lane.begin(), out.fresh_lane.end());
    for (const auto id : leased) {
      const auto& r = db_.rows_.at(id);
      Message m;
      m.id = MessageId{id};
      m.destination = destination;
      m.bucket = static_cast<int>(id % FakeDatabase::kBuckets);
      m.ordering_key = r.key;
      m.endpoint_id = r.endpoint;
      m.idempotency_key = "key-" + std::to_string(id);
      m.payload = r.payload;
      m.attempts = r.attempts;
      out.messages.push_back(std::move(m));
    }
    // No transaction is ever in progress here: every id handed out is committed.
    out.facts.seq_value = db_.seq_;
    out.facts.own_xid = ++db_.xid_;
    // A cursor held: as if a transaction older than every claim kept running.
    out.facts.snap_xmin = db_.cursor_held_ ? 0 : out.facts.own_xid;
    out.facts.fresh_scanned = static_cast<std::int64_t>(fresh.size());
    if (static_cast<int>(fresh.size()) >= fresh_limit && !fresh.empty())
      out.facts.fresh_full_bound = fresh.back();
    out.facts.slow_full = slow_limit > 0 && static_cast<int>(slow.size()) >= slow_limit;
    out.facts.blocked_keys.assign(blocked.begin(), blocked.end());
    if (db_.lose_claim_reply_) {
      db_.lose_claim_reply_ = false;
      throw StoreError(StoreError::Kind::kTransient, "08006", "injected: claim reply lost");
    }
    return out;
  }

  // Rows of the buckets the relay passes (id % kBuckets), whatever Coordinate says now.
  ClaimResult ClaimPartitioned(const std::string& destination, std::int64_t cursor, int fresh_limit,
                               int slow_limit, Millis lease, const std::string&,
                               const std::vector<BucketLease>& owned) override {
    {
      std::lock_guard lk(db_.mu_);
      ++db_.calls_["claim_partitioned"];
    }
    only_buckets_.emplace();
    for (const auto& b : owned) only_buckets_->push_back(b.bucket);
    struct Unscope {
      std::optional<std::vector<int>>& scope;
      ~Unscope() { scope.reset(); }
    } unscope{only_buckets_};
    return Claim(destination, cursor, fresh_limit, slow_limit, lease);
  }

  // Bucket leases: as ClaimPartitioned, in the buckets still owned, and nothing leased.
  ClaimResult ClaimOwned(const std::string& destination, std::int64_t cursor, int fresh_limit,
                         int slow_limit, Millis lease, const std::string& instance_id,
                         const std::vector<BucketLease>& owned) override {
    {
      std::lock_guard lk(db_.mu_);
      ++db_.calls_["claim_owned"];
    }
    reads_only_ = true;
    struct Unscope {
      bool& reads_only;
      ~Unscope() { reads_only = false; }
    } unscope{reads_only_};
    auto out =
        ClaimPartitioned(destination, cursor, fresh_limit, slow_limit, lease, instance_id, owned);
    std::function<void()> hook;
    {
      std::lock_guard lk(db_.mu_);
      if (cursor == 0) hook.swap(db_.after_owned_claim_from_start_);
    }
    if (hook) hook();
    return out;
  }

  const std::string& last_claim_token() const override { return last_token_; }

 private:
  std::optional<std::vector<int>> only_buckets_;  ///< Set during ClaimPartitioned.
  bool reads_only_ = false;                       ///< Set during ClaimOwned.
  /// Set during SettleOwned: the buckets a settle may write in.
  std::optional<std::vector<BucketLease>> fence_;

 public:
  std::int64_t ReleaseLostClaims(const std::vector<std::string>& tokens) override {
    std::function<void()> hook;
    {
      std::lock_guard lk(db_.mu_);
      hook.swap(db_.before_release_lost_claims_);
    }
    if (hook) hook();
    std::lock_guard lk(db_.mu_);
    db_.Enter("release_lost_claims");
    std::int64_t n = 0;
    for (auto& [id, r] : db_.rows_) {
      if (r.lease_owner &&
          std::find(tokens.begin(), tokens.end(), *r.lease_owner) != tokens.end()) {
        Requeue(r);
        ++n;
      }
    }
    return n;
  }

  SettleCounts Settle(const std::vector<Settlement>& settlements, bool,
                      const std::string& instance_id) override {
    std::function<void()> hook;
    {
      std::lock_guard lk(db_.mu_);
      hook.swap(db_.before_settle_);
    }
    if (hook) hook();
    const bool misses_its_wakes = static_cast<bool>(hook);
    std::lock_guard lk(db_.mu_);
    db_.Enter("settle");
    db_.settled_as_.insert(instance_id);
    SettleCounts c;
    bool wake_all = false;
    for (const auto& s : settlements) {
      const auto it = db_.rows_.find(Raw(s.id));
      if (it == db_.rows_.end()) {
        ++c.gone;
        continue;
      }
      auto& r = it->second;
      if (fence_ ? !StillOwned(Raw(s.id)) : r.lease_owner != s.lease_token) {
        ++c.fenced;
        continue;
      }
      if (db_.key_locks_held_ && s.kind == Settlement::Kind::kFanOut &&
          std::any_of(s.children.begin(), s.children.end(),
                      [](const auto& child) { return child.kind != Settlement::Kind::kDead; })) {
        c.deferred.push_back(s.id);
        continue;
      }
      switch (s.kind) {
        case Settlement::Kind::kFanOut:  // the fake keeps no endpoint rows: counted only
          c.spawned += static_cast<std::int64_t>(s.children.size());
          [[fallthrough]];
        case Settlement::Kind::kDelivered:
        case Settlement::Kind::kDead: {
          const FakeDatabase::Row gone = r;
          db_.rows_.erase(it);
          const bool dead = s.kind == Settlement::Kind::kDead;
          (dead ? db_.dead_ : db_.delivered_).push_back(gone.id);
          ++(dead ? c.dead : c.delivered);
          if (!misses_its_wakes) c.woken += db_.WakeSuccessor(gone);
          c.written.push_back(s.id);
          break;
        }
        case Settlement::Kind::kRetry:
          Requeue(r);
          r.attempts += 1;
          r.deliver_after = db_.clock_.WallNow() + s.delay;
          ++c.retried;
          c.written.push_back(s.id);
          break;
        case Settlement::Kind::kRelease:
          Requeue(r);
          ++c.released;
          c.written.push_back(s.id);
          wake_all = wake_all || s.delay <= Millis(0);
          break;
      }
    }
    if (wake_all) db_.Notify();  // handed back due now: the other relays may claim it
    return c;
  }

  // Bucket leases: as Settle, fenced by the buckets still owned instead of by lease tokens.
  SettleCounts SettleOwned(const std::vector<Settlement>& settlements, bool archive,
                           const std::string& instance_id,
                           const std::vector<BucketLease>& owned) override {
    for (const auto& s : settlements) {
      if (s.kind == Settlement::Kind::kFanOut && !s.children.empty())
        throw std::invalid_argument("FakeStore::SettleOwned: a fan-out that leaves endpoints rows");
    }
    {
      std::lock_guard lk(db_.mu_);
      ++db_.calls_["settle_owned"];
    }
    fence_ = owned;
    struct Unscope {
      std::optional<std::vector<BucketLease>>& fence;
      ~Unscope() { fence.reset(); }
    } unscope{fence_};
    return Settle(settlements, archive, instance_id);
  }

  std::vector<MessageId> RenewLeases(const std::vector<std::pair<MessageId, std::string>>& held,
                                     Millis lease) override {
    std::function<void()> hook;
    {
      std::lock_guard lk(db_.mu_);
      hook.swap(db_.before_renew_);
    }
    if (hook) hook();
    std::lock_guard lk(db_.mu_);
    db_.Enter("renew");
    std::vector<MessageId> renewed;
    if (db_.rows_locked_) return renewed;
    for (const auto& [id, token] : held) {
      if (db_.locked_for_renewals_.count(Raw(id)) > 0) continue;
      const auto it = db_.rows_.find(Raw(id));
      if (it == db_.rows_.end() || it->second.lease_owner != token) continue;
      it->second.lease_until = db_.clock_.WallNow() + lease;
      renewed.push_back(id);
    }
    db_.renewed_ += static_cast<std::int64_t>(renewed.size());
    return renewed;
  }

  std::vector<std::string> Reap(Millis queue_scan_every) override {
    std::chrono::milliseconds stall{0};
    {
      std::lock_guard lk(db_.mu_);
      stall = std::exchange(db_.reap_stall_, std::chrono::milliseconds{0});
      db_.reap_stalled_ = stall.count() > 0;
    }
    if (stall.count() > 0) {
      std::this_thread::sleep_for(stall);  // a slow statement on this connection alone
      std::lock_guard lk(db_.mu_);
      db_.reap_stalled_ = false;
    }
    std::lock_guard lk(db_.mu_);
    db_.Enter("reap");
    db_.queue_scan_intervals_.push_back(queue_scan_every);
    std::vector<std::string> out;
    const auto now = db_.clock_.WallNow();
    for (auto& [id, r] : db_.rows_) {
      if (r.lease_owner && r.lease_until < now) {
        Requeue(r);
        r.attempts += 1;
        out.push_back(r.destination);
      }
    }
    if (!out.empty()) db_.Notify();  // reap.sql wakes every relay
    return out;
  }

  OrphanPage WakeOrphans(const std::string& destination, std::int64_t after, int rows) override {
    std::lock_guard lk(db_.mu_);
    db_.Enter("wake_orphans");
    return db_.WakeBlockedPage(destination, after, rows);
  }
  std::int64_t WakeKeys(const std::string& destination,
                        const std::vector<BlockedKey>& keys) override {
    std::lock_guard lk(db_.mu_);
    db_.Enter("wake_keys");
    db_.keys_asked_to_wake_.insert(db_.keys_asked_to_wake_.end(), keys.begin(), keys.end());
    std::set<std::string> set;  // an endpoint row's key names its endpoint already
    for (const auto& k : keys) set.insert(k.key);
    return db_.WakeBlocked(destination, &set);
  }

  // One relay: it owns the buckets OwnBuckets names (every one, unless a test says otherwise)
  // while it beats, none once it leaves. Those HandOver names come back handing until the relay
  // releases them, which gives them away.
  std::vector<BucketLease> Coordinate(const std::string& instance_id, Millis, bool leaving,
                                      const std::string&, bool, bool,
                                      const std::vector<int>& released, Millis) override {
    std::lock_guard lk(db_.mu_);
    db_.Enter(leaving ? "coordinate_leave" : "coordinate");
    db_.coordinated_as_ = instance_id;
    if (leaving) return {};
    for (const int b : released) {
      db_.released_.push_back(b);
      if (db_.handing_.erase(b) > 0) std::erase(db_.owned_buckets_, b);
    }
    std::vector<BucketLease> out;
    for (const int b : db_.owned_buckets_) out.push_back({b, 1, db_.handing_.count(b) > 0});
    return out;
  }
  void Heartbeat(const std::string&, const std::vector<std::string>&, const std::string&,
                 const std::map<std::string, TargetHealth>&, bool) override {
    std::lock_guard lk(db_.mu_);
    db_.Enter("heartbeat");
  }
  void Leave(const std::string&) override {}
  std::vector<std::string> Destinations() override {
    std::lock_guard lk(db_.mu_);
    std::set<std::string> names;
    for (const auto& [id, r] : db_.rows_) names.insert(r.destination);
    return {names.begin(), names.end()};
  }
  std::map<std::string, std::int64_t> LiveRelays(Millis) override { return {}; }
  std::map<std::string, std::string> PausedDestinations() override {
    std::lock_guard lk(db_.mu_);
    try {
      db_.Enter("paused");
    } catch (const StoreError&) {
      if (db_.failures_lose_connection_) connected_ = false;  // until Reset
      throw;
    }
    return db_.paused_;
  }

  // As PostgreSQL: a connection hears the notifications sent after its LISTEN, none before
  // (those sent while it was down are lost). Fails like any call ("listen").
  void Listen() override {
    {
      std::lock_guard lk(db_.mu_);
      db_.Enter("listen");
    }
    if (listening_) return;
    {
      std::lock_guard lk(db_.mu_);
      ++db_.calls_["subscribe"];  // a LISTEN on a fresh connection
    }
    std::lock_guard lk(db_.notify_mu_);
    seen_ = db_.notifications_;
    listening_ = true;
  }
  bool WaitForNotification(Millis timeout) override {
    std::unique_lock lk(db_.notify_mu_);
    const bool got =
        db_.notify_cv_.wait_for(lk, timeout, [&] { return db_.notifications_ != seen_; });
    seen_ = db_.notifications_;
    return got;
  }
  bool TakeRebalance() override {
    std::lock_guard lk(db_.notify_mu_);
    return std::exchange(db_.rebalance_, false);
  }

  StatusSnapshot ReadStatus(const StatusOptions&) override {
    std::function<void()> hook;
    {
      std::lock_guard lk(db_.mu_);
      db_.Enter("status");
      hook.swap(db_.before_read_status_);
    }
    if (hook) hook();
    return {};
  }
  // With a backlog set, every call deletes all it may, taking per_row each.
  std::int64_t CleanupArchive(const std::vector<std::string>&, std::chrono::seconds, int,
                              std::int64_t max_rows) override {
    std::chrono::microseconds per_row{0};
    {
      std::lock_guard lk(db_.mu_);
      db_.Enter("cleanup_archive");
      per_row = db_.cleanup_per_row_;
    }
    if (per_row.count() == 0) return 0;
    std::this_thread::sleep_for(per_row * max_rows);
    return max_rows;
  }
  std::int64_t CleanupDeadLetters(const std::vector<std::string>&, std::chrono::seconds, int,
                                  std::int64_t) override {
    return 0;
  }

  void Reset() override {
    listening_ = false;
    connected_ = true;
  }
  bool Connected() const override { return connected_; }

 private:
  // db_.mu_ held. Whether the row's bucket is one the settle's relay named and still owns.
  bool StillOwned(std::int64_t id) const {
    const int bucket = static_cast<int>(id % FakeDatabase::kBuckets);
    return std::any_of(fence_->begin(), fence_->end(),
                       [&](const BucketLease& b) { return b.bucket == bucket; }) &&
           std::find(db_.owned_buckets_.begin(), db_.owned_buckets_.end(), bucket) !=
               db_.owned_buckets_.end();
  }

  // Back to the queue, due now (a retry then sets its own time).
  void Requeue(FakeDatabase::Row& r) {
    r.lease_owner.reset();
    r.parked = true;
    r.deliver_after = db_.clock_.WallNow();
  }

  FakeDatabase& db_;
  std::string last_token_;
  std::uint64_t seen_ = 0;
  bool listening_ = false;
  std::atomic<bool> connected_{true};
};

inline StoreFactory FakeDatabase::Stores() {
  return [this]() -> std::unique_ptr<QueueStore> { return std::make_unique<FakeStore>(*this); };
}

}  // namespace outbox::relay::testing
