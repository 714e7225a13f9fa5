#include "outbox_relay/dispatcher.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "outbox_relay/clock.h"
#include "outbox_relay/fresh_cursor.h"
#include "outbox_relay/metrics.h"
#include "outbox_relay/retry.h"
#include "outbox_relay/status.h"
#include "outbox_relay/store.h"

namespace outbox::relay {
namespace {

using SteadyTime = Clock::Steady::time_point;

// How often each relay records in outbox.relay_heartbeats that it is alive and which
// destinations it serves, and after how long without one a relay no longer counts (the
// status read uses the same expiry: StatusOptions::relay_heartbeat_expiry).
constexpr Millis kRelayHeartbeat{5'000};
constexpr Millis kRelayHeartbeatExpiry{30'000};

double Uniform01() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return std::uniform_real_distribution<double>(0.0, 1.0)(rng);
}

// Backoff for reconnecting to the database: 100 ms doubling to 5 s.
Millis ReconnectDelay(int failures) {
  return Millis(std::min<long long>(5000, 100LL << std::min(failures, 6)));
}

}  // namespace

struct Dispatcher::Impl {
  RelayConfig config;
  std::map<std::string, SinkPtr> sinks;
  StoreFactory stores;
  const Clock* clock = &RealClock();
  SteadyTime Now() const { return clock->Now(); }
  DispatcherStats stats;
  RelayMetrics* metrics = nullptr;  // optional
  Millis status_interval{5000};

  void DbError() {
    ++stats.db_errors;
    if (metrics) metrics->RecordDbError();
  }

  std::atomic<bool> stopping{false};
  std::atomic<bool> db_ok{false};
  std::mutex mu;                    // guards the condition variables' predicates below
  std::condition_variable wake_cv;  // claim loops: new messages, room in flight, stop
  std::uint64_t wake_gen = 0;

  std::mutex settle_mu;
  std::condition_variable settle_cv;
  std::vector<Settlement> settle_queue;
  std::int64_t unsettled = 0;  // submitted or queued, not yet written by the settler
  // The lease token of every message from Submit until the settler wrote its outcome: the
  // maintenance loop renews these leases, so none expires while its message is still ours.
  std::unordered_map<std::int64_t, std::string> held_leases;  // guarded by settle_mu
  bool settler_stop = false;

  std::vector<std::thread> loops;
  std::thread settler, listener, maintenance;
  bool started = false, stopped = false;

  void Wake() {
    {
      std::lock_guard lk(mu);
      ++wake_gen;
    }
    wake_cv.notify_all();
  }

  // Waits up to `d` or until stopping; returns early when `pred` holds.
  template <class Pred>
  void WaitFor(Millis d, Pred pred) {
    std::unique_lock lk(mu);
    wake_cv.wait_for(lk, d, [&] { return stopping.load() || pred(); });
  }

  void Enqueue(Settlement s) {
    {
      std::lock_guard lk(settle_mu);
      settle_queue.push_back(std::move(s));
    }
    settle_cv.notify_one();
  }

