// Maintenance: the reaper, the orphan waker, lease renewal of messages still in a sink, the
// relay heartbeat, unserved destinations and retention; and, on a thread of its own, the
// status gauges.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <deque>
#include <unordered_set>
#include <utility>

#include "dispatcher_impl.h"
#include "reconnect.h"
#include "tuning.h"

namespace outbox::relay {

std::map<std::string, TargetHealth> Dispatcher::Impl::TargetHealths() const {
  std::map<std::string, TargetHealth> out;
  for (const auto& [name, sink] : sinks) {
    if (auto h = sink->Health()) out.emplace(name, std::move(*h));
  }
  return out;
}

void Dispatcher::Impl::MaintenanceLoop() {
  const auto owned_store = stores();
  QueueStore& store = *owned_store;
  const LiveStore live(*this, Role::kMaintenance, store);  // let go of before the store goes
  Reconnect db("maintenance failed, will retry", "maintenance: database reachable again",
               [this] { DbError(); });
  auto next_reap = Now();
  struct OrphanSweep {
    std::int64_t after = 0;  // where the next page starts
    std::int64_t until = 0;  // where this pass ends: the queue's top when it began
  };
  std::map<std::string, OrphanSweep> orphan_sweeps;  // per destination
  auto next_heartbeat = Now();
  auto next_paused = Now();
  auto next_renewal = Now() + RenewPeriod();
  auto next_unknown = Now() + tuning::kRelayHeartbeat;  // after our first heartbeat
  auto next_cleanup = Now();
  bool winding_down = false;  // stopping seen: only renewals from now on
  bool first_turn = true;     // at once: the claim loops wait for the first heartbeat
  while (true) {
    if (!std::exchange(first_turn, false)) {
      std::unique_lock lk(mu);
      wake_cv.wait_for(lk, tuning::kMaintenanceTick, [&] {
        return maintenance_stopping.load() || (stopping.load() && !winding_down);
      });
    }
    if (maintenance_stopping) break;
    const auto now = Now();
    if (stopping) {
      // Stopping: the sinks may hold messages for up to shutdown_timeout_ms (and a settle may
      // wait for the database): their leases are renewed until the settles are written, or
      // another relay's reaper took them back and sent them again while they were delivered.
      winding_down = true;
      try {
        if (now >= next_renewal) next_renewal = NextRenewal(now, RenewHeldLeases(store));
        db.Succeeded();
      } catch (const std::exception& e) {
        PauseAfterFailure(db.Failed(store, e));
      }
      continue;
    }
    // The sinks' view of their targets (breaker, concurrency, pauses), every turn: also while
    // the database is away, when it matters most (it came after the turn's database work, and
    // froze with it).
    for (const auto& [name, health] : TargetHealths()) metrics->UpdateTargetHealth(name, health);
    for (const auto& [name, sink] : sinks) {
      if (auto counts = sink->EventCounts(); !counts.empty()) {
        metrics->UpdateSinkEvents(name, counts);
      }
    }
    try {
      // First in the turn: a turn that finds it due with the reap (the thread stalled longer
      // than a lease: a slow statement, a database that stopped answering) reaped first, and
      // took back this relay's own messages still in its sinks as expired, to be sent again.
      if (now >= next_renewal) {
        // Failed: tried again after the reconnect pause, not lease / 3.
        next_renewal = NextRenewal(now, RenewHeldLeases(store));
      }
      if (now >= next_paused) {
        next_paused = now + tuning::kPauseRefresh;
        RefreshPaused(store);
      }
      // Before the reap (seconds on a large queue at start-up): the claim loops wait for the
      // first heartbeat accepted.
      if (now >= next_heartbeat) {
        try {
          Beat(store);
        } catch (const StoreError& e) {
          if (e.transient()) throw;  // tried again after the reconnect pause
          // Refused: logged and recorded by Beat; the rest of the turn goes on.
        }
        next_heartbeat = now + tuning::kRelayHeartbeat;
      }
      if (now >= next_reap) {
        next_reap = now + config.reap_interval;
        const auto reaped = store.Reap(config.reap_interval * tuning::kQueueScanEveryReaps);
        if (!reaped.empty()) {
          metrics->RecordReaperRequeued(static_cast<std::int64_t>(reaped.size()));
          for (const auto& dest : reaped) metrics->RecordRetried(dest, Reason::kLeaseExpired);
          spdlog::warn("reaper: returned {} messages whose lease expired", reaped.size());
          Wake();
        }
        // Safety net behind the claim loops' recheck of blocked keys: a page of each
        // destination's blocked rows per reap, the sweep going on from where the last page
        // ended (a million blocked rows took ~5 s in one statement, and this thread renews the
        // leases of what is in flight). A pass ends at the queue's top when it began: claims
        // parking rows faster than a page a reap kept every page full, and an orphan below the
        // cursor then waited for good (review).
        std::int64_t woken = 0;
        for (const auto& [name, dest] : config.destinations) {
          auto& sweep = orphan_sweeps[name];
          const auto page = store.WakeOrphans(name, sweep.after, tuning::kOrphanSweepPage);
          woken += page.woken;
          if (sweep.after == 0) sweep.until = page.top;
          sweep.after = page.next_after >= sweep.until ? 0 : page.next_after;
        }
        if (woken > 0) Wake();
      }
      if (now >= next_unknown) {
        next_unknown = now + config.full_sweep_interval;
        WarnAboutUnservedDestinations(store);
      }
      if (now >= next_cleanup) {
        next_cleanup = now + config.retention.cleanup_interval;
        const auto& r = config.retention;
        bool more = false;  // a table had more to delete than one turn's share
        if (r.archive_delivered || r.archive_retention_set) {
          const auto n = store.CleanupArchive(destination_names, r.archive_retention,
                                              tuning::kCleanupBatch,
                                              tuning::kCleanupRowsPerTurn);
          more = more || n >= tuning::kCleanupRowsPerTurn;
          if (n > 0)
            spdlog::info("retention: removed {} archived messages older than {} h", n,
                         r.archive_retention.count());
        }
        if (r.dead_letter_retention.count() > 0) {
          const auto n = store.CleanupDeadLetters(destination_names, r.dead_letter_retention,
                                                  tuning::kCleanupBatch,
                                                  tuning::kCleanupRowsPerTurn);
          more = more || n >= tuning::kCleanupRowsPerTurn;
          if (n > 0)
            spdlog::info("retention: removed {} dead letters older than {} h", n,
                         r.dead_letter_retention.count());
        }
        if (more) next_cleanup = now;  // the rest on the next turn, after renewals and reaps
      }
      db.Succeeded();
    } catch (const std::exception& e) {
      // The next try comes after the reconnect pause (100 ms doubling to 5 s); a failed lease
      // renewal is tried again then, each other duty at its next turn.
      PauseAfterFailure(db.Failed(store, e));
    }
  }
  try {
    store.Leave(instance_id);  // the others stop counting us at once, not after the expiry
  } catch (const std::exception& e) {
    spdlog::debug("could not remove this relay's heartbeat (it expires): {}", e.what());
  }
}

// The queue gauges: ReadStatus is a pass over the queue (~1.3 s per million rows). On a thread
// and a connection of its own: on the maintenance thread, a large backlog's status read held up
// the lease renewals of messages in flight, the reaper and the heartbeat. The next read comes
// status_interval after this one, or kStatusCostFactor x what this one took if that is longer,
// so the reads keep a backend busy a tenth of the time at most. Not while stopping.
void Dispatcher::Impl::StatusLoop() {
  const auto owned_store = stores();
  QueueStore& store = *owned_store;
  const LiveStore live(*this, Role::kStatus, store);  // let go of before the store goes
  Reconnect db("status read failed, will retry", "status: database reachable again",
               [this] { DbError(); });
  auto next = Now();
  while (!stopping) {
    if (Now() < next) {
      std::unique_lock lk(mu);
      wake_cv.wait_for(lk, tuning::kMaintenanceTick, [&] { return stopping.load(); });
      continue;
    }
    try {
      const auto started = std::chrono::steady_clock::now();
      metrics->UpdateFromStatus(store.ReadStatus(StatusOptions{}));
      const auto took = std::chrono::duration_cast<Millis>(std::chrono::steady_clock::now() -
                                                           started);
      next = Now() + std::max(status_interval, tuning::kStatusCostFactor * took);
      db.Succeeded();
    } catch (const std::exception& e) {
      const auto pause = db.Failed(store, e);
      next = Now() + std::max(pause, status_interval);
    }
  }
}

void Dispatcher::Impl::PauseAfterFailure(Millis pause) {
  std::unique_lock lk(mu);
  wake_cv.wait_for(lk, pause, [&] { return maintenance_stopping.load(); });
}

// False when it passed over some of the messages still in a sink (rows another transaction
// held: outbox.set_bucket_count rewriting the queue). Those whose outcome waits for its settle
// are renewed too but do not count: a settle holds its rows while it writes them, so under
// steady traffic nearly every renewal passed some over, and came back every second instead of
// every lease / 3, rewriting every in-flight row each time.
//
// Passed over means still in a sink under the same claim once the renewal returned: a message
// that left its sink meanwhile (its settle holds or deleted the row) needs no lease.
//
// Each renewed message's claim then holds until the renewal's start plus the lease (its
// ClaimCover): a sink sends nothing whose claim ran out, so a relay whose renewals failed for
// a lease (a database away, a stall) does not send what another relay may have taken back.
bool Dispatcher::Impl::RenewHeldLeases(QueueStore& store) {
  std::vector<std::pair<MessageId, std::string>> held;
  std::chrono::steady_clock::time_point as_of;
  {
    std::lock_guard lk(settle_mu);
    as_of = std::chrono::steady_clock::now();  // before the statement: its leases end later
    held.reserve(held_leases.size());
    for (const auto& [id, h] : held_leases) {
      if (!h.token.empty()) held.emplace_back(MessageId{id}, h.token);  // bucket leases: none
    }
  }
  if (held.empty()) return true;
  const auto renewed = store.RenewLeases(held, config.lease);
  std::unordered_set<std::int64_t> got;
  got.reserve(renewed.size());
  for (const MessageId id : renewed) got.insert(Raw(id));
  const auto until = as_of + config.lease;
  bool passed_over = false;
  std::lock_guard lk(settle_mu);
  for (const auto& [id, token] : held) {
    const auto it = held_leases.find(Raw(id));
    // Settled, or claimed again since the list: nothing to extend, nothing passed over.
    if (it == held_leases.end() || it->second.token != token) continue;
    if (got.count(Raw(id)) > 0) {
      if (it->second.cover) it->second.cover->ExtendTo(until);
    } else if (it->second.in_sink) {
      passed_over = true;
    }
  }
  return !passed_over;
}

// lease / 3, or sooner where the config asks (a lease that must cover a whole attempt).
Millis Dispatcher::Impl::RenewPeriod() const {
  return config.renew_every > Millis{0} ? config.renew_every : config.lease / 3;
}

// When the renewal after one at `now` is due.
SteadyTime Dispatcher::Impl::NextRenewal(SteadyTime now, bool all_renewed) const {
  return now + (all_renewed ? RenewPeriod()
                            : std::min<Millis>(RenewPeriod(), tuning::kRenewPassedOverRetry));
}

// Messages of destinations this relay does not serve belong to other relays (a rolling
// deploy that adds a destination, a canary, another team's relay). They are never
// dead-lettered here; when no live relay serves them at all, say so once per destination
// (and status/metrics show it: outbox_unserved_oldest_age_seconds).
void Dispatcher::Impl::WarnAboutUnservedDestinations(QueueStore& store) {
  const auto queued = store.Destinations();
  std::vector<std::string> foreign;
  for (const auto& name : queued) {
    if (!config.destinations.count(name)) foreign.push_back(name);
  }
  if (foreign.empty()) return;
  const auto live = store.LiveRelays(tuning::kRelayHeartbeatExpiry);
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

}  // namespace outbox::relay
