// What both Kafka sinks (at-least-once and exactly-once) share: the producer's configuration
// and how a message becomes a record (kafka_sink.h has the layout).
#pragma once

#include <librdkafka/rdkafka.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "outbox_relay/kafka_target.h"
#include "outbox_relay/message.h"
#include "outbox_relay/sink.h"

namespace outbox::relay::kafka_detail {

// While a sink is not Ready: how often it asks the brokers for metadata, and how long it waits.
constexpr std::chrono::milliseconds kProbeInterval{500};
constexpr std::chrono::milliseconds kProbeTimeout{250};

struct ConfDeleter {
  void operator()(rd_kafka_conf_t* conf) const { rd_kafka_conf_destroy(conf); }
};
using ConfPtr = std::unique_ptr<rd_kafka_conf_t, ConfDeleter>;

/// An integer property as librdkafka reads it: strtol in base 0 of its leading number ("00" is
/// 0, "0x10" 16, "010" 8, "5abc" 5), cut to an int. Nullopt where it reads no number
/// (librdkafka refuses it).
std::optional<long long> LibrdkafkaInteger(const std::string& value);

/// The producer's configuration: the relay's defaults, the target's brokers and properties,
/// the settings the relay relies on (idempotence, acks=all), each property through
/// librdkafka's own parser. With `transactional_id`, a transactional producer whose
/// transactions must end within the target's attempt timeout, or its explicit
/// message.timeout.ms (delivery.timeout.ms) where that is longer (the config fits either
/// inside the lease). The one check of a Kafka target: both sinks and check-config come
/// here. Throws std::invalid_argument naming the destination and the property.
ConfPtr ProducerConf(const std::string& destination, const KafkaTarget& target,
                     const std::string* transactional_id);

/// A producer property about reaching the brokers (security, TLS, SASL, sockets, metadata):
/// the consumers that read back what was sent (exactly-once recovery, `verify`) take it too.
bool IsConnectionProperty(const std::string& name);

/// kRetry "shutdown": a message the sink gave back unsent when it stopped (not counted).
Outcome ShutdownOutcome(MessageId id);

/// Runs a sink's completion, logging (never passing on) what it throws.
void RunCompletion(const std::string& destination, Sink::Completion& done, Outcome out);

/// The record's headers (kafka_sink.h); the caller owns the list.
rd_kafka_headers_t* BuildHeaders(const Message& msg, const KafkaTarget& target);

/// The record key: the value of the configured header, else the ordering key (null if none).
const std::string* RecordKey(const Message& msg, const KafkaTarget& target);

/// rd_kafka_produceva of `msg` to `topic` (the payload copied; `headers` passed to librdkafka
/// on success, still the caller's on failure). Null on success.
rd_kafka_error_t* ProduceRecord(rd_kafka_t* rk, const Message& msg, const KafkaTarget& target,
                                rd_kafka_headers_t* headers, void* opaque,
                                const std::string& topic);

/// The record keys (null: the record has none) of the messages looked for, by topic.
using KeysByTopic = std::map<std::string, std::vector<std::optional<std::string>>>;

struct RecordedFound {
  std::set<std::string> found;               ///< The idempotency keys found.
  std::vector<std::string> partitions_read;  ///< "<topic>/<partition>"
};

/// The messages a recovery looks for: idempotency key -> outbox id. A record is the message's
/// when both agree: the database refuses a key only while it is queued, so a later message may
/// carry the key of one delivered earlier, whose record is not this message's.
using LookedFor = std::map<std::string, std::int64_t>;

/// Which of `looked_for` a read_committed consumer finds in the topics of `topics`
/// (records from `since` on, each partition to the high watermark it had when the read began):
/// the exactly-once sink's check before producing a message that may have been produced
/// already. With the relay's partitioner (murmur2_random, unless `producer.partitioner` says
/// otherwise) a topic whose records all have keys is read only in the partitions the keys
/// hash to. Throws std::runtime_error naming what failed (a broker, a timeout).
RecordedFound FindRecorded(const KafkaTarget& target, const KeysByTopic& topics,
                           std::chrono::system_clock::time_point since, const LookedFor& looked_for,
                           std::chrono::milliseconds timeout);

/// When a read of one partition (ReadBackKafka, FindRecorded) has read what it must: the
/// partition's end as the consumer reports it (librdkafka's PARTITION_EOF) at or past the high
/// watermark the partition had when the read began, or a record at or past that mark. Not an
/// end report below the mark: a read_committed consumer reports its end at the last stable
/// offset, which a transaction left open (a relay killed mid-transaction, until the broker
/// aborts it) holds below records committed after it began; verify stopped there and called
/// those records gaps, or missed their duplicates (review).
/// A busy partition may never report its end: librdkafka does so only when a fetch brings
/// nothing new, and a broker answers a fetch as soon as a new record lands, so while producers
/// commit to it more often than fetch.wait.max.ms the end report never came and the read ran
/// into its deadline (review). Records arrive in offset order, so one at hw - 1 or later comes
/// after every committed record below the mark (a transaction marker at hw - 1 is never
/// delivered: then the next record, or the end report, ends the read).
class PartitionEnd {
 public:
  /// `high_watermark`: where the partition ended when the read began (-1: not known).
  explicit PartitionEnd(std::int64_t high_watermark) : mark_(high_watermark) {}
  /// The consumer reported the end at `offset`. True when the partition is now read.
  bool OnEnd(std::int64_t offset) {
    if (mark_ < 0 || offset >= mark_) done_ = true;
    return done_;
  }
  /// A record at `offset` arrived. True when the partition is now read.
  bool OnRecord(std::int64_t offset) {
    if (mark_ >= 0 && offset >= mark_ - 1) done_ = true;
    return done_;
  }
  bool done() const { return done_; }

 private:
  std::int64_t mark_;
  bool done_ = false;
};

}  // namespace outbox::relay::kafka_detail
