// The Kafka sink: delivers messages to one topic with librdkafka's idempotent producer.
//
// Each message becomes one Kafka record:
//   key     = Message::ordering_key (a NULL key when absent), or the value of the message
//             header named by `key_header` when the message has it,
//   value   = Message::payload,
//   headers = idempotency-key, outbox-id (decimal row id), event-type (when non-empty),
//             created-at (RFC 3339 UTC with milliseconds); with `format: cloudevents` the
//             CloudEvents binary-mode ce_* attributes and content-type (cloudevents.h); then
//             the message's own headers.
//
// Ordering: the dispatcher never submits two messages of the same ordering key at once
// (see Sink), so per-key order never depends on this sink. Within one partition the
// idempotent producer (enable.idempotence=true, acks=all) additionally keeps order and
// avoids duplicates across its internal retries, so a leader change or a lost response
// does not reorder or duplicate records.
//
// Delivery is bounded by message.timeout.ms (default 2/3 of lease_ms, at most 30 s): a message librdkafka could not
// deliver in that time completes with kRetry ("Local: Message timed out").
//
// Threads: Submit runs on the caller's thread and never blocks long (at most a short,
// bounded wait when the local queue is full). A dedicated poll thread serves librdkafka's
// delivery reports and runs the completions.
#pragma once

#include <librdkafka/rdkafka.h>

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include "outbox_relay/kafka_target.h"
#include "outbox_relay/message.h"
#include "outbox_relay/read_back.h"
#include "outbox_relay/sink.h"

namespace outbox::relay {

/// Maps a librdkafka error (from a delivery report or a failed produce call) to an Outcome.
///
/// kPermanent (dead-letter; retrying the same bytes cannot succeed):
///   MSG_SIZE_TOO_LARGE, RECORD_LIST_TOO_LARGE, INVALID_MSG_SIZE, INVALID_MSG, INVALID_RECORD,
///   UNSUPPORTED_FOR_MESSAGE_FORMAT, TOPIC_AUTHORIZATION_FAILED, CLUSTER_AUTHORIZATION_FAILED,
///   TOPIC_EXCEPTION (invalid topic name), INVALID_REQUIRED_ACKS.
/// kRetry: everything else - timeouts (_MSG_TIMED_OUT, REQUEST_TIMED_OUT), transport and
///   broker trouble (_TRANSPORT, _ALL_BROKERS_DOWN, NOT_LEADER_FOR_PARTITION,
///   NOT_ENOUGH_REPLICAS, ...), a full local queue, purges, fatal producer errors.
///   _UNKNOWN_TOPIC / UNKNOWN_TOPIC_OR_PART / _UNKNOWN_PARTITION are deliberately kRetry:
///   the topic may simply not be created yet, and dead-lettering every message of a
///   destination because of a deployment-order mistake would be worse than backing off.
/// `retriable` is rd_kafka_error_is_retriable() of an error object when there is one; when
/// true the outcome is kRetry regardless of the code.
///
/// reason = rd_kafka_err2str(err); reason_class is one of a small fixed set of labels:
/// "msg_too_large", "invalid_message", "authorization", "invalid_topic", "config",
/// "unknown_topic", "timeout", "broker", "queue_full", "purged", "fatal", "other".
Outcome ClassifyDeliveryError(MessageId id, rd_kafka_resp_err_t err, bool retriable = false);

/// A Sink for one Kafka destination. Thread-safe. See the file comment for the record layout.
///
/// Failure handling:
///  - A fatal idempotent-producer error (rd_kafka_fatal_error) is logged, every message the
///    broken producer still holds completes with kRetry (reason_class "fatal"), and a new
///    producer replaces it, so nothing is lost and later Submits go to the new producer.
///  - Ready() is false until a broker answered (a metadata probe, retried every 500 ms while
///    not ready, or a successful delivery). It turns false again on "all brokers down", on a
///    delivery that failed for timeout/broker reasons, and on a fatal error, until a broker
///    answers again.
///
/// Producer defaults, each overridable through KafkaTarget::producer: linger.ms=5,
/// message.timeout.ms=2/3 of lease_ms (at most 30000), queue.buffering.max.messages=100000, partitioner=murmur2_random
/// (the Java client's key hashing), client.id=outbox-relay, message.max.bytes=
/// kDefaultProducerMessageMaxBytes. Always: enable.idempotence=true and acks=all (other values
/// are rejected at start-up); transactional.id is rejected.
class KafkaSink final : public Sink {
 public:
  /// Creates the producer. Throws std::invalid_argument with librdkafka's error text (which
  /// names the property) when a producer property is unknown or invalid.
  KafkaSink(std::string destination, const KafkaTarget& target);
  /// Calls Shutdown(kDestructorShutdownDeadline) unless Shutdown already ran.
  ~KafkaSink() override;
  KafkaSink(const KafkaSink&) = delete;
  KafkaSink& operator=(const KafkaSink&) = delete;