  void ClaimLoop(const Destination& dest, Sink& sink) {
    const auto owned_store = stores();
    QueueStore& store = *owned_store;
    FreshCursor cursor;
    const bool partitioned = config.claim_mode == ClaimMode::kPartitioned;
    std::vector<BucketLease> last_buckets;
    std::deque<std::pair<std::string, SteadyTime>> recheck;  // recently blocked keys
    std::vector<std::string> lost_claims;  // tokens of claims that failed: maybe committed
    auto next_recheck = Now();
    const int batch = dest.batch_size > 0 ? dest.batch_size : config.batch_size;
    const int cap = static_cast<int>(sink.MaxInFlight(batch));
    auto last_sweep = Now();
    int failures = 0;
    std::uint64_t seen_gen;
    {
      std::lock_guard lk(mu);
      seen_gen = wake_gen;
    }
    while (!stopping) {
      if (Now() - last_sweep >= config.full_sweep_interval) {
        cursor.StartSweep();
        last_sweep = Now();
      }
      const int room = cap - static_cast<int>(sink.InFlight());
      if (room <= 0) {
        WaitFor(Millis(50), [&] { return static_cast<int>(sink.InFlight()) < cap; });
        continue;
      }
      const int fresh_limit = std::min(batch, room);
      const int slow_limit = std::max(1, fresh_limit / 2);
      ClaimResult claim;
      std::vector<BucketLease> buckets;
      if (partitioned) {
        buckets = OwnedBuckets();
        // Buckets this relay just gained hold rows below the cursor, which so far only
        // scanned the buckets it owned: start the lane over.
        if (buckets != last_buckets) {
          cursor.Reset();
          last_buckets = buckets;
        }
        if (buckets.empty()) {  // nothing assigned (yet): wait for the coordinator
          std::unique_lock lk(mu);
          wake_cv.wait_for(lk, config.poll_interval,
                           [&] { return stopping.load() || wake_gen != seen_gen; });
          seen_gen = wake_gen;
          continue;
        }
      }
      // Claims that failed may have committed with their reply lost (the database restarted,
      // the connection broke): hand back what they leased before claiming again, so their
      // keys move within a reconnect instead of after the whole lease.
      if (!lost_claims.empty()) {
        try {
          const auto released = store.ReleaseLostClaims(lost_claims);
          if (released > 0) {
            spdlog::warn("{}: handed back {} message(s) leased by a claim whose reply was lost",
                         dest.name, released);
            Wake();
          }
          lost_claims.clear();
        } catch (const std::exception& e) {
          DbError();
          store.Reset();
          WaitFor(ReconnectDelay(++failures), [] { return false; });
          continue;
        }
      }
      const auto claim_started = Now();
      try {
        if (partitioned) {
          const int per_bucket = std::max(1, (fresh_limit + static_cast<int>(buckets.size()) - 1) /
                                                 static_cast<int>(buckets.size()));
          claim = store.ClaimPartitioned(dest.name, cursor.position(), per_bucket, slow_limit,
                                         config.lease, instance_id, buckets);
        } else {
          claim = store.Claim(dest.name, cursor.position(), fresh_limit, slow_limit, config.lease);
        }
        if (failures > 0) spdlog::info("{}: database reachable again", dest.name);
        failures = 0;
        db_ok = true;
      } catch (const std::exception& e) {
        DbError();
        db_ok = false;
        if (!store.last_claim_token().empty()) lost_claims.push_back(store.last_claim_token());
        if (failures++ == 0)
          spdlog::warn("{}: claim failed, reconnecting: {}", dest.name, e.what());
        store.Reset();
        cursor.Reset();
        WaitFor(ReconnectDelay(failures), [] { return false; });
        continue;
      }
      {
        const auto before = cursor.position();
        if (const auto missed = cursor.Missed(claim.fresh_lane); !missed.empty()) {
          RecordSweepFinds(dest, missed, claim.facts);
        }
        cursor.Observe(claim.facts);
        if (spdlog::should_log(spdlog::level::trace)) {
          spdlog::trace(
              "{}: claim cursor {} -> {} seq {} xmin {} xid {} fresh {} leased {} parked {}",
              dest.name, before, cursor.position(), claim.facts.seq_value, claim.facts.snap_xmin,
              claim.facts.own_xid, claim.facts.fresh_scanned, claim.messages.size(),
              claim.facts.held);
        }
      }
      if (metrics) {
        metrics->RecordClaim(dest.name, static_cast<std::int64_t>(claim.messages.size()),
                             std::chrono::duration<double>(Now() - claim_started));
      }
      ++stats.claims;
      if (claim.messages.empty()) ++stats.empty_claims;
      stats.claimed += static_cast<std::int64_t>(claim.messages.size());
      for (auto& msg : claim.messages) Submit(dest, sink, claim.lease_token, std::move(msg));
      // Keys this claim blocked may have lost their predecessor while it ran (its settle
      // committed after our snapshot): recheck them for a second, every 50 ms, so they do not
      // wait for the periodic orphan sweep.
      for (auto& key : claim.facts.blocked_keys) recheck.emplace_back(std::move(key), Now());
      if (!recheck.empty() && Now() >= next_recheck) {
        next_recheck = Now() + Millis(50);
        while (!recheck.empty() && Now() - recheck.front().second > Millis(1000)) {
          recheck.pop_front();
        }
        std::vector<std::string> keys;
        keys.reserve(recheck.size());
        for (const auto& entry : recheck) keys.push_back(entry.first);
        try {
          if (store.WakeKeys(dest.name, keys) > 0) continue;  // claim the woken rows now
        } catch (const std::exception& e) {
          DbError();
          spdlog::warn("{}: recheck of blocked keys failed: {}", dest.name, e.what());
          store.Reset();
          cursor.Reset();
        }
      }
      if (claim.messages.empty() && claim.facts.held == 0) {
        std::unique_lock lk(mu);
        wake_cv.wait_for(lk, recheck.empty() ? config.poll_interval : Millis(50),
                         [&] { return stopping.load() || wake_gen != seen_gen; });
        seen_gen = wake_gen;
      }
    }
  }

