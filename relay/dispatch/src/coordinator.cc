// claim_mode partitioned: heartbeats through outbox.coordinate and the buckets this relay
// owns (docs/scaling.md).
#include <spdlog/spdlog.h>

#include <algorithm>
#include <deque>
#include <string_view>

#include "dispatcher_impl.h"
#include "reconnect.h"
#include "tuning.h"

namespace outbox::relay {
namespace {
// The refusals of outbox.relay_heartbeat and outbox.coordinate (object_not_in_prerequisite_state:
// a live relay of the other lease mode), as opposed to a failed call.
constexpr std::string_view kRefused = "55000";
}  // namespace

// claim_mode partitioned: heartbeat, learn which buckets this relay owns, and stop claiming
// from all of them when heartbeats fail for longer than the partition lease (by then the
// others consider this relay dead and have taken its buckets).
void Dispatcher::Impl::CoordinatorLoop() {
  const auto owned_store = stores();
  QueueStore& store = *owned_store;
  const LiveStore live(*this, Role::kCoordinator, store);  // let go of before the store goes
  auto last_ok = Now();
  Reconnect db("coordinator: heartbeat failed", "coordinator: database reachable again",
               [this] { DbError(); });
  std::uint64_t seen_gen = 0;
  // A relay whose sink fences by bucket (exactly-once Kafka) says so in its heartbeat:
  // outbox.set_bucket_count refuses to move messages between buckets while it lives.
  const bool exactly_once = std::any_of(sinks.begin(), sinks.end(), [](const auto& s) {
    return s.second->FencesOthersWhenItStarts();
  });
  // Written before the first bucket is taken: the other relays share the buckets of an owner
  // that does not serve a destination only once its heartbeat names what it serves
  // (claim_partitioned.sql), and the maintenance loop's first heartbeat waits for a tick and
  // the start-up reap, seconds on a large queue. Until it succeeds, no bucket is taken.
  bool beat = false;
  const auto next_heartbeat = [&] {
    std::unique_lock lk(mu);
    wake_cv.wait_for(lk, config.partition_heartbeat, [&] {
      return coordinator_stopping.load() || (rebalance_requested && wake_gen != seen_gen);
    });
    seen_gen = wake_gen;
    rebalance_requested = false;
  };
  while (!coordinator_stopping) {
    try {
      if (!beat) {
        try {
          Beat(store);
          beat = true;
        } catch (const StoreError& e) {
          // Refused (55000, migration 0037: a live relay of the other lease mode shares a
          // destination): no bucket is taken. Beat logged it (once a period) and the readiness
          // says why; the connection is fine, so no reconnect and no second log line. Any
          // other error is a failed call like the others below.
          if (e.transient() || e.sqlstate() != kRefused) throw;
          next_heartbeat();
          continue;
        }
      }
      // Bucket leases: the buckets being handed over that nothing read from is left of are
      // given up now (migration 0035); the claim loop stopped reading them when they came back
      // handing. One whose messages are not settled within shutdown_timeout_ms is taken anyway.
      std::vector<int> released;
      if (config.bucket_leases) {
        const auto held_now = OwnedBuckets();
        std::lock_guard lk(settle_mu);
        released = IdleHandingBuckets(held_now);
      }
      const auto asked = std::chrono::steady_clock::now();  // the sinks' clock
      auto now_owned =
          store.Coordinate(instance_id, config.partition_lease, false, description, exactly_once,
                           config.bucket_leases, released, config.shutdown_timeout);
      if (!released.empty()) {
        spdlog::info(
            "partitioned: handed over {} bucket(s) once what this relay had read from "
            "them was settled",
            released.size());
      }
      last_ok = Now();
      db.Succeeded();
      bool changed = false;
      {
        std::lock_guard lk(owned_mu);
        if (config.bucket_leases) {
          CoverBuckets(now_owned, asked);
          settle_buckets = now_owned;
        }
        changed = now_owned != owned;
        if (changed) owned = std::move(now_owned);
        coordinator_refused.clear();
      }
      if (changed) {
        spdlog::info("partitioned: this relay now owns {} bucket(s)", OwnedBuckets().size());
        Wake();
      }
    } catch (const std::exception& e) {
      const auto* se = dynamic_cast<const StoreError*>(&e);
      if (se && !se->transient() && se->sqlstate() == kRefused) {
        // outbox.coordinate refuses this relay (a live relay of the other lease mode): the
        // readiness says why, logged when it begins and once a period; the connection is fine.
        bool log = false;
        {
          std::lock_guard lk(owned_mu);
          log = LogRefusalNow(coordinator_refused, coordinator_refusal_logged, se->what(), Now());
        }
        if (log) {
          spdlog::error(
              "partitioned: the coordinator refuses this relay; claiming nothing until it "
              "accepts: {}",
              e.what());
        }
      } else {
        db.Failed(store, e);  // the next try is the next heartbeat
        if (se && !se->transient()) {
          std::lock_guard lk(owned_mu);
          coordinator_refused = se->what();
        }
      }
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
    next_heartbeat();
  }
  // Hand every bucket back at once so the others take them without waiting for our lease.
  try {
    store.Coordinate(instance_id, config.partition_lease, true, description, exactly_once,
                     config.bucket_leases, {}, config.shutdown_timeout);
    spdlog::info("partitioned: handed back all buckets");
  } catch (const std::exception& e) {
    spdlog::warn("partitioned: could not hand back buckets (they move when our lease expires): {}",
                 e.what());
  }
}

}  // namespace outbox::relay