  static constexpr std::chrono::milliseconds kDestructorShutdownDeadline{2'000};

  void Submit(Message msg, Completion done) override;
  /// Stops accepting, flushes up to (most of) `deadline`, then purges what is left; purged
  /// messages complete with kRetry "shutdown" before Shutdown returns. Must not be called
  /// from inside a completion.
  void Shutdown(std::chrono::milliseconds deadline) override;
  bool Ready() const override;
  std::string WhyNotReady() const override;
  std::size_t InFlight() const override;
  std::string_view Kind() const override { return "kafka"; }
  /// Kind "kafka", delivery "at_least_once" (`outbox-relay status` shows it per relay).
  std::optional<TargetHealth> Health() const override;
  std::optional<std::size_t> ClientQueueLength() const override { return QueueLength(); }

  /// Messages and requests librdkafka still holds (rd_kafka_outq_len), for metrics.
  std::size_t QueueLength() const;
  const std::string& destination() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

/// The producers' message.max.bytes unless a destination sets it (librdkafka's own default is
/// 1,000,000): the database's default payload limit, outbox.settings.max_payload_bytes =
/// 1 MiB, plus the most a message's ordering key (1 KiB) and headers (64 of 255 + 4096 bytes)
/// and the relay's own headers can add. librdkafka refuses a record over it before sending
/// (msg_too_large, a dead letter); the topic's max.message.bytes still applies on the broker.
inline constexpr long long kDefaultProducerMessageMaxBytes = 1'048'576 + 286'720;

/// The message.max.bytes a destination's producer runs with: its own setting, or
/// kDefaultProducerMessageMaxBytes. (A setting librdkafka would refuse is left to
/// ValidateKafkaTarget; this returns the default for it.)
long long ProducerMessageMaxBytes(const KafkaTarget& target);

/// Why `target`'s producer would refuse payloads the database accepts (`max_payload_bytes`,
/// outbox.settings): what becomes of them and the two ways out; nullopt when a payload of
/// that size fits with a few KiB of key and headers. `outbox-relay run` logs it at start-up.
std::optional<std::string> PayloadLimitMismatch(const std::string& destination,
                                                const KafkaTarget& target,
                                                long long max_payload_bytes);

/// Checks `target` exactly as the sink does, without connecting: brokers, the settings the
/// relay relies on, and every producer property through librdkafka's parser. Throws
/// std::invalid_argument naming the destination and the property. `check-config` and `run`
/// both rely on it.
void ValidateKafkaTarget(const std::string& destination, const KafkaTarget& target);

/// Creates the sink `target` asks for: a KafkaSink, or with `delivery: exactly_once` the
/// exactly-once sink (MakeTransactionalKafkaSink); throws std::invalid_argument as the
/// constructor does.
SinkPtr MakeKafkaSink(std::string destination, const KafkaTarget& target);

/// The exactly-once sink (`delivery: exactly_once`; docs/adr/0002-exactly-once-kafka.md): the
/// messages of a claim are produced in Kafka transactions, one transactional producer per
/// bucket ("<transactional_id_prefix>.<destination>.<bucket>", whose creation fences the
/// bucket's previous owner), and complete as delivered once their transaction committed. A
/// message claimed with an attempt counted (it may have been produced before) is first looked
/// for in its topic (read_committed, from its creation time to the high watermark) and
/// completes as delivered without producing when it is there. A transaction that did not
/// commit completes its messages with kRetry and Outcome::maybe_sent. Same record layout as
/// KafkaSink; Message::bucket picks the producer.
SinkPtr MakeTransactionalKafkaSink(std::string destination, const KafkaTarget& target);

/// Reads back the destination's topics (its topic, its allowed_topics, or options.streams)
/// with a read_committed consumer, every partition from the first record at or after
/// options.since to its end: the Kafka kind's SinkFactory::read_back (`outbox-relay verify`).
ReadBackResult ReadBackKafka(const Destination& destination, const ReadBackOptions& options);

/// The Kafka kind of sink (serves destinations with a `kafka:` target).
const SinkFactory& KafkaSinkFactory();

}  // namespace outbox::relay
