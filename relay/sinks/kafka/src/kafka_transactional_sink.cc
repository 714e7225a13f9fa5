// The exactly-once Kafka sink (`delivery: exactly_once`, docs/adr/0002-exactly-once-kafka.md):
// the messages of each claimed batch are produced in Kafka transactions, one transactional
// producer per bucket (transactional.id "<prefix>.<destination>.<bucket>"), and complete as
// delivered only once their transaction committed.
//
// Why a transaction per bucket, and what makes it exactly once:
//  - Fencing. In claim_mode partitioned a bucket has one owner. A relay that takes a bucket
//    over creates the bucket's producer, and init_transactions fences the previous owner's:
//    its open transaction is aborted and it can add nothing more, so a relay that stalled
//    (SIGSTOP, a long pause) and wakes up cannot commit what the new owner is sending too.
//  - Recovery. A message that may have been produced before is one claimed again with an
//    attempt counted (the reaper counts one when a lease runs out; a failed transaction counts
//    one, even at shutdown: Outcome::maybe_sent). Before producing such messages, and after
//    the fence, the sink reads their topics (read_committed, from their creation time to the
//    high watermark) and completes those it finds as delivered without producing them again:
//    their earlier transaction committed, and only the settle was lost (a SIGKILL between
//    commit and settle, a Postgres restart).
//  Everything else is produced at most once per transaction; what a transaction that did not
//  commit held is invisible to read_committed consumers.
//
// Threads: Submit queues; one thread ("or-kafka-txn") gathers what is submitted (until 5 ms
// pass without a submission, at most 20 ms: a transaction's cost is mostly per transaction),
// groups it by bucket, and runs one cycle: create the buckets' producers (init_transactions
// fences), recover, begin and produce every bucket's transaction, then commit them. Completions run
// on that thread.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "kafka_records.h"
#include "outbox_relay/kafka_sink.h"
#include "outbox_relay/thread_name.h"
#include "topic_route.h"

