#include "outbox_relay/dispatcher.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <random>
#include <unordered_set>

#include "dispatcher_impl.h"
#include "outbox_relay/retry.h"
#include "outbox_relay/sink_stops.h"
#include "outbox_relay/store.h"
#include "outbox_relay/thread_name.h"
#include "tuning.h"

namespace outbox::relay {
namespace {

double Uniform01() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return std::uniform_real_distribution<double>(0.0, 1.0)(rng);
}

}  // namespace

Dispatcher::Impl::LiveStore::LiveStore(Impl& d, Role role, QueueStore& store) : d_(d) {
  std::lock_guard lk(d_.live_mu);
  it_ = d_.live_stores.emplace(role, &store);
}

Dispatcher::Impl::LiveStore::~LiveStore() {
  {
    std::lock_guard lk(d_.live_mu);
    d_.live_stores.erase(it_);
  }
  d_.live_cv.notify_all();
}

void Dispatcher::Impl::InterruptAfter(Role role, Millis budget) {
  std::unique_lock lk(live_mu);
  if (live_cv.wait_for(lk, budget, [&] { return live_stores.count(role) == 0; })) return;
  const auto [first, last] = live_stores.equal_range(role);
  spdlog::warn("shutdown: {} database call(s) still running after the shutdown budget (a lock "
               "held elsewhere, or a database that does not answer); cutting them",
               std::distance(first, last));
  for (auto it = first; it != last; ++it) it->second->Interrupt();
}

void Dispatcher::Impl::Wake() {
  {
    std::lock_guard lk(mu);
    ++wake_gen;
  }
  wake_cv.notify_all();
}

void Dispatcher::Impl::Enqueue(Settlement s) {
  std::size_t queued;
  {
    std::lock_guard lk(settle_mu);
    settle_queue.push_back(std::move(s));
    queued = settle_queue.size();
  }
  // The settler waits for the first outcome, then lingers for a batch: wake it for those two.
  // (notify_all: Stop may be waiting on the same condition variable.)
  if (queued == 1 || queued == tuning::kSettleBatchTarget) settle_cv.notify_all();
}

bool Dispatcher::Impl::LogRefusalNow(std::string& last, SteadyTime& logged, const std::string& what,
                                     SteadyTime now) {
  const bool log = last != what || now - logged >= tuning::kRelayHeartbeat * 9 / 10;
  if (log) logged = now;
  last = what;
  return log;
}

void Dispatcher::Impl::Beat(QueueStore& store) {
  try {
    store.Heartbeat(instance_id, destination_names, description, TargetHealths(),
                    config.bucket_leases);
  } catch (const StoreError& e) {
    if (!e.transient()) {
      const auto now = Now();
      bool log = false;
      {
        std::lock_guard lk(mu);
        log = LogRefusalNow(heartbeat_refused, heartbeat_refusal_logged, e.what(), now);
        heartbeat_accepted = false;
      }
      if (log) {
        spdlog::error("heartbeat refused; claiming nothing until one is accepted: {}", e.what());
      }
    }
    throw;
  }
  bool first = false;
  {
    std::lock_guard lk(mu);
    first = !heartbeat_accepted;
    heartbeat_accepted = true;
    heartbeat_refused.clear();
  }
  if (first) Wake();  // the claim loops wait for it
}

std::vector<BucketLease> Dispatcher::Impl::OwnedBuckets() {
  std::lock_guard lk(owned_mu);
  return owned;
}

void Dispatcher::Impl::CoverBuckets(const std::vector<BucketLease>& now_owned,
                                    SteadyClockTime asked) {
  // No other relay takes these buckets before this heartbeat is partition_lease_ms old, and it
  // was written after `asked`.
  const auto until = asked + config.partition_lease;
  std::map<int, std::pair<std::int64_t, std::shared_ptr<ClaimCover>>> covers;
  for (const auto& b : now_owned) {
    const auto it = bucket_covers.find(b.bucket);
    if (it != bucket_covers.end() && it->second.first == b.epoch) {
      it->second.second->ExtendTo(until);
      covers.emplace(b.bucket, std::move(it->second));
    } else {
      covers.emplace(b.bucket, std::pair(b.epoch, std::make_shared<ClaimCover>(
                                                      until, ClaimCover::Kind::kBucket)));
    }
  }
  bucket_covers = std::move(covers);  // the others' covers stay with their messages, and run out
}

