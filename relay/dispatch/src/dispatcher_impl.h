// The dispatcher's shared state and its threads, one file each:
//   claim_loop.cc   one per destination: claim -> SubmitMany to the sink (+ blocked-key rechecks,
//                   the sweep, handing back lost claims)
//   settler.cc      writes outcomes in batches
//   listener.cc     LISTEN: wakes the claim loops
//   maintenance.cc  reaper, orphan waker, lease renewal, heartbeat, retention, status gauges
//   coordinator.cc  claim_mode partitioned: heartbeats and bucket ownership
//   dispatcher.cc   construction, Start/Stop, Prepare (the sink's completion -> settler)
// Who owns what is written next to each member: "const after Start" members are set before
// any thread starts and only read afterwards; "guarded by X" members are touched only with X
// held; "<thread> only" members belong to one thread.
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "outbox_relay/clock.h"
#include "outbox_relay/dispatcher.h"
#include "outbox_relay/metrics.h"
#include "outbox_relay/queue_store.h"
#include "room_wait.h"

namespace outbox::relay {

using SteadyTime = Clock::Steady::time_point;
using SteadyClockTime = std::chrono::steady_clock::time_point;  // the sinks' clock

/// The W3C trace id (32 hex digits) of a message's "traceparent" header, or "".
std::string TraceIdOf(const Message& msg);

struct Dispatcher::Impl {
  // A destination's sink room, shared by its claim loops (claim_connections of them).
  using RoomWait = relay::RoomWait;
  // A claim loop's share of its destination's room, from before its claim until what it
  // claimed is in the sink (counted by InFlight): given back by Release, or when it goes out
  // of scope (a claim that failed).
  class RoomShare {
   public:
    explicit RoomShare(RoomWait& room) : room_(room) {}
    ~RoomShare() { Release(); }
    RoomShare(const RoomShare&) = delete;
    RoomShare& operator=(const RoomShare&) = delete;
    // Of the room left (`limit` less what is in flight and what the other loops are claiming),
    // takes up to `want` when at least `worth` is left. Returns what it took (0: none).
    int Take(int limit, const Sink& sink, int worth, int want);
    // max_in_flight_bytes (`budget` > 0): of the rows taken, how many fit the bytes left (the
    // budget less what the sink holds and the other loops' claims may bring) at `estimate`
    // bytes each, and takes their bytes. At least 1 while nothing is held or claimed, else 0
    // when none fits. Without a budget: `rows`.
    int TakeBytes(int rows, std::int64_t budget, std::int64_t estimate);
    // Gives the share back, and wakes the destination's loops waiting for room or bytes when it
    // held any (completions do not wake a loop whose room this share filled: RoomWait::TakeWake;
    // a loop waiting for bytes arms no mark). Also when it goes out of scope: a claim that
    // failed, or found no bytes to take, gives its rows back the same way.
    void Release();

   private:
    RoomWait& room_;
    int taken_ = 0;
    std::int64_t taken_bytes_ = 0;
  };

  // --- const after Start ---
  RelayConfig config;
  std::map<std::string, SinkPtr> sinks;  // the sinks themselves are thread-safe
  StoreFactory stores;                   // called once by each thread, at its start
  const Clock* clock = &RealClock();
  // Every event is recorded here (thread-safe): the caller's metrics, or owned_metrics.
  RelayMetrics* metrics = nullptr;
  std::unique_ptr<RelayMetrics> owned_metrics;
  bool publish_status = false;  // the caller gave metrics: keep the queue gauges current
  // What a claim loop's first claim expects each payload to be (DispatcherEnv::max_payload_bytes).
  std::int64_t first_payload_estimate = 0;
  // Each destination's outbox_delivery_duration_seconds series, looked up once.
  std::map<std::string, metrics::Histogram*> attempt_durations;
  Millis status_interval{5000};
  std::vector<std::string> destination_names;
  // One per destination; shared with the outbox_sink_payload_bytes gauge, which a scrape may
  // read while the dispatcher goes.
  std::map<std::string, std::shared_ptr<RoomWait>> room_waits;
  // Each destination's claim loops: claim_connections, or (auto) what its sink asks for.
  std::map<std::string, int> claim_loops;
  std::string instance_id = NewUuid();
  std::string description;  // host and pid, for heartbeats

  SteadyTime Now() const { return clock->Now(); }

  // --- any thread ---
  std::atomic<bool> sweep_find_logged{false};
  std::atomic<bool> stopping{false};
  // The coordinator's own stop (claim_mode partitioned): set with `stopping`, or, when a sink
  // fences the next owner as it starts (Sink::FencesOthersWhenItStarts), after the sinks shut
  // down and the settles were written, so the buckets move only then.
  std::atomic<bool> coordinator_stopping{false};
  std::atomic<bool> db_ok{false};  // the last claim reached the database (readiness)
  // Bucket leases: a claim loop waits after a claim that read only rows the relay holds; the
  // next settle (which takes some of them out of the lane) wakes it.
  std::atomic<bool> waiting_for_settles{false};
  // The maintenance loop's own stop: after the sinks finished and the settles were written.
  // Until then a stopping relay goes on renewing the leases of what its sinks still hold.
  std::atomic<bool> maintenance_stopping{false};

