#include "outbox_relay/kafka_sink.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <map>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <stdexcept>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kafka_records.h"
#include "outbox_relay/cloudevents.h"
#include "outbox_relay/thread_name.h"
#include "topic_route.h"

namespace outbox::relay {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr milliseconds kPollTimeout{50};     // rd_kafka_poll on the poll thread
constexpr milliseconds kQueueFullWait{200};  // Submit's bound when the local queue is full
constexpr milliseconds kQueueFullBackoff{2};
constexpr milliseconds kRetireDrain{2'000};      // reports of a broken producer after purge
constexpr milliseconds kRecreateBackoff{1'000};  // when creating a replacement failed
constexpr milliseconds kShutdownReserve{250};    // part of the deadline kept for the purge

bool IsPurge(rd_kafka_resp_err_t err) {
  return err == RD_KAFKA_RESP_ERR__PURGE_QUEUE || err == RD_KAFKA_RESP_ERR__PURGE_INFLIGHT;
}

using kafka_detail::ConfDeleter;
using kafka_detail::ProducerConf;
using kafka_detail::ShutdownOutcome;

}  // namespace

// One librdkafka producer handle. Replaced as a whole after a fatal error.
struct Producer {
  KafkaSink::Impl* impl = nullptr;
  rd_kafka_t* rk = nullptr;
  std::atomic<bool> fatal{false};
  std::size_t outstanding = 0;  // pending entries submitted to this handle; Impl::pending_mu
};

struct KafkaSink::Impl {
  struct Pending {
    MessageId id{};
    Completion done;
    Producer* producer = nullptr;
  };

  Impl(std::string dest, const KafkaTarget& tgt)
      : destination(std::move(dest)), target(tgt), route(destination, target) {}

  const std::string destination;
  const KafkaTarget target;
  const kafka_detail::TopicRoute route;  ///< The topic of each message.

  // Submit holds it shared while it uses `producer`; replacing `producer` takes it exclusively.
  // Only the poll thread (or Shutdown, after the poll thread ended) replaces `producer`.
  mutable std::shared_mutex producer_mu;
  std::unique_ptr<Producer> producer;

  std::mutex pending_mu;
  std::unordered_map<std::uint64_t, Pending> pending;  // by the per-message opaque (a token)
  std::uint64_t next_token = 1;

  std::atomic<std::size_t> in_flight{0};
  std::atomic<bool> accepting{true};
  std::atomic<bool> stopping{false};  // Shutdown began: purged messages report "shutdown"
  std::atomic<bool> ready{false};
  std::atomic<bool> stop_poll{false};
  std::thread poller;

  std::mutex shutdown_mu;
  bool shut_down = false;

  // --- producer lifecycle ------------------------------------------------------------

  std::unique_ptr<Producer> CreateProducer() {
    std::unique_ptr<rd_kafka_conf_t, ConfDeleter> conf = ProducerConf(destination, target, nullptr);
    char errstr[512];
    auto p = std::make_unique<Producer>();
    p->impl = this;
    rd_kafka_conf_set_opaque(conf.get(), p.get());
    rd_kafka_conf_set_dr_msg_cb(conf.get(), &Impl::DeliveryReportCb);
    rd_kafka_conf_set_error_cb(conf.get(), &Impl::ErrorCb);
    rd_kafka_conf_set_log_cb(conf.get(), &Impl::LogCb);

    p->rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf.get(), errstr, sizeof errstr);
    if (p->rk == nullptr) {
      throw std::invalid_argument("kafka destination \"" + destination +
                                  "\": cannot create the producer: " + errstr);
    }
    conf.release();  // owned by rk now
    return p;
  }

  void Start() {
    producer = CreateProducer();
    poller = std::thread([this] {
      NameThisThread("or-kafka-poll");
      PollLoop();
    });
  }

  // --- completions ---------------------------------------------------------------------

  void Finish(Completion& done, Outcome out) {
    kafka_detail::RunCompletion(destination, done, std::move(out));
    in_flight.fetch_sub(1);
  }

  std::uint64_t Register(MessageId id, Completion done, Producer* p) {
    std::lock_guard lock(pending_mu);
    const std::uint64_t token = next_token++;
    pending.emplace(token, Pending{id, std::move(done), p});
    ++p->outstanding;
    return token;
  }

  std::optional<Pending> Take(std::uint64_t token) {
    std::lock_guard lock(pending_mu);
    auto it = pending.find(token);
    if (it == pending.end()) return std::nullopt;
    Pending taken = std::move(it->second);
    pending.erase(it);
    --taken.producer->outstanding;
    return taken;
  }

  std::size_t Outstanding(const Producer* p) {
    std::lock_guard lock(pending_mu);
    return p->outstanding;
  }

  // Completes every message still registered to `p` (librdkafka did not report it in time).
  void FailAll(Producer* p, const std::function<Outcome(MessageId)>& outcome) {
    std::vector<Pending> left;
    {
      std::lock_guard lock(pending_mu);
      for (auto it = pending.begin(); it != pending.end();) {
        if (it->second.producer == p) {
          left.push_back(std::move(it->second));
          it = pending.erase(it);
        } else {
          ++it;
        }
      }
      p->outstanding = 0;
    }
    for (auto& entry : left) Finish(entry.done, outcome(entry.id));
  }

  Outcome FatalOutcome(Producer* p, MessageId id) const {
    char text[512] = "";
    const rd_kafka_resp_err_t fatal = rd_kafka_fatal_error(p->rk, text, sizeof text);
    Outcome out;
    out.id = id;
    out.kind = OutcomeKind::kRetry;
    out.reason = std::string("fatal producer error (") + rd_kafka_err2name(fatal) + "): " + text;
    out.reason_class = Reason::kFatal;
    return out;
  }

  // --- Submit --------------------------------------------------------------------------

  void Submit(Message msg, Completion done) {
    in_flight.fetch_add(1);
    if (!accepting.load()) {
      Finish(done, ShutdownOutcome(msg.id));
      return;
    }
    const auto routed = route.TopicFor(msg);
    if (!routed.error.empty()) {  // a dead letter with the reason, never a produce error loop
      Outcome out;
      out.id = msg.id;
      out.kind = OutcomeKind::kPermanent;
      out.reason = routed.error;
      out.reason_class = Reason::kInvalidTopic;
      Finish(done, std::move(out));
      return;
    }
    rd_kafka_headers_t* headers = kafka_detail::BuildHeaders(msg, target);
    const auto give_up = Clock::now() + kQueueFullWait;
    while (true) {
      std::optional<Outcome> failed;
      {
        std::shared_lock lock(producer_mu);
        if (!accepting.load()) {
          failed = ShutdownOutcome(msg.id);
        } else {
          Producer* p = producer.get();
          const std::uint64_t token = Register(msg.id, std::move(done), p);
          rd_kafka_error_t* error = kafka_detail::ProduceRecord(
              p->rk, msg, target, headers,
              reinterpret_cast<void*>(static_cast<std::uintptr_t>(token)), routed.topic);
          if (error == nullptr) return;  // headers belong to librdkafka now
          const rd_kafka_resp_err_t code = rd_kafka_error_code(error);
          const bool retriable = rd_kafka_error_is_retriable(error) != 0;
          rd_kafka_error_destroy(error);
          done = std::move(Take(token)->done);
          if (code == RD_KAFKA_RESP_ERR__QUEUE_FULL && Clock::now() < give_up) {
            // The poll thread drains delivery reports meanwhile; try again shortly.
          } else if (code == RD_KAFKA_RESP_ERR__FATAL) {
            p->fatal.store(true);  // the poll thread replaces the producer
            failed = FatalOutcome(p, msg.id);
          } else {
            failed = ClassifyDeliveryError(msg.id, code, retriable);
          }
        }
      }
      if (failed) {
        rd_kafka_headers_destroy(headers);
        Finish(done, std::move(*failed));
        return;
      }
      std::this_thread::sleep_for(kQueueFullBackoff);
    }
  }

  // --- librdkafka callbacks (run on the thread calling rd_kafka_poll/flush) -------------

  static void DeliveryReportCb(rd_kafka_t*, const rd_kafka_message_t* m, void* opaque) {
    auto* p = static_cast<Producer*>(opaque);
    p->impl->OnDelivery(p, m);
  }

  void OnDelivery(Producer* p, const rd_kafka_message_t* m) {
    const auto token = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(m->_private));
    std::optional<Pending> entry = Take(token);
    if (!entry) return;  // already completed (e.g. given up on after a purge)
    Outcome out;
    if (m->err == RD_KAFKA_RESP_ERR_NO_ERROR) {
      out.id = entry->id;
      out.kind = OutcomeKind::kDelivered;
      if (p == producer.get() && !p->fatal.load()) ready.store(true);
    } else if (IsPurge(m->err) && stopping.load()) {
      out = ShutdownOutcome(entry->id);
    } else if (IsFatal(p)) {
      out = FatalOutcome(p, entry->id);
    } else {
      out = ClassifyDeliveryError(entry->id, m->err, false);
      // Could not reach the partition leader in message.timeout.ms: not ready until the
      // metadata probe (or a delivery) shows a broker answers again.
      if ((out.reason_class == Reason::kTimeout || out.reason_class == Reason::kBroker) &&
          p == producer.get()) {
        ready.store(false);
      }
    }
    Finish(entry->done, std::move(out));
  }

