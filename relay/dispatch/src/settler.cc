// The settler: writes every sink's outcomes in batches, and keeps them while the database is
// away.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <deque>
#include <map>
#include <unordered_set>

#include "dispatcher_impl.h"
#include "reconnect.h"
#include "tuning.h"

namespace outbox::relay {

// What a settle wrote, message by message: a fenced outcome (the lease had moved on) and a
// message already gone count nothing, so the counters match the queue and the dead letters.
void Dispatcher::Impl::RecordSettled(const std::vector<Settlement>& batch, const SettleCounts& c) {
  if (c.written.empty()) return;
  std::unordered_set<std::int64_t> written;
  written.reserve(c.written.size());
  for (const auto id : c.written) written.insert(Raw(id));
  // A settle carries hundreds of deliveries, mostly of one destination: its series are looked
  // up once per run of the same destination, and the clock read once.
  const auto now = std::chrono::system_clock::now();
  const std::string* series_of = nullptr;
  std::optional<RelayMetrics::DeliveredSeries> series;
  auto delivered = [&](const Settlement& s) {
    if (series_of == nullptr || *series_of != s.destination) {
      series.emplace(metrics->Delivered(s.destination));
      series_of = &s.destination;
    }
    series->Record(now - s.created_at);
  };
  for (const auto& s : batch) {
    if (!written.count(Raw(s.id))) continue;
    switch (s.kind) {
      case Settlement::Kind::kDelivered:
        delivered(s);
        break;
      case Settlement::Kind::kRetry:
        metrics->RecordRetried(s.destination, s.reason_class);
        break;
      case Settlement::Kind::kDead:
        metrics->RecordDeadLettered(s.destination, s.reason_class);
        break;
      case Settlement::Kind::kRelease:
        metrics->RecordReleased(s.destination);
        break;
      case Settlement::Kind::kFanOut:
        // Each endpoint's delivery counts like a message of its own.
        for (int i = 0; i < s.delivered_to; ++i) delivered(s);
        for (const auto& child : s.children) {
          if (child.kind == Settlement::Kind::kRetry) {
            metrics->RecordRetried(s.destination, child.reason_class);
          } else if (child.kind == Settlement::Kind::kDead) {
            metrics->RecordDeadLettered(s.destination, child.reason_class);
          }
        }
        break;
    }
  }
}

void Dispatcher::Impl::TakeLatestToken(Settlement& s) {
  if (!Removes(s)) return;
  if (const auto it = held_leases.find(Raw(s.id));
      it != held_leases.end() && !it->second.in_sink && it->second.removes) {
    s.lease_token = it->second.token;
  }
}

void Dispatcher::Impl::LeaveToTheirLeases(std::vector<Settlement>& outcomes) {
  unsettled -= static_cast<std::int64_t>(outcomes.size());
  for (const auto& s : outcomes) held_leases.erase(Raw(s.id));
  outcomes.clear();
}

// Writes outcomes in batches. Keeps them until the database takes them: nothing is lost
// while it is away, and leases that expire meanwhile are fenced by their token.
void Dispatcher::Impl::SettleLoop() {
  const auto owned_store = stores();
  QueueStore& store = *owned_store;
  const LiveStore live(*this, Role::kSettler, store);  // let go of before the store goes
  Reconnect db("settle failed, will retry", "settler: database reachable again",
               [this] { DbError(); });
  std::vector<Settlement> batch;
  // Fan-outs the store deferred (SettleCounts::deferred): still unsettled, their leases still
  // renewed, written again once deferred_until has passed.
  std::vector<Settlement> deferred;
  SteadyTime deferred_until{};
  while (true) {
    {
      std::unique_lock lk(settle_mu);
      const auto deferred_due = [&] { return !deferred.empty() && Now() >= deferred_until; };
      while (settle_queue.empty() && !settler_stop && !deferred_due()) {
        if (deferred.empty()) {
          settle_cv.wait(lk);
        } else {
          settle_cv.wait_for(lk, deferred_until - Now());
        }
      }
      if (settle_queue.empty() && settler_stop && !deferred.empty()) {
        // Stopping: what is still deferred when the shutdown budget is spent is left to its
        // leases, like any outcome that could not be written.
        spdlog::error(
            "shutdown: {} fanned-out message(s) could not be written (a lock they need was "
            "held elsewhere); their leases will expire",
            deferred.size());
        LeaveToTheirLeases(deferred);
      }
      if (settle_queue.empty() && settler_stop && deferred.empty()) return;
      if (deferred_due()) {
        for (auto& s : deferred) {
          TakeLatestToken(s);
          settle_queue.push_back(std::move(s));
        }
        deferred.clear();
      }
      if (settle_queue.size() < tuning::kSettleBatchTarget && !settler_stop) {
        settle_cv.wait_for(lk, tuning::kSettleLinger, [&] {
          return settle_queue.size() >= tuning::kSettleBatchTarget || settler_stop;
        });
      }
      // The whole queue at once where it fits a batch (the usual case): a swap, not a copy,
      // under the lock every completion takes; `batch` was cleared after its last settle, so
      // the queue keeps a capacity and completions do not grow it again.
      batch.clear();
      if (settle_queue.size() <= tuning::kSettleBatchMax) {
        batch.swap(settle_queue);
      } else {
        const auto n = static_cast<long>(tuning::kSettleBatchMax);
        batch.assign(std::make_move_iterator(settle_queue.begin()),
                     std::make_move_iterator(settle_queue.begin() + n));
        settle_queue.erase(settle_queue.begin(), settle_queue.begin() + n);
      }
    }
    SettleCounts c;
    // Written kSlowSettle or longer after the first try began: a try that committed with its
    // reply lost counts too, though the try after it was quick (review).
    bool slow = false;
    const auto started = Now();
    while (true) {
      try {
        if (config.bucket_leases) {
          // Fenced by the buckets of the last successful heartbeat, at their epochs, which the
          // database checks: one lost and owned again since the claim is written (its next
          // owner found the message delivered, or delivered it too). Not by `owned`, which
          // failing heartbeats clear: deliveries then looked fenced, and went out again.
          std::vector<BucketLease> buckets;
          {
            std::lock_guard lk(owned_mu);
            buckets = settle_buckets;
          }
          c = store.SettleOwned(batch, config.retention.archive_delivered, instance_id, buckets);
        } else {
          c = store.Settle(batch, config.retention.archive_delivered,
                           config.claim_mode == ClaimMode::kPartitioned ? instance_id : "");
        }
        slow = Now() - started >= tuning::kSlowSettle;
        if (!c.deferred.empty()) {
          std::unordered_set<std::int64_t> later;
          for (const auto id : c.deferred) later.insert(Raw(id));
          const auto split = std::stable_partition(
              batch.begin(), batch.end(), [&](const Settlement& s) { return !later.count(Raw(s.id)); });
          std::lock_guard lk(settle_mu);
          // The retry is due 5 s after the oldest deferral: newer ones go with it early rather
          // than pushing it back.
          if (deferred.empty()) deferred_until = Now() + tuning::kDeferredSettleRetry;
          deferred.insert(deferred.end(), std::make_move_iterator(split),
                          std::make_move_iterator(batch.end()));
          batch.erase(split, batch.end());
          spdlog::warn(
              "settler: {} fanned-out message(s) not written yet: a lock their endpoint rows "
              "need is held elsewhere (a key's, by an uncommitted replay or a writer of a key "
              "like \"<endpoint>:<key>\"; the bucket count's, while it changes; or an "
              "endpoint's registry row, while it is changed or moved); trying "
              "again in {} ms",
              c.deferred.size(), tuning::kDeferredSettleRetry.count());
        }
        RecordSettled(batch, c);
        // The next message of a settled key may go now; or a claim loop waits for rows it holds
        // to leave the lane (bucket leases).
        if (c.woken > 0 || waiting_for_settles.exchange(false)) Wake();
        metrics->RecordSettleFenced(c.fenced);
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
        db.Succeeded();
        break;
      } catch (const std::exception& e) {
        const auto pause = db.Failed(store, e);
        std::unique_lock lk(settle_mu);
        // Give up only when stopping and the shutdown budget is spent; the leases then
        // expire and the messages are delivered again (at least once).
        if (settler_stop && settler_give_up) {
          spdlog::error("shutdown: {} outcomes could not be written; their leases will expire",
                        batch.size());
          LeaveToTheirLeases(batch);
          break;
        }
        settle_cv.wait_for(lk, pause);
        // A message claimed again meanwhile (the outage outlasted its lease) settles under the
        // new token.
        for (auto& s : batch) TakeLatestToken(s);
      }
    }
    bool again = false;
    std::map<std::string, std::vector<BlockedKey>> keys_to_wake;  // after a slow settle
    {
      std::lock_guard lk(settle_mu);
      if (config.bucket_leases && !reads_in_progress.empty()) {
        // Reads under way may hold these rows from before this write (DropHeld skips them):
        // removed, or a retry or release whose row an older snapshot sees as it was.
        const auto mark = ++settle_mark;
        for (const auto& s : batch) {
          settled_at[Raw(s.id)] = mark;
          settled_order.emplace_back(Raw(s.id), mark);
        }
      }
      for (auto& s : batch) {
        const auto it = held_leases.find(Raw(s.id));
        if (slow && Removes(s) && it != held_leases.end() && it->second.key) {
          keys_to_wake[s.destination].push_back(*it->second.key);
        }
        if (it == held_leases.end()) {
          --unsettled;
        } else if (it->second.token == s.lease_token) {
          held_leases.erase(it);
          --unsettled;
        } else if (Removes(s) && it->second.removes && !it->second.in_sink &&
                   std::find(c.written.begin(), c.written.end(), s.id) == c.written.end()) {
          // Claimed again while this write ran, which the write found fenced: once more,
          // under the new token.
          s.lease_token = it->second.token;
          settle_queue.push_back(std::move(s));
          again = true;
        } else {
          --unsettled;  // claimed again and sent again (after a retry or release): stays held
        }
      }
    }
    if (again) spdlog::info("settler: writing again outcomes whose message was claimed again");
    settle_cv.notify_all();
    batch.clear();
    // A settle this slow may have raced a claim past the claim loop's rechecks of the keys it
    // parked (tuning::kSlowSettle): the keys' next messages are woken now, not by the orphan
    // sweep (review; DispatcherTest.AKeyWhoseSettleOutlastedTheClaimLoopsRechecks...).
    for (const auto& [destination, keys] : keys_to_wake) {
      try {
        if (store.WakeKeys(destination, keys) > 0) Wake();
      } catch (const std::exception& e) {
        DbError();
        spdlog::warn("{}: waking the keys of a slow settle failed ({}); the orphan sweep will",
                     destination, e.what());
        store.Reset();  // a broken connection: the next settle connects anew at once
      }
    }
  }
}

}  // namespace outbox::relay