std::map<int, std::shared_ptr<ClaimCover>> Dispatcher::Impl::CoversOf(
    const std::vector<BucketLease>& buckets) {
  std::map<int, std::shared_ptr<ClaimCover>> out;
  std::lock_guard lk(owned_mu);
  for (const auto& b : buckets) {
    const auto it = bucket_covers.find(b.bucket);
    out.emplace(b.bucket,
                it != bucket_covers.end() && it->second.first == b.epoch
                    ? it->second.second
                    : std::make_shared<ClaimCover>(SteadyClockTime{}, ClaimCover::Kind::kBucket));
  }
  return out;
}

std::vector<BucketLease> Dispatcher::Impl::ClaimableBuckets() {
  auto buckets = OwnedBuckets();
  std::erase_if(buckets, [](const BucketLease& b) { return b.handing; });
  return buckets;
}

bool Dispatcher::Impl::IsPaused(const std::string& destination) {
  std::lock_guard lk(paused_mu);
  return paused.count(destination) > 0;
}

void Dispatcher::Impl::RefreshPaused(QueueStore& store) {
  std::unique_lock lk(pause_read_mu, std::try_to_lock);
  if (!lk.owns_lock()) return;
  std::map<std::string, std::string> now;
  try {
    now = store.PausedDestinations();
  } catch (const std::exception& e) {
    // Thrown, a failed read dropped the listener's connection (what was notified meanwhile
    // lost, every lane started over) and cut maintenance's turn short with a reconnect, once
    // a second for as long as it kept failing.
    if (!store.Connected() || stopping) throw;
    DbError();
    if (!pause_read_failing) {
      spdlog::warn(
          "cannot read the paused destinations ({}); the last read stands, and the "
          "next is tried in a second",
          e.what());
    }
    pause_read_failing = true;
    return;
  }
  if (pause_read_failing) spdlog::info("the paused destinations are read again");
  pause_read_failing = false;
  UpdatePaused(std::move(now));
}

void Dispatcher::Impl::UpdatePaused(std::map<std::string, std::string> now) {
  // One caller at a time (pause_read_mu, or the start before the threads): `paused` changes
  // only here.
  std::vector<std::string> pausing, resuming;
  {
    std::lock_guard lk(paused_mu);
    if (now == paused) return;
    for (const auto& [name, reason] : now) {
      if (!config.destinations.count(name) || paused.count(name)) continue;
      spdlog::warn(
          "destination \"{}\" is paused{}: claiming nothing for it until `outbox-relay "
          "resume {}`, and what its sink holds unsent goes back",
          name, reason.empty() ? "" : " (" + reason + ")", name);
      pausing.push_back(name);
    }
    for (const auto& [name, reason] : paused) {
      if (now.count(name) || !config.destinations.count(name)) continue;
      spdlog::info("destination \"{}\" resumed", name);
      resuming.push_back(name);
    }
  }
  // The sinks are told (their completions take settle_mu, never paused_mu): of a resume before
  // the claim loops see it, of a pause after. Told of a resume after, a sink slow to take it
  // (the webhook service's waits for a reload of the registry under way) refused what the
  // loops claimed at once, and each message waited a second as "paused by an operator".
  const auto tell = [this](const std::vector<std::string>& names, bool is_paused) {
    for (const auto& name : names) {
      if (const auto it = sinks.find(name); it != sinks.end()) it->second->SetPaused(is_paused);
    }
  };
  tell(resuming, false);
  {
    std::lock_guard lk(paused_mu);
    paused = std::move(now);
  }
  tell(pausing, true);  // what the sinks hold unsent goes back
  if (!resuming.empty()) Wake();
}