  // The fresh lane passed these rows and only the sweep found them: by design this never
  // happens, so each is counted and the first is logged with what the cursor knew.
  void RecordSweepFinds(const Destination& dest, const std::vector<MessageId>& missed,
                        const ClaimFacts& facts) {
    const auto n = static_cast<std::int64_t>(missed.size());
    if (stats.sweep_found.fetch_add(n) == 0) {
      spdlog::warn(
          "{}: the full sweep found {} message(s) the fresh lane had passed (first id {}; "
          "sequence {}, snapshot xmin {}); they waited up to full_sweep_interval_ms. Counted in "
          "outbox_sweep_found_total; please report it with this line",
          dest.name, n, Raw(missed.front()), facts.seq_value, facts.snap_xmin);
    }
    if (metrics) metrics->RecordSweepFound(dest.name, n);
  }

  void Submit(const Destination& dest, Sink& sink, const std::string& token, Message msg) {
    {
      std::lock_guard lk(settle_mu);
      ++unsettled;
      held_leases[Raw(msg.id)] = token;
    }
    if (msg.attempts >= dest.retry.max_attempts) {
      Settlement s;
      s.id = msg.id;
      s.lease_token = token;
      s.kind = Settlement::Kind::kDead;
      s.counts_attempt = false;
      s.error = "attempts exhausted (" + std::to_string(msg.attempts) +
                ") before this delivery; the last ones ended by lease expiry";
      s.reason_class = "attempts_exhausted";
      s.destination = dest.name;
      s.created_at = msg.created_at;
      Enqueue(std::move(s));
      return;
    }
    const MessageId id = msg.id;
    const int attempts = msg.attempts;
    const auto created_at = msg.created_at;
    const auto submitted = Now();
    const Destination* d = &dest;
    sink.Submit(std::move(msg), [this, id, attempts, d, &sink, token, created_at,
                                 submitted](Outcome outcome) {
      if (outcome.kind != OutcomeKind::kDelivered) {
        spdlog::debug("message {}: {} ({})", Raw(id), ToString(outcome.kind), outcome.reason);
      }
      Settlement s = Decide(id, attempts, outcome, d->retry, token, Uniform01(), stopping.load());
      s.destination = d->name;
      s.created_at = created_at;
      if (metrics) RecordAttempt(*d, sink, outcome, submitted);
      Enqueue(std::move(s));
      wake_cv.notify_all();  // room in flight
    });
  }

  // One delivery attempt, whatever its settle finds: how long it took, what the endpoint said.
  void RecordAttempt(const Destination& d, const Sink& sink, const Outcome& outcome,
                     SteadyTime submitted) {
    metrics->RecordDeliveryDuration(d.name, sink.Kind(),
                                    std::chrono::duration<double>(Now() - submitted));
    if (sink.OutcomesAreResponses()) metrics->RecordWebhookResponse(d.name, outcome);
  }