  void DbError() { metrics->RecordDbError(); }

  // --- wake-ups of the claim loops (and the coordinator) ---
  std::mutex mu;
  std::condition_variable wake_cv;   // new messages, a backlog, stop (room: RoomWait::Wait)
  std::uint64_t wake_gen = 0;        // guarded by mu
  bool rebalance_requested = false;  // guarded by mu
  /// NOTIFY 'rebalance's heard (outbox.set_bucket_count, a relay leaving); guarded by mu.
  std::uint64_t rebalance_gen = 0;

  void Wake();
  // Every relay's heartbeat (outbox.relay_heartbeat, migration 0037): no claim before one is
  // accepted, nor while the last was refused for good (a live relay of the other lease mode
  // serves one of this relay's destinations: it would lease rows that relay holds in memory,
  // or the other way round). Guarded by mu.
  bool heartbeat_accepted = false;
  std::string heartbeat_refused;  // guarded by mu: what the database said; empty once accepted
  SteadyTime heartbeat_refusal_logged{};  // guarded by mu: when the refusal was last logged
  // Whether a refusal saying `what` (replacing `last`, logged at `logged`) is logged now: when it
  // begins or changes, then about once a relay heartbeat period (a tenth of slack: the
  // maintenance loop's period starts before its call, `now` after it), however often it is
  // tried (the coordinator: every partition_heartbeat). Updates `last` and `logged`.
  static bool LogRefusalNow(std::string& last, SteadyTime& logged, const std::string& what,
                            SteadyTime now);
  // Writes this relay's heartbeat and records whether it was accepted; a refusal (a permanent
  // StoreError) is logged and recorded, then thrown like any other error.
  void Beat(QueueStore& store);
  // Waits up to `d` or until stopping; returns early when `pred` holds (checked under mu).
  template <class Pred>
  void WaitFor(Millis d, Pred pred) {
    std::unique_lock lk(mu);
    wake_cv.wait_for(lk, d, [&] { return stopping.load() || pred(); });
  }

  // --- outcomes on their way to the settler ---
  std::mutex settle_mu;
  std::condition_variable settle_cv;
  std::vector<Settlement> settle_queue;  // guarded by settle_mu
  std::int64_t unsettled = 0;  // guarded by settle_mu: submitted or queued, not yet written
  // Every message from Submit until the settler wrote its outcome: the lease token of its
  // latest claim (the maintenance loop renews these leases, so none expires while its message
  // is still ours), whether the sink still has it (until its completion), and whether the
  // outcome on its way to the settler removes it from the queue (delivered, dead, fanned out).
  // A message claimed again meanwhile (its lease ran out while this relay stalled or the
  // database was away, or a fence) is not given to the sink a second time while a copy is in
  // the sink or a removing outcome is unsettled: that one settles the new claim, under the
  // token held here (the settler takes it before each try, and tries once more when a write
  // was fenced because the claim came while it ran). After an unsettled retry or release the
  // new claim is sent as usual.
  struct Held {
    std::string token;
    bool in_sink = false;
    bool removes = false;
    // Until when the claim holds (the message in the sink shares it: a sink sends nothing
    // whose claim ran out, ClaimRunsOut): moved on by each renewal of its lease, and by a
    // claim of it again while its copy is still in the sink.
    std::shared_ptr<ClaimCover> cover;
    // Its key (with its endpoint): a settle slow enough to have raced a claim past the claim
    // loop's rechecks wakes it again once committed (SettleLoop).
    std::optional<BlockedKey> key;
    int bucket = 0;  // bucket leases: what a handover waits for (IdleHandingBuckets)
  };
  std::unordered_map<std::int64_t, Held> held_leases;  // guarded by settle_mu
  // Bucket leases (config.bucket_leases): a claim reads rows without leasing them, so one that
  // reads from the start of the lane again (the sweep, a change of buckets) finds what is in
  // the sink (held_leases: not sent twice) and, from a snapshot taken before a settle
  // committed, what was settled while it ran: those are not sent again either (DropHeld, by
  // the claim loop as the claim returns). Each removing outcome's id is kept with a mark of
  // when the settler wrote it for as long as a read that began before then (a lower mark) is
  // in progress (reads_in_progress, from before the claim statement until DropHeld).
  // A bucket being handed over (BucketLease::handing) is given up only once nothing read from
  // it is left: no read in progress that includes it, none of its messages between the read
  // and Prepare (unprepared), none in held_leases.
  std::uint64_t settle_mark = 0;  // guarded by settle_mu: counts reads begun and settles written
  std::unordered_map<std::int64_t, std::uint64_t> settled_at;       // guarded by settle_mu
  std::deque<std::pair<std::int64_t, std::uint64_t>> settled_order;  // guarded by settle_mu
  // guarded by settle_mu: each read's mark and the buckets it reads
  std::map<std::uint64_t, std::vector<int>> reads_in_progress;
  // guarded by settle_mu: what reads returned and the hand-off has not put in held_leases yet,
  // by id, with its bucket
  std::unordered_map<std::int64_t, int> unprepared;
  // settle_mu held: forgets what no read in progress can have seen unsettled.
  void ForgetSettledBefore();
  // Bucket leases: takes out of `claim` (messages and fresh lane) what this relay has in its
  // sink, on its way there (an earlier claim's, not through the hand-off yet) or settled since
  // the read began (`read`, ended here), and counts the rest as unprepared until the hand-off
  // has put them in held_leases (Prepared). Returns how many it took out.
  class ReadInProgress;
  std::size_t DropHeld(ClaimResult& claim, std::unique_ptr<ReadInProgress> read);
  void Prepared(const std::vector<MessageId>& ids);
  // Bucket leases: a claim's read, from before its statement until DropHeld. Takes the buckets
  // it may read (those owned and not being handed over) under the same lock as the coordinator
  // looks for reads of a bucket it hands over: a read either includes a bucket before it is
  // marked handing, and is seen, or excludes it.
  class ReadInProgress {
   public:
    explicit ReadInProgress(Impl& d);
    ~ReadInProgress();
    ReadInProgress(const ReadInProgress&) = delete;
    ReadInProgress& operator=(const ReadInProgress&) = delete;
    std::uint64_t mark() const { return it_->first; }
    const std::vector<BucketLease>& buckets() const { return buckets_; }