void Dispatcher::Impl::EnqueueCompleted(Settlement s) {
  std::size_t queued;
  {
    std::lock_guard lk(settle_mu);
    if (const auto it = held_leases.find(Raw(s.id)); it != held_leases.end()) {
      it->second.in_sink = false;
      it->second.removes = Removes(s);
      s.lease_token = it->second.token;
    }
    settle_queue.push_back(std::move(s));
    queued = settle_queue.size();
  }
  if (queued == 1 || queued == tuning::kSettleBatchTarget) settle_cv.notify_all();
}

Dispatcher::Impl::ReadInProgress::ReadInProgress(Impl& d) : d_(d) {
  std::lock_guard lk(d_.settle_mu);
  buckets_ = d_.ClaimableBuckets();
  std::vector<int> numbers;
  numbers.reserve(buckets_.size());
  for (const auto& b : buckets_) numbers.push_back(b.bucket);
  it_ = d_.reads_in_progress.emplace(++d_.settle_mark, std::move(numbers)).first;
}

Dispatcher::Impl::ReadInProgress::~ReadInProgress() {
  std::lock_guard lk(d_.settle_mu);
  d_.reads_in_progress.erase(it_);
  d_.ForgetSettledBefore();
}

void Dispatcher::Impl::ForgetSettledBefore() {
  while (!settled_order.empty() &&
         (reads_in_progress.empty() ||
          settled_order.front().second < reads_in_progress.begin()->first)) {
    const auto [id, at] = settled_order.front();
    settled_order.pop_front();
    if (const auto it = settled_at.find(id); it != settled_at.end() && it->second == at) {
      settled_at.erase(it);
    }
  }
}

std::size_t Dispatcher::Impl::DropHeld(ClaimResult& claim, std::unique_ptr<ReadInProgress> read) {
  const std::uint64_t read_mark = read->mark();
  std::unordered_set<std::int64_t> dropped;
  {
    std::lock_guard lk(settle_mu);
    // A read from the start of the lane again (the sweep, a change of buckets; or the cursor
    // held back by a transaction in progress) finds what this relay holds, in any state (an
    // outcome not written yet, a retry or a release too: the row says nothing of it yet), and,
    // from a snapshot older than the settle, what it settled meanwhile. The rest counts as
    // unprepared before the read ends: a handover sees one or the other.
    for (const auto& msg : claim.messages) {
      const auto settled = settled_at.find(Raw(msg.id));
      if (held_leases.count(Raw(msg.id)) > 0 || unprepared.count(Raw(msg.id)) > 0 ||
          (settled != settled_at.end() && settled->second > read_mark)) {
        dropped.insert(Raw(msg.id));
      } else {
        unprepared.emplace(Raw(msg.id), msg.bucket);
      }
    }
  }
  read.reset();
  if (!dropped.empty()) {
    std::erase_if(claim.messages, [&](const Message& m) { return dropped.count(Raw(m.id)) > 0; });
    std::erase_if(claim.fresh_lane, [&](MessageId id) { return dropped.count(Raw(id)) > 0; });
  }
  return dropped.size();
}

void Dispatcher::Impl::Prepared(const std::vector<MessageId>& ids) {
  std::lock_guard lk(settle_mu);
  for (const auto id : ids) unprepared.erase(Raw(id));
}

std::vector<int> Dispatcher::Impl::IdleHandingBuckets(const std::vector<BucketLease>& owned_now) {
  std::set<int> busy;
  for (const auto& [mark, buckets] : reads_in_progress) busy.insert(buckets.begin(), buckets.end());
  for (const auto& [id, bucket] : unprepared) busy.insert(bucket);
  for (const auto& [id, held] : held_leases) busy.insert(held.bucket);
  std::vector<int> idle;
  for (const auto& b : owned_now) {
    if (b.handing && busy.count(b.bucket) == 0) idle.push_back(b.bucket);
  }
  return idle;
}

