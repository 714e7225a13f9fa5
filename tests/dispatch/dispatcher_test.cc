// The dispatcher on an in-memory store and a clock the test moves (fake_store.h): ordering,
// backpressure, retries, leases, reconnects, lost claim replies, the sweep and shutdown,
// without PostgreSQL. Nothing here waits on wall time for a lease or a retry to come due:
// the test advances the clock. Waits are on conditions, with deadlines.
#include "outbox_relay/dispatcher.h"

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "fake_store.h"
#include "outbox_relay/metrics.h"
#include "outbox_test/log_watch.h"

namespace outbox::relay {
namespace {

// A kind of target no sink serves: the dispatcher runs on the sinks it is given.
struct FakeTarget {
  static constexpr std::string_view kKind = "fake";
};

using namespace std::chrono_literals;
using testing::FakeClock;
using testing::FakeDatabase;

template <class Pred>
bool WaitFor(Pred pred, std::chrono::milliseconds deadline = 10s) {
  const auto until = std::chrono::steady_clock::now() + deadline;
  while (std::chrono::steady_clock::now() < until) {
    if (pred()) return true;
    std::this_thread::sleep_for(2ms);
  }
  return pred();
}

// A sink that records what it was given and completes on its own thread, in shuffled order,
// as a real sink's callbacks arrive. `decide` says per message what happens: an outcome now,
// or nullopt to hold it until Release() (or Shutdown).
class RecordingSink final : public Sink {
 public:
  using Decide = std::function<std::optional<Outcome>(const Message&)>;

  explicit RecordingSink(Decide decide) : decide_(std::move(decide)) {
    worker_ = std::thread([this] { Run(); });
  }
  ~RecordingSink() override {
    {
      std::lock_guard lk(mu_);
      quit_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }

  void Submit(Message msg, Completion done) override {
    std::unique_lock lk(mu_);
    if (paused_) ++submitted_while_paused_;
    if (shut_) {
      lk.unlock();
      done(Outcome{msg.id,
                   OutcomeKind::kRetry,
                   "shutdown",
                   Reason::kShutdown,
                   std::nullopt,
                   {},
                   0,
                   std::nullopt});
      return;
    }
    ++in_flight_;
    max_in_flight_ = std::max(max_in_flight_, in_flight_);
    in_flight_bytes_ += msg.payload.size();
    max_in_flight_bytes_ = std::max(max_in_flight_bytes_, in_flight_bytes_);
    if (msg.ordering_key) {
      if (!keys_in_flight_.insert(*msg.ordering_key).second) ++key_overlaps_;
    }
    submitted_.push_back(Raw(msg.id));
    const auto outcome = decide_(msg);
    Pending p{std::move(msg), std::move(done), outcome.value_or(Outcome{})};
    if (outcome) {
      ready_.push_back(std::move(p));
      cv_.notify_all();
    } else {
      held_.push_back(std::move(p));
    }
  }

  void SubmitMany(std::vector<std::pair<Message, Completion>> batch) override {
    std::function<void()> hook;
    {
      std::lock_guard lk(mu_);
      hand_overs_.push_back(batch.size());
      hook.swap(before_submit_many_);
    }
    if (hook) hook();
    Sink::SubmitMany(std::move(batch));
  }
  /// Runs once, at the start of the next SubmitMany (a hand-over that takes that long).
  void BeforeSubmitMany(std::function<void()> hook) {
    std::lock_guard lk(mu_);
    before_submit_many_ = std::move(hook);
  }
  /// How many messages each SubmitMany call handed over, in order.
  std::vector<std::size_t> hand_overs() const {
    std::lock_guard lk(mu_);
    return hand_overs_;
  }

  void Shutdown(std::chrono::milliseconds) override {
    if (on_shutdown_) on_shutdown_();
    std::deque<Pending> held;
    {
      std::lock_guard lk(mu_);
      shut_ = true;
      held.swap(held_);
    }
    for (auto& p : held) {
      p.outcome =
          Outcome{p.msg.id, OutcomeKind::kRetry, "shutdown", Reason::kShutdown, std::nullopt, {},
                  0,        std::nullopt};
      Complete(std::move(p));
    }
  }
  bool Ready() const override { return true; }
  void SetPaused(bool paused) override {
    std::chrono::milliseconds slow{0};
    {
      std::lock_guard lk(mu_);
      if (!paused) slow = slow_resume_;
    }
    std::this_thread::sleep_for(slow);  // a sink that takes a while to take the resume
    std::lock_guard lk(mu_);
    pauses_.push_back(paused);
    paused_ = paused;
  }
  /// SetPaused(false) takes this long before the sink takes it (the webhook service's waits
  /// for a reload of its registry under way).
  void SlowResume(std::chrono::milliseconds slow) {
    std::lock_guard lk(mu_);
    slow_resume_ = slow;
  }
  /// Messages submitted while the sink was paused (it would have refused them).
  int submitted_while_paused() const {
    std::lock_guard lk(mu_);
    return submitted_while_paused_;
  }
  std::optional<TargetHealth> Health() const override {
    std::lock_guard lk(mu_);
    return health_;
  }
  /// What Health() says from now on.
  void SetHealth(std::optional<TargetHealth> health) {
    std::lock_guard lk(mu_);
    health_ = std::move(health);
  }
  /// What SetPaused was told, in order.
  std::vector<bool> pauses() const {
    std::lock_guard lk(mu_);
    return pauses_;
  }
  std::string_view Kind() const override { return "recording"; }
  bool FencesOthersWhenItStarts() const override { return fences_; }
  /// Acts as an exactly-once sink would: its start fences the relay it took over from.
  void SetFences(bool fences) { fences_ = fences; }
  /// Runs at the start of Shutdown (set before the dispatcher starts).
  void OnShutdown(std::function<void()> hook) { on_shutdown_ = std::move(hook); }
  std::size_t InFlight() const override {
    std::lock_guard lk(mu_);
    return static_cast<std::size_t>(in_flight_);
  }
  /// 4 x the claim batch (Sink's default) unless SetRoom gave a fixed room, as a webhook sink
  /// sizes its room by its connections rather than by the claim.
  std::size_t MaxInFlight(int claim_batch) const override {
    if (room_ >= 0) return static_cast<std::size_t>(room_);
    return Sink::MaxInFlight(claim_batch);
  }
  void SetRoom(int room) { room_ = room; }
  /// What it asks for under claim_connections auto (Sink::ClaimLoops); 1 unless set.
  void SetClaimLoops(int loops) { claim_loops_ = loops; }
  int ClaimLoops() const override { return claim_loops_; }

  /// Delivers everything held.
  void Release() {
    std::lock_guard lk(mu_);
    for (auto& p : held_) {
      p.outcome = Outcome{
          p.msg.id, OutcomeKind::kDelivered, "", Reason::kNone, std::nullopt, {}, 0, std::nullopt};
      ready_.push_back(std::move(p));
    }
    held_.clear();
    cv_.notify_all();
  }

  /// Delivers message `id` if held.
  void ReleaseOne(std::int64_t id) {
    std::lock_guard lk(mu_);
    for (auto it = held_.begin(); it != held_.end(); ++it) {
      if (Raw(it->msg.id) != id) continue;
      it->outcome = Outcome{
          it->msg.id, OutcomeKind::kDelivered, "", Reason::kNone, std::nullopt, {}, 0, std::nullopt};
      ready_.push_back(std::move(*it));
      held_.erase(it);
      cv_.notify_all();
      return;
    }
  }

  std::size_t Held() const {
    std::lock_guard lk(mu_);
    return held_.size();
  }
  /// Copies of the messages held.
  std::vector<Message> HeldMessages() const {
    std::lock_guard lk(mu_);
    std::vector<Message> out;
    for (const auto& p : held_) out.push_back(p.msg);
    return out;
  }
  int max_in_flight() const {
    std::lock_guard lk(mu_);
    return max_in_flight_;
  }
  /// The most payload bytes it held at once.
  std::size_t max_in_flight_bytes() const {
    std::lock_guard lk(mu_);
    return max_in_flight_bytes_;
  }
  int key_overlaps() const {
    std::lock_guard lk(mu_);
    return key_overlaps_;
  }
  std::vector<std::int64_t> submitted() const {
    std::lock_guard lk(mu_);
    return submitted_;
  }

 private:
  struct Pending {
    Message msg;
    Completion done;
    Outcome outcome;  // what it completes with (set when it is ready)
  };

  void Run() {
    std::mt19937 rng(7);
    std::unique_lock lk(mu_);
    while (true) {
      cv_.wait(lk, [&] { return quit_ || !ready_.empty(); });
      if (quit_ && ready_.empty()) return;
      std::shuffle(ready_.begin(), ready_.end(), rng);
      std::deque<Pending> batch;
      batch.swap(ready_);
      lk.unlock();
      for (auto& p : batch) Complete(std::move(p));
      lk.lock();
    }
  }

  void Complete(Pending p) {
    Outcome o = std::move(p.outcome);
    o.id = p.msg.id;
    {
      std::lock_guard lk(mu_);
      --in_flight_;
      in_flight_bytes_ -= p.msg.payload.size();
      if (p.msg.ordering_key) keys_in_flight_.erase(*p.msg.ordering_key);
    }
    p.done(std::move(o));
  }

  Decide decide_;
  bool fences_ = false;
  std::atomic<int> room_{-1};
  std::atomic<int> claim_loops_{1};
  std::vector<std::size_t> hand_overs_;
  std::vector<bool> pauses_;
  bool paused_ = false;
  int submitted_while_paused_ = 0;
  std::chrono::milliseconds slow_resume_{0};
  std::optional<TargetHealth> health_;
  std::function<void()> on_shutdown_, before_submit_many_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Pending> ready_, held_;
  std::set<std::string> keys_in_flight_;
  std::vector<std::int64_t> submitted_;
  int in_flight_ = 0, max_in_flight_ = 0, key_overlaps_ = 0;
  std::size_t in_flight_bytes_ = 0, max_in_flight_bytes_ = 0;
  bool shut_ = false, quit_ = false;
  std::thread worker_;
};

// Each key's ids (in the order written) appear in `delivered` in that order.
void ExpectEachKeyInOrder(const std::map<std::string, std::vector<std::int64_t>>& by_key,
                          const std::vector<std::int64_t>& delivered) {
  for (const auto& [key, ids] : by_key) {
    std::vector<std::int64_t> order;
    for (const auto id : delivered)
      if (std::find(ids.begin(), ids.end(), id) != ids.end()) order.push_back(id);
    EXPECT_EQ(order, ids) << "key " << key << " was delivered out of order";
  }
}

std::optional<Outcome> DeliverAll(const Message& m) {
  return Outcome{m.id,        OutcomeKind::kDelivered, "", Reason::kNone, std::nullopt, {}, 0,
                 std::nullopt};
}

class DispatcherTest : public ::testing::Test {
 protected:
  /// Until `id` is parked behind an earlier message of its key ('infinity').
  bool WaitUntilBlocked(std::int64_t id) {
    return WaitFor([&] {
      const auto row = db_.Find(id);
      return row && row->parked && row->deliver_after == FakeDatabase::kInfinity;
    });
  }
  /// `n` messages for "orders" over `keys` keys ("k0", "k1", ...): each key's ids, in order.
  std::map<std::string, std::vector<std::int64_t>> EnqueueKeyed(int n, int keys) {
    std::map<std::string, std::vector<std::int64_t>> by_key;
    for (int i = 0; i < n; ++i) {
      const std::string key = "k" + std::to_string(i % keys);
      by_key[key].push_back(db_.Enqueue("orders", key));
    }
    return by_key;
  }
  /// Until `id` has been handed to the sink.
  bool WaitUntilSubmitted(std::int64_t id, std::chrono::milliseconds timeout) {
    return WaitFor(
        [&] {
          const auto sent = sink_->submitted();
          return std::find(sent.begin(), sent.end(), id) != sent.end();
        },
        timeout);
  }
  RelayConfig Config(int batch = 50) {
    RelayConfig c;
    c.database_url = "postgresql://unused.invalid/none";  // the fake store never connects
    c.batch_size = batch;
    c.poll_interval = 20ms;
    c.lease = 30s;
    c.reap_interval = 5s;
    c.full_sweep_interval = 30s;
    c.shutdown_timeout = 300ms;
    Destination d;
    d.name = "orders";
    d.target = FakeTarget{};  // the dispatcher never looks into a target
    d.retry.max_attempts = 5;
    c.destinations.emplace(d.name, d);
    return c;
  }

  // Config() in claim_mode partitioned with bucket leases, heartbeating every 20 ms.
  RelayConfig BucketLeaseConfig(int batch = 50) {
    RelayConfig c = Config(batch);
    c.claim_mode = ClaimMode::kPartitioned;
    c.bucket_leases = true;
    c.partition_heartbeat = 20ms;
    return c;
  }

  // How a refusal of `op` for good (`why`) is logged, as lines containing `line`: after ten
  // tries (the coordinator tries every partition_heartbeat, 20 ms here), and once the fake
  // clock moved a relay heartbeat period on. Stops the dispatcher.
  struct RefusalLogs {
    bool tried = false;  ///< ten tries were made
    int first = 0;       ///< lines by then
    int failed = 0;      ///< lines saying the call failed ("heartbeat failed")
    bool again = false;  ///< logged again in the next period
    int then = 0;        ///< lines by then
    std::string why;     ///< the readiness
  };
  RefusalLogs LogsOfARefusal(const std::string& op, const std::string& why, const std::string& line,
                             RelayConfig cfg) {
    auto log = outbox::testing::LogWatch::Install();
    db_.Refuse(op, why);
    cfg.partition_heartbeat = 20ms;
    Start(cfg, DeliverAll);
    RefusalLogs logs;
    logs.tried = WaitFor([&] { return db_.Calls(op) >= 10; });
    logs.first = log->Count(line);
    logs.failed = log->Count("heartbeat failed");
    clock_.Advance(6s);
    logs.again = WaitFor([&] { return log->Count(line) >= 2; });
    logs.then = log->Count(line);
    logs.why = dispatcher_->WhyNotReady();
    dispatcher_->Stop();  // before the watch leaves the logger's sinks: no thread logs meanwhile
    log->Remove();
    return logs;
  }

  // Starts a dispatcher for `config` whose only destination's sink is `sink`.
  Dispatcher& Start(RelayConfig config, RecordingSink::Decide decide,
                    RelayMetrics* metrics = nullptr,
                    const std::function<void(RecordingSink&)>& prepare = nullptr) {
    auto sink = std::make_unique<RecordingSink>(std::move(decide));
    sink_ = sink.get();
    if (prepare) prepare(*sink);
    std::map<std::string, SinkPtr> sinks;
    sinks.emplace("orders", std::move(sink));
    DispatcherEnv env;
    env.stores = db_.Stores();
    env.clock = &clock_;
    env.metrics = metrics;
    env.max_payload_bytes = max_payload_bytes_;
    dispatcher_ = std::make_unique<Dispatcher>(std::move(config), std::move(sinks), std::move(env));
    dispatcher_->Start();
    return *dispatcher_;
  }

  void TearDown() override {
    if (dispatcher_) dispatcher_->Stop();
  }