   private:
    Impl& d_;
    std::vector<BucketLease> buckets_;
    std::map<std::uint64_t, std::vector<int>>::iterator it_;
  };
  // settle_mu held: of the buckets `owned` marks handing, those nothing read from is left of.
  std::vector<int> IdleHandingBuckets(const std::vector<BucketLease>& owned);
  bool settler_stop = false;                           // guarded by settle_mu
  bool settler_give_up = false;                        // guarded by settle_mu

  void Enqueue(Settlement s);
  // settle_mu held. A removing outcome of a message claimed again meanwhile (its lease ran
  // out) is written under the new claim's token.
  void TakeLatestToken(Settlement& s);
  // settle_mu held. Outcomes that will not be written (shutdown): their messages are
  // delivered again once their leases expire. Clears `outcomes`.
  void LeaveToTheirLeases(std::vector<Settlement>& outcomes);
  // Whether `s` takes its message out of the queue (delivered, dead, fanned out).
  static bool Removes(const Settlement& s) {
    return s.kind == Settlement::Kind::kDelivered || s.kind == Settlement::Kind::kDead ||
           s.kind == Settlement::Kind::kFanOut;
  }
  // Enqueue for a sink's completion: the message leaves the sink, and the settlement takes the
  // lease token of the message's latest claim.
  void EnqueueCompleted(Settlement s);
  // What to hand `sink` for `msg`: the message and its completion, which (on a sink thread)
  // turns the outcome into a settlement for the settler; or nothing, when the message was
  // dead-lettered here (its attempts spent) or is still in the sink under an earlier claim.
  // The claim loop hands a claim's messages over at once (Sink::SubmitMany).
  // `cover`: bucket leases, its bucket's (CoversOf), which its claim then follows.
  std::optional<std::pair<Message, Sink::Completion>> Prepare(
      const Destination& dest, Sink& sink, const std::string& token, Message msg, RoomWait& room,
      std::shared_ptr<ClaimCover> cover = nullptr);
  void RecordAttempt(const Destination& d, const Sink& sink, const Outcome& outcome,
                     SteadyTime submitted);
  void LogOutcome(const Destination& d, MessageId id, const std::string& trace,
                  const Outcome& outcome, const Settlement& s);

  // --- destinations operators paused (outbox.paused_destinations), read by maintenance ---
  std::mutex paused_mu;                       // taken after mu, never before it
  std::map<std::string, std::string> paused;  // guarded by paused_mu: destination -> reason
  bool IsPaused(const std::string& destination);
  // Applies a fresh read of the paused destinations: logs and publishes changes, wakes the
  // claim loops on a resume.
  void UpdatePaused(std::map<std::string, std::string> now);
  // Reads the paused destinations on `store` and applies them, unless the other reader (the
  // listener, maintenance) is doing so now: one read and its application at a time, so an
  // older read is never applied after a newer one. A read that fails on a connection still
  // open (a statement timeout, a grant revoked) is counted and logged, and the caller goes on
  // (the next read is a second away); a lost connection is thrown, for the caller's reconnect.
  void RefreshPaused(QueueStore& store);
  std::mutex pause_read_mu;
  bool pause_read_failing = false;  // guarded by pause_read_mu