  // What a settle wrote, message by message: a fenced outcome (the lease had moved on) and a
  // message already gone count nothing, so the counters match the queue and the dead letters.
  void RecordSettled(const std::vector<Settlement>& batch, const SettleCounts& c) {
    if (!metrics || c.written.empty()) return;
    std::unordered_set<std::int64_t> written;
    written.reserve(c.written.size());
    for (const auto id : c.written) written.insert(Raw(id));
    for (const auto& s : batch) {
      if (!written.count(Raw(s.id))) continue;
      switch (s.kind) {
        case Settlement::Kind::kDelivered:
          metrics->RecordDelivered(s.destination, s.created_at);
          break;
        case Settlement::Kind::kRetry:
          metrics->RecordRetried(s.destination, s.reason_class);
          break;
        case Settlement::Kind::kDead:
          metrics->RecordDeadLettered(s.destination, s.reason_class);
          break;
        case Settlement::Kind::kRelease:
          break;
      }
    }
  }

  // Writes outcomes in batches. Keeps them until the database takes them: nothing is lost
  // while it is away, and leases that expire meanwhile are fenced by their token.
  void SettleLoop() {
    const auto owned_store = stores();
    QueueStore& store = *owned_store;
    int failures = 0;
    std::vector<Settlement> batch;
    while (true) {
      {
        std::unique_lock lk(settle_mu);
        settle_cv.wait(lk, [&] { return !settle_queue.empty() || settler_stop; });
        if (settle_queue.empty() && settler_stop) return;
        const std::size_t n = std::min<std::size_t>(settle_queue.size(), 2000);
        batch.assign(std::make_move_iterator(settle_queue.begin()),
                     std::make_move_iterator(settle_queue.begin() + static_cast<long>(n)));
        settle_queue.erase(settle_queue.begin(), settle_queue.begin() + static_cast<long>(n));
      }
      while (true) {
        try {
          const SettleCounts c = store.Settle(batch, config.retention.archive_delivered);
          stats.delivered += c.delivered;
          stats.retried += c.retried;
          stats.dead += c.dead;
          stats.released += c.released;
          stats.fenced += c.fenced;
          RecordSettled(batch, c);
          if (c.woken > 0) Wake();  // the next message of a settled key may go now
          if (metrics && c.fenced > 0) metrics->RecordSettleFenced(c.fenced);
          if (c.fenced > 0) {
            spdlog::warn(
                "{} settlements fenced: their lease expired and moved on (redelivery follows)",
                c.fenced);
          }
          if (c.gone > 0) {
            spdlog::info(
                "{} settlements found their message already gone: settled by an earlier try of "
                "this write whose reply was lost, or delivered by another relay; nothing to do",
                c.gone);
          }
          if (failures > 0) spdlog::info("settler: database reachable again");
          failures = 0;
          break;
        } catch (const std::exception& e) {
          DbError();
          if (failures++ == 0) spdlog::warn("settle failed, will retry: {}", e.what());
          store.Reset();
          std::unique_lock lk(settle_mu);
          // Give up only when stopping and the shutdown budget is spent; the leases then
          // expire and the messages are delivered again (at least once).
          if (settler_stop && settler_give_up) {
            spdlog::error("shutdown: {} outcomes could not be written; their leases will expire",
                          batch.size());
            unsettled -= static_cast<std::int64_t>(batch.size());
            for (const auto& s : batch) held_leases.erase(Raw(s.id));
            batch.clear();
            break;
          }
          settle_cv.wait_for(lk, ReconnectDelay(failures));
        }
      }
      {
        std::lock_guard lk(settle_mu);
        unsettled -= static_cast<std::int64_t>(batch.size());
        for (const auto& s : batch) {
          // A message claimed again under a new token since (after a fence) stays held.
          if (auto it = held_leases.find(Raw(s.id));
              it != held_leases.end() && it->second == s.lease_token) {
            held_leases.erase(it);
          }
        }
      }
      settle_cv.notify_all();
      batch.clear();
    }
  }