  // The fatal flag may be set by librdkafka before its error callback was served.
  static bool IsFatal(Producer* p) {
    if (p->fatal.load()) return true;
    char text[8];
    if (rd_kafka_fatal_error(p->rk, text, sizeof text) == RD_KAFKA_RESP_ERR_NO_ERROR) return false;
    p->fatal.store(true);
    return true;
  }

  static void ErrorCb(rd_kafka_t* rk, int err, const char* reason, void* opaque) {
    auto* p = static_cast<Producer*>(opaque);
    p->impl->OnError(p, rk, static_cast<rd_kafka_resp_err_t>(err), reason);
  }

  void OnError(Producer* p, rd_kafka_t* rk, rd_kafka_resp_err_t err, const char* reason) {
    const bool current = p == producer.get();
    if (err == RD_KAFKA_RESP_ERR__FATAL) {
      char text[512] = "";
      const rd_kafka_resp_err_t fatal = rd_kafka_fatal_error(rk, text, sizeof text);
      spdlog::error(
          "kafka destination \"{}\": fatal producer error {}: {}; failing its in-flight "
          "messages with retry and recreating the producer",
          destination, rd_kafka_err2name(fatal), text);
      p->fatal.store(true);
      if (current) ready.store(false);
      return;
    }
    if (err == RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN) {
      if (current) ready.store(false);
      spdlog::warn("kafka destination \"{}\": all brokers are down: {}", destination, reason);
      return;
    }
    // Connection trouble is also in librdkafka's own log (LogCb); keep it out of warn here.
    const bool connection =
        err == RD_KAFKA_RESP_ERR__TRANSPORT || err == RD_KAFKA_RESP_ERR__RESOLVE;
    spdlog::log(connection ? spdlog::level::debug : spdlog::level::warn,
                "kafka destination \"{}\": {}: {}", destination, rd_kafka_err2name(err), reason);
  }