std::optional<std::pair<Message, Sink::Completion>> Dispatcher::Impl::Prepare(
    const Destination& dest, Sink& sink, const std::string& token, Message msg, RoomWait& room_wait,
    std::shared_ptr<ClaimCover> cover) {
  auto dead = DecideBeforeAttempt(msg.id, msg.attempts, dest.retry, token);
  {
    std::lock_guard lk(settle_mu);
    const auto [it, fresh] = held_leases.try_emplace(Raw(msg.id));
    Held& held = it->second;
    held.token = token;
    if (!fresh && (held.in_sink || held.removes)) {
      // Its earlier copy is still in the sink, or delivered and not settled yet: that
      // outcome settles this claim. (A queued outcome takes the token here; one the settler
      // has taken takes it before its next try, SettleLoop.) The copy in the sink is covered
      // by this claim now.
      if (held.cover && msg.claim_expires) held.cover->ExtendTo(*msg.claim_expires);
      if (!held.in_sink) {
        for (auto& queued : settle_queue) {
          if (queued.id == msg.id && Removes(queued)) queued.lease_token = token;
        }
      }
      spdlog::warn(
          "{}: message {} was claimed again while its earlier claim was not settled yet "
          "(that lease ran out); not sent twice, the earlier claim's outcome settles it",
          dest.name, Raw(msg.id));
      return std::nullopt;
    }
    ++unsettled;
    held.in_sink = !dead;
    held.removes = dead.has_value();
    held.cover = cover               ? std::move(cover)  // bucket leases: its bucket's
                 : msg.claim_expires ? std::make_shared<ClaimCover>(*msg.claim_expires)
                                     : nullptr;
    held.bucket = msg.bucket;
    msg.claim_cover = held.cover;
    if (msg.ordering_key) {
      held.key = BlockedKey{*msg.ordering_key, msg.endpoint_id};
    } else {
      held.key.reset();
    }
  }
  if (dead) {
    dead->destination = dest.name;
    dead->created_at = msg.created_at;
    Enqueue(std::move(*dead));
    return std::nullopt;
  }
  const MessageId id = msg.id;
  const int attempts = msg.attempts;
  const auto created_at = msg.created_at;
  const auto submitted = Now();
  const Destination* d = &dest;
  std::string trace = TraceIdOf(msg);
  const auto bytes = static_cast<std::int64_t>(msg.payload.size());
  // In the Impl, as long as any completion may run (room_waits).
  RoomWait* const room = &room_wait;
  room->payload_bytes.fetch_add(bytes);
  Sink::Completion done = [this, id, attempts, d, &sink, token, created_at, submitted, room, bytes,
                           trace = std::move(trace)](Outcome outcome) {
    // The sink is done with the payload: its bytes no longer count against the destination's
    // max_in_flight_bytes. A claim loop waiting for them waits until the sink holds at most
    // half of it with room for the payload it expects (RoomWait::BytesMark), woken by the
    // completion that frees that much.
    room->payload_bytes.fetch_sub(bytes);
    const bool bytes_freed = d->max_in_flight_bytes > 0 && room->TakeBytesWake();
    Settlement s = Decide(id, attempts, outcome, d->retry, token, Uniform01(), stopping.load());
    LogOutcome(*d, id, trace, outcome, s);
    s.destination = d->name;
    s.created_at = created_at;
    if (outcome.kind != OutcomeKind::kReturned) {
      RecordAttempt(*d, sink, outcome, submitted);
    }
    EnqueueCompleted(std::move(s));
    // Room in flight: wake a claim loop waiting for room once there is enough for a claim,
    // once per wait (RoomWait::TakeWake), not on every completion past the mark: on two cores
    // those wake-ups (of every thread waiting on wake_cv, which they used) cost a webhook
    // worker up to 0.8 ms a message.
    if (bytes_freed || room->TakeWake(static_cast<long>(sink.InFlight()))) room->WakeLoops();
  };
  return std::pair<Message, Sink::Completion>(std::move(msg), std::move(done));
}

std::string TraceIdOf(const Message& msg) {
  for (const auto& [name, value] : msg.headers) {
    // version-traceid-parentid-flags; the format was checked when the message was written,
    // under any case of the name (migration 0031), and it is set once
    if (name.size() == 11 && value.size() == 55 &&
        std::equal(name.begin(), name.end(), "traceparent", [](char a, char b) {
          return std::tolower(static_cast<unsigned char>(a)) == b;
        })) {
      return value.substr(3, 32);
    }
  }
  return "";
}