  // Starts `config` on 60 queued messages with the second claim stuck in the database until
  // they are all delivered (or 10 s pass); true when they were, by the destination's other claim
  // loops. The gate is shared with the hook, which runs on a claim loop's thread and may still
  // be waking up when the test body ends (on the test's stack, its mutex was gone by then: a
  // crash).
  bool DeliversAllWhileTheSecondClaimIsStuck(
      RelayConfig config, const std::function<void(RecordingSink&)>& prepare = nullptr) {
    for (int i = 0; i < 60; ++i) db_.Enqueue("orders", std::nullopt);
    struct Gate {
      std::mutex mu;
      std::condition_variable cv;
      bool open = false;
    };
    auto gate = std::make_shared<Gate>();
    db_.BeforeClaim(2, [gate] {
      std::unique_lock lk(gate->mu);
      gate->cv.wait(lk, [&] { return gate->open; });
    });
    Start(std::move(config), DeliverAll, nullptr, prepare);
    const bool all = WaitFor([&] { return db_.Delivered().size() == 60u; });
    {
      std::lock_guard lk(gate->mu);
      gate->open = true;
    }
    gate->cv.notify_all();
    EXPECT_TRUE(all) << db_.Delivered().size() << " of 60 delivered while one claim was stuck";
    return all;
  }

  void DeliverEveryMessageOnceAndEachKeyInOrder(int claim_connections);

  // Delivers what the sink holds, again and again, until the queue is empty.
  void ReleaseUntilDrained() {
    while (db_.Queued() > 0) {
      sink_->Release();
      ASSERT_TRUE(WaitFor([&] { return sink_->Held() > 0 || db_.Queued() == 0; }));
    }
  }

  // Message 1, claimed and held by the sink (which never answers); `token` is its lease.
  // Returns once the maintenance loop has run (its first turn reaps), so it counts its
  // renewals from before the clock moves: on a loaded machine its thread may start after the
  // claim loop's.
  void HoldOneMessage(std::optional<std::string>* token) {
    db_.Enqueue("orders", "a");
    Start(Config(), [](const Message&) { return std::optional<Outcome>(); });
    ASSERT_TRUE(WaitFor([&] { return sink_->Held() == 1u; }));
    *token = db_.Find(1)->lease_owner;
    ASSERT_TRUE(*token);
    ASSERT_TRUE(WaitFor([&] { return db_.Calls("reap") >= 1; }));
  }

  // Three whole maintenance turns after 1 s of clock each (4.8 s in all) renew nothing: each
  // step waits for a read of the pauses (every 500 ms of clock) after the advance, and another
  // after the next.
  void ExpectNoRenewalForThreeSecondsOfClock() {
    const auto before = db_.Calls("renew");
    for (int step = 0; step < 3; ++step) {
      for (const auto advance : {1000ms, 600ms}) {
        clock_.Advance(advance + 1ms);
        const auto reads = db_.Calls("paused");
        ASSERT_TRUE(WaitFor([&] { return db_.Calls("paused") > reads; })) << step;
      }
    }
    EXPECT_EQ(db_.Calls("renew"), before) << "renewed again within 4.8 s of clock";
  }

  // Message 1's lease, `first`, runs out while this relay's renewals fail, another relay's
  // reaper takes it back, and this relay's claim loop claims the message again.
  void TakeTheLeaseBack(const std::optional<std::string>& first) {
    db_.FailNext("renew", 1'000'000);
    clock_.Advance(31s);  // past the whole lease
    ASSERT_EQ(testing::FakeStore(db_).Reap(5min).size(), 1u);
    ASSERT_TRUE(WaitFor([&] {
      const auto row = db_.Find(1);
      return row && row->lease_owner && row->lease_owner != first && row->attempts == 1;
    })) << "the claim loop did not take the message again";
    db_.Heal("renew");
  }

  // Ten messages delivered; a few idle polls later the cursor stands past id 10 (it moves a
  // claim behind what the claims saw); then a row with id 3 appears (its id was taken long
  // before it committed), below the fresh lane's cursor, and the lane passes it by.
  void LeaveARowBelowTheCursor() {
    for (int i = 0; i < 10; ++i) db_.Enqueue("orders", std::nullopt);
    Start(Config(), DeliverAll);
    ASSERT_TRUE(WaitFor([&] { return db_.Delivered().size() == 10u; }));
    auto claims = db_.Calls("claim");
    ASSERT_TRUE(WaitFor([&] { return db_.Calls("claim") > claims + 3; }));
    db_.EnqueueLate("orders", 3);
    claims = db_.Calls("claim");
    ASSERT_TRUE(WaitFor([&] { return db_.Calls("claim") > claims + 5; }));
    ASSERT_EQ(db_.Queued(), 1u) << "below the cursor";
  }

  // Ten messages of one key, leased by a claim whose reply was lost; handing them back fails
  // until db_.Heal("release_lost_claims").
  void StartWithALostClaimNotHandedBackYet() {
    for (int i = 0; i < 10; ++i) db_.Enqueue("orders", "k");
    db_.LoseNextClaimReply();
    db_.FailNext("release_lost_claims", 1'000'000);
    Start(Config(), DeliverAll);
    ASSERT_TRUE(WaitFor([&] { return db_.Calls("release_lost_claims") >= 1; }));
  }