  std::vector<BucketLease> OwnedBuckets() {
    std::lock_guard lk(owned_mu);
    return owned;
  }

  // claim_mode partitioned: heartbeat, learn which buckets this relay owns, and stop claiming
  // from all of them when heartbeats fail for longer than the partition lease (by then the
  // others consider this relay dead and have taken its buckets).
  void CoordinatorLoop() {
    const auto owned_store = stores();
    QueueStore& store = *owned_store;
    auto last_ok = Now();
    int failures = 0;
    std::uint64_t seen_gen = 0;
    while (!stopping) {
      try {
        auto now_owned = store.Coordinate(instance_id, config.partition_lease, false, description);
        last_ok = Now();
        if (failures > 0) spdlog::info("coordinator: database reachable again");
        failures = 0;
        bool changed = false;
        {
          std::lock_guard lk(owned_mu);
          changed = now_owned != owned;
          if (changed) owned = std::move(now_owned);
        }
        if (changed) {
          spdlog::info("partitioned: this relay now owns {} bucket(s)", OwnedBuckets().size());
          Wake();
        }
      } catch (const std::exception& e) {
        DbError();
        if (failures++ == 0) spdlog::warn("coordinator: heartbeat failed: {}", e.what());
        store.Reset();
        if (Now() - last_ok > config.partition_lease - config.partition_heartbeat) {
          std::lock_guard lk(owned_mu);
          if (!owned.empty()) {
            spdlog::warn(
                "partitioned: no heartbeat for {} ms; giving up all buckets until it succeeds",
                config.partition_lease.count());
            owned.clear();
          }
        }
      }
      std::unique_lock lk(mu);
      wake_cv.wait_for(lk, config.partition_heartbeat, [&] {
        return stopping.load() || (rebalance_requested && wake_gen != seen_gen);
      });
      seen_gen = wake_gen;
      rebalance_requested = false;
    }
    // Hand every bucket back at once so the others take them without waiting for our lease.
    try {
      store.Coordinate(instance_id, config.partition_lease, true, description);
      spdlog::info("partitioned: handed back all buckets");
    } catch (const std::exception& e) {
      spdlog::warn(
          "partitioned: could not hand back buckets (they move when our lease expires): {}",
          e.what());
    }
  }

  void ListenLoop() {
    const auto owned_store = stores();
    QueueStore& store = *owned_store;
    int failures = 0;
    while (!stopping) {
      try {
        store.Listen();
        if (store.WaitForNotification(Millis(200))) {
          if (store.TakeRebalance()) {
            std::lock_guard lk(mu);
            rebalance_requested = true;
          }
          Wake();
        }
        failures = 0;
      } catch (const std::exception& e) {
        if (failures++ == 0)
          spdlog::warn("LISTEN connection lost, polling until it is back: {}", e.what());
        store.Reset();
        WaitFor(ReconnectDelay(failures), [] { return false; });
      }
    }
  }