// Each delivery outcome, with the trace id of the span that wrote the message when it carried
// W3C trace context: dead letters at info, retries at debug, deliveries at trace.
void Dispatcher::Impl::LogOutcome(const Destination& d, MessageId id, const std::string& trace,
                                  const Outcome& outcome, const Settlement& s) {
  const auto level = s.kind == Settlement::Kind::kDelivered ? spdlog::level::trace
                     : s.kind == Settlement::Kind::kDead    ? spdlog::level::info
                                                            : spdlog::level::debug;
  if (!spdlog::should_log(level)) return;  // on the hot path: build nothing at info level
  const std::string traced = trace.empty() ? "" : " trace_id=" + trace;
  switch (s.kind) {
    case Settlement::Kind::kDelivered:
      spdlog::trace("{}: message {} delivered{}", d.name, Raw(id), traced);
      break;
    case Settlement::Kind::kDead:
      spdlog::info("{}: message {} dead-lettered: {}{}", d.name, Raw(id), s.error, traced);
      break;
    case Settlement::Kind::kFanOut:
      spdlog::debug("{}: message {} sent to {} endpoint(s), {} still owed{}", d.name, Raw(id),
                    s.delivered_to, s.children.size(), traced);
      break;
    case Settlement::Kind::kRetry:
    case Settlement::Kind::kRelease:
      spdlog::debug("{}: message {} {} ({}){}", d.name, Raw(id), ToString(outcome.kind),
                    outcome.reason, traced);
      break;
  }
}

// One delivery attempt, whatever its settle finds: how long it took, what the endpoint said.
void Dispatcher::Impl::RecordAttempt(const Destination& d, const Sink& sink, const Outcome& outcome,
                                     SteadyTime submitted) {
  attempt_durations.at(d.name)->Observe(std::chrono::duration<double>(Now() - submitted).count());
  if (sink.OutcomesAreResponses()) metrics->RecordWebhookResponse(d.name, outcome);
}

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
  if (env.metrics == nullptr) impl_->owned_metrics = std::make_unique<RelayMetrics>("");
  auto* metrics = env.metrics ? env.metrics : impl_->owned_metrics.get();
  impl_->metrics = metrics;
  impl_->publish_status = env.metrics != nullptr;
  impl_->status_interval = env.status_interval;
  impl_->first_payload_estimate =
      env.max_payload_bytes > 0 ? env.max_payload_bytes : tuning::kFirstPayloadEstimate;
  for (auto& [name, dest] : impl_->config.destinations) {
    if (!impl_->sinks.count(name)) throw std::invalid_argument("no sink for destination " + name);
    // As the config file resolves it: a destination's own, else the relay's (0: no limit).
    if (dest.max_in_flight_bytes == 0) dest.max_in_flight_bytes = impl_->config.max_in_flight_bytes;
  }
  for (const auto& [name, sink] : impl_->sinks) {
    metrics->InitDestination(name, sink->Kind());
    impl_->attempt_durations[name] = &metrics->DeliveryDuration(name, sink->Kind());
  }
}

Dispatcher::~Dispatcher() {
  Stop();
  // The gauge reads this dispatcher's counts: gone with it (the metrics may outlive it).
  for (const auto& [name, room] : impl_->room_waits) impl_->metrics->ClearSinkPayloadBytes(name);
}

DispatcherStats Dispatcher::stats() const {
  const RelayMetrics& m = *impl_->metrics;
  auto total = [](const metrics::CounterFamily& f) {
    return static_cast<std::int64_t>(std::llround(f.Total()));
  };
  DispatcherStats s;
  s.claims = total(m.claims_total);
  s.empty_claims = total(m.empty_polls_total);
  s.claimed = total(m.messages_claimed_total);
  s.sweep_found = total(m.sweep_found_total);
  s.delivered = total(m.delivered_total);
  s.retried = total(m.retried_total);
  s.dead = total(m.dead_lettered_total);
  s.released = total(m.released_total);
  s.fenced = total(m.settle_fenced_total);
  s.reaped = total(m.reaper_requeued_total);
  s.db_errors = total(m.db_errors_total);
  return s;
}

