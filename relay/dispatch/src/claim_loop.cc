// The claim loops of a destination (claim_connections of them; under `auto`, the default, as many
// as its sink asks for, Sink::ClaimLoops): claim what the sink has room for, hand it over, and
// keep the fresh-lane cursor (docs/adr/0001-claim-path.md).
#include <spdlog/spdlog.h>

#include <algorithm>
#include <deque>

#include "dispatcher_impl.h"
#include "handoff.h"
#include "outbox_relay/fresh_cursor.h"
#include "reconnect.h"
#include "tuning.h"

namespace outbox::relay {

int Dispatcher::Impl::RoomShare::Take(int limit, const Sink& sink, int worth, int want) {
  std::lock_guard lk(room_.mu);
  // In flight read under the lock: a loop that gave its share back did so after its rows went
  // into the sink, so this sees either its share or its rows, never neither.
  const int room = limit - static_cast<int>(sink.InFlight()) - room_.reserved.load();
  if (room >= worth) {
    taken_ = std::min(want, room);
    room_.reserved += taken_;
  }
  return taken_;
}

int Dispatcher::Impl::RoomShare::TakeBytes(int rows, std::int64_t budget, std::int64_t estimate) {
  if (budget <= 0 || rows <= 0) return rows;
  std::lock_guard lk(room_.mu);
  const std::int64_t used = room_.payload_bytes.load() + room_.reserved_bytes.load();
  const std::int64_t fit = (budget - used) / std::max<std::int64_t>(estimate, 1);
  const int got = static_cast<int>(std::clamp<std::int64_t>(fit, used == 0 ? 1 : 0, rows));
  const std::int64_t bytes = got * std::max<std::int64_t>(estimate, 1);
  room_.reserved_bytes += bytes;
  taken_bytes_ += bytes;
  return got;
}

void Dispatcher::Impl::RoomShare::Release() {
  if (taken_ == 0 && taken_bytes_ == 0) return;
  {
    std::lock_guard lk(room_.mu);
    room_.reserved -= taken_;
    room_.reserved_bytes -= taken_bytes_;
  }
  taken_ = 0;
  taken_bytes_ = 0;
  room_.WakeLoops();
}

// One of a destination's claim loops (claim_connections of them, `index` 0 the first): each
// claims on its own connection with a fresh-lane cursor of its own, as another relay would;
// SKIP LOCKED keeps their claims apart, and a key's next message is claimable only once its
// predecessor is settled, whichever loop claimed it.
void Dispatcher::Impl::ClaimLoop(const Destination& dest, Sink& sink, int index) {
  const auto owned_store = stores();
  QueueStore& store = *owned_store;
  const LiveStore live(*this, Role::kClaim, store);  // let go of before the store goes
  FreshCursor cursor;
  const bool partitioned = config.claim_mode == ClaimMode::kPartitioned;
  // Partitioned, and the buckets lease their rows: claims read, the settles are fenced by the
  // buckets' epochs (docs/adr/0003-bucket-leases.md).
  const bool bucket_leases = config.bucket_leases;
  std::vector<BucketLease> last_buckets;
  std::optional<std::string> last_scanned;  // the buckets the last partitioned claim scanned
  std::deque<std::pair<BlockedKey, SteadyTime>> recheck;  // recently blocked keys
  std::vector<std::string> lost_claims;  // tokens of claims that failed: maybe committed
  auto next_recheck = Now();
  // Not the first loop: whether it must claim again whatever the backlog says, because its
  // cursor started over or its last claim stopped at its limit. Its claims lock rows the other
  // loops' cursors pass (SKIP LOCKED); what it locked and did not lease only its own cursor is
  // sure to come back for.
  bool must_claim = false;
  // Back to the start of the lane, claiming at once. The next claim's buckets are then its
  // baseline: it scans all of them from the start, so a change of them from the last claim's
  // needs no second start (below).
  const auto start_over = [&] {
    cursor.Reset();
    must_claim = true;
    last_scanned.reset();
  };
  const int batch = dest.batch_size > 0 ? dest.batch_size : config.batch_size;
  // The sink's room, asked before every claim: an open circuit breaker makes it 0 (and a probe
  // 1). Where it holds at least a whole claim, each claim loop after the first adds room for a
  // claim of its own, so that their claims run side by side: a webhook sink once sized its
  // room at 512 for 32 connections, less than two claims of 500, and with only that room the
  // second loop waited for the first one's claim to finish, so more loops claimed no faster. A
  // room under a claim is a sink throttling on purpose (a rate limit: two seconds of its pace;
  // a lowered concurrency): it stays as it is (review).
  const int loops = claim_loops.at(dest.name);
  const auto cap = [&] {
    const int room = static_cast<int>(sink.MaxInFlight(batch));
    if (room <= 1 || room < batch) return room;
    return room + (loops - 1) * batch;
  };
  auto last_sweep = Now();
  // In the Impl, not on this stack: completions run on sink threads after this loop ended.
  RoomWait& room_wait = *room_waits.at(dest.name);
  // max_in_flight_bytes: the payloads in the sink stay under it, whatever their size (counted
  // in messages, the room let a backlog of 1 MiB payloads hold 1.5 GiB in a webhook sink). A
  // claim asks for what fits the bytes left at the largest payload it expects, taken under the
  // room's lock with what the destination's other loops are claiming (RoomShare::TakeBytes),
  // and once the sink holds more than half the budget, or too much for the payload it expects
  // beside it, the loop waits until it holds half and that fits (RoomWait::BytesMark), as it
  // waits for half its room in messages: claims of a row or two cost the database nearly a
  // full one's. The first claim expects the largest payload writers may queue
  // (outbox.settings.max_payload_bytes); each later one the largest of the last claim, or half
  // the estimate before. Over the budget only by what one claim's payloads exceed that (payloads
  // that grew from one claim to the next: at worst batch_size of them, per loop).
  const std::int64_t byte_budget = dest.max_in_flight_bytes;
  std::int64_t payload_estimate = first_payload_estimate;
  const auto bytes_allow_a_claim = [&] {
    return room_wait.BytesAllowAClaim(byte_budget, payload_estimate);
  };
  Reconnect db(dest.name + ": claim failed, reconnecting", dest.name + ": database reachable again",
               [this] { DbError(); });
  std::uint64_t seen_gen;
  {
    std::lock_guard lk(mu);
    seen_gen = wake_gen;
  }
  // Keys a claim blocked may have lost their predecessor while it ran (its settle committed
  // after our snapshot): each is checked every 50 ms for a second, so their next messages do
  // not wait for the periodic orphan sweep; a key's last check comes before it is dropped,
  // however long the loop was away (waiting for room), and only a check that succeeded counts
  // (review: with the claim's connection broken, every check failed and the keys were dropped
  // unchecked). True when it woke rows.
  const auto recheck_blocked_keys = [&]() -> bool {
    if (recheck.empty() || Now() < next_recheck) return false;
    next_recheck = Now() + tuning::kBlockedKeyRecheckEvery;
    std::vector<BlockedKey> keys;
    keys.reserve(recheck.size());
    for (const auto& entry : recheck) keys.push_back(entry.first);
    const auto checked_at = Now();
    try {
      const bool woke = store.WakeKeys(dest.name, keys) > 0;
      while (!recheck.empty() &&
             checked_at - recheck.front().second > tuning::kBlockedKeyRecheckFor) {
        recheck.pop_front();
      }
      return woke;
    } catch (const std::exception& e) {
      DbError();
      spdlog::warn("{}: recheck of blocked keys failed: {}", dest.name, e.what());
      store.Reset();
      start_over();
      return false;
    }
  };
  // Claims that failed may have committed with their reply lost (the database restarted, the
  // connection broke): hand back what they leased, so their keys move within a reconnect
  // instead of after the whole lease. True when nothing is left to hand back.
  const auto release_lost_claims = [&]() -> bool {
    if (lost_claims.empty()) return true;
    try {
      const auto released = store.ReleaseLostClaims(lost_claims);
      if (released > 0) {
        spdlog::warn("{}: handed back {} message(s) leased by a claim whose reply was lost",
                     dest.name, released);
        Wake();
      }
      lost_claims.clear();
      return true;
    } catch (const std::exception& e) {
      if (!stopping) WaitFor(db.Failed(store, e), [] { return false; });
      return false;
    }
  };
  std::uint64_t seen_rebalance = 0;
  {
    std::lock_guard lk(mu);
    seen_rebalance = rebalance_gen;
  }
  // What a claim leased goes to the sink on the hand-off thread while this loop claims again
  // (handoff.h). The claim's share of the room goes with it and is given back once its rows are
  // in the sink. Declared last: it runs what it holds before the loop's other state goes.
  // Under bucket leases the claim's rows are not leased: their bucket's ownership is their
  // lease, and its end theirs.
  struct Claimed {
    std::vector<Message> messages;
    std::string token;
    std::optional<std::chrono::steady_clock::time_point> expires;
    std::unique_ptr<RoomShare> share;
    std::vector<BucketLease> buckets;  // bucket leases: read from these, at these epochs
  };
  Handoff<Claimed> handoff(
      [&](Claimed& c) {
        std::vector<std::pair<Message, Sink::Completion>> handed;
        handed.reserve(c.messages.size());
        std::vector<MessageId> ids;  // bucket leases: what DropHeld counted as unprepared
        if (bucket_leases) {
          ids.reserve(c.messages.size());
          for (const auto& msg : c.messages) ids.push_back(msg.id);
        }
        std::map<int, std::shared_ptr<ClaimCover>> covers;
        if (bucket_leases) covers = CoversOf(c.buckets);
        for (auto& msg : c.messages) {
          msg.claim_expires = c.expires;
          std::shared_ptr<ClaimCover> cover;
          if (bucket_leases) {
            // Its bucket's cover at the epoch it was read at (bucket_covers).
            const auto it = covers.find(msg.bucket);
            cover = it != covers.end() ? it->second
                                       : std::make_shared<ClaimCover>(SteadyClockTime{},
                                                                      ClaimCover::Kind::kBucket);
            msg.claim_expires = cover->Until();
          }
          if (auto h = Prepare(dest, sink, c.token, std::move(msg), room_wait, std::move(cover))) {
            handed.push_back(std::move(*h));
          }
        }
        if (bucket_leases) Prepared(ids);
        if (!handed.empty()) sink.SubmitMany(std::move(handed));
        c.share->Release();
      },
      "or-handoff");
  while (!stopping) {
    if (Now() - last_sweep >= config.full_sweep_interval) {
      cursor.StartSweep();
      last_sweep = Now();
    }
    {
      // outbox.set_bucket_count rewrote every row in one transaction: the claims meanwhile
      // skipped them all (SKIP LOCKED), and the cursor went past them. It notifies once it has
      // committed; the lane starts over then (not a sweep: what it finds was not missed).
      std::lock_guard lk(mu);
      if (rebalance_gen != seen_rebalance) {
        seen_rebalance = rebalance_gen;
        start_over();
      }
    }
    if (index > 0 && !must_claim && !room_wait.backlog.load()) {
      // Not the first loop: claim only while the destination has a backlog (the last claim
      // came back full); a quiet destination's wake-ups are the first loop's.
      release_lost_claims();
      if (recheck_blocked_keys()) {  // claim the woken rows now: nothing else wakes a loop
        must_claim = true;
        continue;
      }
      std::unique_lock lk(mu);
      wake_cv.wait_for(lk, recheck.empty() ? config.poll_interval : tuning::kBlockedKeyRecheckEvery,
                       [&] { return stopping.load() || room_wait.backlog.load(); });
      continue;
    }
    {
      // Not before this relay's heartbeat is accepted, nor while it is refused (Beat).
      std::unique_lock lk(mu);
      if (!heartbeat_accepted) {
        lk.unlock();
        release_lost_claims();
        WaitFor(tuning::kPausedPoll, [&] { return heartbeat_accepted; });
        continue;
      }
    }
    if (IsPaused(dest.name)) {  // an operator paused it: claim nothing, spend no attempt
      // A lost claim's rows go back now, not after the resume (they held their keys until the
      // lease ran out, and the reaper counted an attempt).
      release_lost_claims();
      WaitFor(tuning::kPausedPoll, [&] { return !IsPaused(dest.name); });
      continue;
    }
    // Claim when there is room for a good share of a batch, not for every completion: a claim
    // of a few rows costs the database nearly as much as a full one. Half the sink's room
    // still leaves it that much queued work meanwhile.
    const auto worth_a_claim = [&](int limit) { return std::max(1, std::min(batch, limit / 2)); };
    // The room left: the sink's, less what the destination's other loops are claiming now.
    const auto room_left = [&](int limit) {
      return limit - static_cast<int>(sink.InFlight()) - room_wait.reserved.load();
    };
    const int limit = cap();
    if (room_left(limit) < worth_a_claim(limit)) {
      // Woken rows wait for room like the rest; then this loop claims them, even past the gate.
      if (recheck_blocked_keys()) must_claim = true;
      // Armed before the room is looked at: the completion that finds the room worth a claim
      // takes the wake-up (room_wait.h).
      room_wait.Wait(tuning::kRoomPoll, stopping, [&] {
        const int now_cap = cap();
        room_wait.Arm(index, now_cap - worth_a_claim(now_cap));
        return room_left(now_cap) >= worth_a_claim(now_cap);
      });
      room_wait.Disarm(index);
      continue;
    }
    if (!bytes_allow_a_claim()) {
      if (recheck_blocked_keys()) must_claim = true;
      // Armed before the bytes are looked at: the completion that frees enough for this loop's
      // claim takes the wake-up (RoomWait::TakeBytesWake).
      room_wait.Wait(tuning::kRoomPoll, stopping, [&] {
        room_wait.ArmBytes(index, RoomWait::BytesMark(byte_budget, payload_estimate));
        return bytes_allow_a_claim();
      });
      room_wait.DisarmBytes(index);
      continue;
    }
    // Wake-ups from here on are about rows this claim may not see (their commit came after
    // its snapshot) or buckets it does not claim from (assigned after they were read below,
    // e.g. while lost claims were handed back); earlier ones it covers.
    {
      std::lock_guard lk(mu);
      seen_gen = wake_gen;
    }
    ClaimResult claim;
    std::vector<BucketLease> buckets;
    if (partitioned) {
      // Bucket leases: not those being handed over (they are drained, then given up).
      buckets = bucket_leases ? ClaimableBuckets() : OwnedBuckets();
      // Buckets this relay just gained hold rows below the cursor, which so far only
      // scanned the buckets it owned: start the lane over.
      if (buckets != last_buckets) {
        start_over();
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
    // What lost claims leased goes back before claiming again.
    if (!release_lost_claims()) continue;
    // This loop's share of the room, taken only now (no wait comes between it and the claim)
    // and held until what it claims is in the sink: the other loops see it taken.
    auto share = std::make_unique<RoomShare>(room_wait);
    int fresh_limit = share->Take(cap(), sink, worth_a_claim(limit), batch);
    if (fresh_limit == 0) continue;  // another loop took the room meanwhile
    int slow_limit = std::max(1, fresh_limit / 2);
    // The claim leases up to both lanes' limits: what fits the bytes is split between them, a
    // third for the slow lane, which keeps at least a row so due retries never wait for a
    // budget that only ever fits one (such a claim may then bring two).
    if (const int fits = share->TakeBytes(fresh_limit + slow_limit, byte_budget, payload_estimate);
        fits < fresh_limit + slow_limit) {
      if (fits == 0) continue;  // another loop's claim took the bytes meanwhile
      fresh_limit = std::max(1, fits - fits / 3);
      slow_limit = std::max(1, fits / 3);
    }
    const auto claim_started = Now();
    // (The sinks' clock, not the dispatcher's: a sink compares it with its own steady time.)
    const auto claim_expires = std::chrono::steady_clock::now() + config.lease;
    auto read = bucket_leases ? std::make_unique<ReadInProgress>(*this) : nullptr;
    if (read && read->buckets() != buckets) continue;  // a handover began meanwhile: look again
    try {
      if (bucket_leases) {
        claim = store.ClaimOwned(dest.name, cursor.position(), fresh_limit, slow_limit,
                                 config.lease, instance_id, read->buckets());
      } else if (partitioned) {
        claim = store.ClaimPartitioned(dest.name, cursor.position(), fresh_limit, slow_limit,
                                       config.lease, instance_id, buckets);
      } else {
        claim = store.Claim(dest.name, cursor.position(), fresh_limit, slow_limit, config.lease);
      }
      db.Succeeded();
      db_ok = true;
    } catch (const std::exception& e) {
      db_ok = false;
      if (!store.last_claim_token().empty()) lost_claims.push_back(store.last_claim_token());
      share->Release();  // not held through the pause
      const auto pause = db.Failed(store, e);
      start_over();
      WaitFor(pause, [] { return false; });
      continue;
    }
    // Bucket leases: what the relay holds is read again wherever the cursor had not passed it
    // yet, and is not sent twice (nor counted as missed by a sweep).
    // What the claim read, dropped rows included: whether to claim again goes by it.
    const std::size_t read_rows = claim.messages.size();
    if (read) DropHeld(claim, std::move(read));
    {
      const auto before = cursor.position();
      if (const auto missed = cursor.Missed(claim.fresh_lane); !missed.empty()) {
        RecordSweepFinds(dest, missed, claim.facts);
      }
      cursor.Observe(claim.facts);
      // Buckets that joined the scan without this relay's own changing (an owner whose
      // heartbeat says it does not serve the destination) hold rows below where the cursor
      // had moved over the other buckets: start the lane over. (It was not started over, and
      // their rows waited for the full sweep: review.)
      if (claim.facts.scanned_buckets != last_scanned) {
        if (last_scanned) start_over();
        last_scanned = claim.facts.scanned_buckets;
      }
      if (spdlog::should_log(spdlog::level::trace)) {
        spdlog::trace(
            "{}: claim cursor {} -> {} seq {} xmin {} xid {} fresh {} leased {} parked {}",
            dest.name, before, cursor.position(), claim.facts.seq_value, claim.facts.snap_xmin,
            claim.facts.own_xid, claim.facts.fresh_scanned, claim.messages.size(),
            claim.facts.held);
      }
    }
    metrics->RecordClaim(dest.name, static_cast<std::int64_t>(claim.messages.size()),
                         std::chrono::duration<double>(Now() - claim_started));
    // Handed over at once: one wake-up of a webhook sink's workers per claim, not one per
    // message (on the 16-core machine the claim thread spent 11 us a message handing a
    // webhook claim over, against 5.8 to Kafka, between claims of ~10 ms); and by the hand-off
    // thread, while this loop claims again.
    const auto leased = claim.messages.size();
    std::int64_t largest = 0;  // payload of the claim (the next claims' estimate)
    for (const auto& msg : claim.messages) {
      largest = std::max(largest, static_cast<std::int64_t>(msg.payload.size()));
    }
    if (leased > 0) {
      payload_estimate = std::max(largest, payload_estimate / 2);
      // Bucket leases: as long as its bucket is surely this relay's (the hand-off gives each
      // message its bucket's cover, which follows the heartbeats).
      handoff.Put(Claimed{std::move(claim.messages), claim.lease_token,
                          bucket_leases ? std::nullopt : std::optional(claim_expires),
                          std::move(share), bucket_leases ? buckets : std::vector<BucketLease>{}});
    } else {
      share->Release();
    }
    // Claim again at once only while a lane stopped at its limit, as the statement says
    // (fresh_full_bound, slow_full; a partitioned lane stops at a bucket's share with fewer
    // rows than it asked for), or parked rows behind keys may have moved: a claim whose lanes
    // did not stop saw everything committed before it, and what commits later wakes this loop
    // (its NOTIFY, a woken key, the reaper). Claiming again anyway cost, under live traffic, an empty claim after almost
    // every delivered message (measured at 1k msg/s: 2,751 empty of 9,303 claims).
    const auto fresh_got = claim.fresh_lane.size();
    const auto slow_got = leased - fresh_got;
    const bool drained = !claim.facts.fresh_full_bound.has_value() && !claim.facts.slow_full;
    must_claim = !drained;
    // A backlog: the slow lane got all it asked for, or the claim got at least half of what it
    // asked for and a lane stopped at its limit (a partitioned claim's lanes stop at a small
    // per-bucket share with a row or two; that is no backlog to call the other loops for).
    const bool backlog = !drained && (slow_got >= static_cast<std::size_t>(slow_limit) ||
                                      read_rows * 2 >= static_cast<std::size_t>(fresh_limit));
    if (loops > 1 && room_wait.backlog.exchange(backlog) != backlog) {
      // The backlog began (the other loops join in) or ended.
      std::lock_guard lk(mu);
      wake_cv.notify_all();
    }
    for (auto& key : claim.facts.blocked_keys) recheck.emplace_back(std::move(key), Now());
    if (recheck_blocked_keys()) {  // claim the woken rows now, even past the gate
      must_claim = true;
      continue;
    }
    if (bucket_leases && read_rows > 0 && leased == 0 && !drained) {
      // Bucket leases: it read only what this relay holds (its cursor held back by a
      // transaction in progress); claiming again at once read the same rows again and again
      // (review). They leave the lane once settled (the next settle wakes this loop), or the
      // cursor moves.
      waiting_for_settles = true;
      std::unique_lock lk(mu);
      wake_cv.wait_for(lk, tuning::kAllHeldPause,
                       [&] { return stopping.load() || wake_gen != seen_gen; });
      seen_gen = wake_gen;
    } else if ((read_rows == 0 || drained) && claim.facts.held == 0) {
      std::unique_lock lk(mu);
      wake_cv.wait_for(lk, recheck.empty() ? config.poll_interval : tuning::kBlockedKeyRecheckEvery,
                       [&] { return stopping.load() || wake_gen != seen_gen; });
      seen_gen = wake_gen;
    }
  }
  // Stopping: one more try, so a lost claim's rows do not wait for their lease.
  if (!release_lost_claims()) {
    spdlog::warn(
        "{}: could not hand back what a claim whose reply was lost leased; its lease "
        "will expire",
        dest.name);
  }
}

// The fresh lane passed these rows and only the sweep found them: by design this never
// happens, so each is counted and the first is logged with what the cursor knew.
void Dispatcher::Impl::RecordSweepFinds(const Destination& dest,
                                        const std::vector<MessageId>& missed,
                                        const ClaimFacts& facts) {
  const auto n = static_cast<std::int64_t>(missed.size());
  if (!sweep_find_logged.exchange(true)) {
    spdlog::warn(
        "{}: the full sweep found {} message(s) the fresh lane had passed (first id {}; "
        "sequence {}, snapshot xmin {}); they waited up to full_sweep_interval_ms. Counted in "
        "outbox_sweep_found_total; please report it with this line",
        dest.name, n, Raw(missed.front()), facts.seq_value, facts.snap_xmin);
  }
  metrics->RecordSweepFound(dest.name, n);
}

}  // namespace outbox::relay