  FakeClock clock_;
  FakeDatabase db_{clock_};
  RecordingSink* sink_ = nullptr;
  // Before dispatcher_: a dispatcher given these metrics is destroyed (stopped) first.
  RelayMetrics metrics_{"test"};
  std::int64_t max_payload_bytes_ = 0;  // DispatcherEnv::max_payload_bytes of Start
  std::unique_ptr<Dispatcher> dispatcher_;
};

TEST_F(DispatcherTest, DeliversEveryMessageOnceAndEachKeyInOrder) {
  DeliverEveryMessageOnceAndEachKeyInOrder(1);
}

// claim_connections: the destination's claim loops claim side by side, each on its own
// connection; a key's next message is claimable only once its predecessor is settled,
// whichever loop claimed it.
TEST_F(DispatcherTest, ThreeClaimConnectionsDeliverEveryMessageOnceAndEachKeyInOrder) {
  DeliverEveryMessageOnceAndEachKeyInOrder(3);
}

// A claim that takes long in the database (a slow plan, a disk) holds up only its own
// connection: the destination's other claim loop goes on claiming the backlog.
TEST_F(DispatcherTest, AStuckClaimHoldsUpOnlyItsOwnClaimConnection) {
  auto config = Config(/*batch=*/10);
  config.claim_connections = 2;
  EXPECT_TRUE(DeliversAllWhileTheSecondClaimIsStuck(config));
}

// claim_connections auto (the default): the sink says how many claim loops feed it (a webhook
// sink with a high max_in_flight asks for more than one), and they claim side by side: a claim
// stuck in the database holds up only its own loop.
TEST_F(DispatcherTest, UnderAutoTheSinkSaysHowManyClaimLoopsFeedIt) {
  auto config = Config(/*batch=*/10);
  ASSERT_EQ(config.claim_connections, 0) << "auto is the default";
  EXPECT_TRUE(DeliversAllWhileTheSecondClaimIsStuck(
      config, [](RecordingSink& sink) { sink.SetClaimLoops(2); }));
  EXPECT_EQ(dispatcher_->ClaimLoops("orders"), 2);
}

// Under auto the relay opens no more claim connections in all than the larger of its
// destination count and the most one destination asks for: each destination's sink asks as if
// it were alone (a webhook sink: up to one loop per 4 CPUs), and twenty webhook destinations on
// 16 CPUs would otherwise open 80 connections to the application's database in a backlog.
TEST_F(DispatcherTest, UnderAutoTheRelaysClaimConnectionsInAllStayWithinWhatOneDestinationAsks) {
  const auto loops_of = [&](int destinations, int asked) {
    RelayConfig config = Config();
    std::map<std::string, SinkPtr> sinks;
    for (int i = 0; i < destinations; ++i) {
      const std::string name = "d" + std::to_string(i);
      Destination d = config.destinations.at("orders");
      d.name = name;
      config.destinations.emplace(name, d);
      auto sink = std::make_unique<RecordingSink>(DeliverAll);
      sink->SetClaimLoops(asked);
      sinks.emplace(name, std::move(sink));
    }
    config.destinations.erase("orders");
    DispatcherEnv env;
    env.stores = db_.Stores();
    env.clock = &clock_;
    Dispatcher dispatcher(std::move(config), std::move(sinks), std::move(env));
    dispatcher.Start();
    std::vector<int> loops;
    for (int i = 0; i < destinations; ++i)
      loops.push_back(dispatcher.ClaimLoops("d" + std::to_string(i)));
    dispatcher.Stop();
    return loops;
  };
  EXPECT_EQ(loops_of(1, 4), (std::vector<int>{4}));
  EXPECT_EQ(loops_of(2, 4), (std::vector<int>{2, 2}));
  EXPECT_EQ(loops_of(3, 4), (std::vector<int>{2, 1, 1}));
  EXPECT_EQ(loops_of(5, 4), (std::vector<int>{1, 1, 1, 1, 1}));
  EXPECT_EQ(loops_of(2, 1), (std::vector<int>{1, 1}));
}

// A number written for claim_connections wins over what the sink asks for.
TEST_F(DispatcherTest, AClaimConnectionsNumberWinsOverWhatTheSinkAsksFor) {
  auto config = Config();
  config.claim_connections = 1;
  auto& dispatcher =
      Start(config, DeliverAll, nullptr, [](RecordingSink& sink) { sink.SetClaimLoops(4); });
  EXPECT_EQ(dispatcher.ClaimLoops("orders"), 1);
  EXPECT_EQ(dispatcher.ClaimLoops("elsewhere"), 0) << "a destination it does not serve";
}

// A claim's messages reach the sink in one hand-over (Sink::SubmitMany), not one Submit each:
// a webhook sink then takes them under one lock with one wake-up of its workers.
TEST_F(DispatcherTest, EachClaimIsHandedToTheSinkAtOnce) {
  for (int i = 0; i < 30; ++i) db_.Enqueue("orders", std::nullopt);
  Start(Config(/*batch=*/10), DeliverAll);
  ASSERT_TRUE(WaitFor([&] { return db_.Delivered().size() == 30u; }));
  const auto hand_overs = sink_->hand_overs();
  std::size_t total = 0;
  for (const auto n : hand_overs) {
    EXPECT_GE(n, 1u);
    EXPECT_LE(n, 10u) << "more than one claim in a hand-over";
    total += n;
  }
  EXPECT_EQ(total, 30u) << "every message was handed over, each in its claim's hand-over";
  EXPECT_EQ(sink_->submitted().size(), 30u);
}

// One claim loop claims again while the sink still takes its last claim's messages: the
// hand-over runs on a thread of its own (handoff.h). On the claim thread it took ~1 ms of each
// ~8 ms cycle on 2 cores (Kafka), with the database idle for the loop meanwhile.
TEST_F(DispatcherTest, OneClaimLoopClaimsAgainWhileTheSinkTakesItsLastClaim) {
  for (int i = 0; i < 30; ++i) db_.Enqueue("orders", std::nullopt);
  // Shared with the hooks, which run on the relay's threads: they may outlive a failed test.
  struct Seen {
    std::atomic<bool> second_claim{false}, hook_ran{false}, overlapped{false};
  };
  auto seen = std::make_shared<Seen>();
  db_.BeforeClaim(2, [seen] { seen->second_claim = true; });
  Start(Config(/*batch=*/10), DeliverAll, nullptr, [seen](RecordingSink& sink) {
    // The first hand-over waits for the second claim to start (or 5 s).
    sink.BeforeSubmitMany([seen] {
      seen->overlapped = WaitFor([seen] { return seen->second_claim.load(); }, 5s);
      seen->hook_ran = true;
    });
  });
  ASSERT_TRUE(WaitFor([&] { return seen->hook_ran.load(); })) << "nothing was handed over";
  EXPECT_TRUE(seen->overlapped.load())
      << "the claim loop waited for the sink to take its claim before claiming again";
  ASSERT_TRUE(WaitFor([&] { return db_.Queued() == 0 && db_.Delivered().size() == 30u; }))
      << db_.Delivered().size() << " of 30 delivered";
  EXPECT_EQ(sink_->submitted().size(), 30u) << "each message handed over once";
}

// Stop ends a claim loop only after what it claimed is in the sink: nothing claimed is left
// behind in the hand-off, which would hold its lease until the reaper took it back.
TEST_F(DispatcherTest, StopHandsOverWhatTheLastClaimLeased) {
  for (int i = 0; i < 10; ++i) db_.Enqueue("orders", std::nullopt);
  auto leave = std::make_shared<std::atomic<bool>>(false);
  Start(Config(/*batch=*/10), DeliverAll, nullptr, [leave](RecordingSink& sink) {
    sink.BeforeSubmitMany([leave] { WaitFor([leave] { return leave->load(); }, 5s); });
  });
  ASSERT_TRUE(WaitFor([&] { return sink_->hand_overs().size() == 1u; }));
  auto stopped = std::async(std::launch::async, [&] { return dispatcher_->Stop(); });
  *leave = true;
  stopped.get();
  EXPECT_EQ(sink_->submitted().size(), 10u) << "the claim's messages reached the sink";
  EXPECT_EQ(db_.Delivered().size() + db_.Queued(), 10u);
}

// A sink whose room is less than two claims (a webhook sink's once was: 512 for 32
// connections, with claims of 500): the second loop still gets room for a claim of its own while
// the first loop's claim runs. Sharing the one loop's room, it waited until that claim was in
// the sink and delivered, so two loops claimed no faster than one.
TEST_F(DispatcherTest, ASecondClaimConnectionClaimsWhileTheFirstClaimRunsWhenTheRoomIsUnderTwoBatches) {
  for (int i = 0; i < 100; ++i) db_.Enqueue("orders", std::nullopt);
  // Shared with the hook, which runs on a claim loop's thread: it may outlive a failed test.
  struct Seen {
    std::atomic<bool> done{false}, side_by_side{false};
  };
  auto seen = std::make_shared<Seen>();
  FakeDatabase* db = &db_;
  db_.BeforeClaim(2, [seen, db] {
    // Claim 1 leased 10 and they were delivered; this one holds its share of the room until
    // another claim has delivered more (or 5 s pass).
    seen->side_by_side = WaitFor([db] { return db->Delivered().size() > 10u; }, 5s);
    seen->done = true;
  });
  auto config = Config(/*batch=*/10);
  config.claim_connections = 2;
  Start(config, DeliverAll, nullptr, [](RecordingSink& sink) { sink.SetRoom(12); });
  ASSERT_TRUE(WaitFor([&] { return seen->done.load(); })) << "claim 2 never ran";
  EXPECT_TRUE(seen->side_by_side.load())
      << "the second claim connection waited for the first one's claim to finish";
  ASSERT_TRUE(WaitFor([&] { return db_.Queued() == 0 && db_.Delivered().size() == 100u; }))
      << db_.Delivered().size() << " of 100 delivered";
}

// A sink whose room is under a claim (a rate-limited webhook endpoint keeps two seconds of its
// pace, at least 8; one whose concurrency was lowered, 16 a request) throttles on purpose: more
// claim connections add no room to it (review: rate_limit 1 and 16 connections held 128).
TEST_F(DispatcherTest, MoreClaimConnectionsAddNoRoomToASinkWhoseRoomIsUnderAClaim) {
  for (int i = 0; i < 100; ++i) db_.Enqueue("orders", std::nullopt);
  auto config = Config(/*batch=*/10);
  config.claim_connections = 4;
  Start(config, [](const Message&) { return std::optional<Outcome>(); }, nullptr,
        [](RecordingSink& sink) { sink.SetRoom(8); });
  ASSERT_TRUE(WaitFor([&] { return sink_->Held() >= 8u; })) << sink_->Held() << " held";
  ReleaseUntilDrained();
  EXPECT_EQ(db_.Delivered().size(), 100u);
  EXPECT_LE(sink_->max_in_flight(), 8);
}

// The loops share the sink's room, plus room for one claim per loop after the first (where the
// room holds a whole claim): side by side they claim no more than that.
TEST_F(DispatcherTest, InFlightStaysWithinTheCapWithTwoClaimConnections) {
  for (int i = 0; i < 300; ++i) db_.Enqueue("orders", std::nullopt);
  auto config = Config(/*batch=*/10);
  config.claim_connections = 2;
  Start(config, [](const Message&) { return std::optional<Outcome>(); });
  // 4 x 10 for the first loop, 10 for the second.
  ASSERT_TRUE(WaitFor([&] { return sink_->Held() == 50u; })) << sink_->Held() << " held";
  ReleaseUntilDrained();
  EXPECT_EQ(db_.Delivered().size(), 300u);
  EXPECT_LE(sink_->max_in_flight(), 50);
}

void DispatcherTest::DeliverEveryMessageOnceAndEachKeyInOrder(int claim_connections) {
  std::map<std::string, std::vector<std::int64_t>> by_key;
  for (int i = 0; i < 400; ++i) {
    std::optional<std::string> key;
    if (i % 9 != 0) key = "k" + std::to_string(i % 7);
    const auto id = db_.Enqueue("orders", key);
    if (key) by_key[*key].push_back(id);
  }
  auto config = Config(/*batch=*/25);
  config.claim_connections = claim_connections;
  Start(config, DeliverAll);
  ASSERT_TRUE(WaitFor([&] { return db_.Queued() == 0; })) << db_.Queued() << " left";

  const auto delivered = db_.Delivered();
  EXPECT_EQ(delivered.size(), 400u);
  EXPECT_EQ(std::set<std::int64_t>(delivered.begin(), delivered.end()).size(), 400u)
      << "a message was delivered twice";
  EXPECT_EQ(sink_->submitted().size(), 400u) << "a message was submitted twice";
  EXPECT_EQ(sink_->key_overlaps(), 0) << "two messages of one key were in flight together";
  ExpectEachKeyInOrder(by_key, delivered);
  EXPECT_EQ(dispatcher_->stats().delivered, 400);
}

// The metrics are the dispatcher's one record: stats() reads them back, and what a caller's
// metrics show is what stats() says.
TEST_F(DispatcherTest, CountsIntoTheMetricsItIsGivenAndStatsReadsThemBack) {
  for (int i = 0; i < 40; ++i) db_.Enqueue("orders", std::nullopt);
  RelayMetrics& metrics = metrics_;
  std::atomic<int> failures{0};
  Start(
      Config(/*batch=*/10),
      [&](const Message& m) -> std::optional<Outcome> {
        // Every fourth message fails once (a retry), then everything is delivered.
        if (m.attempts == 0 && Raw(m.id) % 4 == 0) {
          ++failures;
          return Outcome{m.id, OutcomeKind::kRetry, "503", Reason::kHttp5xx, std::nullopt, {},
                         0,    std::nullopt};
        }
        return DeliverAll(m);
      },
      &metrics);
  // The fake clock drives the backoff (under 500 ms for a first retry); it moves only while
  // nothing is leased, so no lease can expire and no reaper retry is counted.
  ASSERT_TRUE(WaitFor([&] {
    if (db_.Leased() == 0) clock_.Advance(1s);
    return db_.Queued() == 0;
  })) << db_.Queued()
      << " left";
  // The settler counts a batch right after its write: the last one may trail the table
  // (seen under ASAN: 30 of 40 counted when the table was empty).
  WaitFor([&] { return dispatcher_->stats().delivered == 40; });
  const DispatcherStats s = dispatcher_->stats();
  EXPECT_EQ(s.delivered, 40);
  EXPECT_EQ(metrics.delivered_total.Labels({"orders"}).Value(), 40.0);
  EXPECT_EQ(s.retried, failures.load());
  EXPECT_EQ(metrics.retried_total.Total(), static_cast<double>(failures.load()));
  EXPECT_EQ(s.claims, static_cast<std::int64_t>(metrics.claims_total.Total()));
  EXPECT_EQ(s.claimed, 40 + failures.load());
  EXPECT_EQ(metrics.messages_claimed_total.Labels({"orders"}).Value(), s.claimed);
}

TEST_F(DispatcherTest, InFlightStaysWithinTheCapUntilTheSinkCompletes) {
  for (int i = 0; i < 300; ++i) db_.Enqueue("orders", std::nullopt);
  // Kafka destinations: at most 4 batches in flight.
  Start(Config(/*batch=*/10), [](const Message&) { return std::optional<Outcome>(); });
  ASSERT_TRUE(WaitFor([&] { return sink_->Held() == 40u; })) << sink_->Held() << " held";
  EXPECT_EQ(sink_->max_in_flight(), 40);
  EXPECT_EQ(db_.Leased(), 40u);
  sink_->Release();
  // What it then claims it holds again, 40 at a time.
  ASSERT_TRUE(WaitFor([&] { return db_.Delivered().size() >= 40u && sink_->Held() == 40u; }));
  EXPECT_EQ(sink_->max_in_flight(), 40);
  ReleaseUntilDrained();
  EXPECT_EQ(db_.Delivered().size(), 300u);
  EXPECT_LE(sink_->max_in_flight(), 40);
}

TEST_F(DispatcherTest, ARetryWaitsForItsDelayOnTheClockNotOnTheWall) {
  for (int i = 0; i < 20; ++i) db_.Enqueue("orders", "k" + std::to_string(i % 4));
  std::mutex mu;
  std::set<std::int64_t> failed_once;
  auto cfg = Config();
  cfg.destinations.at("orders").retry.initial_backoff = 1h;
  cfg.destinations.at("orders").retry.max_backoff = 2h;
  Start(cfg, [&](const Message& m) -> std::optional<Outcome> {
    std::lock_guard lk(mu);
    if (Raw(m.id) <= 4 && failed_once.insert(Raw(m.id)).second) {
      // The endpoint asks for an hour: the delay is at least that (and at most max_backoff).
      return Outcome{
          m.id, OutcomeKind::kRetry, "http 503", Reason::kHttp5xx, std::chrono::hours(1), {},
          0,    std::nullopt};
    }
    return Outcome{m.id,        OutcomeKind::kDelivered, "", Reason::kNone, std::nullopt, {}, 0,
                   std::nullopt};
  });
  // The head of each key (ids 1-4) fails once and waits; the rest of each key waits behind it.
  ASSERT_TRUE(WaitFor([&] { return dispatcher_->stats().retried == 4; }));
  const auto claims = db_.Calls("claim");
  ASSERT_TRUE(WaitFor([&] { return db_.Calls("claim") > claims + 5; })) << "polls go on";
  EXPECT_TRUE(db_.Delivered().empty()) << "a retry came due before its delay";
  EXPECT_EQ(db_.Leased(), 0u);
  for (const auto id : {1, 2, 3, 4}) {
    const auto row = db_.Find(id);
    ASSERT_TRUE(row);
    EXPECT_EQ(row->attempts, 1);
    EXPECT_GE(row->deliver_after, clock_.WallNow() + 1h);
  }
  clock_.Advance(2h + 1s);
  ASSERT_TRUE(WaitFor([&] { return db_.Queued() == 0; })) << db_.Queued() << " left";
  EXPECT_EQ(db_.Delivered().size(), 20u);
  EXPECT_EQ(sink_->key_overlaps(), 0);
}

// A fan-out whose endpoint rows need a key lock that another transaction holds is deferred by
// the store (SettleCounts::deferred); the settler writes everything else meanwhile, keeps
// the fan-out's lease, and writes it again later. Before, the settle waited for the lock, and
// no outcome of the relay was written until that transaction ended.
TEST_F(DispatcherTest, ADeferredFanOutIsWrittenLaterAndHoldsBackNothingElse) {
  const auto fanned = db_.Enqueue("orders", "k");
  const auto plain = db_.Enqueue("orders", "other");
  db_.HoldKeyLocks(true);
  Start(Config(), [fanned](const Message& m) -> std::optional<Outcome> {
    Outcome o{m.id, OutcomeKind::kDelivered, "", Reason::kNone, std::nullopt, {}, 0, std::nullopt};
    if (Raw(m.id) == fanned) {
      o.kind = OutcomeKind::kFannedOut;
      o.delivered_to = 1;
      o.owed.push_back({"ep_a", OutcomeKind::kRetry, "http 503", Reason::kHttp5xx, std::nullopt});
    }
    return o;
  });
  ASSERT_TRUE(WaitFor([&] { return db_.Delivered() == std::vector<std::int64_t>{plain}; }))
      << "the rest of the batch is written";
  const auto next = db_.Enqueue("orders", std::nullopt);
  ASSERT_TRUE(WaitFor([&] {
    return db_.Delivered() == std::vector<std::int64_t>{plain, next};
  })) << "the settler goes on writing what comes after";
  const auto row = db_.Find(fanned);
  ASSERT_TRUE(row);
  EXPECT_TRUE(row->lease_owner) << "the deferred fan-out keeps its lease";

  db_.HoldKeyLocks(false);
  clock_.Advance(5s);
  const auto later = db_.Enqueue("orders", std::nullopt);  // wakes the settler
  ASSERT_TRUE(WaitFor([&] { return db_.Queued() == 0; })) << "written once the lock is free";
  auto delivered = db_.Delivered();
  std::sort(delivered.begin(), delivered.end());
  EXPECT_EQ(delivered, (std::vector<std::int64_t>{fanned, plain, next, later}));
}

// A fan-out still deferred when the shutdown budget is spent is left to its lease, as any
// outcome that could not be written: Stop returns, and says not everything was settled.
TEST_F(DispatcherTest, StopLeavesAFanOutStillDeferredToItsLease) {
  const auto fanned = db_.Enqueue("orders", "k");
  db_.HoldKeyLocks(true);
  Start(Config(), [](const Message& m) -> std::optional<Outcome> {
    Outcome o{m.id, OutcomeKind::kFannedOut, "", Reason::kNone, std::nullopt, {}, 1, std::nullopt};
    o.owed.push_back({"ep_a", OutcomeKind::kRetry, "http 503", Reason::kHttp5xx, std::nullopt});
    return o;
  });
  ASSERT_TRUE(WaitFor([&] { return db_.Calls("settle") >= 1; }));
  const auto started = std::chrono::steady_clock::now();
  EXPECT_FALSE(dispatcher_->Stop());
  EXPECT_LT(std::chrono::steady_clock::now() - started, 10s);
  const auto row = db_.Find(fanned);
  ASSERT_TRUE(row);
  EXPECT_TRUE(row->lease_owner) << "nothing written; the lease expires and it goes again";
}

TEST_F(DispatcherTest, TheLastAllowedAttemptDeadLetters) {
  db_.Enqueue("orders", "a");
  db_.Enqueue("orders", "a");
  auto cfg = Config();
  cfg.destinations.at("orders").retry.max_attempts = 3;
  cfg.destinations.at("orders").retry.initial_backoff = 1min;
  cfg.destinations.at("orders").retry.max_backoff = 1min;
  Start(cfg, [](const Message& m) -> std::optional<Outcome> {
    if (Raw(m.id) == 1)
      return Outcome{m.id, OutcomeKind::kRetry, "timeout", Reason::kTimeout, {}, {},
                     0,    std::nullopt};
    return Outcome{m.id,        OutcomeKind::kDelivered, "", Reason::kNone, std::nullopt, {}, 0,
                   std::nullopt};
  });
  for (int attempt = 1; attempt < 3; ++attempt) {
    ASSERT_TRUE(WaitFor([&] {
      const auto row = db_.Find(1);
      return row && row->attempts == attempt && !row->lease_owner;
    })) << "attempt "
        << attempt;
    clock_.Advance(1min + 1s);
  }
  ASSERT_TRUE(WaitFor([&] { return db_.Queued() == 0; }));
  EXPECT_EQ(db_.DeadLetters(), std::vector<std::int64_t>{1});
  EXPECT_EQ(db_.Delivered(), std::vector<std::int64_t>{2})
      << "the key moved on after the dead letter";
}

TEST_F(DispatcherTest, LeasesOfMessagesStillInTheSinkAreRenewedNotReaped) {
  std::optional<std::string> token;
  ASSERT_NO_FATAL_FAILURE(HoldOneMessage(&token));
  // More than a whole lease (4 x lease/3) passes on the clock while the sink holds the message.
  for (int step = 0; step < 4; ++step) {
    const auto renewed = db_.RenewedLeases();
    clock_.Advance(10s + 1ms);  // lease / 3
    ASSERT_TRUE(WaitFor([&] { return db_.RenewedLeases() > renewed; })) << "step " << step;
  }
  const auto row = db_.Find(1);
  ASSERT_TRUE(row);
  EXPECT_EQ(row->lease_owner, token) << "the lease moved on while the message was in the sink";
  EXPECT_EQ(row->attempts, 0);
  EXPECT_EQ(dispatcher_->stats().reaped, 0);
  sink_->Release();
  ASSERT_TRUE(WaitFor([&] { return db_.Queued() == 0; }));
  EXPECT_EQ(dispatcher_->stats().fenced, 0);
}

// A message in a sink knows until when its claim holds (ClaimRunsOut, which the webhook and
// exactly-once Kafka sinks check before they send): its claim's start plus the lease, moved on
// by each renewal of its own lease, and by no renewal that failed or passed its row over.
// Without it, a relay whose renewals failed for a whole lease (its database away) sent what
// was queued in its sinks although another relay may have taken it over.
TEST_F(DispatcherTest, AMessageInTheSinkKnowsUntilWhenItsClaimHolds) {
  db_.Enqueue("orders", "a");
  db_.Enqueue("orders", "b");
  Start(Config(), [](const Message&) { return std::optional<Outcome>(); });
  ASSERT_TRUE(WaitFor([&] { return sink_->Held() == 2u; }));
  ASSERT_TRUE(WaitFor([&] { return db_.Calls("reap") >= 1; }));
  const auto runs_out = [&](std::int64_t id) {
    for (const auto& m : sink_->HeldMessages()) {
      if (Raw(m.id) == id) return ClaimRunsOut(m);
    }
    ADD_FAILURE() << "message " << id << " is not in the sink";
    return std::optional<std::chrono::steady_clock::time_point>();
  };
  const auto claimed = runs_out(1);
  ASSERT_TRUE(claimed) << "the claim's end is not known to the sink";
  const auto now = std::chrono::steady_clock::now();
  EXPECT_GT(*claimed, now + 25s) << "about the claim's start plus the 30 s lease";
  EXPECT_LE(*claimed, now + 30s);
  EXPECT_EQ(runs_out(2), claimed) << "one claim";

  // Renewals that fail move nothing. (The maintenance thread renews one call after the other:
  // once the third call starts, the first two have finished.)
  db_.FailNext("renew", 1'000'000);
  auto renews = db_.Calls("renew");
  clock_.Advance(10s + 1ms);  // lease / 3; each failure is tried again after a short pause
  ASSERT_TRUE(WaitFor([&] { return db_.Calls("renew") > renews + 2; }));
  EXPECT_EQ(runs_out(1), claimed);

  // One that renewed message 1 and passed over message 2's row (another transaction held it)
  // moves message 1's alone, to the renewal's start plus the lease. (Row 2 is locked and the
  // time read before the renewals may succeed: a retry of the failed one comes on its own.)
  db_.LockRowForRenewals(2, true);
  const auto before = std::chrono::steady_clock::now();
  db_.Heal("renew");
  renews = db_.Calls("renew");
  clock_.Advance(10s + 1ms);
  ASSERT_TRUE(WaitFor([&] { return runs_out(1) > claimed; })) << "message 1's claim did not move";
  EXPECT_GE(*runs_out(1), before + 30s);
  EXPECT_LE(*runs_out(1), std::chrono::steady_clock::now() + 30s);
  // What it passed over is tried again a second later: by then the first call has finished.
  clock_.Advance(1s + 1ms);
  ASSERT_TRUE(WaitFor([&] { return db_.Calls("renew") > renews + 1; }));
  EXPECT_EQ(runs_out(2), claimed) << "message 2's claim moved although its lease was not renewed";
  db_.LockRowForRenewals(2, false);
  sink_->Release();
  ASSERT_TRUE(WaitFor([&] { return db_.Queued() == 0; }));
}

// A renewal takes its list of leases, then runs its statement. A message in that list that
// left its sink meanwhile (delivered, and its settle deleted the row or held it) is not passed
// over: it needs no lease. Counted as passed over, it brought the renewal back every second
// under steady traffic, rewriting every row in flight each time (review).
TEST_F(DispatcherTest, AMessageThatLeftItsSinkDuringARenewalIsNotPassedOver) {
  db_.Enqueue("orders", "a");
  db_.Enqueue("orders", "b");
  Start(Config(), [](const Message&) { return std::optional<Outcome>(); });
  ASSERT_TRUE(WaitFor([&] { return sink_->Held() == 2u; }));
  ASSERT_TRUE(WaitFor([&] { return db_.Calls("reap") >= 1; }));
  const auto claimed = ClaimRunsOut(sink_->HeldMessages().front());
  db_.BeforeRenew([&] {
    const auto settles = db_.Calls("settle");
    sink_->ReleaseOne(2);
    ASSERT_TRUE(WaitFor([&] {
      return db_.Calls("settle") > settles && db_.Find(2) == std::nullopt;
    }));
  });
  const auto first = db_.Calls("renew");
  clock_.Advance(10s + 1ms);  // lease / 3: the renewal lists 1 and 2; 2 is settled before it runs
  ASSERT_TRUE(WaitFor([&] { return db_.Calls("renew") > first; }));
  const auto held = sink_->HeldMessages();
  ASSERT_EQ(held.size(), 1u);
  EXPECT_TRUE(WaitFor([&] { return ClaimRunsOut(sink_->HeldMessages().front()) > claimed; }))
      << "message 1's claim did not move";
  ASSERT_NO_FATAL_FAILURE(ExpectNoRenewalForThreeSecondsOfClock());
  sink_->Release();
  ASSERT_TRUE(WaitFor([&] { return db_.Queued() == 0; }));
}

// A maintenance turn that finds both the renewal and the reap due (its thread stalled longer
// than a lease: a slow status read, a database that stopped answering for a while) renews
// first. Reaping first, it took back the leases of this relay's own messages still in its sink
// as expired, and they were claimed and sent again: a duplicate and an attempt counted for
// nothing (review).
TEST_F(DispatcherTest, AStalledMaintenanceTurnRenewsBeforeItReaps) {
  std::optional<std::string> token;
  ASSERT_NO_FATAL_FAILURE(HoldOneMessage(&token));
  const auto renewals = db_.Calls("renew");
  clock_.Advance(30s + 1ms);  // a whole lease in one step: both are due in the next turn
  ASSERT_TRUE(WaitFor([&] { return db_.Calls("renew") > renewals; }));
  const auto row = db_.Find(1);
  ASSERT_TRUE(row);
  EXPECT_EQ(row->lease_owner, token) << "reaped before it was renewed";
  EXPECT_EQ(row->attempts, 0);
  EXPECT_EQ(dispatcher_->stats().reaped, 0);
  sink_->Release();
  ASSERT_TRUE(WaitFor([&] { return db_.Queued() == 0; }));
}

// A key a claim blocked whose head settled after the claim's snapshot is rechecked for a second
// (wake_keys.sql); a claim loop waiting for room in its sink longer than that dropped the key
// unchecked, and the next message waited for the orphan sweep (reap_interval_ms; here never)
// (review). Now the last check comes before a key is dropped, and checks go on while the loop
// waits for room.
TEST_F(DispatcherTest, ABlockedKeyIsRecheckedWhileTheLoopWaitsForRoom) {
  auto config = Config(/*batch=*/2);  // room for 8; a claim needs 2 free
  config.reap_interval = 1h;          // no orphan sweep: only the recheck can wake `next`
  for (int i = 0; i < 6; ++i) db_.Enqueue("orders", std::nullopt);
  const auto head = db_.Enqueue("orders", "k");
  const auto next = db_.Enqueue("orders", "k");
  Start(std::move(config), [](const Message&) { return std::optional<Outcome>(); });
  ASSERT_TRUE(WaitUntilBlocked(next));
  ASSERT_TRUE(WaitFor([&] { return sink_->Held() == 7u; }));     // room 1: the loop waits
  ASSERT_TRUE(WaitFor([&] { return db_.Calls("reap") >= 1; }));  // the orphan sweep ran once
  db_.RemoveWithoutWaking(head);  // its settle committed after the claim's snapshot
  clock_.Advance(1100ms);         // past the second of rechecks
  sink_->Release();
  EXPECT_TRUE(WaitUntilSubmitted(next, 5s)) << "the blocked key was dropped without a recheck";
}

// The rechecks of a key end with one that succeeded: with the claim's connection failing, every
// check in the key's second failed, the key was dropped unchecked, and its next message (whose
// predecessor's settle committed meanwhile) waited for the orphan sweep (review).
TEST_F(DispatcherTest, ABlockedKeyIsDroppedOnlyAfterACheckThatSucceeded) {
  auto config = Config();
  config.reap_interval = 1h;  // no orphan sweep: only a recheck can move `next`
  const auto head = db_.Enqueue("orders", "k");
  const auto next = db_.Enqueue("orders", "k");
  Start(std::move(config), [](const Message&) { return std::optional<Outcome>(); });
  ASSERT_TRUE(WaitUntilBlocked(next));
  ASSERT_TRUE(WaitFor([&] { return db_.Calls("wake_orphans") >= 1; }));  // the sweep ran once
  db_.FailNext("wake_keys", 1'000);  // every check fails from here on
  db_.RemoveWithoutWaking(head);     // its settle committed after the claim's snapshot
  const auto checks = db_.Calls("wake_keys");
  clock_.Advance(1100ms);  // past the key's second
  ASSERT_TRUE(WaitFor([&] { return db_.Calls("wake_keys") >= checks + 1; }));
  clock_.Advance(60ms);  // the next check, 50 ms on: failing too
  ASSERT_TRUE(WaitFor([&] { return db_.Calls("wake_keys") >= checks + 2; }));
  db_.Heal("wake_keys");
  clock_.Advance(60ms);  // and the next, which succeeds
  EXPECT_TRUE(WaitUntilSubmitted(next, 5s)) << "the key was dropped after checks that all failed";
}

// A settle that ran longer than the claim loop's second of rechecks, and whose own wake of the
// key's next message came before the claim that parked that message committed (its snapshot was
// older): the rechecks saw the earlier message still there until they stopped, and the next one
// waited for the orphan sweep (review: the rechecks were bounded by time, not by the
// transactions that could have raced the claim). Now a settle that took that long wakes the
// keys it settled once it has committed.
TEST_F(DispatcherTest, AKeyWhoseSettleOutlastedTheClaimLoopsRechecksIsWokenAfterThatSettle) {
  auto config = Config();
  config.reap_interval = 1h;  // no orphan sweep: only a recheck or a wake can move `next`
  const auto head = db_.Enqueue("orders", "k");
  const auto next = db_.Enqueue("orders", "k");
  Start(std::move(config), [](const Message&) { return std::optional<Outcome>(); });
  ASSERT_TRUE(WaitUntilBlocked(next));
  ASSERT_TRUE(WaitFor([&] { return sink_->Held() == 1u; }));
  ASSERT_TRUE(WaitFor([&] { return db_.Calls("wake_orphans") >= 1; }));  // the sweep ran once
  // The claim loop's rechecks run out while the head is still in flight.
  const auto checks = db_.Calls("wake_keys");
  clock_.Advance(1100ms);
  ASSERT_TRUE(WaitFor([&] { return db_.Calls("wake_keys") > checks; }));
  db_.BeforeSettleMissingItsWakes([this] { clock_.Advance(1100ms); });
  sink_->Release();  // the head is delivered; its settle takes 1.1 s and wakes nothing itself
  ASSERT_TRUE(WaitFor([&] { return !db_.Find(head); }));
  EXPECT_TRUE(WaitUntilSubmitted(next, 5s)) << "the key's next message waited for the orphan sweep";
}

// max_in_flight_bytes: a sink holds no more payload bytes than that, whatever its room in
// messages. (Counted in messages only, a backlog of 1 MiB payloads filled a webhook sink with
// 1.5 GiB.) Here 10 KiB of 2 KiB payloads: 5 at a time, where a claim of 50 held 100 KiB.
TEST_F(DispatcherTest, ASinkHoldsNoMorePayloadBytesThanMaxInFlightBytes) {
  auto config = Config(/*batch=*/50);
  config.max_in_flight_bytes = 10 * 1024;
  for (int i = 0; i < 60; ++i) db_.EnqueuePayload("orders", std::string(2 * 1024, 'x'));
  Start(
      std::move(config), [](const Message&) { return std::optional<Outcome>(); }, &metrics_);
  ASSERT_TRUE(WaitFor([&] { return sink_->Held() > 0u; }));
  // What the sink holds shows in outbox_sink_payload_bytes.
  const auto gauge_matches = [&] {
    const std::string line = "outbox_sink_payload_bytes{destination=\"orders\"} " +
                             std::to_string(sink_->Held() * 2 * 1024) + "\n";
    return metrics_.Render().find(line) != std::string::npos;
  };
  EXPECT_TRUE(WaitFor(gauge_matches)) << metrics_.Render();
  ReleaseUntilDrained();
  EXPECT_EQ(db_.Delivered().size(), 60u);
  EXPECT_LE(sink_->max_in_flight_bytes(), 10u * 1024);
}

// A payload larger than the whole budget still goes, alone; and a destination's own
// max_in_flight_bytes replaces the relay's.
TEST_F(DispatcherTest, APayloadLargerThanMaxInFlightBytesIsSentAlone) {
  auto config = Config(/*batch=*/50);
  config.max_in_flight_bytes = 0;                                    // no limit for the relay ...
  config.destinations.at("orders").max_in_flight_bytes = 10 * 1024;  // ... but for this one
  for (int i = 0; i < 3; ++i) db_.EnqueuePayload("orders", std::string(20 * 1024, 'x'));
  Start(std::move(config), [](const Message&) { return std::optional<Outcome>(); });
  ASSERT_TRUE(WaitFor([&] { return sink_->Held() > 0u; }));
  ReleaseUntilDrained();
  EXPECT_EQ(db_.Delivered().size(), 3u);
  EXPECT_EQ(sink_->max_in_flight(), 1);
}

// Claim loops side by side (claim_connections) share the budget: each takes the bytes its claim
// may bring under the room's lock, so they do not each claim what fits the whole of it. A
// claim waits in the database (BeforeClaim) until another loop's claim has begun or a second
// has passed: without the shared count, both claimed what fitted the same bytes left.
TEST_F(DispatcherTest, ClaimLoopsSideBySideShareMaxInFlightBytes) {
  auto config = Config(/*batch=*/50);
  config.claim_connections = 4;
  config.max_in_flight_bytes = 20 * 1024;
  for (int i = 0; i < 300; ++i) db_.EnqueuePayload("orders", std::string(2 * 1024, 'x'));
  // Every 5th claim waits for the next one to begin (at most 200 ms), many times over.
  std::function<void()> hold;
  hold = [this, &hold] {
    const auto began = db_.Calls("claim");
    WaitFor([&] { return db_.Calls("claim") > began; }, 200ms);
    db_.BeforeClaim(5, hold);
  };
  db_.BeforeClaim(5, hold);
  Start(std::move(config), [](const Message&) { return std::optional<Outcome>(); });
  ASSERT_TRUE(WaitFor([&] { return sink_->Held() > 0u; }));
  ReleaseUntilDrained();
  EXPECT_EQ(db_.Delivered().size(), 300u);
  EXPECT_LE(sink_->max_in_flight_bytes(), 20u * 1024);
  dispatcher_->Stop();  // no claim runs `hold` (a local) any more
}

// A claim leases up to both lanes' limits: what fits the budget is split between them, so due
// retries (the slow lane) and fresh rows together stay under it. (With the slow lane's half on
// top of the fresh lane's fit, the sink held 1.5 x the budget.)
TEST_F(DispatcherTest, MaxInFlightBytesCoversBothLanesOfAClaim) {
  auto config = Config(/*batch=*/50);
  config.max_in_flight_bytes = 10 * 1024;
  for (int i = 0; i < 40; ++i) db_.EnqueuePayload("orders", std::string(2 * 1024, 'x'), 2s);
  clock_.Advance(3s);  // the parked ones are due: the slow lane's
  for (int i = 0; i < 40; ++i) db_.EnqueuePayload("orders", std::string(2 * 1024, 'x'));
  Start(std::move(config), [](const Message&) { return std::optional<Outcome>(); });
  ASSERT_TRUE(WaitFor([&] { return sink_->Held() > 0u; }));
  ReleaseUntilDrained();
  EXPECT_EQ(db_.Delivered().size(), 80u);
  EXPECT_LE(sink_->max_in_flight_bytes(), 10u * 1024);
}

// The first claim expects each payload to be as large as writers may queue
// (DispatcherEnv::max_payload_bytes, which the relay reads from outbox.settings): 1 MiB of
// budget at 256 KiB fits 4 rows, 3 for the fresh lane and 1 for the slow one.
TEST_F(DispatcherTest, TheFirstClaimExpectsTheLargestPayloadWritersMayQueue) {
  auto config = Config(/*batch=*/50);
  config.max_in_flight_bytes = 1024 * 1024;
  max_payload_bytes_ = 256 * 1024;
  for (int i = 0; i < 10; ++i) db_.EnqueuePayload("orders", std::string(100, 'x'));
  Start(std::move(config), DeliverAll);
  ASSERT_TRUE(WaitFor([&] { return db_.Delivered().size() == 10u; }));
  ASSERT_FALSE(sink_->hand_overs().empty());
  EXPECT_EQ(sink_->hand_overs().front(), 3u);
}

// The first claim expects payloads of 1 MiB (tuning::kFirstPayloadEstimate), and the next
// ones what they saw: small payloads soon fill whole claims again.
TEST_F(DispatcherTest, ClaimsOfSmallPayloadsGrowToTheBatchUnderMaxInFlightBytes) {
  auto config = Config(/*batch=*/50);
  config.max_in_flight_bytes = 1024 * 1024;  // the first claim: 1 row
  for (int i = 0; i < 400; ++i) db_.EnqueuePayload("orders", std::string(100, 'x'));
  Start(std::move(config), DeliverAll);
  ASSERT_TRUE(WaitFor([&] { return db_.Delivered().size() == 400u; }));
  const auto sizes = sink_->hand_overs();
  ASSERT_FALSE(sizes.empty());
  EXPECT_EQ(sizes.front(), 1u);
  EXPECT_EQ(*std::max_element(sizes.begin(), sizes.end()), 50u);
}

// A settle quicker than tuning::kSlowSettle wakes no key itself: settle.sql wakes each removed
// message's successor, and a statement per batch on top of it would cost every keyed drain.
TEST_F(DispatcherTest, ASettleQuickerThanTheSlowMarkWakesNoKeys) {
  auto config = Config();
  config.reap_interval = 1h;                      // no orphan sweep
  const auto keyed = db_.Enqueue("orders", "k");  // nothing behind it: no recheck either
  Start(std::move(config), DeliverAll);
  ASSERT_TRUE(WaitFor([&] { return db_.Delivered().size() == 1u; }));
  // The settler writes batches one after another: once a later one is written, it is done
  // with the first.
  const auto later = db_.Enqueue("orders", std::nullopt);
  ASSERT_TRUE(WaitFor([&] { return db_.Delivered().size() == 2u; }));
  ASSERT_EQ(db_.Delivered(), (std::vector<std::int64_t>{keyed, later}));
  EXPECT_EQ(db_.Calls("wake_keys"), 0);
}

// The wake after a slow settle names an endpoint row's key with its endpoint: wake_keys.sql
// looks a fanned-out row's successors up in its endpoint's rows (endpoint_id), and without it
// found none.
TEST_F(DispatcherTest, ASlowSettleWakesAnEndpointRowsKeyWithItsEndpoint) {
  auto config = Config();
  config.reap_interval = 1h;  // no orphan sweep
  db_.EnqueueForEndpoint("orders", "ep_1", "k");
  db_.BeforeSettleMissingItsWakes([this] { clock_.Advance(1100ms); });
  Start(std::move(config), DeliverAll);
  ASSERT_TRUE(WaitFor([&] { return db_.Delivered().size() == 1u; }));
  ASSERT_TRUE(WaitFor([&] { return db_.Calls("wake_keys") >= 1; }))
      << "no wake after a slow settle";
  const auto asked = db_.KeysAskedToWake();
  ASSERT_EQ(asked.size(), 1u);
  EXPECT_EQ(asked[0].key, "ep_1:k");
  EXPECT_EQ(asked[0].endpoint, std::optional<std::string>("ep_1"));
}

// The orphan sweep reads a page of the blocked rows per reap and goes on from where the last
// page ended: an orphan behind more blocked rows than a page is found on a later reap. (In one
// statement the sweep read every blocked row, ~5 s for a million, on the thread that renews
// leases.)
TEST_F(DispatcherTest, TheOrphanSweepGoesOnFromWhereItsLastPageEnded) {
  auto config = Config();
  config.reap_interval = 1s;
  db_.Enqueue("orders", "a");  // in flight for good: what is blocked behind it stays blocked
  for (int i = 0; i < 5'000; ++i) db_.EnqueueBlocked("orders", "a");
  const auto orphan = db_.EnqueueBlocked("orders", "z");  // nothing before it in its key
  Start(config, [](const Message&) { return std::optional<Outcome>(); });
  ASSERT_TRUE(WaitFor([&] { return sink_->Held() == 1u; }));
  const auto submitted = [&] {
    const auto sent = sink_->submitted();
    return std::find(sent.begin(), sent.end(), orphan) != sent.end();
  };
  // A reap per second of the dispatcher's clock; the page of 5,000 ends before the orphan.
  for (int reap = 1; reap <= 3 && !submitted(); ++reap) {
    ASSERT_TRUE(WaitFor([&] { return db_.Calls("wake_orphans") >= reap; })) << "reap " << reap;
    clock_.Advance(1s);
  }
  EXPECT_TRUE(WaitFor(submitted, 5s)) << "the sweep never got past its first page";
}

// A pass of the orphan sweep ends at the highest blocked row there was when it began, then the
// next starts over: with claims parking rows faster than a page a reap (a keyed drain), no
// page came back short, the cursor never went back, and an orphan below it waited for good
// (review). Here 5,000 rows more are blocked before every reap.
TEST_F(DispatcherTest, AnOrphanBelowTheSweepsCursorIsFoundWhileRowsKeepBeingBlocked) {
  auto config = Config();
  config.reap_interval = 1s;
  db_.Enqueue("orders", "a");  // both heads held in the sink: what is behind them is blocked
  const auto b_head = db_.Enqueue("orders", "b");
  const auto orphan = db_.EnqueueBlocked("orders", "b");
  for (int i = 0; i < 5'000; ++i) db_.EnqueueBlocked("orders", "a");
  Start(config, [](const Message&) { return std::optional<Outcome>(); });
  ASSERT_TRUE(WaitFor([&] { return sink_->Held() == 2u; }));
  ASSERT_TRUE(WaitFor([&] { return db_.Calls("wake_orphans") >= 1; }));  // passed `orphan`
  db_.RemoveWithoutWaking(b_head);  // its settle committed without waking `orphan`
  const auto submitted = [&] {
    const auto sent = sink_->submitted();
    return std::find(sent.begin(), sent.end(), orphan) != sent.end();
  };
  for (int reap = 2; reap <= 6 && !submitted(); ++reap) {
    for (int i = 0; i < 5'000; ++i) db_.EnqueueBlocked("orders", "a");
    clock_.Advance(1s);
    ASSERT_TRUE(WaitFor([&] { return db_.Calls("wake_orphans") >= reap; })) << "reap " << reap;
  }
  EXPECT_TRUE(WaitFor(submitted, 5s)) << "the sweep never came back to the orphan";
}

// The queue status (a pass over the queue: ~1.3 s per million rows) is read on a thread and a
// connection of its own. On the maintenance thread, a slow status read held up the lease
// renewals of messages in flight (and the reaper, the heartbeat), so a large enough backlog let
// leases run out and other relays send those messages again (review).
TEST_F(DispatcherTest, ASlowStatusReadDoesNotHoldUpLeaseRenewals) {
  struct Hold {
    std::atomic<bool> entered{false}, released{false};
  };
  auto hold = std::make_shared<Hold>();
  db_.BeforeReadStatus([hold] {
    hold->entered = true;
    WaitFor([hold] { return hold->released.load(); }, 20s);
  });
  db_.Enqueue("orders", "a");
  Start(Config(), [](const Message&) { return std::optional<Outcome>(); }, &metrics_);
  ASSERT_TRUE(WaitFor([&] { return sink_->Held() == 1u; }));
  ASSERT_TRUE(WaitFor([&] { return hold->entered.load(); })) << "no status read";
  // The maintenance loop runs (it set its first renewal lease / 3 after its start).
  ASSERT_TRUE(WaitFor([&] { return db_.Calls("reap") >= 1; }));
  const auto renewed = db_.RenewedLeases();
  clock_.Advance(10s + 1ms);  // lease / 3: a renewal is due
  EXPECT_TRUE(WaitFor([&] { return db_.RenewedLeases() > renewed; }, 5s))
      << "the renewal waited for the status read";
  hold->released = true;
  sink_->Release();
}

// A lease renewal that failed (a connection reset, a deadlock victim) is tried again after the
// reconnect pause (100 ms, doubling), not lease / 3 later (review): two failures in a row let
// the lease of a message still in the sink run out at the third.
TEST_F(DispatcherTest, AFailedLeaseRenewalIsTriedAgainSoon) {
  db_.Enqueue("orders", "a");
  Start(Config(), [](const Message&) { return std::optional<Outcome>(); });
  ASSERT_TRUE(WaitFor([&] { return sink_->Held() == 1u; }));
  ASSERT_TRUE(WaitFor([&] { return db_.Calls("reap") >= 1; }));
  db_.FailNext("renew", 1);
  const auto renewed = db_.RenewedLeases();
  clock_.Advance(10s + 1ms);  // lease / 3: a renewal is due, and fails
  ASSERT_TRUE(WaitFor([&] { return db_.Calls("renew") >= 1; }));
  EXPECT_TRUE(WaitFor([&] { return db_.RenewedLeases() > renewed; }, 5s))
      << "not tried again until the clock moved another lease / 3";
  sink_->Release();
}

// A renewal passes over rows another transaction holds (renew_leases.sql: SKIP LOCKED), a
// settle in flight as a rule, but also outbox.set_bucket_count rewriting the whole queue. What
// it passed over is tried again a second later, not lease / 3 later: once such a rewrite
// commits, the leases it held up are renewed before the reaper, every reap_interval_ms, finds
// them run out (found in review).
TEST_F(DispatcherTest, LeasesARenewalPassedOverAreTriedAgainSoon) {
  db_.Enqueue("orders", "a");
  Start(Config(), [](const Message&) { return std::optional<Outcome>(); });
  ASSERT_TRUE(WaitFor([&] { return sink_->Held() == 1u; }));
  ASSERT_TRUE(WaitFor([&] { return db_.Calls("reap") >= 1; }));
  db_.LockRowsForRenewals(true);
  const auto renews = db_.Calls("renew");
  clock_.Advance(10s + 1ms);  // lease / 3: a renewal is due, and passes the row over
  ASSERT_TRUE(WaitFor([&] { return db_.Calls("renew") > renews; }));
  db_.LockRowsForRenewals(false);
  const auto renewed = db_.RenewedLeases();
  clock_.Advance(1s + 1ms);
  EXPECT_TRUE(WaitFor([&] { return db_.RenewedLeases() > renewed; }, 5s))
      << "not tried again until the clock moved another lease / 3";
  sink_->Release();
}

// Outcomes waiting for their settle are renewed too, and a settle holds its rows while it
// writes them, so a renewal under steady traffic nearly always passed some over: it then came
// back every second instead of every lease / 3, rewriting every in-flight row each time
// (review). Only rows still in a sink count toward trying again soon.
TEST_F(DispatcherTest, RowsASettleHoldsDoNotBringTheRenewalBackEverySecond) {
  db_.Enqueue("orders", "a");
  db_.FailNext("settle", 1000000);  // delivered; its settle keeps failing (and holds the row)
  Start(Config(), DeliverAll);
  ASSERT_TRUE(WaitFor([&] { return db_.Calls("settle") >= 1; }));
  ASSERT_TRUE(WaitFor([&] { return db_.Calls("reap") >= 1; }));
  db_.LockRowsForRenewals(true);
  const auto first = db_.Calls("renew");
  clock_.Advance(10s + 1ms);  // lease / 3: a renewal is due, and passes the row over
  ASSERT_TRUE(WaitFor([&] { return db_.Calls("renew") > first; }));
  ASSERT_NO_FATAL_FAILURE(ExpectNoRenewalForThreeSecondsOfClock());
  db_.LockRowsForRenewals(false);
  db_.Heal("settle");
}

// A stopping relay's sinks finish what they hold for up to shutdown_timeout_ms, and the settles
// may wait for the database after that: the leases of what they hold are renewed until then
// (review). The maintenance thread stopped at once, so a stop longer than the rest of a lease
// let another relay's reaper take the messages back and send them again while this relay's
// copies were still being delivered.
TEST_F(DispatcherTest, LeasesAreRenewedWhileAStoppingRelaysSinksFinish) {
  db_.Enqueue("orders", "a");
  auto config = Config();
  config.shutdown_timeout = 120s;  // on the fake clock
  std::atomic<bool> in_shutdown{false};
  std::promise<void> finish;
  std::shared_future<void> finished = finish.get_future().share();
  Start(
      std::move(config), [](const Message&) { return std::optional<Outcome>(); }, nullptr,
      [&](RecordingSink& sink) {
        sink.OnShutdown([&in_shutdown, finished] {
          in_shutdown = true;
          finished.wait_for(20s);  // a request still running
        });
      });
  ASSERT_TRUE(WaitFor([&] { return sink_->Held() == 1u; }));
  ASSERT_TRUE(WaitFor([&] { return db_.Calls("reap") >= 1; }));
  const auto token = db_.Find(1)->lease_owner;
  auto stopped = std::async(std::launch::async, [&] { return dispatcher_->Stop(); });
  ASSERT_TRUE(WaitFor([&] { return in_shutdown.load(); }));
  for (int step = 0; step < 4; ++step) {  // more than a whole lease
    const auto renewed = db_.RenewedLeases();
    clock_.Advance(10s + 1ms);  // lease / 3
    EXPECT_TRUE(WaitFor([&] { return db_.RenewedLeases() > renewed; }, 5s)) << "step " << step;
  }
  const auto row = db_.Find(1);
  ASSERT_TRUE(row);
  EXPECT_EQ(row->lease_owner, token) << "the lease ran out while the stopping sink held it";
  finish.set_value();
  stopped.get();
}

// A relay stalled past its lease (its maintenance thread starved, a long GC-like pause): the
// reaper returns a message whose copy is still in the sink, and the claim loop takes it again.
// A second copy would be a second delivery (and, in exactly-once mode, a second record if the
// first had not been produced yet when the second's recovery read the topic); the copy already
// in the sink delivers it, and its outcome settles the new claim.
// retention.archive_retention_hours cleans the archive even with archive_delivered off (what
// was archived while it was on): the key was read and then ignored, and the archive kept it all.
TEST_F(DispatcherTest, AnArchiveRetentionSetAloneCleansTheArchive) {
  auto config = Config();
  config.retention.archive_delivered = false;
  config.retention.archive_retention_set = true;
  config.retention.cleanup_interval = 1s;
  Start(std::move(config), DeliverAll);
  ASSERT_TRUE(WaitFor([&] { return db_.Calls("reap") >= 1; }));
  for (int step = 0; step < 3 && db_.Calls("cleanup_archive") == 0; ++step) {
    clock_.Advance(1s + 1ms);
    WaitFor([&] { return db_.Calls("cleanup_archive") > 0; }, 2s);
  }
  EXPECT_GT(db_.Calls("cleanup_archive"), 0);
}

// A retention backlog (archiving just switched on, a lowered retention) is worked off in
// slices between the maintenance loop's other duties: one call deleted up to a million rows
// while lease renewals and the reaper waited behind it, and held messages' leases ran out
// (review).
TEST_F(DispatcherTest, ARetentionBacklogDoesNotHoldUpLeaseRenewals) {
  db_.Enqueue("orders", "a");
  db_.SetCleanupBacklog(std::chrono::microseconds(20));  // 20 ms per 1,000 rows, never empty
  auto config = Config();
  config.retention.archive_delivered = true;
  Start(std::move(config), [](const Message&) { return std::optional<Outcome>(); });
  ASSERT_TRUE(WaitFor([&] { return sink_->Held() == 1u; }));
  ASSERT_TRUE(WaitFor([&] { return db_.Calls("cleanup_archive") >= 1; }));
  for (int step = 0; step < 3; ++step) {
    const auto renewed = db_.RenewedLeases();
    clock_.Advance(10s + 1ms);  // lease / 3
    ASSERT_TRUE(WaitFor([&] { return db_.RenewedLeases() > renewed; }, 5s)) << "step " << step;
  }
  EXPECT_GE(db_.Calls("cleanup_archive"), 2) << "the backlog is worked off turn after turn";
  sink_->Release();
}

TEST_F(DispatcherTest, AMessageClaimedAgainWhileItsCopyIsInTheSinkIsNotSentTwice) {
  db_.Enqueue("orders", "a");
  Start(Config(), [](const Message&) { return std::optional<Outcome>(); });
  ASSERT_TRUE(WaitFor([&] { return sink_->Held() == 1u; }));
  const auto first = db_.Find(1)->lease_owner;
  ASSERT_TRUE(first);
  TakeTheLeaseBack(first);
  sink_->Release();
  ASSERT_TRUE(WaitFor([&] { return db_.Queued() == 0; }))
      << "the claim taken again was never settled";
  EXPECT_EQ(sink_->submitted(), std::vector<std::int64_t>{1}) << "sent twice";
  EXPECT_EQ(db_.Delivered(), std::vector<std::int64_t>{1});
}

// The same after the sink: the message was delivered, but its settle cannot be written (the
// database is away longer than the lease); when it is back, the reaper and this relay's claim
// loop take the message again before the settler's next try. Sending it again would deliver
// it twice; the delivered outcome settles the new claim instead.
TEST_F(DispatcherTest, AMessageClaimedAgainWhileItsDeliveryIsUnsettledIsNotSentTwice) {
  db_.Enqueue("orders", "a");
  db_.FailNext("settle", 1000);
  Start(Config(), DeliverAll);
  ASSERT_TRUE(WaitFor([&] { return db_.Calls("settle") >= 1; }));
  const auto first = db_.Find(1)->lease_owner;
  ASSERT_TRUE(first);
  TakeTheLeaseBack(first);
  const auto calls = db_.Calls("settle");
  ASSERT_TRUE(WaitFor([&] { return db_.Calls("settle") > calls; }));  // a try after the claim
  db_.Heal("settle");
  ASSERT_TRUE(WaitFor([&] { return db_.Queued() == 0; }, 20s))
      << "the claim taken again was never settled";
  EXPECT_EQ(sink_->submitted(), std::vector<std::int64_t>{1}) << "sent twice";
  EXPECT_EQ(db_.Delivered(), std::vector<std::int64_t>{1});
}

TEST_F(DispatcherTest, ReconnectsAfterTransientErrorsAndLosesNothing) {
  for (int i = 0; i < 60; ++i) db_.Enqueue("orders", "k" + std::to_string(i % 3));
  db_.FailNext("claim", 1);
  db_.FailNext("settle", 1);
  Start(Config(/*batch=*/10), DeliverAll);
  ASSERT_TRUE(WaitFor([&] { return db_.Queued() == 0; })) << db_.Queued() << " left";
  EXPECT_EQ(db_.Delivered().size(), 60u);
  EXPECT_GE(dispatcher_->stats().db_errors, 2);
  EXPECT_EQ(sink_->key_overlaps(), 0);
  EXPECT_EQ(sink_->submitted().size(), 60u) << "a settle that failed was delivered again";
}

TEST_F(DispatcherTest, AClaimWhoseReplyWasLostIsHandedBackNotLeftToItsLease) {
  for (int i = 0; i < 10; ++i) db_.Enqueue("orders", "k");
  db_.LoseNextClaimReply();
  Start(Config(), DeliverAll);
  // Without the hand-back, the lost claim's lease would hold key "k" for 30 s of clock time,
  // which never passes here.
  ASSERT_TRUE(WaitFor([&] { return db_.Queued() == 0; })) << db_.Queued() << " left";
  EXPECT_EQ(db_.Calls("release_lost_claims"), 1);
  EXPECT_EQ(dispatcher_->stats().reaped, 0);
  EXPECT_EQ(db_.Delivered().size(), 10u);
}

// A claim whose reply was lost is handed back even when its destination is paused before the
// hand-back could be written: the loop waited for the resume first, and the claim's rows stayed
// leased (their keys held) until the lease ran out and the reaper counted an attempt.
TEST_F(DispatcherTest, AClaimWhoseReplyWasLostIsHandedBackWhileTheDestinationIsPaused) {
  ASSERT_NO_FATAL_FAILURE(StartWithALostClaimNotHandedBackYet());
  db_.Pause("orders", "maintenance");
  // Maintenance reads the pause every 500 ms of clock time.
  for (int i = 0; i < 2; ++i) {
    const auto reads = db_.Calls("paused");
    clock_.Advance(600ms);
    ASSERT_TRUE(WaitFor([&] { return db_.Calls("paused") > reads; }))
        << "the relay reads the pause";
  }
  db_.Heal("release_lost_claims");
  EXPECT_TRUE(WaitFor([&] { return db_.Leased() == 0; }, 15s))
      << db_.Leased() << " still leased by the lost claim while paused";
  EXPECT_TRUE(db_.Delivered().empty()) << "paused: nothing is sent";
}

// The same when the relay stops: the loop ended with the lost claim's rows still leased.
TEST_F(DispatcherTest, AClaimWhoseReplyWasLostIsHandedBackWhenTheRelayStops) {
  ASSERT_NO_FATAL_FAILURE(StartWithALostClaimNotHandedBackYet());
  db_.Heal("release_lost_claims");
  dispatcher_->Stop();
  EXPECT_EQ(db_.Leased(), 0u) << "the lost claim's rows are handed back on the way out";
}

TEST_F(DispatcherTest, TheFullSweepFindsARowTheLaneHadPassedAndCountsIt) {
  // The lane never looks below its cursor again ...
  ASSERT_NO_FATAL_FAILURE(LeaveARowBelowTheCursor());
  EXPECT_EQ(dispatcher_->stats().sweep_found, 0);
  // ... until the full sweep interval has passed on the clock.
  clock_.Advance(30s);
  ASSERT_TRUE(WaitFor([&] { return db_.Queued() == 0; }));
  EXPECT_EQ(dispatcher_->stats().sweep_found, 1);
}

// outbox.set_bucket_count rewrites every queued row in one transaction: while it runs, the
// claims skip them all (SKIP LOCKED), see no scan stop at its limit, and the fresh-lane cursor
// moves past the whole backlog; once it commits, those rows wait for the full sweep (30 s),
// counted as misses (found in review). It notifies 'rebalance' when it commits: every claim
// loop starts its lane over then, in either claim mode. Here the row below the cursor stands
// for that backlog.
TEST_F(DispatcherTest, ARebalanceStartsTheFreshLaneOver) {
  ASSERT_NO_FATAL_FAILURE(LeaveARowBelowTheCursor());
  db_.NotifyRebalance();
  ASSERT_TRUE(WaitFor([&] { return db_.Queued() == 0; }, 5s)) << "left for the full sweep";
  EXPECT_EQ(dispatcher_->stats().sweep_found, 0) << "not a miss of the lane";
}

TEST_F(DispatcherTest, StopHandsBackWhatTheSinkStillHoldsWithoutCountingAnAttempt) {
  for (int i = 0; i < 30; ++i) db_.Enqueue("orders", "k" + std::to_string(i % 5));
  Start(Config(), [](const Message& m) -> std::optional<Outcome> {
    if (Raw(m.id) % 2 == 0)
      return Outcome{m.id,        OutcomeKind::kDelivered, "", Reason::kNone, std::nullopt, {}, 0,
                     std::nullopt};
    return std::nullopt;  // the odd ones never finish
  });
  ASSERT_TRUE(WaitFor([&] { return sink_->Held() == 5u; })) << sink_->Held();
  const auto started = std::chrono::steady_clock::now();
  EXPECT_TRUE(dispatcher_->Stop()) << "not everything was settled";
  EXPECT_LT(std::chrono::steady_clock::now() - started, 3s);
  EXPECT_EQ(db_.Leased(), 0u) << "a lease was left for the reaper";
  EXPECT_EQ(dispatcher_->stats().released, 5);
  for (std::int64_t id = 1; id <= 30; ++id) {
    if (const auto row = db_.Find(id)) {
      EXPECT_EQ(row->attempts, 0) << "id " << id << ": a handed-back message counted an attempt";
    }
  }
  EXPECT_EQ(db_.Queued() + db_.Delivered().size(), 30u);
}

TEST_F(DispatcherTest, PartitionedModeClaimsWhatTheCoordinatorAssignsAndHandsItBackAtStop) {
  const auto by_key = EnqueueKeyed(200, 7);
  auto cfg = Config(/*batch=*/25);
  cfg.claim_mode = ClaimMode::kPartitioned;
  cfg.partition_heartbeat = 20ms;
  Start(cfg, DeliverAll);
  ASSERT_TRUE(WaitFor([&] { return db_.Queued() == 0; })) << db_.Queued() << " left";
  EXPECT_GE(db_.Calls("coordinate"), 1);
  EXPECT_GE(db_.Calls("claim_partitioned"), 1) << "partitioned mode claimed the other way";
  EXPECT_EQ(sink_->key_overlaps(), 0);
  const auto delivered = db_.Delivered();
  ExpectEachKeyInOrder(by_key, delivered);
  EXPECT_TRUE(dispatcher_->Stop());
  EXPECT_EQ(db_.Calls("coordinate_leave"), 1) << "buckets are handed back at stop";
}

// A partitioned relay's heartbeat (the destinations it serves) is written before it takes its
// first bucket: the other relays claim a destination's messages in the buckets of an owner
// that does not serve it only once its heartbeat says so (claim_partitioned.sql), and the
// maintenance loop's first heartbeat comes after a tick and the start-up reap, which on a
// large queue takes seconds. Until then those messages waited.
TEST_F(DispatcherTest, APartitionedRelaysFirstHeartbeatIsWrittenBeforeItsFirstCoordinate) {
  auto cfg = Config();
  cfg.claim_mode = ClaimMode::kPartitioned;
  Start(cfg, DeliverAll);
  ASSERT_TRUE(WaitFor([&] { return db_.Calls("coordinate") >= 1 && db_.Calls("heartbeat") >= 1; }));
  const auto order = db_.CallOrder();
  const auto first = [&](const std::string& op) {
    return std::find(order.begin(), order.end(), op) - order.begin();
  };
  EXPECT_LT(first("heartbeat"), first("coordinate"));
}

// The reaper asks for the relays' turn at the scan of the whole queue for leases without a
// record once no relay has begun one for 60 of its reap intervals (migration 0034).
TEST_F(DispatcherTest, TheReaperAsksForTheQueueScanAfterSixtyOfItsReapIntervals) {
  auto config = Config();
  config.reap_interval = 7s;
  Start(config, DeliverAll);
  ASSERT_TRUE(WaitFor([&] { return db_.Calls("reap") >= 1; }));
  EXPECT_EQ(db_.QueueScanIntervals().front(), Millis{7'000 * 60});
}

// A partitioned relay's settles name it, so that a key's next message released in a bucket
// another relay owns now wakes that relay (woke_elsewhere, in both settle statements;
// StoreTest covers them); a skip_locked relay's name none, every relay claiming every bucket.
TEST_F(DispatcherTest, APartitionedRelaysSettlesNameItAndOthersNone) {
  std::string me;  // the partitioned relay's id
  for (const auto mode : {ClaimMode::kPartitioned, ClaimMode::kSkipLocked}) {
    const bool partitioned = mode == ClaimMode::kPartitioned;
    SCOPED_TRACE(partitioned ? "partitioned" : "skip_locked");
    if (dispatcher_) dispatcher_->Stop();
    dispatcher_.reset();
    const auto delivered = db_.Delivered().size();
    for (int i = 0; i < 20; ++i) db_.Enqueue("orders", "k" + std::to_string(i % 3));
    auto cfg = Config(/*batch=*/5);
    cfg.claim_mode = mode;
    cfg.partition_heartbeat = 20ms;
    Start(cfg, DeliverAll);
    ASSERT_TRUE(WaitFor([&] { return db_.Delivered().size() == delivered + 20; }));
    if (partitioned) {
      me = db_.CoordinatedAs();
      ASSERT_FALSE(me.empty());
      EXPECT_EQ(db_.SettledAs(), std::set<std::string>{me});
    } else {
      EXPECT_EQ(db_.SettledAs(), (std::set<std::string>{me, ""}));
    }
    EXPECT_TRUE(dispatcher_->Stop());
  }
}

// Exactly-once: the next owner of a bucket fences this relay's producer when it starts, which
// aborts a transaction still open. A stopping relay whose sink fences keeps its buckets until
// the sink finished what it holds (and the settles are written); others hand them back first,
// so that the other relays take over at once.
TEST_F(DispatcherTest, AFencingSinkFinishesBeforeTheBucketsAreHandedBack) {
  for (const bool fences : {true, false}) {
    SCOPED_TRACE(fences ? "fencing sink" : "plain sink");
    if (dispatcher_) dispatcher_->Stop();
    dispatcher_.reset();
    const auto leaves_before = db_.Calls("coordinate_leave");
    db_.Enqueue("orders", "k");
    auto cfg = Config();
    cfg.claim_mode = ClaimMode::kPartitioned;
    cfg.partition_heartbeat = 20ms;
    std::atomic<std::int64_t> left_at_shutdown{-1};
    Start(
        cfg, [](const Message&) { return std::optional<Outcome>(); }, nullptr,
        [&](RecordingSink& sink) {
          sink.SetFences(fences);
          sink.OnShutdown(
              [&] { left_at_shutdown = db_.Calls("coordinate_leave") - leaves_before; });
        });
    ASSERT_TRUE(WaitFor([&] { return sink_->Held() == 1u; }));
    dispatcher_->Stop();
    EXPECT_EQ(left_at_shutdown.load(), fences ? 0 : 1)
        << "buckets handed back before the sink had finished";
    EXPECT_EQ(db_.Calls("coordinate_leave") - leaves_before, 1) << "buckets are handed back";
  }
}

// The sinks of a stopping relay are stopped side by side: one may run to a deadline of its
// own (a webhook sink connecting to an endpoint that does not answer runs to its connect
// timeout), and stopped one after another the stop took the sum of them. Each sink's Shutdown
// here waits until all three have begun (or 3 s).
TEST_F(DispatcherTest, SinksAreStoppedSideBySide) {
  RelayConfig cfg = Config();
  const Destination orders = cfg.destinations.at("orders");
  cfg.destinations.clear();
  std::mutex mu;
  std::condition_variable cv;
  int begun = 0;
  std::vector<int> seen;
  std::map<std::string, SinkPtr> sinks;
  for (const std::string name : {"a", "b", "c"}) {
    Destination d = orders;
    d.name = name;
    cfg.destinations.emplace(name, d);
    auto sink = std::make_unique<RecordingSink>(DeliverAll);
    sink->OnShutdown([&] {
      std::unique_lock lock(mu);
      ++begun;
      cv.notify_all();
      cv.wait_for(lock, 3s, [&] { return begun == 3; });
      seen.push_back(begun);
    });
    sinks.emplace(name, std::move(sink));
  }
  DispatcherEnv env;
  env.stores = db_.Stores();
  env.clock = &clock_;
  Dispatcher dispatcher(std::move(cfg), std::move(sinks), std::move(env));
  dispatcher.Start();
  dispatcher.Stop();
  std::lock_guard lock(mu);
  EXPECT_EQ(seen, (std::vector<int>{3, 3, 3})) << "a sink's stop began only after another's ended";
}

// The claim loop reads its buckets, may hand back a lost claim's rows (a round trip), then
// claims. A bucket the coordinator assigns in between must not wait for the poll: its
// wake-up is counted from before the buckets were read, so the partial claim on the old
// buckets is followed by one on the new.
TEST_F(DispatcherTest, ABucketGainedWhileAClaimIsPreparedIsClaimedWithoutWaitingForThePoll) {
  db_.OwnBuckets({0, 1, 2});
  for (int i = 0; i < 4; ++i) db_.Enqueue("orders", std::nullopt);  // id 3 is in bucket 3
  db_.LoseNextClaimReply();
  db_.BeforeReleaseLostClaims([&] {
    db_.OwnBuckets({0, 1, 2, 3});
    // Two heartbeats later the coordinator has stored the new buckets and woken the loop.
    const auto beats = db_.Calls("coordinate");
    EXPECT_TRUE(WaitFor([&] { return db_.Calls("coordinate") >= beats + 2; }));
  });
  auto cfg = Config();
  cfg.claim_mode = ClaimMode::kPartitioned;
  cfg.partition_heartbeat = 20ms;
  cfg.poll_interval = 1h;  // a wake-up that is lost is never made up for here
  Start(cfg, DeliverAll);
  ASSERT_TRUE(WaitFor([&] { return db_.Queued() == 0; }))
      << db_.Queued() << " left; release_lost_claims ran " << db_.Calls("release_lost_claims")
      << " time(s)";
  EXPECT_EQ(db_.Calls("release_lost_claims"), 1);
}

// Notifications sent while the LISTEN connection is down are lost, and the listener, back,
// woke nobody: a message written meanwhile waited for poll_interval (review). The listener
// now wakes the claim loops, and starts their lanes over (a 'rebalance' may be among what it
// missed), once it listens again after a failure.
TEST_F(DispatcherTest, AMessageWrittenWhileTheListenConnectionWasDownIsClaimedOnceItIsBack) {
  auto cfg = Config();
  cfg.poll_interval = 1h;  // a wake-up that is lost is never made up for here
  Start(cfg, DeliverAll);
  db_.Enqueue("orders", std::nullopt);
  ASSERT_TRUE(WaitFor([&] { return db_.Queued() == 0; })) << "the listener works at all";
  db_.FailNext("listen", 1000);
  const auto failed = db_.Calls("listen");
  ASSERT_TRUE(WaitFor([&] { return db_.Calls("listen") > failed + 1; })) << "the listener is down";
  db_.Enqueue("orders", std::nullopt);  // its notification is lost
  db_.Heal("listen");
  ASSERT_TRUE(WaitFor([&] { return db_.Queued() == 0; }))
      << "the message written while the listener was down waits for poll_interval";
}

// The listener's connection reads the paused destinations too (every kPauseRefresh). A read
// that failed there (a statement timeout, a grant revoked) was taken for a lost LISTEN
// connection: the connection was dropped and LISTENed again, what was notified meanwhile lost
// and every claim loop's lane started over (a rebalance), once a second for as long as the
// read kept failing. The connection stays; the next read tries again.
TEST_F(DispatcherTest, AFailedPauseReadKeepsTheListenConnection) {
  Start(Config(), DeliverAll);
  ASSERT_TRUE(WaitFor([&] {
    clock_.Advance(100ms);
    return db_.Calls("subscribe") > 0 && db_.Calls("paused") > 0;
  }));
  const auto subscribed = db_.Calls("subscribe");
  db_.Refuse("paused", "permission denied for table paused_destinations");
  const auto errors = dispatcher_->stats().db_errors;
  // Some seconds of failed reads, by the listener and by maintenance.
  for (int i = 0; i < 8 && db_.Calls("subscribe") == subscribed; ++i) {
    const auto reads = db_.Calls("paused");
    ASSERT_TRUE(WaitFor([&] {
      clock_.Advance(200ms);
      return db_.Calls("paused") > reads || db_.Calls("subscribe") > subscribed;
    }));
  }
  EXPECT_EQ(db_.Calls("subscribe"), subscribed) << "the LISTEN connection was dropped";
  EXPECT_GT(dispatcher_->stats().db_errors, errors) << "the failed reads are counted";
  db_.Heal("paused");
  db_.Pause("orders", "maintenance");
  ASSERT_TRUE(WaitFor([&] {
    clock_.Advance(200ms);
    return !sink_->pauses().empty();
  }));
  EXPECT_EQ(sink_->pauses(), (std::vector<bool>{true}));
  // A notification still wakes the claim loops at once.
  db_.Resume("orders");
  ASSERT_TRUE(WaitFor([&] {
    clock_.Advance(200ms);
    return sink_->pauses().size() == 2u;
  }));
  db_.Enqueue("orders", std::nullopt);
  EXPECT_TRUE(WaitFor([&] { return db_.Queued() == 0; }));
  EXPECT_EQ(db_.Calls("subscribe"), subscribed);
}

// A paused read that fails because the connection is gone is the listener's lost connection:
// it LISTENs again on a fresh one (and wakes the claim loops for what it may have missed).
TEST_F(DispatcherTest, APauseReadThatLosesTheConnectionListensAgain) {
  Start(Config(), DeliverAll);
  ASSERT_TRUE(WaitFor([&] {
    clock_.Advance(100ms);
    return db_.Calls("subscribe") > 0;
  }));
  const auto subscribed = db_.Calls("subscribe");
  db_.FailuresLoseTheConnection();
  db_.FailNext("paused", 1'000'000);
  ASSERT_TRUE(WaitFor([&] {
    clock_.Advance(200ms);
    return db_.Calls("subscribe") > subscribed;
  })) << "the listener kept a connection that was gone";
  db_.Heal("paused");
}

// A resume reaches the sink before the claim loops claim again. Told after, a sink slow to
// take it (the webhook service's waits for a reload of its registry under way) was handed what
// the loops claimed at once while it still counted itself paused, refused it all, and every
// message waited a second as "paused by an operator".
TEST_F(DispatcherTest, AResumeReachesTheSinkBeforeTheClaimsDo) {
  db_.Pause("orders", "maintenance");
  Start(Config(), DeliverAll);
  ASSERT_TRUE(WaitFor([&] {
    clock_.Advance(100ms);
    return !sink_->pauses().empty();
  }));
  for (int i = 0; i < 20; ++i) db_.Enqueue("orders", "k" + std::to_string(i % 4));
  sink_->SlowResume(1500ms);  // longer than the paused loops' poll (kPausedPoll)
  db_.Resume("orders");
  ASSERT_TRUE(WaitFor([&] {
    clock_.Advance(100ms);
    return db_.Queued() == 0 && sink_->pauses().size() == 2u;
  }));
  EXPECT_EQ(sink_->pauses(), (std::vector<bool>{true, false}));
  EXPECT_EQ(sink_->submitted_while_paused(), 0) << "claimed before the sink took the resume";
}

TEST_F(DispatcherTest, APausedDestinationIsNotClaimedUntilResumed) {
  db_.Pause("orders", "endpoint maintenance");
  for (int i = 0; i < 20; ++i) db_.Enqueue("orders", "k" + std::to_string(i % 3));
  Start(Config(), DeliverAll);
  // Maintenance reads the pause every 500 ms of clock time; three reads pass without a claim.
  for (int i = 0; i < 3; ++i) {
    const auto reads = db_.Calls("paused");
    clock_.Advance(600ms);
    ASSERT_TRUE(WaitFor([&] { return db_.Calls("paused") > reads; })) << "read " << i;
  }
  EXPECT_EQ(db_.Calls("claim"), 0) << "a paused destination was claimed";
  EXPECT_EQ(db_.Queued(), 20u);
  EXPECT_TRUE(sink_->submitted().empty());

  db_.Resume("orders");
  clock_.Advance(600ms);
  ASSERT_TRUE(WaitFor([&] { return db_.Queued() == 0; })) << db_.Queued() << " left";
  EXPECT_EQ(db_.Delivered().size(), 20u);
  EXPECT_EQ(sink_->pauses(), (std::vector<bool>{true, false}))
      << "the sink was told of the pause and of the resume";
}

// The sinks' view of their targets (breaker, concurrency, pauses) reaches the metrics every
// turn, also while the database is away: it was published only after a turn's database work
// had all succeeded, so during an outage the breaker's gauge stayed where it was (review).
TEST_F(DispatcherTest, TheSinksHealthReachesTheMetricsWhileTheDatabaseIsAway) {
  Start(Config(), DeliverAll, &metrics_);
  ASSERT_TRUE(WaitFor([&] { return db_.Calls("paused") > 0; }));
  db_.FailNext("paused", 1'000'000);
  db_.FailNext("heartbeat", 1'000'000);
  db_.FailNext("renew", 1'000'000);
  const auto fails = db_.Calls("paused");
  ASSERT_TRUE(WaitFor([&] {
    clock_.Advance(600ms);
    return db_.Calls("paused") > fails + 1;
  }));
  TargetHealth h;
  h.kind = "webhook";
  h.breaker = "open";
  h.concurrency_limit = 3;
  sink_->SetHealth(h);
  const auto shown = [&] {
    clock_.Advance(200ms);
    return metrics_.Render().find("outbox_webhook_breaker_state{destination=\"orders\"} 2\n") !=
           std::string::npos;
  };
  EXPECT_TRUE(WaitFor(shown)) << metrics_.Render();
}

// A pause is honoured within a second while the maintenance thread is busy (a reap or a
// retention batch on a large queue takes seconds): the listener's connection reads the paused
// destinations too. Read only by maintenance, a pause waited for the end of its turn (review).
TEST_F(DispatcherTest, APauseIsReadWhileMaintenanceIsBusy) {
  auto config = Config();
  config.reap_interval = 1s;
  Start(config, DeliverAll);
  ASSERT_TRUE(WaitFor([&] { return db_.Calls("reap") > 0; }));
  db_.StallNextReap(8s);
  ASSERT_TRUE(WaitFor([&] {
    clock_.Advance(100ms);
    return db_.ReapStalled();
  }));
  db_.Pause("orders", "maintenance window");
  const auto paused_at = std::chrono::steady_clock::now();
  ASSERT_TRUE(WaitFor([&] {
    clock_.Advance(100ms);
    return !sink_->pauses().empty();
  }));
  EXPECT_LT(std::chrono::steady_clock::now() - paused_at, 3s) << "read after the stalled reap";
  EXPECT_TRUE(db_.ReapStalled()) << "the test did not hold maintenance up";
}

// A pause reaches the destination's sink too, so what it holds and has not sent yet goes back
// instead of going out for as long as its queue takes (review: up to three claims' worth
// behind a slow endpoint); a resume lets it send again.
TEST_F(DispatcherTest, APauseAndAResumeAreHandedToTheSink) {
  for (int i = 0; i < 5; ++i) db_.Enqueue("orders", std::nullopt);
  Start(Config(), DeliverAll);
  ASSERT_TRUE(WaitFor([&] { return db_.Queued() == 0; }));
  EXPECT_TRUE(sink_->pauses().empty()) << "nothing was paused";
  db_.Pause("orders", "maintenance");
  ASSERT_TRUE(WaitFor([&] {
    clock_.Advance(600ms);
    return !sink_->pauses().empty();
  }));
  EXPECT_EQ(sink_->pauses(), std::vector<bool>{true});
  db_.Resume("orders");
  ASSERT_TRUE(WaitFor([&] {
    clock_.Advance(600ms);
    return sink_->pauses().size() == 2;
  }));
  EXPECT_EQ(sink_->pauses(), (std::vector<bool>{true, false}));
}

// Bucket leases (docs/adr/0003-bucket-leases.md): the claims read (ClaimOwned), nothing is
// leased or renewed, every settle is fenced by bucket (SettleOwned), and a key's messages still
// go one at a time, in order, retries included.
TEST_F(DispatcherTest, BucketLeasesClaimByReadingAndSettleByBucketInKeyOrder) {
  const auto by_key = EnqueueKeyed(200, 7);
  auto cfg = BucketLeaseConfig(/*batch=*/25);
  std::mutex mu;
  std::set<std::int64_t> failed_once;
  Start(cfg, [&](const Message& m) -> std::optional<Outcome> {
    std::lock_guard lk(mu);
    if (Raw(m.id) % 10 == 3 && failed_once.insert(Raw(m.id)).second) {
      return Outcome{m.id, OutcomeKind::kRetry, "HTTP 503", Reason::kNone, std::nullopt, {}, 0,
                     std::nullopt};
    }
    return DeliverAll(m);
  });
  ASSERT_TRUE(WaitFor([&] {
    if (db_.Queued() > 0) clock_.Advance(1s);  // the retries' backoff
    EXPECT_EQ(db_.Leased(), 0u) << "a row was leased";
    return db_.Queued() == 0;
  })) << db_.Queued() << " left";
  EXPECT_GE(db_.Calls("claim_owned"), 1);
  EXPECT_EQ(db_.Calls("claim_owned"), db_.Calls("claim")) << "a claim leased its rows";
  EXPECT_GE(db_.Calls("settle_owned"), 1);
  EXPECT_EQ(db_.Calls("settle_owned"), db_.Calls("settle")) << "a settle checked lease tokens";
  EXPECT_EQ(db_.RenewedLeases(), 0);
  EXPECT_EQ(sink_->key_overlaps(), 0);
  EXPECT_EQ(failed_once.size(), 20u);
  const auto delivered = db_.Delivered();
  ExpectEachKeyInOrder(by_key, delivered);
}

// Under bucket leases a claim that reads the lane from its start again (the full sweep) finds
// the rows this relay has in flight, unleased; and from a snapshot taken before their settle
// committed, rows settled while it ran. Neither is sent again (without the check of what was
// settled during the read, all ten went to the sink a second time, and the sweep counted them
// as rows the fresh lane had missed).
TEST_F(DispatcherTest, BucketLeasesSendNothingTwiceWhenTheSweepReadsWhatWasSettledMeanwhile) {
  std::vector<std::int64_t> ids;
  for (int i = 0; i < 10; ++i) ids.push_back(db_.Enqueue("orders", std::nullopt));
  auto cfg = BucketLeaseConfig();
  std::atomic<bool> hold{true};
  Start(cfg, [&](const Message& m) -> std::optional<Outcome> {
    if (hold) return std::nullopt;
    return DeliverAll(m);
  });
  ASSERT_TRUE(WaitFor([&] { return sink_->Held() == 10u; }));
  std::atomic<bool> read_again{false};
  db_.AfterOwnedClaimFromTheStart([&] {
    hold = false;
    sink_->Release();  // delivered and settled while the sweep's claim is on its way back
    EXPECT_TRUE(WaitFor([&] { return db_.Queued() == 0; }));
    read_again = true;
  });
  clock_.Advance(cfg.full_sweep_interval + 1s);  // the loop's next poll starts the sweep
  ASSERT_TRUE(WaitFor([&] { return read_again.load(); })) << "the sweep did not run";
  const auto claims = db_.Calls("claim_owned");
  ASSERT_TRUE(WaitFor([&] { return db_.Calls("claim_owned") > claims; }));
  auto sent = sink_->submitted();
  std::sort(sent.begin(), sent.end());
  EXPECT_EQ(sent, ids) << "a message went to the sink twice";
  EXPECT_EQ(db_.Delivered().size(), 10u);
  EXPECT_EQ(dispatcher_->stats().sweep_found, 0) << "what the relay held counted as missed";
}

// A stopping relay under bucket leases keeps its buckets until what its sinks held is settled:
// handed back first, those settles would be fenced and the next owner would send it all again.
TEST_F(DispatcherTest, BucketLeasesKeepTheBucketsUntilTheSettlesAreWritten) {
  const auto id = db_.Enqueue("orders", "k");
  auto cfg = BucketLeaseConfig();
  std::atomic<std::int64_t> left_at_shutdown{-1};
  Start(
      cfg, [](const Message&) { return std::optional<Outcome>(); }, nullptr,
      [&](RecordingSink& sink) {
        sink.OnShutdown([&] { left_at_shutdown = db_.Calls("coordinate_leave"); });
      });
  ASSERT_TRUE(WaitFor([&] { return sink_->Held() == 1u; }));
  dispatcher_->Stop();
  EXPECT_EQ(left_at_shutdown.load(), 0) << "buckets handed back before the sink had finished";
  EXPECT_EQ(db_.Calls("coordinate_leave"), 1);
  const auto row = db_.Find(id);
  ASSERT_TRUE(row.has_value());
  EXPECT_EQ(row->attempts, 0) << "the shutdown's release counts no attempt";
  EXPECT_TRUE(row->parked) << "released by a settle in a bucket still owned";
}

// Bucket leases: a bucket the coordinator hands over (migration 0035) is claimed from no more,
// and given up only once what the relay read from it is settled; before, the next owner would
// have delivered those messages again, beside this relay's copies still in its sink.
TEST_F(DispatcherTest, BucketLeasesGiveABucketUpOnlyOnceWhatWasReadFromItIsSettled) {
  const auto bucket_of = [](std::int64_t id) {
    return static_cast<int>(id % FakeDatabase::kBuckets);
  };
  std::vector<std::int64_t> first;
  for (int i = 0; i < 8; ++i) first.push_back(db_.Enqueue("orders", std::nullopt));
  auto cfg = BucketLeaseConfig();
  Start(cfg, [](const Message&) { return std::optional<Outcome>(); });  // holds everything
  ASSERT_TRUE(WaitFor([&] { return sink_->Held() == 8u; }));
  const int handed = bucket_of(first[0]);
  db_.HandOver(handed);
  const auto beats = db_.Calls("coordinate");
  ASSERT_TRUE(WaitFor([&] { return db_.Calls("coordinate") >= beats + 3; }));
  std::vector<std::int64_t> later, later_handed;
  for (int i = 0; i < 8; ++i) {
    const auto id = db_.Enqueue("orders", std::nullopt);
    (bucket_of(id) == handed ? later_handed : later).push_back(id);
  }
  ASSERT_TRUE(WaitFor([&] { return sink_->Held() == 8u + later.size(); }))
      << "the buckets not handed over are still claimed";
  const auto beats_after = db_.Calls("coordinate");
  ASSERT_TRUE(WaitFor([&] { return db_.Calls("coordinate") >= beats_after + 3; }));
  EXPECT_TRUE(db_.Released().empty()) << "given up while its messages were still in the sink";
  sink_->Release();
  ASSERT_TRUE(WaitFor([&] { return !db_.Released().empty(); })) << "never given up";
  EXPECT_EQ(db_.Released(), std::vector<int>{handed});
  ASSERT_TRUE(WaitFor([&] {
    const auto owned = db_.OwnedBuckets();
    return std::find(owned.begin(), owned.end(), handed) == owned.end();
  }));
  const auto sent = sink_->submitted();
  for (const auto id : later_handed) {
    EXPECT_EQ(std::count(sent.begin(), sent.end(), id), 0)
        << id << " claimed from a bucket handed over";
    EXPECT_TRUE(db_.Find(id).has_value()) << id << " is left for the bucket's next owner";
  }
  EXPECT_FALSE(later_handed.empty());
}

// Bucket leases: a message's claim runs out when its bucket may have moved, partition_lease_ms
// after the start of the relay's last successful heartbeat, moved on by each heartbeat. A sink
// that checks (a webhook sink, an exactly-once Kafka sink) then sends nothing a relay paused or
// cut off past its partition lease had in hand, as under row leases; the messages carried no
// end at all before.
TEST_F(DispatcherTest, BucketLeasesClaimsRunOutWithTheLastHeartbeat) {
  db_.Enqueue("orders", std::nullopt);
  auto cfg = BucketLeaseConfig();
  cfg.partition_lease = 300ms;
  const auto started = std::chrono::steady_clock::now();
  Start(cfg, [](const Message&) { return std::optional<Outcome>(); });  // holds it
  ASSERT_TRUE(WaitFor([&] { return sink_->Held() == 1u; }));
  const Message held = sink_->HeldMessages().front();
  const auto first = ClaimRunsOut(held);
  ASSERT_TRUE(first.has_value()) << "no end: a sink would send it after any pause";
  EXPECT_GT(*first, started + cfg.partition_lease - 1ms);
  EXPECT_LE(*first, std::chrono::steady_clock::now() + cfg.partition_lease);
  ASSERT_TRUE(WaitFor([&] { return ClaimRunsOut(held) > *first + 50ms; }))
      << "the heartbeats did not move it on";
  db_.FailNext("coordinate", 1'000'000);
  const auto failing_from = std::chrono::steady_clock::now();
  ASSERT_TRUE(WaitFor([&] { return std::chrono::steady_clock::now() > *ClaimRunsOut(held); }))
      << "it kept running without heartbeats";
  EXPECT_LE(*ClaimRunsOut(held), failing_from + cfg.partition_lease);
  db_.Heal("coordinate");
}

// A relay the coordinator refuses for good (a live relay of the other lease mode: migration
// 0035) claims nothing, and its readiness says why until a heartbeat succeeds; it logged the
// error at every heartbeat and /readyz said it was ready.
TEST_F(DispatcherTest, ARelayTheCoordinatorRefusesIsNotReadyAndSaysWhy) {
  db_.Enqueue("orders", std::nullopt);
  db_.Refuse("coordinate",
             "relay 7 (host pid 1) runs with bucket_leases false, this one with true");
  auto cfg = BucketLeaseConfig();
  Start(cfg, DeliverAll);
  std::string why;
  ASSERT_TRUE(WaitFor([&] {
    why = dispatcher_->WhyNotReady();
    return why.find("coordinator refuses") != std::string::npos;
  })) << why;
  EXPECT_NE(why.find("runs with bucket_leases false, this one with true"), std::string::npos)
      << why;
  EXPECT_EQ(db_.Calls("claim_owned"), 0) << "a refused relay claimed";
  db_.Heal("coordinate");
  ASSERT_TRUE(WaitFor([&] { return db_.Queued() == 0; }));
  EXPECT_EQ(dispatcher_->WhyNotReady().find("coordinator"), std::string::npos);
}

// The coordinator's refusal (outbox.coordinate, 55000: a live relay of the other lease mode) is
// logged like the heartbeat's: when it begins and about once a relay heartbeat period, not as a
// failed database call at every partition_heartbeat ("coordinator: heartbeat failed: ... fix
// the database or the relay's role", a reconnect each time).
TEST_F(DispatcherTest, ACoordinatorRefusalIsLoggedOnceAPeriodNotAtEveryTry) {
  const auto logs = LogsOfARefusal(
      "coordinate", "relay 7 (host pid 1) runs with bucket_leases false, this one with true",
      "the coordinator refuses this relay", BucketLeaseConfig());
  ASSERT_TRUE(logs.tried) << db_.Calls("coordinate") << " coordinates tried";
  EXPECT_EQ(logs.first, 1);
  EXPECT_EQ(logs.failed, 0);
  EXPECT_TRUE(logs.again) << "not logged again in the next period";
  EXPECT_NE(logs.why.find("runs with bucket_leases false, this one with true"), std::string::npos)
      << logs.why;
  EXPECT_EQ(db_.Calls("claim_owned"), 0) << "a refused relay claimed";
}

// A relay whose heartbeat the database refuses (a live relay of the other lease mode serves
// one of its destinations: migration 0037) claims nothing, and its readiness says why, until a
// heartbeat is accepted. A skip_locked relay beside bucket-lease relays leased the rows they
// hold in memory: nothing refused it, since it never calls the coordinator.
TEST_F(DispatcherTest, ARelayWhoseHeartbeatIsRefusedClaimsNothingAndSaysWhy) {
  db_.Enqueue("orders", std::nullopt);
  db_.Refuse("heartbeat",
             "relay 7 (host pid 1) holds the rows of orders by bucket leases, this one by row "
             "leases");
  Start(Config(), DeliverAll);
  std::string why;
  ASSERT_TRUE(WaitFor([&] {
    why = dispatcher_->WhyNotReady();
    return why.find("heartbeat is refused") != std::string::npos;
  })) << why;
  EXPECT_NE(why.find("holds the rows of orders by bucket leases"), std::string::npos) << why;
  EXPECT_EQ(db_.Calls("claim"), 0) << "a refused relay claimed";
  db_.Heal("heartbeat");
  clock_.Advance(6s);  // the next heartbeat is due
  ASSERT_TRUE(WaitFor([&] { return db_.Queued() == 0; }));
  EXPECT_EQ(dispatcher_->WhyNotReady().find("heartbeat"), std::string::npos);
}

// A partitioned relay's coordinator tries its heartbeat every partition_heartbeat until one is
// accepted. Each refused try was logged twice (the refusal, then as a failed database call:
// "coordinator: heartbeat failed: ... fix the database or the relay's role"), the connection
// reset each time, as many times a second as it tried. The refusal is logged when it begins and
// once a relay heartbeat period (5 s) while it lasts.
TEST_F(DispatcherTest, ARefusedHeartbeatIsLoggedOnceAPeriodNotAtEveryTry) {
  RelayConfig cfg = Config();
  cfg.claim_mode = ClaimMode::kPartitioned;
  const auto logs = LogsOfARefusal("heartbeat",
                                   "relay 7 (host pid 1) holds the rows of orders by bucket "
                                   "leases, this one by row leases",
                                   "heartbeat refused", cfg);
  ASSERT_TRUE(logs.tried) << db_.Calls("heartbeat") << " heartbeats tried";
  EXPECT_EQ(logs.first, 1);
  EXPECT_EQ(logs.failed, 0);
  EXPECT_TRUE(logs.again) << "not logged again in the next period";
  EXPECT_LE(logs.then, 3);
  EXPECT_EQ(db_.Calls("claim_partitioned") + db_.Calls("claim"), 0) << "a refused relay claimed";
}

// Bucket leases: a retry whose outcome is not written yet leaves its row as it was, fresh and
// due; a claim that reads it again (here the sweep) must not send it: the row is still this
// relay's. It went to the sink again at once, skipping its backoff and spending an attempt.
TEST_F(DispatcherTest, BucketLeasesDoNotSendAgainAMessageWhoseRetryIsNotWrittenYet) {
  const auto id = db_.Enqueue("orders", std::nullopt);
  auto cfg = BucketLeaseConfig();
  std::mutex mu;
  std::condition_variable cv;
  bool settle_may_go = false;
  db_.BeforeSettleMissingItsWakes([&] {  // the retry's settle waits
    std::unique_lock lk(mu);
    cv.wait_for(lk, 10s, [&] { return settle_may_go; });
  });
  Start(cfg, [](const Message& m) -> std::optional<Outcome> {
    return Outcome{m.id, OutcomeKind::kRetry, "HTTP 503", Reason::kNone, std::nullopt, {},
                   0,    std::nullopt};
  });
  ASSERT_TRUE(WaitFor([&] { return db_.Calls("settle_owned") >= 1; })) << "no settle began";
  const auto claims = db_.Calls("claim_owned");
  clock_.Advance(cfg.full_sweep_interval + 1s);  // the next poll reads the lane from its start
  ASSERT_TRUE(WaitFor([&] { return db_.Calls("claim_owned") >= claims + 2; }));
  const auto sent = sink_->submitted();
  EXPECT_EQ(std::count(sent.begin(), sent.end(), id), 1)
      << "sent again before its retry was written";
  {
    std::lock_guard lk(mu);
    settle_may_go = true;
  }
  cv.notify_all();
  ASSERT_TRUE(WaitFor([&] { return db_.Find(id) && db_.Find(id)->attempts == 1; }));
}

// Bucket leases: each message's claim follows its own bucket, at the epoch it was read at. A
// bucket the relay no longer owns (taken after its partition lease, or by force after a
// handover timed out) stops covering what was read from it although the relay's heartbeats go
// on: one cover for the whole relay kept such messages sendable while the relay lived.
TEST_F(DispatcherTest, BucketLeasesAMessagesClaimRunsOutWhenItsBucketIsNoLongerOwned) {
  const auto id = db_.Enqueue("orders", std::nullopt);
  const int bucket = static_cast<int>(id % FakeDatabase::kBuckets);
  auto cfg = BucketLeaseConfig();
  cfg.partition_lease = 300ms;
  Start(cfg, [](const Message&) { return std::optional<Outcome>(); });  // holds it
  ASSERT_TRUE(WaitFor([&] { return sink_->Held() == 1u; }));
  const Message held = sink_->HeldMessages().front();
  ASSERT_TRUE(ClaimRunsOut(held).has_value());
  std::vector<int> others;
  for (int b = 0; b < FakeDatabase::kBuckets; ++b)
    if (b != bucket) others.push_back(b);
  db_.OwnBuckets(others);  // its bucket went to another relay
  const auto beats = db_.Calls("coordinate");
  ASSERT_TRUE(WaitFor([&] { return std::chrono::steady_clock::now() > *ClaimRunsOut(held); }))
      << "it stayed covered by the relay's other buckets";
  EXPECT_GE(db_.Calls("coordinate"), beats + 3) << "the heartbeats went on meanwhile";
}

// Bucket leases: with its cursor held back (a transaction older than its claims still runs),
// each claim reads again the rows the relay holds, and drops them all. The loop claimed again at
// once, reading the same batch in a busy loop for as long as the sink held it (review); it
// pauses now (tuning::kAllHeldPause) or waits for a wake-up. Ten such claims take at least
// nine pauses: a lower bound, which a slow machine only raises.
TEST_F(DispatcherTest, BucketLeasesPauseAfterAClaimThatReadOnlyWhatTheRelayHolds) {
  for (int i = 0; i < 10; ++i) db_.Enqueue("orders", std::nullopt);
  db_.HoldCursor(true);
  auto cfg = BucketLeaseConfig(/*batch=*/5);  // two claims' worth: each stops at its limit
  Start(cfg, [](const Message&) { return std::optional<Outcome>(); });  // holds them all
  ASSERT_TRUE(WaitFor([&] { return sink_->Held() == 5u; }));
  const auto claims = db_.Calls("claim_owned");
  const auto from = std::chrono::steady_clock::now();
  ASSERT_TRUE(WaitFor([&] { return db_.Calls("claim_owned") >= claims + 10; }));
  EXPECT_GE(std::chrono::steady_clock::now() - from, 9 * 40ms)
      << "claims that read only held rows went on back to back";
  EXPECT_EQ(sink_->submitted().size(), 5u);
  db_.HoldCursor(false);
}

// Bucket leases: heartbeats that fail for a partition lease make the relay stop claiming (it
// gives up its buckets until one succeeds), but its settles are fenced by the database, at the
// epochs of its last successful heartbeat: a delivery written meanwhile in a bucket nobody took
// is written. Fenced by the emptied list, it stayed queued and went out again (review).
TEST_F(DispatcherTest, BucketLeasesSettleWhatWasDeliveredWhileHeartbeatsFail) {
  const auto id = db_.Enqueue("orders", std::nullopt);
  auto cfg = BucketLeaseConfig();
  cfg.partition_lease = 300ms;
  std::atomic<bool> hold{true};
  Start(cfg, [&](const Message& m) -> std::optional<Outcome> {
    if (hold) return std::nullopt;
    return DeliverAll(m);
  });
  ASSERT_TRUE(WaitFor([&] { return sink_->Held() == 1u; }));
  db_.FailNext("coordinate", 1'000'000);
  const auto failures = db_.Calls("coordinate");
  clock_.Advance(1s);  // past the partition lease since the last heartbeat that succeeded
  ASSERT_TRUE(WaitFor([&] { return db_.Calls("coordinate") >= failures + 3; }));
  hold = false;
  sink_->Release();
  ASSERT_TRUE(WaitFor([&] { return !db_.Delivered().empty(); }))
      << "the delivery was fenced; the message stays queued";
  EXPECT_EQ(db_.Delivered(), std::vector<std::int64_t>{id});
  EXPECT_EQ(dispatcher_->stats().fenced, 0);
  db_.Heal("coordinate");
}

}  // namespace
}  // namespace outbox::relay