bool Dispatcher::Ready() const { return WhyNotReady().empty(); }

std::string Dispatcher::WhyNotReady() const {
  {
    // First: a refused relay never claims, so the database reads as not reached.
    std::lock_guard lk(impl_->owned_mu);
    if (!impl_->coordinator_refused.empty()) {
      return "partitioned: the coordinator refuses this relay: " + impl_->coordinator_refused;
    }
  }
  {
    std::lock_guard lk(impl_->mu);
    if (!impl_->heartbeat_refused.empty()) {
      return "the heartbeat is refused, so nothing is claimed: " + impl_->heartbeat_refused;
    }
  }
  if (!impl_->db_ok) return "database: not reached yet, or the last call failed";
  for (const auto& [name, sink] : impl_->sinks) {
    if (auto why = sink->WhyNotReady(); !why.empty()) return name + ": " + why;
  }
  return "";
}

std::map<std::string, int> ShareAutoClaimLoops(const std::map<std::string, int>& asked) {
  int budget = static_cast<int>(asked.size());
  for (const auto& [name, loops] : asked) budget = std::max(budget, loops);
  std::map<std::string, int> given;
  for (const auto& [name, loops] : asked) given[name] = 1;
  int left = budget - static_cast<int>(asked.size());
  // The loops past the first, one round at a time in name order, while the budget lasts.
  for (bool gave = true; left > 0 && gave;) {
    gave = false;
    for (auto& [name, loops] : given) {
      if (left > 0 && loops < asked.at(name)) {
        ++loops;
        --left;
        gave = true;
      }
    }
  }
  return given;
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
  const bool automatic = d.config.claim_connections <= 0;
  std::map<std::string, int> asked;
  for (const auto& [name, dest] : d.config.destinations) {
    // Bucket leases: one loop (a claim holds the slow lane's rows in a second statement; the
    // config refuses more than 1).
    asked[name] = d.config.bucket_leases ? 1
                                         : std::clamp(automatic ? d.sinks.at(name)->ClaimLoops()
                                                                : d.config.claim_connections,
                                                      1, kMaxClaimConnections);
  }
  if (automatic) asked = ShareAutoClaimLoops(asked);
  for (const auto& [name, dest] : d.config.destinations) {
    d.destination_names.push_back(name);
    auto room = d.room_waits.emplace(name, std::make_shared<Impl::RoomWait>()).first->second;
    d.metrics->SetSinkPayloadBytes(
        name, [room] { return static_cast<double>(room->payload_bytes.load()); });
    const int loops = asked.at(name);
    d.claim_loops[name] = loops;
    if (loops > 1) {
      spdlog::info("destination \"{}\": {} claim loops, each on a connection of its own{}", name,
                   loops, automatic ? " (claim_connections auto: as its sink asks)" : "");
    }
  }
  // A destination paused before start is not claimed even once; if this read fails, the
  // maintenance loop's next one applies the pause.
  try {
    d.UpdatePaused(d.stores()->PausedDestinations());
  } catch (const std::exception& e) {
    spdlog::debug("could not read the paused destinations at start (maintenance retries): {}",
                  e.what());
  }
  d.settler = std::thread([&d] {
    NameThisThread("or-settle");
    d.SettleLoop();
  });
  d.listener = std::thread([&d] {
    NameThisThread("or-listen");
    d.ListenLoop();
  });
  d.maintenance = std::thread([&d] {
    NameThisThread("or-maint");
    d.MaintenanceLoop();
  });
  if (d.publish_status) {
    d.status_reader = std::thread([&d] {
      NameThisThread("or-status");
      d.StatusLoop();
    });
  }
  if (d.config.claim_mode == ClaimMode::kPartitioned) {
    d.coordinator = std::thread([&d] {
      NameThisThread("or-coord");
      d.CoordinatorLoop();
    });
  }
  for (const auto& [name, dest] : d.config.destinations) {
    Sink& sink = *d.sinks.at(name);
    const Destination& dst = dest;
    const int loops = d.claim_loops.at(name);
    for (int index = 0; index < loops; ++index) {
      d.loops.emplace_back([&d, &dst, &sink, index] {
        NameThisThread("or-claim");
        d.ClaimLoop(dst, sink, index);
      });
    }
  }
}