  static void LogCb(const rd_kafka_t* rk, int level, const char* fac, const char* buf) {
    auto* p = static_cast<Producer*>(rd_kafka_opaque(rk));
    const std::string& dest = p != nullptr ? p->impl->destination : std::string();
    // librdkafka logs connection failures at LOG_ERR (3); they are transient, so warn.
    spdlog::level::level_enum lvl = spdlog::level::debug;
    if (level <= 2) {
      lvl = spdlog::level::err;
    } else if (level <= 4) {
      lvl = spdlog::level::warn;
    } else if (level <= 6) {
      lvl = spdlog::level::info;
    }
    spdlog::log(lvl, "kafka destination \"{}\": librdkafka {}: {}", dest, fac, buf);
  }

  // --- the poll thread -----------------------------------------------------------------

  void PollLoop() {
    auto next_probe = Clock::now();
    auto next_recreate = Clock::now();
    while (!stop_poll.load()) {
      Producer* p = producer.get();
      rd_kafka_poll(p->rk, static_cast<int>(kPollTimeout.count()));
      if (p->fatal.load()) {
        if (Clock::now() >= next_recreate && !Recreate()) {
          next_recreate = Clock::now() + kRecreateBackoff;
        }
        continue;
      }
      if (!ready.load() && Clock::now() >= next_probe) {
        Probe(p);
        next_probe = Clock::now() + kafka_detail::kProbeInterval;
      }
    }
  }