  void MaintenanceLoop() {
    const auto owned_store = stores();
    QueueStore& store = *owned_store;
    auto next_reap = Now();
    auto next_heartbeat = Now();
    auto next_renewal = Now() + config.lease / 3;
    auto next_unknown = Now() + kRelayHeartbeat;  // after our first heartbeat
    auto next_status = Now();
    auto next_cleanup = Now();
    while (!stopping) {
      WaitFor(Millis(100), [] { return false; });
      if (stopping) break;
      const auto now = Now();
      try {
        if (now >= next_reap) {
          next_reap = now + config.reap_interval;
          const auto reaped = store.Reap();
          if (!reaped.empty()) {
            stats.reaped += static_cast<std::int64_t>(reaped.size());
            if (metrics) {
              metrics->RecordReaperRequeued(static_cast<std::int64_t>(reaped.size()));
              for (const auto& dest : reaped) metrics->RecordRetried(dest, "lease_expired");
            }
            spdlog::warn("reaper: returned {} messages whose lease expired", reaped.size());
            Wake();
          }
          // Safety net behind the claim loops' recheck of blocked keys: one probe per blocked key.
          std::int64_t woken = 0;
          for (const auto& [name, dest] : config.destinations) woken += store.WakeOrphans(name);
          if (woken > 0) Wake();
        }
        if (now >= next_renewal) {
          next_renewal = now + config.lease / 3;
          std::vector<std::pair<MessageId, std::string>> held;
          {
            std::lock_guard lk(settle_mu);
            held.reserve(held_leases.size());
            for (const auto& [id, token] : held_leases) held.emplace_back(MessageId{id}, token);
          }
          store.RenewLeases(held, config.lease);
        }
        if (now >= next_heartbeat) {
          next_heartbeat = now + kRelayHeartbeat;
          store.Heartbeat(instance_id, destination_names, description);
        }
        if (now >= next_unknown) {
          next_unknown = now + config.full_sweep_interval;
          WarnAboutUnservedDestinations(store);
        }
        if (now >= next_cleanup) {
          next_cleanup = now + config.retention.cleanup_interval;
          const auto& r = config.retention;
          if (r.archive_delivered) {
            const auto n = store.CleanupArchive(r.archive_retention, 1000);
            if (n > 0)
              spdlog::info("retention: removed {} archived messages older than {} h", n,
                           r.archive_retention.count());
          }
          if (r.dead_letter_retention.count() > 0) {
            const auto n = store.CleanupDeadLetters(r.dead_letter_retention, 1000);
            if (n > 0)
              spdlog::info("retention: removed {} dead letters older than {} h", n,
                           r.dead_letter_retention.count());
          }
        }
        if (metrics && now >= next_status) {
          next_status = now + status_interval;
          metrics->UpdateFromStatus(store.ReadStatus(StatusOptions{}));
        }
      } catch (const std::exception& e) {
        DbError();
        spdlog::warn("maintenance failed, will retry: {}", e.what());
        store.Reset();
      }
    }
    try {
      store.Leave(instance_id);  // the others stop counting us at once, not after the expiry
    } catch (const std::exception& e) {
      spdlog::debug("could not remove this relay's heartbeat (it expires): {}", e.what());
    }
  }

  // Messages of destinations this relay does not serve belong to other relays (a rolling
  // deploy that adds a destination, a canary, another team's relay). They are never
  // dead-lettered here; when no live relay serves them at all, say so once per destination
  // (and status/metrics show it: outbox_unserved_oldest_age_seconds).
  void WarnAboutUnservedDestinations(QueueStore& store) {
    const auto queued = store.Destinations();
    std::vector<std::string> foreign;
    for (const auto& name : queued) {
      if (!config.destinations.count(name)) foreign.push_back(name);
    }
    if (foreign.empty()) return;
    const auto live = store.LiveRelays(kRelayHeartbeatExpiry);
    for (const auto& name : foreign) {
      if (live.count(name)) {
        spdlog::debug("destination \"{}\" is served by {} other relay(s)", name, live.at(name));
        continue;
      }
      if (warned_unserved.insert(name).second) {
        spdlog::warn(
            "destination \"{}\" has messages that no running relay serves: add it under "
            "destinations: in a relay's config, or, if nothing will ever serve it, dead-letter "
            "them with `outbox-relay dlq bury --destination {}`",
            name, name);
      }
    }
  }

  bool settler_give_up = false;
  std::set<std::string> warned_unserved;  // maintenance thread only
  std::vector<std::string> destination_names;