namespace outbox::relay {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr milliseconds kLinger{20};          // the longest a cycle gathers submissions
constexpr milliseconds kLingerQuiet{5};      // ... and how long nothing may arrive meanwhile
constexpr milliseconds kIdleClose{60'000};  // a bucket producer unused this long is closed
// A topic whose writes the broker refused (alone in a transaction) fails its messages on their
// own this long, then is tried alone again.
constexpr milliseconds kWriteRefusalFor{60'000};
// The longest a transactional call waits before the worker looks at a stop's deadline again
// (init, commit and abort may be called again after they timed out, and resume). Not shorter:
// librdkafka's header recommends a commit be given the whole remaining transaction time (-1)
// and warns that other timeouts risk desynchronising its state when a request fails; most
// commits end well within a slice, so only a slow one is cut and resumed.
constexpr milliseconds kStopCheck{1000};
// Records are looked for from this long before the message was written (or last known
// absent): the record's timestamp is the clock of the relay that produced it, created_at the
// database's, absent_as_of another relay's.
constexpr std::chrono::minutes kClockSlack{5};

// Where a recovery of `msg` reads from (before kClockSlack): since it was last known not to
// be in Kafka (an attempt that checked and then aborted or produced nothing, migration 0012),
// else since it was written.
std::chrono::system_clock::time_point RecoverFrom(const Message& msg) {
  return msg.absent_as_of ? std::max(*msg.absent_as_of, msg.created_at) : msg.created_at;
}

struct Item {
  Message msg;
  std::string topic;
  Sink::Completion done;
  // Filled during the cycle.
  rd_kafka_resp_err_t report = RD_KAFKA_RESP_ERR_NO_ERROR;  // its delivery report
  bool reported = false;
  // Known not to be in Kafka when this attempt began to produce: no earlier attempt, or
  // recovery looked (after the fence) and did not find it. An attempt that then produces
  // nothing, or aborts, reports the time as Outcome::absent_as_of.
  bool absent = false;
};

// The retry (or hand-back) of an item this attempt did not put in Kafka.
Outcome NotProduced(const Item& item, Outcome out) {
  if (item.absent && (out.kind == OutcomeKind::kRetry || out.kind == OutcomeKind::kReturned)) {
    out.absent_as_of = std::chrono::system_clock::now();
  }
  return out;
}

struct BucketProducer {
  rd_kafka_t* rk = nullptr;
  std::string transactional_id;
  Clock::time_point last_used{};
  std::atomic<bool> fatal{false};
  // Delivery reports point into the cycle's items; served only while the cycle runs.
  bool in_cycle = false;
  ~BucketProducer() {
    if (rk != nullptr) rd_kafka_destroy(rk);
  }
};

Outcome Make(MessageId id, OutcomeKind kind, std::string reason = {},
             Reason reason_class = Reason::kNone, bool maybe_sent = false) {
  Outcome out;
  out.id = id;
  out.kind = kind;
  out.reason = std::move(reason);
  out.reason_class = reason_class;
  out.maybe_sent = maybe_sent;
  return out;
}

std::string ErrorText(rd_kafka_error_t* error) {
  return std::string(rd_kafka_error_name(error)) + ": " + rd_kafka_error_string(error);
}

class TransactionalKafkaSink final : public Sink {
 public:
  TransactionalKafkaSink(std::string destination, const KafkaTarget& target)
      : destination_(std::move(destination)), target_(target), route_(destination_, target_) {
    ValidateKafkaTarget(destination_, target_);  // throws when invalid
    char errstr[512];
    kafka_detail::ConfPtr conf = kafka_detail::ProducerConf(destination_, target_, nullptr);
    rd_kafka_conf_set_log_cb(conf.get(), &LogCb);
    probe_ = rd_kafka_new(RD_KAFKA_PRODUCER, conf.get(), errstr, sizeof errstr);
    if (probe_ == nullptr) {
      throw std::invalid_argument("kafka destination \"" + destination_ +
                                  "\": cannot create the producer: " + errstr);
    }
    conf.release();
    worker_ = std::thread([this] {
      NameThisThread("or-kafka-txn");
      Run();
    });
  }

  ~TransactionalKafkaSink() override {
    Shutdown(KafkaSink::kDestructorShutdownDeadline);
    if (probe_ != nullptr) rd_kafka_destroy(probe_);
  }

  void Submit(Message msg, Completion done) override {
    in_flight_.fetch_add(1);
    const auto routed = route_.TopicFor(msg);
    if (!routed.error.empty()) {  // a dead letter with the reason, never a produce error loop
      Finish(done, Make(msg.id, OutcomeKind::kPermanent, routed.error, Reason::kInvalidTopic));
      return;
    }
    {
      std::lock_guard lk(mu_);
      if (accepting_) {
        queue_.push_back(Item{std::move(msg), routed.topic, std::move(done)});
        cv_.notify_one();
        return;
      }
    }
    Finish(done, kafka_detail::ShutdownOutcome(msg.id));
  }

  void Shutdown(milliseconds deadline) override {
    std::lock_guard guard(shutdown_mu_);
    if (shut_down_) return;
    const auto start = Clock::now();
    {
      std::lock_guard lk(mu_);
      accepting_ = false;
      // The cycle running now ends its transactions (bounded by the attempt timeout); what is
      // still queued was never sent.
      stop_ = true;
      stop_by_ = start + deadline;
    }
    cv_.notify_all();
    if (worker_.joinable()) worker_.join();
    std::deque<Item> left;
    {
      std::lock_guard lk(mu_);
      left.swap(queue_);
    }
    for (auto& item : left) Finish(item.done, kafka_detail::ShutdownOutcome(item.msg.id));
    producers_.clear();
    ready_.store(false);
    shut_down_ = true;
    spdlog::info("kafka destination \"{}\": exactly-once sink shut down in {} ms", destination_,
                 std::chrono::duration_cast<milliseconds>(Clock::now() - start).count());
  }

  bool Ready() const override { return ready_.load(); }
  std::string WhyNotReady() const override {
    if (Ready()) return "";
    return "no Kafka broker reachable (bootstrap.servers " + target_.brokers + ")";
  }
  std::size_t InFlight() const override { return in_flight_.load(); }
  std::string_view Kind() const override { return "kafka"; }
  bool FencesOthersWhenItStarts() const override { return true; }  // init_transactions
  std::optional<TargetHealth> Health() const override {
    TargetHealth h;
    h.kind = "kafka";
    h.delivery = "exactly_once";
    h.transactional_id_prefix = target_.transactional_id_prefix;
    h.transactions_committed = committed_.load();
    h.transactions_failed = failed_.load();
    h.recovered = recovered_.load();
    return h;
  }
  /// Room for the claims that arrive while a cycle commits: the next cycle takes them all, and
  /// a transaction's cost is mostly per transaction, not per message.
  std::size_t MaxInFlight(int claim_batch) const override {
    return static_cast<std::size_t>(claim_batch) * 8;
  }
  std::map<std::string, std::int64_t> EventCounts() const override {
    return {{"transactions_committed", committed_.load()},
            {"transactions_failed", failed_.load()},
            {"recovered", recovered_.load()},
            {"producers_created", created_.load()},
            {"recovery_partitions_read", partitions_read_.load()}};
  }

 private:
  void Finish(Completion& done, Outcome out) {
    kafka_detail::RunCompletion(destination_, done, std::move(out));
    in_flight_.fetch_sub(1);
  }

  // --- the worker --------------------------------------------------------------------

  void Run() {
    auto next_probe = Clock::now();
    while (true) {
      std::vector<Item> batch;
      {
        std::unique_lock lk(mu_);
        cv_.wait_for(lk, kafka_detail::kProbeInterval, [&] { return stop_ || !queue_.empty(); });
        if (stop_) return;
        if (!queue_.empty()) {
          // Take what keeps arriving together (a claim's messages, the next claim's): a
          // transaction costs mostly per transaction. Stop gathering once nothing arrived for
          // kLingerQuiet, or after kLinger, so a lone message waits only kLingerQuiet.
          const auto until = Clock::now() + kLinger;
          std::size_t seen = 0;
          while (!stop_ && queue_.size() != seen && Clock::now() < until) {
            seen = queue_.size();
            cv_.wait_for(lk, kLingerQuiet, [&] { return stop_; });
          }
          if (stop_) return;  // never sent: Shutdown hands them back
          while (!queue_.empty()) {
            batch.push_back(std::move(queue_.front()));
            queue_.pop_front();
          }
        }
      }
      if (!batch.empty()) Cycle(batch);
      CloseIdle();
      if (!ready_.load() && Clock::now() >= next_probe) {
        Probe();
        next_probe = Clock::now() + kafka_detail::kProbeInterval;
      }
    }
  }

  void Probe() {
    const rd_kafka_metadata_t* md = nullptr;
    if (rd_kafka_metadata(probe_, 0, nullptr, &md,
                          static_cast<int>(kafka_detail::kProbeTimeout.count())) ==
        RD_KAFKA_RESP_ERR_NO_ERROR) {
      if (md->broker_cnt > 0) ready_.store(true);
      rd_kafka_metadata_destroy(md);
    }
  }

  // One cycle over everything queued: producers (fencing), recovery, transactions.
  void Cycle(std::vector<Item>& batch) {
    std::map<int, std::vector<Item*>> by_bucket;
    for (auto& item : batch) by_bucket[item.msg.bucket].push_back(&item);

    // 1. Every bucket's producer, so that each previous owner is fenced before anything is
    //    read back or produced.
    EnsureProducers(by_bucket);
    if (HandBackOnStop(by_bucket)) return;
    // 2. Recovery: what an earlier attempt may have produced is looked for in its topic.
    Recover(by_bucket);
    if (HandBackOnStop(by_bucket)) return;
    // 3a. A claim that ran out meanwhile may be another relay's now, which may have sent it;
    //     our producer, made just now, may even have fenced that relay. Not ours to send.
    DropExpiredClaims(by_bucket);
    // 3b. A record for a topic the broker refuses (authorization, invalid name) would fail its
    //     whole bucket's transaction: such messages fail on their own, before it begins.
    DropUnusableTopics(by_bucket);
    // 3c. A topic suspected of refusing writes goes alone in its bucket's transaction.
    IsolateSuspects(by_bucket);
    if (HandBackOnStop(by_bucket)) return;
    // 3. Begin and produce every bucket's transaction, then 4. commit them: their records
    //    travel together, each commit waits only for its own.
    std::vector<std::pair<int, std::vector<Item*>>> open;
    for (auto& [bucket, items] : by_bucket) {
      if (items.empty()) continue;
      if (BeginAndProduce(bucket, items)) open.emplace_back(bucket, std::move(items));
    }
    for (auto& [bucket, items] : open) Commit(bucket, items);
  }

  Clock::time_point StopBy() {
    std::lock_guard lk(mu_);
    return stop_by_;
  }
  bool Stopping() {
    std::lock_guard lk(mu_);
    return stop_;
  }

  // Once a stop began, what this cycle has not produced goes back unsent (true) rather than
  // begin transactions the stop's deadline would cut off.
  bool HandBackOnStop(std::map<int, std::vector<Item*>>& by_bucket) {
    if (!Stopping()) return false;
    std::size_t n = 0;
    for (auto& [bucket, items] : by_bucket) {
      for (Item* item : items) {
        ++n;
        Finish(item->done, NotProduced(*item, kafka_detail::ShutdownOutcome(item->msg.id)));
      }
      items.clear();
    }
    if (n > 0) {
      spdlog::info("kafka destination \"{}\": stopping: {} message(s) handed back unsent",
                   destination_, n);
    }
    return true;
  }

  // Runs `call` (init_transactions, commit_transaction or abort_transaction: each may be called
  // again after it timed out, and resumes) in slices of kStopCheck until it succeeds, fails
  // for another reason, or `until` or the stop's deadline passes; returns its last error.
  rd_kafka_error_t* WithinDeadline(Clock::time_point until,
                                   const std::function<rd_kafka_error_t*(int)>& call) {
    while (true) {
      const auto end = std::min(until, StopBy());
      const auto left = std::chrono::duration_cast<milliseconds>(end - Clock::now());
      const auto slice = std::clamp(left, milliseconds(1), kStopCheck);
      rd_kafka_error_t* error = call(static_cast<int>(slice.count()));
      if (error == nullptr || !rd_kafka_error_is_retriable(error) ||
          Clock::now() >= std::min(until, StopBy())) {
        return error;
      }
      rd_kafka_error_destroy(error);
    }
  }

  // The bucket's producer when it has a usable one (null otherwise: it needs a new one).
  BucketProducer* Existing(int bucket) {
    auto it = producers_.find(bucket);
    if (it == producers_.end()) return nullptr;
    if (it->second->fatal.load()) {  // fenced or broken: a new one fences back
      producers_.erase(it);
      return nullptr;
    }
    it->second->last_used = Clock::now();
    return it->second.get();
  }

  // Creates the bucket's transactional producer and runs init_transactions (the fence): null
  // with `why` when that failed. Touches nothing shared but the stop's deadline, so several
  // run at once.
  std::unique_ptr<BucketProducer> Create(int bucket, std::string* why) {
    auto p = std::make_unique<BucketProducer>();
    p->transactional_id =
        target_.transactional_id_prefix + "." + destination_ + "." + std::to_string(bucket);
    kafka_detail::ConfPtr conf =
        kafka_detail::ProducerConf(destination_, target_, &p->transactional_id);
    rd_kafka_conf_set_opaque(conf.get(), p.get());
    rd_kafka_conf_set_dr_msg_cb(conf.get(), &DeliveryReportCb);
    rd_kafka_conf_set_error_cb(conf.get(), &ErrorCb);
    rd_kafka_conf_set_log_cb(conf.get(), &LogCb);
    char errstr[512];
    p->rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf.get(), errstr, sizeof errstr);
    if (p->rk == nullptr) {
      *why = std::string("cannot create the transactional producer: ") + errstr;
      return nullptr;
    }
    conf.release();
    spdlog::debug(
        "kafka destination \"{}\": starting transactional producer {} (init_transactions: "
        "finds its transaction coordinator and fences the bucket's earlier producer)",
        destination_, p->transactional_id);
    if (rd_kafka_error_t* error =
            WithinDeadline(Clock::now() + target_.attempt_timeout,
                           [&](int ms) { return rd_kafka_init_transactions(p->rk, ms); })) {
      *why = "init_transactions of " + p->transactional_id + " failed: " + ErrorText(error);
      rd_kafka_error_destroy(error);
      spdlog::warn("kafka destination \"{}\": {}", destination_, *why);
      return nullptr;
    }
    spdlog::info(
        "kafka destination \"{}\": transactional producer {} ready (any earlier producer of "
        "bucket {} is fenced)",
        destination_, p->transactional_id, bucket);
    p->last_used = Clock::now();
    return p;
  }

  // Every bucket of `by_bucket` gets a usable producer; the buckets that cannot are removed,
  // their items completed as retries (nothing was sent). New producers are created side by
  // side: init_transactions waits for the transaction coordinator (a second or so at first).
  void EnsureProducers(std::map<int, std::vector<Item*>>& by_bucket) {
    struct Pending {
      int bucket;
      std::string why;
      std::future<std::unique_ptr<BucketProducer>> made;
    };
    std::vector<Pending> pending;
    for (auto& [bucket, items] : by_bucket) {
      if (Existing(bucket) == nullptr) pending.push_back(Pending{bucket, {}, {}});
    }
    for (auto& p : pending) {
      p.made = std::async(std::launch::async, [this, &p] { return Create(p.bucket, &p.why); });
    }
    for (auto& p : pending) {
      std::unique_ptr<BucketProducer> made = p.made.get();
      if (made) {
        ++created_;
        producers_[p.bucket] = std::move(made);
        ready_.store(true);
        continue;
      }
      const bool stopping = Stopping();  // cut short by the stop: not the broker's failure
      if (!stopping) ready_.store(false);
      for (Item* item : by_bucket.at(p.bucket)) {
        Finish(item->done, stopping
                               ? kafka_detail::ShutdownOutcome(item->msg.id)
                               : Make(item->msg.id, OutcomeKind::kRetry, p.why, Reason::kBroker));
      }
      by_bucket.erase(p.bucket);
    }
  }

  // Why the broker refuses records for `topic` for good (nullopt: it takes them, or cannot be
  // asked now: the transaction will tell). Asked once per topic until it answered for 60 s;
  // a refusal is asked again after 5 s. An unknown topic is not refused: a broker may create
  // it on the first record.
  std::optional<rd_kafka_resp_err_t> TopicRefusal(const std::string& topic) {
    const auto now = Clock::now();
    if (const auto it = topic_checked_.find(topic);
        it != topic_checked_.end() && now < it->second.until) {
      return it->second.refusal;
    }
    rd_kafka_topic_t* t = rd_kafka_topic_new(probe_, topic.c_str(), nullptr);
    const rd_kafka_metadata_t* md = nullptr;
    const rd_kafka_resp_err_t e =
        rd_kafka_metadata(probe_, 0, t, &md, static_cast<int>(kafka_detail::kProbeTimeout.count()));
    std::optional<rd_kafka_resp_err_t> refusal;
    bool answered = false;
    bool unknown = false;
    if (e == RD_KAFKA_RESP_ERR_NO_ERROR && md->topic_cnt == 1) {
      answered = true;
      switch (md->topics[0].err) {
        case RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED:
        case RD_KAFKA_RESP_ERR_TOPIC_EXCEPTION:  // invalid topic name
          refusal = md->topics[0].err;
          break;
        case RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART:
          unknown = true;
          // Still unknown after one of its records failed a transaction: the broker does not
          // create it. Until it exists, its messages are retried without being produced.
          if (stalled_topics_.count(topic)) refusal = md->topics[0].err;
          break;
        default:
          stalled_topics_.erase(topic);
          break;
      }
    }
    if (md != nullptr) rd_kafka_metadata_destroy(md);
    rd_kafka_topic_destroy(t);
    if (answered) {
      topic_checked_[topic] = TopicCheck{
          refusal, now + (refusal || unknown ? milliseconds(5'000) : milliseconds(60'000))};
      if (topic_checked_.size() > 10'000) topic_checked_.clear();  // templates: bounded
      if (stalled_topics_.size() > 10'000) stalled_topics_.clear();
    }
    return refusal;
  }

  void DropUnusableTopics(std::map<int, std::vector<Item*>>& by_bucket) {
    std::map<std::string, std::optional<rd_kafka_resp_err_t>> refused;
    for (auto& [bucket, items] : by_bucket) {
      std::vector<Item*> keep;
      for (Item* item : items) {
        auto it = refused.find(item->topic);
        if (it == refused.end() && Stopping()) {  // asks no more: the cycle hands back after
          keep.push_back(item);
          continue;
        }
        if (it == refused.end()) it = refused.emplace(item->topic, TopicRefusal(item->topic)).first;
        if (!it->second) {
          keep.push_back(item);
          continue;
        }
        Outcome out = ClassifyDeliveryError(item->msg.id, *it->second, false);
        out.reason = "topic " + item->topic + ": " + rd_kafka_err2str(*it->second) +
                     (out.kind == OutcomeKind::kRetry
                          ? " (a record of it did not complete before; not produced until the "
                            "broker has the topic)"
                          : " (not produced; the other messages of its transaction were)");
        Finish(item->done, NotProduced(*item, std::move(out)));
      }
      items.swap(keep);
    }
    for (const auto& [topic, why] : refused) {
      if (why) {
        spdlog::warn("kafka destination \"{}\": the broker refuses topic {}: {}", destination_,
                     topic, rd_kafka_err2str(*why));
      }
    }
  }

  // Messages for a topic refused alone (below) fail on their own while the refusal holds; then
  // the topic is a suspect again, tried alone (its permission may have been granted since).
  // In each bucket whose messages include suspects, the first suspect by name goes alone in
  // the transaction; the bucket's other messages go back unsent (no attempt counted), claimed
  // again for the next cycle.
  void IsolateSuspects(std::map<int, std::vector<Item*>>& by_bucket) {
    const auto now = Clock::now();
    for (auto it = write_refused_.begin(); it != write_refused_.end();) {
      if (now >= it->second) {
        write_suspects_.insert(it->first);
        it = write_refused_.erase(it);
      } else {
        ++it;
      }
    }
    if (write_refused_.empty() && write_suspects_.empty()) return;
    for (auto& [bucket, items] : by_bucket) {
      std::vector<Item*> keep;
      std::optional<std::string> alone;
      for (Item* item : items) {
        if (write_refused_.count(item->topic)) {
          Finish(item->done, NotProduced(*item, WriteRefused(*item)));
          continue;
        }
        if (write_suspects_.count(item->topic) && (!alone || item->topic < *alone)) {
          alone = item->topic;
        }
        keep.push_back(item);
      }
      if (alone) {
        std::vector<Item*> only;
        for (Item* item : keep) {
          if (item->topic == *alone) {
            only.push_back(item);
            continue;
          }
          Finish(item->done,
                 NotProduced(*item, Make(item->msg.id, OutcomeKind::kReturned,
                                         "held back: topic " + *alone +
                                             " goes alone in this transaction (a transaction "
                                             "with it was refused: TOPIC_AUTHORIZATION_FAILED)",
                                         Reason::kNone)));
        }
        keep.swap(only);
      }
      items.swap(keep);
    }
  }

  Outcome WriteRefused(const Item& item) const {
    Outcome out =
        ClassifyDeliveryError(item.msg.id, RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED, false);
    out.reason = "topic " + item.topic +
                 ": the broker refuses this relay's writes (TOPIC_AUTHORIZATION_FAILED when it "
                 "was added to a transaction of its own); grant WRITE on it, or route elsewhere";
    return out;
  }

  void DropExpiredClaims(std::map<int, std::vector<Item*>>& by_bucket) {
    const auto now = std::chrono::steady_clock::now();
    std::size_t dropped = 0;
    for (auto& [bucket, items] : by_bucket) {
      std::vector<Item*> keep;
      for (Item* item : items) {
        if (const auto runs_out = ClaimRunsOut(item->msg); runs_out && *runs_out <= now) {
          ++dropped;
          Finish(item->done,
                 Make(item->msg.id, OutcomeKind::kReturned,
                      "the claim ran out (lease_ms) before the bucket's producer was ready: not "
                      "sent, another relay may have taken the message over",
                      Reason::kNone));
        } else {
          keep.push_back(item);
        }
      }
      items.swap(keep);
    }
    if (dropped > 0) {
      spdlog::warn(
          "kafka destination \"{}\": {} message(s) not sent: their claim ran out before their "
          "bucket's producer was ready (this relay stalled, or the broker was slow)",
          destination_, dropped);
    }
  }

  void Recover(std::map<int, std::vector<Item*>>& by_bucket) {
    kafka_detail::LookedFor keys;
    kafka_detail::KeysByTopic topics;
    auto since = std::chrono::system_clock::time_point::max();
    for (auto& [bucket, items] : by_bucket) {
      for (Item* item : items) {
        if (item->msg.attempts == 0) {
          item->absent = true;  // nothing of it can be in Kafka
          continue;
        }
        keys.emplace(item->msg.idempotency_key, Raw(item->msg.id));
        const std::string* record_key = kafka_detail::RecordKey(item->msg, target_);
        topics[item->topic].push_back(record_key ? std::optional<std::string>(*record_key)
                                                 : std::nullopt);
        since = std::min(since, RecoverFrom(item->msg) - kClockSlack);
      }
    }
    if (keys.empty()) return;
    // Topic by topic: one that cannot be read (no permission, gone) fails its own messages,
    // not every message of the cycle. All within one attempt timeout (or by a stop's deadline
    // when the stop had begun; one that begins meanwhile waits for this read).
    const auto deadline = std::min(Clock::now() + target_.attempt_timeout, StopBy());
    std::set<std::string> found;
    std::map<std::string, std::string> failed;  // topic -> why
    std::size_t partitions = 0;
    for (const auto& [topic, record_keys] : topics) {
      try {
        const auto left = std::max(
            milliseconds(1), std::chrono::duration_cast<milliseconds>(deadline - Clock::now()));
        auto read = kafka_detail::FindRecorded(target_, {{topic, record_keys}}, since, keys, left);
        found.insert(read.found.begin(), read.found.end());
        partitions += read.partitions_read.size();
      } catch (const std::exception& e) {
        failed[topic] = e.what();
      }
    }
    partitions_read_ += static_cast<std::int64_t>(partitions);
    std::size_t recovered = 0, unchecked = 0;
    for (auto& [bucket, items] : by_bucket) {
      std::vector<Item*> keep;
      for (Item* item : items) {
        const auto why = failed.find(item->topic);
        if (item->msg.attempts == 0) {
          keep.push_back(item);
        } else if (why != failed.end() && Stopping()) {
          Finish(item->done, kafka_detail::ShutdownOutcome(item->msg.id));
        } else if (why != failed.end()) {
          ++unchecked;
          Finish(item->done,
                 Make(item->msg.id, OutcomeKind::kRetry,
                      "cannot check whether an earlier attempt reached Kafka: " + why->second,
                      Reason::kBroker));
        } else if (found.count(item->msg.idempotency_key)) {  // under its own id (LookedFor)
          ++recovered;
          ++recovered_;
          Finish(item->done, Make(item->msg.id, OutcomeKind::kDelivered));
        } else {
          item->absent = true;
          keep.push_back(item);
        }
      }
      items.swap(keep);
    }
    for (const auto& [topic, why] : failed) {
      spdlog::warn(
          "kafka destination \"{}\": exactly-once recovery could not read topic {}; its "
          "messages are retried later: {}",
          destination_, topic, why);
    }
    spdlog::info(
        "kafka destination \"{}\": exactly-once recovery: {} of {} message(s) claimed again "
        "were already in Kafka (committed, settle lost) and complete without producing them "
        "again ({} partition(s) read{})",
        destination_, recovered, keys.size(), partitions,
        unchecked > 0 ? ", " + std::to_string(unchecked) + " not checked" : std::string());
  }

  // Begins `bucket`'s transaction and produces its items. False when nothing is open (every
  // item completed).
  bool BeginAndProduce(int bucket, std::vector<Item*>& items) {
    BucketProducer* p = producers_.at(bucket).get();
    if (rd_kafka_error_t* error = rd_kafka_begin_transaction(p->rk)) {
      const std::string why = "begin_transaction failed: " + ErrorText(error);
      rd_kafka_error_destroy(error);
      p->fatal.store(true);  // replaced next time
      for (Item* item : items) {
        Finish(item->done,
               NotProduced(*item, Make(item->msg.id, OutcomeKind::kRetry, why, Reason::kFatal)));
      }
      return false;
    }
    std::vector<Item*> produced;
    p->in_cycle = true;
    for (Item* item : items) {
      rd_kafka_headers_t* headers = kafka_detail::BuildHeaders(item->msg, target_);
      rd_kafka_error_t* error =
          kafka_detail::ProduceRecord(p->rk, item->msg, target_, headers, item, item->topic);
      if (error == nullptr) {
        produced.push_back(item);
        continue;
      }
      rd_kafka_headers_destroy(headers);
      const rd_kafka_resp_err_t code = rd_kafka_error_code(error);
      const bool retriable = rd_kafka_error_is_retriable(error) != 0;
      rd_kafka_error_destroy(error);
      Finish(item->done, NotProduced(*item, ClassifyDeliveryError(item->msg.id, code, retriable)));
    }
    items.swap(produced);
    if (!items.empty()) return true;
    p->in_cycle = false;
    if (rd_kafka_error_t* error = Abort(*p)) {
      rd_kafka_error_destroy(error);
      p->fatal.store(true);
    }
    return false;
  }

  rd_kafka_error_t* Abort(BucketProducer& p) {
    return WithinDeadline(Clock::now() + target_.attempt_timeout,
                          [&](int ms) { return rd_kafka_abort_transaction(p.rk, ms); });
  }

  void Commit(int bucket, std::vector<Item*>& items) {
    BucketProducer* p = producers_.at(bucket).get();
    spdlog::debug("kafka destination \"{}\": committing the transaction of {} ({} message(s))",
                  destination_, p->transactional_id, items.size());
    // Up to the attempt timeout, or a stop's deadline (also one that comes meanwhile).
    rd_kafka_error_t* error = WithinDeadline(Clock::now() + target_.attempt_timeout, [&](int ms) {
      return rd_kafka_commit_transaction(p->rk, ms);
    });
    struct EndCycle {
      BucketProducer* p;
      ~EndCycle() { p->in_cycle = false; }
    } end_cycle{p};
    std::set<std::string> topics;
    for (const Item* item : items) topics.insert(item->topic);
    if (error == nullptr) {
      ++committed_;
      ready_.store(true);
      if (committed_topics_.size() > 10'000) committed_topics_.clear();  // templates: bounded
      for (const auto& topic : topics) {
        committed_topics_.insert(topic);
        write_suspects_.erase(topic);
      }
      for (Item* item : items) Finish(item->done, Make(item->msg.id, OutcomeKind::kDelivered));
      return;
    }
    ++failed_;
    const bool write_refused =
        rd_kafka_error_code(error) == RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED;
    if (!rd_kafka_error_is_fatal(error)) ready_.store(false);  // until a broker answers again
    std::string why =
        "transaction of " + p->transactional_id + " did not commit: " + ErrorText(error);
    Reason reason = Reason::kBroker;
    bool aborted = false;
    if (rd_kafka_error_txn_requires_abort(error)) {
      rd_kafka_error_destroy(error);
      if (rd_kafka_error_t* abort = Abort(*p)) {
        why += "; the abort failed too: " + ErrorText(abort);
        rd_kafka_error_destroy(abort);
      } else {
        why += " (aborted)";
        aborted = true;
      }
    } else {
      // Fenced (another relay now owns the bucket), or the end is unknown.
      if (rd_kafka_error_is_fatal(error)) reason = Reason::kFatal;
      rd_kafka_error_destroy(error);
    }
    // Whatever failed, the bucket's next transaction gets a new producer, whose
    // init_transactions fences this one and settles the end of its transaction. Kept after an
    // abort, a producer whose records a broker refused (PRODUCER_FENCED, which librdkafka 2.0
    // treats as abortable) failed every later transaction on sequence numbers.
    p->fatal.store(true);
    // Writes refused: a topic alone is refused (its messages dead-lettered, as an
    // authorization failure); of several, those that never committed are suspects, each tried
    // alone next (all of them, when each has committed before: a permission revoked since).
    if (write_refused && aborted && topics.size() == 1) {
      write_suspects_.erase(*topics.begin());
      write_refused_[*topics.begin()] = Clock::now() + kWriteRefusalFor;
      spdlog::warn(
          "kafka destination \"{}\": the broker refuses writes to topic {} "
          "(TOPIC_AUTHORIZATION_FAILED in a transaction of its own): its messages are "
          "dead-lettered; asked again in {} s",
          destination_, *topics.begin(), kWriteRefusalFor.count() / 1000);
      for (Item* item : items) Finish(item->done, NotProduced(*item, WriteRefused(*item)));
      return;
    }
    spdlog::warn("kafka destination \"{}\": {}; {} message(s) retried", destination_, why,
                 items.size());
    if (write_refused) {
      std::size_t added = 0;
      for (const auto& topic : topics) added += !committed_topics_.count(topic);
      for (const auto& topic : topics) {
        if (added == 0 || !committed_topics_.count(topic)) write_suspects_.insert(topic);
      }
      if (write_suspects_.size() > 10'000) write_suspects_.clear();  // templates: bounded
    }
    // A record that never completed, or whose topic the broker did not know, may be one for a
    // topic that does not exist: asked again before the next transaction (TopicRefusal).
    for (Item* item : items) {
      if (!item->reported || item->report == RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART ||
          item->report == RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC) {
        stalled_topics_.insert(item->topic);
        topic_checked_.erase(item->topic);
      }
    }
    for (Item* item : items) {
      if (item->reported && item->report != RD_KAFKA_RESP_ERR_NO_ERROR) {
        Outcome own = ClassifyDeliveryError(item->msg.id, item->report, false);
        if (own.kind == OutcomeKind::kPermanent) {  // this record can never be produced
          Finish(item->done, std::move(own));
          continue;
        }
      }
      // May be in Kafka (the commit's end is unknown; an aborted transaction's records are
      // still in the log): counted, so the next attempt checks the topic first. After an
      // abort, from now on: a read_committed reader sees nothing of this transaction.
      Outcome out = Make(item->msg.id, OutcomeKind::kRetry, why, reason, true);
      Finish(item->done, aborted ? NotProduced(*item, std::move(out)) : std::move(out));
    }
  }

  void CloseIdle() {
    const auto now = Clock::now();
    for (auto it = producers_.begin(); it != producers_.end();) {
      if (now - it->second->last_used > kIdleClose || it->second->fatal.load()) {
        it = producers_.erase(it);
      } else {
        ++it;
      }
    }
  }

  // --- librdkafka callbacks ----------------------------------------------------------

  static void DeliveryReportCb(rd_kafka_t*, const rd_kafka_message_t* m, void* opaque) {
    auto* item = static_cast<Item*>(m->_private);
    if (item == nullptr || !static_cast<BucketProducer*>(opaque)->in_cycle) return;
    item->reported = true;
    item->report = m->err;
  }

  static void ErrorCb(rd_kafka_t* rk, int err, const char* reason, void* opaque) {
    auto* p = static_cast<BucketProducer*>(opaque);
    if (err == RD_KAFKA_RESP_ERR__FATAL) {
      char text[512] = "";
      const rd_kafka_resp_err_t fatal = rd_kafka_fatal_error(rk, text, sizeof text);
      p->fatal.store(true);
      // Fenced: another relay created this bucket's producer (it owns the bucket now).
      spdlog::info("transactional producer {}: {} ({}); closed", p->transactional_id, text,
                   rd_kafka_err2name(fatal));
      return;
    }
    const bool connection = err == RD_KAFKA_RESP_ERR__TRANSPORT ||
                            err == RD_KAFKA_RESP_ERR__RESOLVE ||
                            err == RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN;
    spdlog::log(connection ? spdlog::level::debug : spdlog::level::warn,
                "transactional producer {}: {}: {}", p->transactional_id,
                rd_kafka_err2name(static_cast<rd_kafka_resp_err_t>(err)), reason);
  }

  static void LogCb(const rd_kafka_t*, int level, const char* fac, const char* buf) {
    spdlog::log(
        level <= 2 ? spdlog::level::err : (level <= 4 ? spdlog::level::warn : spdlog::level::debug),
        "kafka (exactly-once): librdkafka {}: {}", fac, buf);
  }

  const std::string destination_;
  const KafkaTarget target_;
  const kafka_detail::TopicRoute route_;
  rd_kafka_t* probe_ = nullptr;  // metadata only: Ready() before the first transaction
  struct TopicCheck {
    std::optional<rd_kafka_resp_err_t> refusal;
    Clock::time_point until;
  };
  std::map<std::string, TopicCheck> topic_checked_;  // worker thread only
  /// Topics with a record that did not complete in a failed transaction; worker thread only.
  std::set<std::string> stalled_topics_;
  /// Write permission (worker thread only). A broker that refuses it refuses the whole
  /// transaction (AddPartitionsToTxn: TOPIC_AUTHORIZATION_FAILED, no record says which topic):
  /// the topics of such a transaction that never committed are suspects, each tried alone
  /// (IsolateSuspects); one refused alone is refused for kWriteRefusalFor, then a suspect again.
  std::set<std::string> committed_topics_;
  std::set<std::string> write_suspects_;
  std::map<std::string, Clock::time_point> write_refused_;  // topic -> until

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  bool accepting_ = true;
  bool stop_ = false;
  // After Shutdown began: the running cycle's commits end by then.
  Clock::time_point stop_by_ = Clock::time_point::max();

  std::map<int, std::unique_ptr<BucketProducer>> producers_;  // the worker's
  std::atomic<std::size_t> in_flight_{0};
  // EventCounts().
  std::atomic<std::int64_t> committed_{0}, failed_{0}, recovered_{0}, created_{0},
      partitions_read_{0};
  std::atomic<bool> ready_{false};
  std::thread worker_;
  std::mutex shutdown_mu_;
  bool shut_down_ = false;
};

}  // namespace

SinkPtr MakeTransactionalKafkaSink(std::string destination, const KafkaTarget& target) {
  return std::make_unique<TransactionalKafkaSink>(std::move(destination), target);
}

}  // namespace outbox::relay