  // A broker answered a metadata request: the sink can deliver.
  void Probe(Producer* p) {
    const rd_kafka_metadata_t* md = nullptr;
    const rd_kafka_resp_err_t err = rd_kafka_metadata(
        p->rk, 0, nullptr, &md, static_cast<int>(kafka_detail::kProbeTimeout.count()));
    if (err == RD_KAFKA_RESP_ERR_NO_ERROR) {
      if (md->broker_cnt > 0 && !p->fatal.load()) ready.store(true);
      rd_kafka_metadata_destroy(md);
    }
  }

  // Replaces a producer that raised a fatal error. Returns false when the new one could not
  // be created (it is tried again later; the broken one keeps failing Submits with kRetry).
  bool Recreate() {
    std::unique_ptr<Producer> fresh;
    try {
      fresh = CreateProducer();
    } catch (const std::exception& e) {
      spdlog::error("kafka destination \"{}\": cannot recreate the producer: {}", destination,
                    e.what());
      return false;
    }
    std::unique_ptr<Producer> retired;
    {
      std::unique_lock lock(producer_mu);
      retired = std::move(producer);
      producer = std::move(fresh);
    }
    ready.store(false);
    Producer* broken = retired.get();
    Retire(std::move(retired), Clock::now() + kRetireDrain,
           [this, broken](MessageId id) { return FatalOutcome(broken, id); });
    spdlog::info("kafka destination \"{}\": producer recreated", destination);
    return true;
  }