  // claim_mode partitioned
  std::string instance_id = NewUuid();
  std::string description;
  std::mutex owned_mu;
  std::vector<BucketLease> owned;
  bool rebalance_requested = false;  // guarded by mu
  std::thread coordinator;
};

Dispatcher::Dispatcher(RelayConfig config, std::map<std::string, SinkPtr> sinks,
                       RelayMetrics* metrics, Millis status_interval)
    : Dispatcher(std::move(config), std::move(sinks),
                 DispatcherEnv{{}, nullptr, metrics, status_interval}) {}

Dispatcher::Dispatcher(RelayConfig config, std::map<std::string, SinkPtr> sinks, DispatcherEnv env)
    : impl_(std::make_unique<Impl>()) {
  impl_->config = std::move(config);
  impl_->sinks = std::move(sinks);
  impl_->stores = env.stores ? std::move(env.stores) : PostgresStores(impl_->config.database_url);
  if (env.clock) impl_->clock = env.clock;
  auto* metrics = env.metrics;
  impl_->metrics = metrics;
  impl_->status_interval = env.status_interval;
  for (const auto& [name, dest] : impl_->config.destinations) {
    if (!impl_->sinks.count(name)) throw std::invalid_argument("no sink for destination " + name);
  }
  if (metrics) {
    for (const auto& [name, sink] : impl_->sinks) metrics->InitDestination(name, sink->Kind());
  }
}

Dispatcher::~Dispatcher() { Stop(); }

const DispatcherStats& Dispatcher::stats() const { return impl_->stats; }

bool Dispatcher::Ready() const { return WhyNotReady().empty(); }

std::string Dispatcher::WhyNotReady() const {
  if (!impl_->db_ok) return "database: not reached yet, or the last call failed";
  for (const auto& [name, sink] : impl_->sinks) {
    if (auto why = sink->WhyNotReady(); !why.empty()) return name + ": " + why;
  }
  return "";
}

void Dispatcher::Start() {
  auto& d = *impl_;
  if (d.started) return;
  d.started = true;
  {
    char host[256] = {0};
    gethostname(host, sizeof host - 1);
    d.description = std::string(host) + " pid " + std::to_string(getpid());
  }
  for (const auto& [name, dest] : d.config.destinations) d.destination_names.push_back(name);
  d.settler = std::thread([&d] { d.SettleLoop(); });
  d.listener = std::thread([&d] { d.ListenLoop(); });
  d.maintenance = std::thread([&d] { d.MaintenanceLoop(); });
  if (d.config.claim_mode == ClaimMode::kPartitioned) {
    d.coordinator = std::thread([&d] { d.CoordinatorLoop(); });
  }
  for (const auto& [name, dest] : d.config.destinations) {
    Sink& sink = *d.sinks.at(name);
    const Destination& dst = dest;
    d.loops.emplace_back([&d, &dst, &sink] { d.ClaimLoop(dst, sink); });
  }
}

bool Dispatcher::Stop() {
  auto& d = *impl_;
  if (!d.started || d.stopped) return true;
  d.stopped = true;
  const auto deadline = d.Now() + d.config.shutdown_timeout;
  d.stopping = true;
  d.wake_cv.notify_all();
  for (auto& t : d.loops) t.join();
  if (d.coordinator.joinable()) d.coordinator.join();  // hands the buckets back at once
  if (d.listener.joinable()) d.listener.join();
  // In-flight deliveries come before maintenance, which may be inside a long query: it is
  // joined after the sinks have had their shutdown budget.
  // Sinks finish what they hold; what they cannot is completed as retry -> released.
  for (auto& [name, sink] : d.sinks) {
    const auto left = std::chrono::duration_cast<Millis>(deadline - d.Now());
    sink->Shutdown(std::max(left, Millis(100)));
  }
  bool all = true;
  {
    std::unique_lock lk(d.settle_mu);
    // A real wait of what is left of the budget (at least 2 s), measured on the given clock.
    const auto settle_wait =
        std::max(std::chrono::duration_cast<Millis>(deadline - d.Now()), Millis(2000));
    all = d.settle_cv.wait_for(lk, settle_wait, [&] { return d.unsettled == 0; });
    d.settler_stop = true;
    d.settler_give_up = true;
  }
  d.settle_cv.notify_all();
  d.settler.join();
  if (d.maintenance.joinable()) d.maintenance.join();
  return all;
}

}  // namespace outbox::relay
