// The webhook service sink: fans each message out to the endpoints stored in Postgres, one
// webhook sink per endpoint, and hands back what an endpoint did not take as rows of its own.
#include "outbox_relay/webhook_service.h"

#include <openssl/evp.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <limits>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <unordered_set>

#include "outbox_relay/endpoint_directory.h"
#include "outbox_relay/sink_stops.h"
#include "outbox_relay/thread_name.h"
#include "outbox_relay/webhook_sink.h"
#include "outbox_relay/webhook_url.h"
#include "webhook_remake.h"

namespace outbox::relay {

std::string EndpointDeliveryId(const std::string& message_key, const std::string& endpoint_id) {
  const std::string input = message_key + "/" + endpoint_id;
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(input.data(), input.size(), digest, &len, EVP_md5(), nullptr);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(36);
  for (unsigned int i = 0; i < 16 && i < len; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
    out += kHex[digest[i] >> 4];
    out += kHex[digest[i] & 0xF];
  }
  return out;
}

// "https://host:port" of an endpoint's URL, for the log: its path and query may carry a
// credential (a token, a secret path as in Slack's webhook URLs), which the log must not show.
static std::string UrlOrigin(const std::string& url) {
  try {
    const WebhookUrl u = ParseWebhookUrl(url);
    const bool v6 = u.host.find(':') != std::string::npos;
    return std::string(u.https ? "https://" : "http://") + (v6 ? "[" + u.host + "]" : u.host) +
           ":" + std::to_string(u.port);
  } catch (const std::invalid_argument&) {
    return "an unreadable url";
  }
}

bool EndpointWants(const std::vector<std::string>& event_types, const std::string& event_type) {
  if (event_types.empty()) return true;
  for (const auto& t : event_types) {
    if (t == event_type || t == "*") return true;
    if (t.size() >= 2 && t.ends_with(".*") &&
        event_type.starts_with(std::string_view(t).substr(0, t.size() - 1))) {
      return true;
    }
  }
  return false;
}

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr milliseconds kPollEvery{250};        ///< Registry version poll.
constexpr milliseconds kNotLoadedHold{1'000};  ///< Before the first load: try again after.
constexpr milliseconds kBusyHold{1'000};       ///< An endpoint slower than the others.
/// The longest an endpoint's own rows are held back while it is busy (see OwnRowHold).
constexpr milliseconds kMaxBusyHold{30'000};
/// How long a delivery may wait in an endpoint's backlog before it becomes a row of its own.
constexpr milliseconds kBacklogWait{2'000};
constexpr milliseconds kAgeEvery{100};
constexpr milliseconds kMinBlockedHold{1'000};
/// A disabled endpoint's rows wait this long between looks; `endpoints enable` wakes them.
constexpr milliseconds kDisabledHold{3'600'000};
/// An endpoint whose sink could not be made (its ca_file unreadable for a moment, no thread
/// left, no TLS context) is tried again this often; its messages wait as long meanwhile.
constexpr milliseconds kUnusableRetry{5'000};
constexpr std::size_t kPlanBatchMax = 1000;    ///< Messages per owed-keys query.
constexpr milliseconds kLogEvery{200};         ///< Delivery-log batches.
constexpr std::size_t kLogQueueMax = 100'000;  ///< Beyond this (database away) rows are dropped.
constexpr milliseconds kCleanupEvery{60'000};
/// After an endpoint is enabled again: longer than a claim, a hand-back and its settle take.
constexpr milliseconds kRewakeAfter{3'000};
/// A wake after an endpoint was enabled again takes the rows held as disabled since this long
/// before the enable began (a settle that read the clock before it, and committed after the
/// enable's own wake read the backlog).
constexpr milliseconds kRewakeMargin{60'000};
/// A row of an endpoint not in the registry this relay read waits this long for a fresh read.
constexpr milliseconds kUnknownHold{1'000};
/// After the stop's deadline, how long the service's threads may stay in a database call
/// before their directories are interrupted.
constexpr milliseconds kStuckCallGrace{1'000};

/// Runs `action` once `deadline` has passed, unless destroyed before.
class AtDeadline {
 public:
  AtDeadline(Clock::time_point deadline, std::function<void()> action)
      : thread_([this, deadline, action = std::move(action)] {
          std::unique_lock lock(mu_);
          if (cv_.wait_until(lock, deadline, [this] { return cancelled_; })) return;
          lock.unlock();
          action();
        }) {}
  ~AtDeadline() {
    {
      std::lock_guard lock(mu_);
      cancelled_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  AtDeadline(const AtDeadline&) = delete;
  AtDeadline& operator=(const AtDeadline&) = delete;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool cancelled_ = false;
  std::thread thread_;  // last: it uses the members above
};

const char* LoggedOutcome(OutcomeKind k) {
  return k == OutcomeKind::kDelivered   ? "delivered"
         : k == OutcomeKind::kPermanent ? "permanent"
                                        : "retry";
}

void Call(const Sink::Completion& done, Outcome outcome, const std::string& destination) {
  try {
    done(std::move(outcome));
  } catch (const std::exception& e) {
    spdlog::error("webhook {}: completion threw: {}", destination, e.what());
  }
}

Outcome Simple(MessageId id, OutcomeKind kind, std::string reason, Reason cls = Reason::kNone,
               std::optional<milliseconds> after = std::nullopt) {
  Outcome o;
  o.id = id;
  o.kind = kind;
  o.reason = std::move(reason);
  o.reason_class = cls;
  o.retry_after = after;
  return o;
}

/// One endpoint: its spec and the sink that sends to it (null when the spec is unusable).
struct Lane {
  EndpointSpec spec;
  std::shared_ptr<Sink> sink;
  std::string error;  ///< Why there is no sink.
  /// Since when the endpoint's own rows have been handed back as busy, its sink not three
  /// quarters empty since (steady clock, ns; 0: not busy).
  mutable std::atomic<std::int64_t> busy_since_ns{0};
};
using LanePtr = std::shared_ptr<const Lane>;
using Lanes = std::map<std::string, LanePtr>;

/// How long a message waits for an endpoint that stopped sending (breaker open, paused).
milliseconds BlockedHold(const Sink& sink) {
  milliseconds hold = kMinBlockedHold;
  if (const auto h = sink.Health()) hold = std::max({hold, h->probe_in, h->paused_for});
  return hold;
}

/// Collects the endpoints' outcomes of one fanned-out message; the last one completes it.
class FanOut {
 public:
  FanOut(MessageId id, int endpoints, Sink::Completion done, std::function<void()> finished)
      : remaining_(endpoints), done_(std::move(done)), finished_(std::move(finished)) {
    result_.id = id;
  }

  void Took() { Add(std::nullopt); }
  void Owed(EndpointOutcome owed) { Add(std::move(owed)); }

 private:
  void Add(std::optional<EndpointOutcome> owed) {
    Outcome out;
    {
      std::lock_guard lock(mu_);
      if (owed) {
        result_.owed.push_back(std::move(*owed));
      } else {
        ++result_.delivered_to;
      }
      if (--remaining_ > 0) return;
      out = std::move(result_);
    }
    out.kind = out.owed.empty() ? OutcomeKind::kDelivered : OutcomeKind::kFannedOut;
    finished_();
    Call(done_, std::move(out), "service");
  }

  std::mutex mu_;
  int remaining_;
  Outcome result_;
  Sink::Completion done_;
  std::function<void()> finished_;
};

class WebhookServiceSink final : public Sink {
 public:
  WebhookServiceSink(std::string destination, const WebhookTarget& defaults)
      : destination_(std::move(destination)),
        defaults_(defaults),
        lanes_(std::make_shared<Lanes>()),
        registry_dir_(MakeEndpointDirectory(defaults.database_url, destination_)),
        planner_dir_(MakeEndpointDirectory(defaults.database_url, destination_)),
        log_dir_(MakeEndpointDirectory(defaults.database_url, destination_)) {
    registry_thread_ = std::thread([this] {
      NameThisThread("or-endpoints");
      RegistryLoop();
    });
    planner_thread_ = std::thread([this] {
      NameThisThread("or-fanout");
      PlanLoop();
    });
    log_thread_ = std::thread([this] {
      NameThisThread("or-attempts");
      LogLoop();
    });
  }

  ~WebhookServiceSink() override { Shutdown(milliseconds(0)); }

  void Submit(Message msg, Completion done) override {
    LanePtr child_lane;
    std::vector<LanePtr> matched;
    std::unique_lock lock(mu_);
    if (stopping_) {
      lock.unlock();
      Call(done,
           Simple(msg.id, OutcomeKind::kRetry, "shutdown: the webhook service is stopping",
                  Reason::kShutdown),
           destination_);
      return;
    }
    if (!loaded_) {
      lock.unlock();
      Call(done,
           Simple(msg.id, OutcomeKind::kReturned, "the endpoint registry is not loaded yet",
                  Reason::kNone, kNotLoadedHold),
           destination_);
      return;
    }
    const auto lanes = lanes_;
    if (!msg.endpoint_id) {
      for (const auto& [id, lane] : *lanes) {
        if (EndpointWants(lane->spec.event_types, msg.event_type)) matched.push_back(lane);
      }
      if (matched.empty()) {
        lock.unlock();
        Call(done, Simple(msg.id, OutcomeKind::kDelivered, ""), destination_);
        return;
      }
      in_flight_.fetch_add(1);
      plan_queue_.push_back(Job{std::move(msg), std::move(done), std::move(matched)});
      lock.unlock();
      plan_cv_.notify_one();
      return;
    }
    if (auto it = lanes->find(*msg.endpoint_id); it != lanes->end()) {
      child_lane = it->second;
    } else if (!Forgotten(*msg.endpoint_id)) {
      // Not known here (yet): an endpoint created a moment ago, whose rows came before the
      // registry poll saw it, or one this relay could not read since. Read the registry now;
      // the row comes back after a short hold, and counts as deleted only when a read that
      // began after it was first seen still does not have its endpoint.
      lock.unlock();
      registry_cv_.notify_all();
      Call(done,
           Simple(msg.id, OutcomeKind::kReturned,
                  "endpoint " + *msg.endpoint_id + " is not in this relay's registry yet",
                  Reason::kNone, kUnknownHold),
           destination_);
      return;
    }
    lock.unlock();
    SubmitOwed(std::move(msg), std::move(done), child_lane);
  }

  // An operator paused the destination: every endpoint's sink hands back what it holds
  // unsent, and so do the sinks of endpoints added meanwhile (Apply), until the resume.
  void SetPaused(bool paused) override {
    std::lock_guard pause_lock(pause_mu_);
    std::shared_ptr<const Lanes> lanes;
    {
      std::lock_guard lock(mu_);
      operator_paused_ = paused;
      lanes = lanes_;
    }
    for (const auto& [id, lane] : *lanes) {
      if (lane->sink) lane->sink->SetPaused(paused);
    }
  }

  void Shutdown(milliseconds deadline) override {
    std::lock_guard shutdown_lock(shutdown_mu_);
    if (joined_) return;
    const auto until = Clock::now() + deadline;
    // The threads below that are still in a database call a moment after the deadline (a
    // statement waiting for a lock, a database that stopped answering: up to tcp_user_timeout)
    // have it fail then, as the dispatcher's do, so the stop keeps to its deadline.
    const AtDeadline cut_loose(until + kStuckCallGrace, [this] {
      registry_dir_->Interrupt();
      planner_dir_->Interrupt();
      log_dir_->Interrupt();
    });
    std::deque<Job> queued;
    std::vector<std::shared_ptr<Sink>> stopped;  // replaced sinks, then every endpoint's
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
      stop_until_ = until;
      queued.swap(plan_queue_);
      stopped = retiring_;
      for (const auto& [id, lane] : *lanes_) {
        if (lane->sink) stopped.push_back(lane->sink);
      }
    }
    plan_cv_.notify_all();
    registry_cv_.notify_all();
    for (auto& job : queued) {
      in_flight_.fetch_sub(1);
      Call(job.done,
           Simple(job.msg.id, OutcomeKind::kRetry, "shutdown: not sent before the relay stopped",
                  Reason::kShutdown),
           destination_);
    }
    {
      // Every sink stops at once, while the threads below are waited for: the registry thread
      // may be waiting for replaced endpoints' sinks (up to a request timeout), which this
      // brings forward to the deadline (one it begins stopping later takes the deadline from
      // stop_until_, see Apply); and an endpoint's sink still connecting runs to its connect
      // timeout, during which a sink not told to stop yet would take its next row and
      // connect again.
      SideBySideStops stops = StopsBy(until);
      for (const auto& sink : stopped) stops.Stop(sink);
      if (planner_thread_.joinable()) planner_thread_.join();
      if (registry_thread_.joinable()) registry_thread_.join();
      // Replaced sinks: stopped above (by the deadline) if Apply had begun to stop them, or by
      // the deadline in Apply (it read stop_until_) if it began after.
      std::vector<std::future<void>> retirements;
      {
        std::lock_guard lock(mu_);
        retirements.swap(retirements_);
      }
      for (auto& r : retirements) r.wait();
      AgeBacklogs(true);  // what never reached an endpoint's sink is handed back
      // Endpoints a reload installed meanwhile.
      std::shared_ptr<const Lanes> lanes;
      {
        std::lock_guard lock(mu_);
        lanes = lanes_;
      }
      for (const auto& [id, lane] : *lanes) {
        if (lane->sink && std::find(stopped.begin(), stopped.end(), lane->sink) == stopped.end()) {
          stops.Stop(lane->sink);
        }
      }
    }  // joins the stops
    {
      std::lock_guard lock(log_mu_);
      log_stop_ = true;
    }
    log_cv_.notify_all();
    if (log_thread_.joinable()) log_thread_.join();  // writes what the lanes finished with
    joined_ = true;
  }

  bool Ready() const override { return WhyNotReady().empty(); }

  std::string WhyNotReady() const override {
    std::lock_guard lock(mu_);
    if (stopping_) return "shutting down";
    if (!loaded_) {
      return "the endpoint registry is not loaded yet" +
             (registry_error_.empty() ? std::string() : " (" + registry_error_ + ")");
    }
    if (RegistryStale()) {
      return "the endpoint registry could not be read for " +
             std::to_string(
                 std::chrono::duration_cast<std::chrono::seconds>(Clock::now() - *unread_since_)
                     .count()) +
             " s (" + registry_error_ +
             "); nothing more is claimed until it can be, since an endpoint may have been "
             "deleted or disabled, or a secret rotated out, meanwhile";
    }
    return "";
  }

  // mu_ held. The registry has failed every read for longer than registry_stale_after.
  bool RegistryStale() const {
    return unread_since_ && Clock::now() - *unread_since_ >= defaults_.registry_stale_after;
  }

  std::size_t InFlight() const override { return in_flight_.load(); }
  std::string_view Kind() const override { return "webhook"; }

  // Two claims' worth while any endpoint sends. An endpoint slower than the others keeps its
  // surplus in its backlog, and what waits there too long becomes a row of its own, so it
  // never holds back the others. When every endpoint stopped sending (breakers open), nothing
  // is claimed (1 for a probe): the messages wait as they are rather than be copied into rows
  // of each endpoint.
  std::size_t MaxInFlight(int claim_batch) const override {
    std::shared_ptr<const Lanes> lanes;
    {
      std::lock_guard lock(mu_);
      // Until the registry is read every message would go back unsent (Submit): claim none.
      // With two claims' worth, a registry that could not be read (grants missing) had the
      // relay claim and hand back the whole queue every second (review). And once it has not
      // been read for long: what it last read may have changed (review).
      if (!loaded_ || RegistryStale()) return 0;
      lanes = lanes_;
    }
    std::size_t most = 0;
    bool sending = false;
    for (const auto& [id, lane] : *lanes) {
      if (lane->sink && lane->spec.enabled) {
        sending = true;
        most = std::max(most, lane->sink->MaxInFlight(claim_batch));
      }
    }
    // Whole claims (what does not fit an endpoint's sink waits in its backlog here), so one
    // claim serves every endpoint: at fan-out, claims of a few rows would cost the database as
    // much per request as a claim per endpoint.
    const std::size_t claims = 2 * static_cast<std::size_t>(std::max(claim_batch, 1));
    if (!sending) return claims;
    return most <= 1 ? most : std::max(most, claims);
  }

  std::optional<TargetHealth> Health() const override {
    std::shared_ptr<const Lanes> lanes;
    {
      std::lock_guard lock(mu_);
      lanes = lanes_;
    }
    TargetHealth h;
    h.service = true;
    h.endpoints_auto_disabled = auto_disabled_.load();
    int sending = 0;
    for (const auto& [id, lane] : *lanes) {
      ++h.endpoints;
      if (!lane->spec.enabled) {
        ++h.endpoints_disabled;
        continue;
      }
      if (!lane->sink) continue;
      ++sending;
      const auto e = lane->sink->Health();
      if (!e) continue;
      // Half-open: its cool-down passed, and nothing is sent but the probe a message brings.
      if (e->breaker != "closed") ++h.endpoints_open;
      h.consecutive_failures = std::max(h.consecutive_failures, e->consecutive_failures);
      h.concurrency_limit += e->concurrency_limit;
      h.max_concurrency += e->max_concurrency;
      h.times_opened += e->times_opened;
      h.times_paused += e->times_paused;
    }
    h.breaker = sending > 0 && h.endpoints_open == sending ? "open" : "closed";
    return h;
  }

 private:
  /// A delivery waiting in an endpoint's backlog for room in its sink.
  struct Pending {
    Message msg;
    Completion done;
    std::shared_ptr<Sink> sink;
    Clock::time_point queued_at{};
  };

  struct Job {
    Message msg;
    Completion done;
    std::vector<LanePtr> lanes;
  };

  // Whether endpoint `id`, not in the lanes, is known to be gone: it was first seen missing
  // before the start of the last registry read that succeeded. Otherwise remembers when it was
  // first seen missing and asks the registry thread to read now. mu_ held.
  bool Forgotten(const std::string& id) {
    const auto now = Clock::now();
    const auto [it, fresh] = unknown_since_.try_emplace(id, now);
    if (!fresh && last_load_started_ > it->second) {
      unknown_since_.erase(it);
      return true;
    }
    reload_now_ = true;
    return false;
  }

  // A row owed to one endpoint: to that endpoint only, as a message of its own.
  void SubmitOwed(Message msg, Completion done, const LanePtr& lane) {
    const MessageId id = msg.id;
    if (!lane) {
      Call(done,
           Simple(id, OutcomeKind::kPermanent,
                  "endpoint " + *msg.endpoint_id + " no longer exists (deleted)", Reason::kOther),
           destination_);
      return;
    }
    if (!lane->spec.enabled) {
      Call(done,
           Simple(id, OutcomeKind::kReturned, "endpoint " + lane->spec.id + " is disabled",
                  Reason::kNone, kDisabledHold),
           destination_);
      return;
    }
    if (!lane->sink) {
      Call(done,
           Simple(id, OutcomeKind::kReturned,
                  "endpoint " + lane->spec.id + " is unusable: " + lane->error, Reason::kNone,
                  kUnusableRetry),
           destination_);
      return;
    }
    std::shared_ptr<Sink> sink = lane->sink;
    const std::size_t held = sink->InFlight();
    if (held >= OwnRowRoom(*sink)) {
      Call(done,
           Simple(id, OutcomeKind::kReturned,
                  "endpoint " + lane->spec.id + " busy: " + std::to_string(held) +
                      " of its requests waiting; not sent",
                  Reason::kNone, OwnRowHold(*lane)),
           destination_);
      return;
    }
    // Busy until the endpoint catches up (its sink three quarters empty), not merely until a
    // row gets in: a slow endpoint that keeps going frees a place every request, and each
    // reset sent its handed-back rows round again a second later.
    if (held < OwnRowRoom(*sink) / 4) lane->busy_since_ns.store(0);
    in_flight_.fetch_add(1);
    std::string delivery = msg.idempotency_key;  // an endpoint row's key is its delivery id
    sink->Submit(std::move(msg),
                 [this, sink, endpoint = lane->spec.id, delivery = std::move(delivery),
                  done = std::move(done)](Outcome o) {
                   Log(endpoint, delivery, o);
                   if (o.kind == OutcomeKind::kRetry && o.reason_class == Reason::kShutdown) {
                     // The endpoint's sink was replaced (an update) or the relay stops: not a
                     // failure.
                     o.kind = OutcomeKind::kReturned;
                   } else if (o.kind == OutcomeKind::kReturned && !o.retry_after) {
                     o.retry_after = BlockedHold(*sink);
                   }
                   in_flight_.fetch_sub(1);
                   Pump(endpoint);  // room in the endpoint's sink: the next of its backlog goes
                   Call(done, std::move(o), destination_);
                 });
  }

  void PlanLoop() {
    while (true) {
      std::vector<Job> batch;
      {
        std::unique_lock lock(mu_);
        plan_cv_.wait_for(lock, kAgeEvery, [this] { return stopping_ || !plan_queue_.empty(); });
        if (stopping_) return;  // Shutdown completes what is queued
        if (plan_queue_.empty()) {
          lock.unlock();
          AgeBacklogs(false);
          continue;
        }
        while (!plan_queue_.empty() && batch.size() < kPlanBatchMax) {
          batch.push_back(std::move(plan_queue_.front()));
          plan_queue_.pop_front();
        }
      }
      Plan(batch);
      AgeBacklogs(false);
    }
  }

  // Sends a batch of messages to their endpoints, after one query for the keys an endpoint
  // still owes.
  void Plan(std::vector<Job>& batch) {
    std::vector<std::string> keys;
    for (const auto& job : batch) {
      if (!job.msg.ordering_key) continue;
      for (const auto& lane : job.lanes)
        keys.push_back(lane->spec.id + ":" + *job.msg.ordering_key);
    }
    std::unordered_set<std::string> owed;
    bool owed_known = true;
    std::string owed_error;
    try {
      owed = planner_dir_->OwedKeys(keys);
    } catch (const std::exception& e) {
      owed_known = false;
      owed_error = e.what();
      spdlog::warn("webhook {}: cannot read what endpoints still owe ({}); keyed messages wait",
                   destination_, e.what());
    }
    for (auto& job : batch) {
      if (job.msg.ordering_key && !owed_known) {
        in_flight_.fetch_sub(1);
        Call(job.done,
             Simple(job.msg.id, OutcomeKind::kReturned,
                    "cannot check the endpoints' order of this key: " + owed_error, Reason::kNone,
                    kNotLoadedHold),
             destination_);
        continue;
      }
      auto fan = std::make_shared<FanOut>(job.msg.id, static_cast<int>(job.lanes.size()),
                                          std::move(job.done), [this] { in_flight_.fetch_sub(1); });
      for (const auto& lane : job.lanes) {
        SendTo(job.msg, *lane, fan,
               job.msg.ordering_key && owed.count(lane->spec.id + ":" + *job.msg.ordering_key));
      }
    }
  }

  void SendTo(const Message& msg, const Lane& lane, const std::shared_ptr<FanOut>& fan,
              bool key_owed) {
    auto hold = [&](std::string why, milliseconds after) {
      EndpointOutcome o;
      o.endpoint_id = lane.spec.id;
      o.endpoint_incarnation = lane.spec.incarnation;
      o.kind = OutcomeKind::kReturned;
      o.reason = std::move(why);
      if (after.count() > 0) o.retry_after = after;
      fan->Owed(std::move(o));
    };
    if (!lane.spec.enabled) return hold("endpoint disabled", kDisabledHold);
    if (!lane.sink) {
      return hold("endpoint " + lane.spec.id + " is unusable: " + lane.error, kUnusableRetry);
    }
    if (key_owed) return hold("an earlier message of this key is still owed", milliseconds(0));
    if (lane.sink->MaxInFlight(kLaneClaim) == 0) {
      return hold("endpoint not sending (breaker or pause)", BlockedHold(*lane.sink));
    }

    Message copy = msg;
    copy.idempotency_key = EndpointDeliveryId(msg.idempotency_key, lane.spec.id);
    std::shared_ptr<Sink> sink = lane.sink;
    const std::string endpoint = lane.spec.id;
    std::string delivery = copy.idempotency_key;
    Completion done = [this, fan, sink, endpoint, incarnation = lane.spec.incarnation,
                       delivery = std::move(delivery)](Outcome o) {
      Log(endpoint, delivery, o);
      Pump(endpoint);  // room in the endpoint's sink: the next of its backlog goes
      if (o.kind == OutcomeKind::kDelivered) return fan->Took();
      EndpointOutcome owed;
      owed.endpoint_id = endpoint;
      owed.endpoint_incarnation = incarnation;
      owed.kind = o.kind;
      owed.reason = std::move(o.reason);
      owed.reason_class = o.reason_class;
      owed.retry_after = o.retry_after;
      if (o.kind == OutcomeKind::kReturned && !owed.retry_after) {
        owed.retry_after = BlockedHold(*sink);
      }
      fan->Owed(std::move(owed));
    };
    std::unique_lock lock(backlog_mu_);
    auto& backlog = backlog_[endpoint];
    if (!backlog.empty() || sink->InFlight() >= LaneRoom(*sink)) {
      backlog.push_back(Pending{std::move(copy), std::move(done), sink, Clock::now()});
      return;
    }
    lock.unlock();
    sink->Submit(std::move(copy), std::move(done));
  }

  // How many requests an endpoint's sink may hold before its own rows (retries, what aged out
  // of its backlog) are handed back, due again after kBusyHold: half of what the sink asks
  // for. Sent past it, a slow or rate-limited endpoint's rows piled up in its sink at its pace
  // and held the destination's claim budget (MaxInFlight), so no other endpoint got new
  // messages; held up to it, the sink stays full, so fan-out copies still wait in the backlog
  // and age out rather than pace their message at the slow endpoint's rate.
  static std::size_t OwnRowRoom(const Sink& sink) {
    return std::max(LaneRoom(sink), sink.MaxInFlight(kLaneClaim) / 2);
  }

  // How long an own row handed back as busy waits: as long as the endpoint has been busy so
  // far (since its sink was last three quarters empty), from kBusyHold up to kMaxBusyHold. A
  // slow endpoint with a large backlog of its own otherwise had every due row claimed and
  // handed back again each second (a claim and a release written per row per second); the
  // longer it stays busy, the rarer that gets.
  static milliseconds OwnRowHold(const Lane& lane) {
    const std::int64_t now = Clock::now().time_since_epoch().count();
    std::int64_t since = 0;
    lane.busy_since_ns.compare_exchange_strong(since, now);
    const auto busy =
        std::chrono::duration_cast<milliseconds>(Clock::duration(now - (since == 0 ? now : since)));
    return std::clamp(busy, kBusyHold, kMaxBusyHold);
  }

  // What an endpoint's sink holds at most; the rest of what the claim brought waits in the
  // endpoint's backlog here, in order, and leaves it either for the sink as room frees or, when
  // it waited longer than kBacklogWait (the endpoint is slower than the others), as a row of its
  // own: so a slow endpoint never holds back the claim, and so the others.
  // Two per request the endpoint allows (its MaxInFlight counts 16): enough to keep its
  // connections busy, little enough that a slow endpoint's work waits here, where it can age.
  // Asked for as if for an unbounded claim: a webhook sink caps what it asks for at twice the
  // claim's batch, and with the lanes' 64 that held an endpoint allowed 32 requests to 16
  // copies at a time (its rate limit still caps it, at 2 s of its pace).
  static std::size_t LaneRoom(const Sink& sink) {
    return std::max<std::size_t>(2, sink.MaxInFlight(kUnboundedClaim) / 8);
  }

  // Sends what waits in `endpoint`'s backlog while its sink has room. Called when one of the
  // endpoint's requests finished, fan-out copies and the endpoint's own rows alike. (After an
  // update replaced the endpoint's sink, what waited for the old one still goes to it first:
  // it hands it back, "shutdown", and a row of the endpoint follows; then the new one's turn.)
  // A completion that runs inside Submit (a stopped sink) calls back in: the outer call goes on.
  void Pump(const std::string& endpoint) {
    thread_local std::set<std::string> pumping;  // endpoints this thread is pumping now
    if (!pumping.insert(endpoint).second) return;
    struct Done {
      const std::string& endpoint;
      ~Done() { pumping.erase(endpoint); }
    } done{endpoint};
    while (true) {
      Pending next;
      {
        std::lock_guard lock(backlog_mu_);
        auto it = backlog_.find(endpoint);
        if (it == backlog_.end() || it->second.empty()) return;
        const auto& sink = it->second.front().sink;
        if (sink->InFlight() >= LaneRoom(*sink)) return;
        next = std::move(it->second.front());
        it->second.pop_front();
      }
      if (Disabled(endpoint)) {
        // Disabled since it was queued: nothing more goes to it (it kept feeding the sink as
        // requests finished, up to kBacklogWait: review). Held as a disabled endpoint's are.
        Outcome o;
        o.id = next.msg.id;
        o.kind = OutcomeKind::kReturned;
        o.reason = "endpoint disabled";
        o.retry_after = kDisabledHold;
        next.done(std::move(o));
        continue;
      }
      next.sink->Submit(std::move(next.msg), std::move(next.done));
    }
  }

  // Whether the registry this relay read last has `endpoint` disabled.
  bool Disabled(const std::string& endpoint) const {
    std::lock_guard lock(mu_);
    const auto it = lanes_->find(endpoint);
    return it != lanes_->end() && !it->second->spec.enabled;
  }

  // Hands back what waited too long in an endpoint's backlog (a row of its own follows).
  void AgeBacklogs(bool everything) {
    std::vector<Pending> expired;
    const auto cutoff = Clock::now() - kBacklogWait;
    {
      std::lock_guard lock(backlog_mu_);
      for (auto& [endpoint, backlog] : backlog_) {
        while (!backlog.empty() && (everything || backlog.front().queued_at <= cutoff)) {
          expired.push_back(std::move(backlog.front()));
          backlog.pop_front();
        }
      }
    }
    for (auto& p : expired) {
      Outcome o;
      o.id = p.msg.id;
      if (everything) {
        o.kind = OutcomeKind::kRetry;
        o.reason = "shutdown: not sent before the relay stopped";
        o.reason_class = Reason::kShutdown;
      } else {
        o.kind = OutcomeKind::kReturned;
        o.reason = "endpoint slower than the others: its backlog waited over " +
                   std::to_string(kBacklogWait.count()) + " ms";
        o.retry_after = kBusyHold;
      }
      p.done(std::move(o));
    }
  }

  // The delivery log: what each request to an endpoint exchanged, and the endpoint's health.
  void Log(const std::string& endpoint, const std::string& delivery, const Outcome& o) {
    if (!o.exchange) return;  // not tried (returned, held)
    AttemptRow row;
    row.endpoint_id = endpoint;
    row.delivery_id = delivery;
    row.at = o.exchange->at;
    row.status = o.exchange->status;
    row.took = o.exchange->took;
    row.outcome = LoggedOutcome(o.kind);
    if (o.kind != OutcomeKind::kDelivered) row.error = o.reason;
    row.body = o.exchange->body;
    std::lock_guard lock(log_mu_);
    if (log_queue_.size() >= kLogQueueMax) {
      ++log_dropped_;
      return;
    }
    log_queue_.push_back(std::move(row));
  }

  void LogLoop() {
    const bool auto_disable = defaults_.auto_disable_after.count() > 0;
    const milliseconds check_every =
        std::clamp(defaults_.auto_disable_after / 2, milliseconds(200), milliseconds(5'000));
    auto next_check = Clock::now() + check_every;
    // The first cleanup comes at once (a relay restarted more often than kCleanupEvery still
    // cleans up); a full batch brings the next forward to the next turn, so a backlog (a
    // retention shortened, a relay that was down) goes kCleanupBatch rows a turn, never
    // slower than the log grows.
    auto next_cleanup = Clock::now();
    bool failing = false;
    while (true) {
      std::vector<AttemptRow> rows;
      std::int64_t dropped = 0;
      bool stop = false;
      {
        std::unique_lock lock(log_mu_);
        log_cv_.wait_for(lock, kLogEvery, [this] { return log_stop_; });
        rows.assign(std::make_move_iterator(log_queue_.begin()),
                    std::make_move_iterator(log_queue_.end()));
        log_queue_.clear();
        std::swap(dropped, log_dropped_);
        stop = log_stop_;
      }
      if (dropped > 0) {
        spdlog::warn("webhook {}: {} delivery-log rows dropped while the database was away",
                     destination_, dropped);
      }
      try {
        log_dir_->RecordAttempts(rows, defaults_.delivery_log);
        rows.clear();  // written: what fails below must not write them again
        const auto now = Clock::now();
        if (auto_disable && now >= next_check) {
          next_check = now + check_every;
          for (const auto& d : log_dir_->DisableFailing(defaults_.auto_disable_after,
                                                        defaults_.operational_events)) {
            auto_disabled_.fetch_add(1);
            spdlog::warn(
                "webhook {}: endpoint {} disabled automatically: failing since {} (longer than "
                "auto_disable_after_ms); its messages wait for it until `outbox-relay endpoints "
                "enable {}`",
                destination_, d.endpoint_id, d.failing_since, d.endpoint_id);
          }
        }
        // Also with the log off: what it kept while it was on ages out the same.
        if (now >= next_cleanup) {
          next_cleanup = now + kCleanupEvery;
          if (log_dir_->CleanupAttempts(defaults_.delivery_log_retention) >=
              EndpointDirectory::kCleanupBatch) {
            next_cleanup = now;
          }
        }
        failing = false;
      } catch (const std::exception& e) {
        if (!failing) {
          spdlog::warn(
              "webhook {}: cannot write the delivery log: {}; keeping its rows (up to {}) until "
              "it can",
              destination_, e.what(), kLogQueueMax);
        }
        failing = true;
        if (stop) {
          spdlog::warn("webhook {}: stopping: {} delivery-log rows not written", destination_,
                       rows.size());
          return;
        }
        // Back in front of what came since, in order; past the bound the oldest are dropped.
        std::lock_guard lock(log_mu_);
        const std::size_t room = kLogQueueMax - std::min(kLogQueueMax, log_queue_.size());
        const std::size_t keep = std::min(room, rows.size());
        log_dropped_ += static_cast<std::int64_t>(rows.size() - keep);
        log_queue_.insert(log_queue_.begin(),
                          std::make_move_iterator(rows.end() - static_cast<long>(keep)),
                          std::make_move_iterator(rows.end()));
        continue;
      }
      if (stop) return;
    }
  }

  void RegistryLoop() {
    std::int64_t seen = -1;
    std::optional<std::chrono::system_clock::time_point> next_expiry;
    /// When an endpoint's sink is to be made again (max: none is to be).
    auto retry_unusable = Clock::time_point::max();
    bool failing = false;
    while (true) {
      try {
        bool now = false;
        {
          std::lock_guard lock(mu_);
          std::swap(now, reload_now_);
        }
        const auto started = Clock::now();
        const std::int64_t v = registry_dir_->Version();
        if (v != seen || now || (next_expiry && std::chrono::system_clock::now() >= *next_expiry) ||
            started >= retry_unusable) {
          Directory d = registry_dir_->Load();
          seen = d.version;
          next_expiry = d.next_expiry;
          retry_unusable = Apply(d, started) ? Clock::time_point::max() : started + kUnusableRetry;
        }
        {
          std::lock_guard lock(mu_);
          unread_since_.reset();
        }
        WakeReenabled();
        if (failing) spdlog::info("webhook {}: endpoint registry readable again", destination_);
        failing = false;
      } catch (const std::exception& e) {
        if (!failing) {
          spdlog::warn(
              "webhook {}: cannot read the endpoint registry: {}; past {} s of this, "
              "nothing more is claimed until it can be",
              destination_, e.what(),
              std::chrono::duration_cast<std::chrono::seconds>(defaults_.registry_stale_after)
                  .count());
        }
        failing = true;
        std::lock_guard lock(mu_);
        registry_error_ = e.what();
        if (!unread_since_) unread_since_ = Clock::now();
      }
      std::unique_lock lock(mu_);
      registry_cv_.wait_for(lock, failing ? milliseconds(1'000) : kPollEvery,
                            [this] { return stopping_ || reload_now_; });
      if (stopping_) return;
    }
  }

  // The wakes of rewake_ that are due. One that fails is tried again a second later, until the
  // rows it is for are due anyway (kDisabledHold after this relay saw the enable); it takes
  // every hold since the enable, however late it runs.
  void WakeReenabled() {
    for (auto it = rewake_.begin(); it != rewake_.end();) {
      const auto now = Clock::now();
      if (now < it->at) {
        ++it;
        continue;
      }
      if (now - it->noticed >= kDisabledHold) {
        if (it->failed) {
          spdlog::warn("webhook {}: gave up waking what was held for endpoint {}: it is due now",
                       destination_, it->id);
        }
        it = rewake_.erase(it);
        continue;
      }
      try {
        registry_dir_->WakeEndpoint(it->id, kDisabledHold, kRewakeMargin);
        it = rewake_.erase(it);
      } catch (const std::exception& e) {
        if (!it->failed) {
          spdlog::warn(
              "webhook {}: cannot wake what was held for endpoint {} before it was enabled: {} "
              "(tried again each second)",
              destination_, it->id, e.what());
        }
        it->failed = true;
        it->at = now + milliseconds(1'000);
        ++it;
      }
    }
  }

  // Swaps in the endpoints of `d`, keeping the sink of every endpoint whose sending did not
  // change; sinks no longer used finish what they hold and stop. False when an endpoint's sink
  // could not be made (tried again on the next call).
  bool Apply(const Directory& d, Clock::time_point started) {
    // A pause or resume waits until the new lanes are published and paused as the destination
    // is (a sink made here before a pause would otherwise miss it).
    std::lock_guard pause_lock(pause_mu_);
    std::shared_ptr<const Lanes> old;
    {
      std::lock_guard lock(mu_);
      old = lanes_;
    }
    auto next = std::make_shared<Lanes>();
    std::unordered_set<const Sink*> kept;
    std::vector<std::string> reenabled;
    bool usable = true;
    for (const auto& spec : d.endpoints) {
      auto lane = std::make_shared<Lane>();
      lane->spec = spec;
      const auto it = old->find(spec.id);
      if (it != old->end() && it->second->sink && it->second->spec.SameSink(spec)) {
        lane->sink = it->second->sink;
        if (it->second->spec.incarnation != spec.incarnation) {
          // Its sink is kept (the same URL and settings); what the copies sent to the deleted
          // one are owed is settled as the deleted endpoint's (EndpointOutcome).
          spdlog::info("webhook {}: endpoint {} was deleted and added again", destination_,
                       spec.id);
        }
        if (it->second->spec.enabled != spec.enabled) {
          spdlog::info("webhook {}: endpoint {} {}", destination_, spec.id,
                       spec.enabled ? "enabled" : "disabled: its messages wait for it");
        }
      } else {
        try {
          // The same URL: the same endpoint, whose breaker, pause and concurrency limit the
          // new sink goes on from (a new secret made a fresh sink, which sent at once to an
          // endpoint that had asked for quiet or whose breaker was open: review).
          const Sink* previous =
              it != old->end() && it->second->sink && it->second->spec.url == spec.url
                  ? it->second->sink.get()
                  : nullptr;
          lane->sink = MakeLaneSink(spec, previous);
          bool paused = false;
          {
            std::lock_guard lock(mu_);
            paused = operator_paused_;
          }
          if (paused) lane->sink->SetPaused(true);
          spdlog::info("webhook {}: endpoint {} {} ({}, {} secret(s){})", destination_, spec.id,
                       it == old->end() ? "added" : "updated", UrlOrigin(spec.url),
                       spec.secrets.size(), spec.enabled ? "" : ", disabled");
        } catch (const std::exception& e) {
          lane->error = e.what();
          usable = false;
          // Once per endpoint and error, not on every try.
          if (it == old->end() || it->second->error != lane->error) {
            spdlog::error(
                "webhook {}: endpoint {} is unusable: {}; its messages wait, and it is tried "
                "again every {} s (if it needs fixing: outbox-relay endpoints update, or "
                "disable)",
                destination_, spec.id, e.what(), kUnusableRetry.count() / 1000);
          }
        }
      }
      // Enabled again, whether its sink was kept or made again (its URL changed with it: the
      // rows this relay held as disabled meanwhile waited kDisabledHold: review).
      if (it != old->end() && !it->second->spec.enabled && spec.enabled) {
        reenabled.push_back(spec.id);
      }
      if (lane->sink) kept.insert(lane->sink.get());
      (*next)[spec.id] = std::move(lane);
    }
    {
      std::lock_guard lock(mu_);
      lanes_ = next;
      loaded_ = true;
      registry_error_.clear();
      last_load_started_ = started;
      for (auto it = unknown_since_.begin(); it != unknown_since_.end();) {
        // Known now, or not asked about for long (rows of a deleted endpoint that stopped).
        if (next->count(it->first) || started - it->second > kDisabledHold) {
          it = unknown_since_.erase(it);
        } else {
          ++it;
        }
      }
    }
    // `endpoints enable` woke the endpoint's rows, but this relay may have claimed some before
    // it saw the change and be about to hold them again as disabled: wake them once more now
    // that it knows, and again once such settles are surely written (each relay does this when
    // it notices; the last one to notice wins).
    // (Through rewake_, which the registry loop works off and keeps what failed for its next
    // turn: a wake that throws here would leave the replaced sinks below running.)
    // And once more after the fan-outs in flight when it was enabled have surely settled: a
    // copy handed back as disabled is written only when its message's slowest endpoint is done
    // (a request timeout, then up to kBacklogWait in a backlog), and would otherwise wait out
    // kDisabledHold (review).
    for (const auto& id : reenabled) {
      const auto now = Clock::now();
      for (const auto at :
           {now, now + kRewakeAfter, now + defaults_.timeout + kBacklogWait + kRewakeAfter}) {
        rewake_.push_back(Rewake{id, at, now, false});
      }
    }
    // Requests already sent to replaced sinks finish (up to one request timeout for all of
    // them, or the service's stop deadline when it is stopping); new ones use the new sinks.
    std::vector<std::shared_ptr<Sink>> retired;
    for (const auto& [id, lane] : *old) {
      if (!next->count(id)) spdlog::info("webhook {}: endpoint {} removed", destination_, id);
      if (lane->sink && !kept.count(lane->sink.get())) retired.push_back(lane->sink);
    }
    if (retired.empty()) return usable;
    auto until = Clock::now() + defaults_.timeout;
    std::vector<std::future<void>> finished;  // destroyed after the lock is released
    std::lock_guard lock(mu_);
    if (stopping_) until = std::min(until, stop_until_);
    retiring_.insert(retiring_.end(), retired.begin(), retired.end());
    // Stopped beside this thread, which goes on reading the registry: waiting here for a
    // replaced endpoint's hanging request held every later change (an endpoint added, another
    // disabled) for up to the request timeout. Shutdown waits for these stops.
    for (auto it = retirements_.begin(); it != retirements_.end();) {
      if (it->wait_for(milliseconds(0)) == std::future_status::ready) {
        finished.push_back(std::move(*it));
        it = retirements_.erase(it);
      } else {
        ++it;
      }
    }
    retirements_.push_back(std::async(std::launch::async, [this, retired, until]() mutable {
      NameThisThread("or-retire");
      {
        SideBySideStops stops = StopsBy(until);
        for (const auto& sink : retired) stops.Stop(sink);
      }
      {
        std::lock_guard lock(mu_);
        std::erase_if(retiring_, [&](const std::shared_ptr<Sink>& s) {
          return std::find(retired.begin(), retired.end(), s) != retired.end();
        });
      }
      // The last references, most likely: the sinks go here, not under mu_ wherever the
      // future happens to be destroyed.
      retired.clear();
    }));
    return usable;
  }

  // Stops sinks side by side (SideBySideStops), each by `until`.
  static SideBySideStops StopsBy(Clock::time_point until) {
    return SideBySideStops([until] {
      return std::max(std::chrono::duration_cast<milliseconds>(until - Clock::now()),
                      milliseconds(0));
    });
  }

  static bool SameHeaderName(const std::string& a, const std::string& b) {
    return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
             return std::tolower(static_cast<unsigned char>(x)) ==
                    std::tolower(static_cast<unsigned char>(y));
           });
  }

  std::shared_ptr<Sink> MakeLaneSink(const EndpointSpec& spec, const Sink* previous) const {
    WebhookTarget t = defaults_;
    t.endpoints_from_database = false;
    t.url = spec.url;
    t.secrets = spec.secrets;
    // Over the destination's header of the same name, in whatever case either is written
    // (HTTP names are case-insensitive: merged as two names, both went out).
    for (const auto& [name, value] : spec.headers) {
      std::erase_if(t.headers, [&](const auto& h) { return SameHeaderName(h.first, name); });
      t.headers[name] = value;
    }
    if (spec.max_in_flight) t.max_in_flight = *spec.max_in_flight;
    if (spec.rate_limit) t.rate_limit = *spec.rate_limit;
    if (spec.breaker_enabled) t.breaker.enabled = *spec.breaker_enabled;
    if (spec.failure_threshold) t.breaker.failure_threshold = *spec.failure_threshold;
    if (spec.cooldown_ms) t.breaker.cooldown = Millis{*spec.cooldown_ms};
    if (spec.max_cooldown_ms) t.breaker.max_cooldown = Millis{*spec.max_cooldown_ms};
    t.breaker.max_cooldown = std::max(t.breaker.max_cooldown, t.breaker.cooldown);
    if (spec.adaptive_concurrency) t.adaptive_concurrency = *spec.adaptive_concurrency;
    if (t.secrets.empty()) throw std::invalid_argument("it has no secret that signs now");
    if (previous) {
      return std::shared_ptr<Sink>(
          webhook_detail::RemakeWebhookSink(destination_ + "/" + spec.id, t, *previous));
    }
    return std::shared_ptr<Sink>(
        MakeWebhookSink(destination_ + "/" + spec.id, t, WebhookRoom::kServiceLane));
  }

  /// The claim size MaxInFlight of an endpoint's sink is asked with.
  static constexpr int kLaneClaim = 64;
  static constexpr int kUnboundedClaim = std::numeric_limits<int>::max() / 2;

  const std::string destination_;
  const WebhookTarget defaults_;

  mutable std::mutex mu_;
  std::mutex pause_mu_;                 ///< Taken before mu_: SetPaused and Apply, one at a time.
  bool operator_paused_ = false;        ///< outbox-relay pause (SetPaused); guarded by mu_.
  std::shared_ptr<const Lanes> lanes_;  ///< Guarded by mu_ (the pointer; the map is immutable).
  bool loaded_ = false;                 ///< Guarded by mu_.
  bool stopping_ = false;               ///< Guarded by mu_.
  Clock::time_point stop_until_{};      ///< Shutdown's deadline, once stopping_; guarded by mu_.
  /// Sinks of replaced or removed endpoints that Apply is stopping; guarded by mu_.
  std::vector<std::shared_ptr<Sink>> retiring_;
  /// Apply's stops of those sinks, each on a thread of its own; guarded by mu_.
  std::vector<std::future<void>> retirements_;
  std::string registry_error_;  ///< Guarded by mu_.
  /// Since when every read of the registry failed; none while the last one succeeded. Guarded
  /// by mu_.
  std::optional<Clock::time_point> unread_since_;
  /// Endpoints of rows that were not in the lanes, since when (guarded by mu_): see Forgotten.
  std::map<std::string, Clock::time_point> unknown_since_;
  Clock::time_point last_load_started_{};  ///< Of the last read applied; guarded by mu_.
  bool reload_now_ = false;                ///< Read the registry at once; guarded by mu_.
  std::deque<Job> plan_queue_;             ///< Guarded by mu_.
  std::condition_variable plan_cv_;
  std::condition_variable registry_cv_;
  std::atomic<std::size_t> in_flight_{0};

  std::unique_ptr<EndpointDirectory> registry_dir_;  ///< Used by the registry thread only.
  /// An endpoint enabled again, to wake once more at `at`.
  struct Rewake {
    std::string id;
    Clock::time_point at;
    Clock::time_point noticed;  ///< When this relay saw it enabled.
    bool failed;                ///< Tried and failed (logged once).
  };
  /// Owned by the registry thread.
  std::vector<Rewake> rewake_;
  std::unique_ptr<EndpointDirectory> planner_dir_;  ///< Used by the planner thread only.
  std::unique_ptr<EndpointDirectory> log_dir_;      ///< Used by the log thread only.
  std::thread registry_thread_;
  std::thread planner_thread_;
  std::thread log_thread_;

  std::mutex backlog_mu_;
  std::map<std::string, std::deque<Pending>> backlog_;  ///< By endpoint; guarded by backlog_mu_.

  std::mutex log_mu_;
  std::condition_variable log_cv_;
  std::vector<AttemptRow> log_queue_;  ///< Guarded by log_mu_.
  std::int64_t log_dropped_ = 0;       ///< Guarded by log_mu_.
  bool log_stop_ = false;              ///< Guarded by log_mu_.
  std::atomic<std::int64_t> auto_disabled_{0};

  std::mutex shutdown_mu_;
  bool joined_ = false;  ///< Guarded by shutdown_mu_.
};

}  // namespace

SinkPtr MakeWebhookServiceSink(std::string destination, const WebhookTarget& defaults) {
  if (defaults.database_url.empty()) {
    throw std::invalid_argument("webhook " + destination +
                                ": endpoints: database needs the relay's database_url");
  }
  return std::make_unique<WebhookServiceSink>(std::move(destination), defaults);
}

}  // namespace outbox::relay