  // --- claim_mode partitioned: the buckets this relay owns ---
  std::mutex owned_mu;
  std::vector<BucketLease> owned;  // guarded by owned_mu; written by the coordinator
  // Bucket leases: what the last successful heartbeat returned, which the settles are fenced
  // by (the database checks the epochs); not cleared when heartbeats fail, as `owned` is for
  // the claims. Guarded by owned_mu.
  std::vector<BucketLease> settle_buckets;
  // What the database said when it last refused this relay's heartbeat for good (a relay of the
  // other lease mode is live: migration 0035); empty once one succeeds. Guarded by owned_mu.
  std::string coordinator_refused;
  SteadyTime coordinator_refusal_logged{};  // guarded by owned_mu
  std::vector<BucketLease> OwnedBuckets();
  // Bucket leases: each owned bucket's cover at its epoch, until when it is surely this
  // relay's: the start of the last successful heartbeat that returned it at that epoch, plus
  // partition_lease_ms. The cover of every message read from it (Message::claim_cover): a sink
  // that checks sends nothing once it has run out, as a claim's lease under row leases. A
  // bucket that moved, or came back at another epoch, keeps its old cover for what was read
  // from it, and that runs out. Guarded by owned_mu.
  std::map<int, std::pair<std::int64_t, std::shared_ptr<ClaimCover>>> bucket_covers;
  // owned_mu held: after a heartbeat that began at `asked` and returned `now_owned`.
  void CoverBuckets(const std::vector<BucketLease>& now_owned, SteadyClockTime asked);
  // The covers of messages read from `buckets` at their epochs, by bucket (one that has run
  // out for a bucket no longer held at that epoch).
  std::map<int, std::shared_ptr<ClaimCover>> CoversOf(const std::vector<BucketLease>& buckets);
  // The buckets to claim from: those owned, less those being handed over (bucket leases).
  std::vector<BucketLease> ClaimableBuckets();

  // --- the stores of the threads that talk to the database, for Stop ---
  // A statement can hang (a lock held elsewhere, a database that stopped answering): Stop
  // waits for such a thread only so long, then cuts the statement it is stuck in.
  enum class Role { kClaim, kCoordinator, kSettler, kMaintenance, kStatus };
  std::mutex live_mu;
  std::condition_variable live_cv;               // a thread let go of its store
  std::multimap<Role, QueueStore*> live_stores;  // guarded by live_mu
  // Held by a thread for as long as it uses `store`.
  class LiveStore {
   public:
    LiveStore(Impl& d, Role role, QueueStore& store);
    ~LiveStore();
    LiveStore(const LiveStore&) = delete;
    LiveStore& operator=(const LiveStore&) = delete;

   private:
    Impl& d_;
    std::multimap<Role, QueueStore*>::iterator it_;
  };
  // Waits up to `budget` for the threads of `role` to let go of their stores, then interrupts
  // the stores still held (QueueStore::Interrupt). Stop only.
  void InterruptAfter(Role role, Millis budget);

  // --- the threads (Start/Stop only) ---
  std::vector<std::thread> loops;
  std::thread settler, listener, maintenance, coordinator, status_reader;
  bool started = false, stopped = false;

  // claim_loop.cc; `index` 0 is the destination's first loop (claim_connections).
  void ClaimLoop(const Destination& dest, Sink& sink, int index);
  void RecordSweepFinds(const Destination& dest, const std::vector<MessageId>& missed,
                        const ClaimFacts& facts);
  void SettleLoop();  // settler.cc
  void RecordSettled(const std::vector<Settlement>& batch, const SettleCounts& c);
  void ListenLoop();                                               // listener.cc
  void MaintenanceLoop();                                          // maintenance.cc
  void StatusLoop();                                               // maintenance.cc
  bool RenewHeldLeases(QueueStore& store);                         // maintenance.cc
  SteadyTime NextRenewal(SteadyTime now, bool all_renewed) const;  // maintenance.cc
  Millis RenewPeriod() const;                                      // maintenance.cc
  void PauseAfterFailure(Millis pause);                            // maintenance.cc
  std::map<std::string, TargetHealth> TargetHealths() const;       // of the sinks that keep one
  void WarnAboutUnservedDestinations(QueueStore& store);
  std::set<std::string> warned_unserved;  // maintenance thread only
  void CoordinatorLoop();                 // coordinator.cc
};

}  // namespace outbox::relay