int Dispatcher::ClaimLoops(const std::string& destination) const {
  const auto it = impl_->claim_loops.find(destination);
  return it == impl_->claim_loops.end() ? 0 : it->second;
}

bool Dispatcher::Stop() {
  auto& d = *impl_;
  if (!d.started || d.stopped) return true;
  d.stopped = true;
  const auto deadline = d.Now() + d.config.shutdown_timeout;
  // Buckets go back at once, so the other relays take over while this one finishes; unless
  // a sink's start fences the previous owner (exactly-once: the next owner's
  // init_transactions would abort this relay's last transactions), or the buckets lease their
  // rows (bucket leases: the settles of what the sinks still hold would be fenced, and the
  // next owner would send it all again), then after the settles.
  const bool keep_buckets =
      d.config.bucket_leases || std::any_of(d.sinks.begin(), d.sinks.end(), [](const auto& s) {
        return s.second->FencesOthersWhenItStarts();
      });
  auto hand_back_buckets = [&d] {
    {
      std::lock_guard lk(d.mu);
      d.coordinator_stopping = true;
    }
    d.wake_cv.notify_all();
    if (d.coordinator.joinable()) {
      d.InterruptAfter(Impl::Role::kCoordinator, tuning::kStuckStatementGrace);
      d.coordinator.join();  // hands the buckets back
    }
  };
  {
    std::lock_guard lk(d.mu);
    d.stopping = true;
  }
  d.wake_cv.notify_all();
  for (const auto& [name, room] : d.room_waits) room->WakeLoops();  // loops waiting for room
  // A claim stuck in the database (a lock held elsewhere: VACUUM FULL, a migration's ALTER
  // TABLE; a database that stopped answering) is cut at the deadline: waited for, it held the
  // whole shutdown, and the sinks then had no time left for what they still sent.
  d.InterruptAfter(Impl::Role::kClaim,
                   std::max(std::chrono::duration_cast<Millis>(deadline - d.Now()), Millis{0}));
  for (auto& t : d.loops) t.join();
  if (!keep_buckets) hand_back_buckets();
  if (d.listener.joinable()) d.listener.join();
  // In-flight deliveries come before maintenance, which may be inside a long query: it is
  // joined after the sinks have had their shutdown budget.
  // Sinks finish what they hold; what they cannot is completed as retry -> released. Side by
  // side: a sink may run past the deadline on its own (a webhook connect runs to its connect
  // timeout), and one after another those overruns added up.
  {
    SideBySideStops stops([&d, deadline] {
      return std::max(std::chrono::duration_cast<Millis>(deadline - d.Now()),
                      tuning::kMinSinkShutdown);
    });
    for (auto& [name, sink] : d.sinks) stops.Stop(*sink);
  }
  bool all = true;
  {
    std::unique_lock lk(d.settle_mu);
    // A real wait of what is left of the budget (at least 2 s), measured on the given clock.
    const auto settle_wait =
        std::max(std::chrono::duration_cast<Millis>(deadline - d.Now()), tuning::kMinSettleAtStop);
    all = d.settle_cv.wait_for(lk, settle_wait, [&] { return d.unsettled == 0; });
    d.settler_stop = true;
    d.settler_give_up = true;
  }
  d.settle_cv.notify_all();
  d.InterruptAfter(Impl::Role::kSettler, tuning::kStuckStatementGrace);
  d.settler.join();
  if (keep_buckets) hand_back_buckets();
  {
    std::lock_guard lk(d.mu);
    d.maintenance_stopping = true;
  }
  d.wake_cv.notify_all();
  if (d.maintenance.joinable()) {
    d.InterruptAfter(Impl::Role::kMaintenance, tuning::kStuckStatementGrace);
    d.maintenance.join();
  }
  if (d.status_reader.joinable()) {  // stopped reading when `stopping` was set
    d.InterruptAfter(Impl::Role::kStatus, tuning::kStuckStatementGrace);
    d.status_reader.join();
  }
  return all;
}

}  // namespace outbox::relay