  // Purges what `p` still holds, serves the resulting reports until all its messages
  // completed or `until` passed, completes the rest with `outcome`, and destroys it.
  void Retire(std::unique_ptr<Producer> p, Clock::time_point until,
              const std::function<Outcome(MessageId)>& outcome) {
    rd_kafka_purge(p->rk, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
    while (Outstanding(p.get()) > 0 && Clock::now() < until) rd_kafka_poll(p->rk, 10);
    FailAll(p.get(), outcome);
    rd_kafka_destroy(p->rk);
  }

  // --- Shutdown ------------------------------------------------------------------------

  void Shutdown(milliseconds deadline) {
    std::lock_guard guard(shutdown_mu);
    if (shut_down) return;
    const auto start = Clock::now();
    deadline = std::max(deadline, milliseconds(0));
    const auto end = start + deadline;

    accepting.store(false);
    { std::unique_lock barrier(producer_mu); }  // no Submit is inside produce any more
    stop_poll.store(true);
    if (poller.joinable()) poller.join();  // from here on this thread serves the reports
    stopping.store(true);

    Producer* p = producer.get();
    if (p->fatal.load()) {
      Retire(TakeProducer(), end, [this, p](MessageId id) { return FatalOutcome(p, id); });
    } else {
      const auto flush_for = deadline - std::min(deadline / 4, kShutdownReserve);
      rd_kafka_flush(p->rk, static_cast<int>(flush_for.count()));
      Retire(TakeProducer(), end, [](MessageId id) { return ShutdownOutcome(id); });
    }
    ready.store(false);
    shut_down = true;
    const auto took = std::chrono::duration_cast<milliseconds>(Clock::now() - start);
    spdlog::info("kafka destination \"{}\": shut down in {} ms", destination, took.count());
  }

  std::unique_ptr<Producer> TakeProducer() {
    std::unique_lock lock(producer_mu);
    return std::move(producer);
  }
};

KafkaSink::KafkaSink(std::string destination, const KafkaTarget& target)
    : impl_(std::make_unique<Impl>(std::move(destination), target)) {
  impl_->Start();
}

KafkaSink::~KafkaSink() { impl_->Shutdown(kDestructorShutdownDeadline); }

void KafkaSink::Submit(Message msg, Completion done) {
  impl_->Submit(std::move(msg), std::move(done));
}

void KafkaSink::Shutdown(std::chrono::milliseconds deadline) { impl_->Shutdown(deadline); }

bool KafkaSink::Ready() const { return impl_->ready.load(); }

std::string KafkaSink::WhyNotReady() const {
  if (Ready()) return "";
  return "no Kafka broker reachable (bootstrap.servers " + impl_->target.brokers + ")";
}

std::size_t KafkaSink::InFlight() const { return impl_->in_flight.load(); }

std::optional<TargetHealth> KafkaSink::Health() const {
  TargetHealth h;
  h.kind = "kafka";
  h.delivery = "at_least_once";
  return h;
}

std::size_t KafkaSink::QueueLength() const {
  std::shared_lock lock(impl_->producer_mu);
  if (!impl_->producer) return 0;
  return static_cast<std::size_t>(rd_kafka_outq_len(impl_->producer->rk));
}

const std::string& KafkaSink::destination() const { return impl_->destination; }

long long ProducerMessageMaxBytes(const KafkaTarget& target) {
  const auto it = target.producer.find("message.max.bytes");
  if (it == target.producer.end()) return kDefaultProducerMessageMaxBytes;
  long long value = 0;
  const auto [end, ec] =
      std::from_chars(it->second.data(), it->second.data() + it->second.size(), value);
  if (ec != std::errc() || end != it->second.data() + it->second.size()) {
    return kDefaultProducerMessageMaxBytes;
  }
  return value;
}

std::optional<std::string> PayloadLimitMismatch(const std::string& destination,
                                                const KafkaTarget& target,
                                                long long max_payload_bytes) {
  constexpr long long kKeyAndHeaders = 4096;  // room left for a short key and a few headers
  const long long limit = ProducerMessageMaxBytes(target);
  if (max_payload_bytes + kKeyAndHeaders <= limit) return std::nullopt;
  return "kafka destination \"" + destination + "\": the database accepts payloads of up to " +
         std::to_string(max_payload_bytes) +
         " bytes (outbox.settings.max_payload_bytes), but this destination's producer refuses "
         "records over " +
         std::to_string(limit) +
         " bytes (message.max.bytes: payload, key and headers together), so larger messages "
         "are dead-lettered as msg_too_large. Raise message.max.bytes in the destination's "
         "producer properties to at least " +
         std::to_string(max_payload_bytes + kKeyAndHeaders) +
         " (the topic's max.message.bytes must allow as much), or lower the database's limit: "
         "UPDATE outbox.settings SET max_payload_bytes = " +
         std::to_string(std::max<long long>(1, limit - kKeyAndHeaders));
}

void ValidateKafkaTarget(const std::string& destination, const KafkaTarget& target) {
  kafka_detail::TopicRoute(destination, target);  // throws for a bad template or allow-list
  const std::string transactional_id = target.transactional_id_prefix + "." + destination + ".0";
  kafka_detail::ConfPtr conf =
      ProducerConf(destination, target, target.exactly_once ? &transactional_id : nullptr);
  // librdkafka checks one property against another (max.in.flight with the idempotent
  // producer, retries, acks, linger.ms against the timeout) only when it creates the
  // producer: created here without brokers (it connects nowhere) and destroyed at once, so
  // check-config refuses what `run` would.
  char errstr[512];
  if (rd_kafka_conf_set(conf.get(), "bootstrap.servers", "", errstr, sizeof errstr) !=
          RD_KAFKA_CONF_OK ||
      rd_kafka_conf_set(conf.get(), "log_level", "0", errstr, sizeof errstr) != RD_KAFKA_CONF_OK) {
    throw std::invalid_argument("kafka destination \"" + destination + "\": " + errstr);
  }
  rd_kafka_t* rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf.get(), errstr, sizeof errstr);
  if (rk == nullptr) {
    throw std::invalid_argument("kafka destination \"" + destination +
                                "\": the producer settings do not go together: " + errstr);
  }
  conf.release();  // rd_kafka_new took it
  rd_kafka_destroy(rk);
}

SinkPtr MakeKafkaSink(std::string destination, const KafkaTarget& target) {
  if (target.exactly_once) return MakeTransactionalKafkaSink(std::move(destination), target);
  return std::make_unique<KafkaSink>(std::move(destination), target);
}

const SinkFactory& KafkaSinkFactory() {
  static const SinkFactory factory{
      KafkaTarget::kKind,
      KafkaTargetKind,
      [](const Destination& d) { ValidateKafkaTarget(d.name, d.target.Get<KafkaTarget>()); },
      [](const Destination& d) { return MakeKafkaSink(d.name, d.target.Get<KafkaTarget>()); },
      ReadBackKafka,
      [](const Destination& d) -> std::string {
        return d.target.Get<KafkaTarget>().exactly_once ? "exactly once" : "at least once";
      },
  };
  return factory;
}

}  // namespace outbox::relay
