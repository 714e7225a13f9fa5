// Reads back a Kafka destination's topics for `outbox-relay verify`: a read_committed consumer
// assigned to every partition, from the first offset at or after `since` to the end.
#include <librdkafka/rdkafka.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "kafka_records.h"
#include "outbox_relay/kafka_sink.h"
#include "outbox_relay/read_back.h"
#include "outbox_relay/thread_name.h"

namespace outbox::relay {

bool kafka_detail::IsConnectionProperty(const std::string& name) {
  for (const char* prefix :
       {"security.", "sasl.", "ssl.", "ssl_", "enable.ssl.", "enable.sasl.", "socket.", "broker.",
        "client.dns", "api.version", "reconnect.", "connections.max.idle", "metadata.",
        "topic.metadata.", "resolve.canonical"}) {
    if (name.starts_with(prefix)) return true;
  }
  return false;
}

namespace {

using Clock = std::chrono::steady_clock;

int RemainingMs(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return static_cast<int>(std::clamp<long long>(left.count(), 0, 1'000));
}

// A broker lookup's own timeout: all that is left of the deadline; past it, the lookup is not
// made ("timed out <doing>"). It was at least 1 s and up to 10 s whatever was left, once per
// partition, and librdkafka's watermark query waits for its answer past its timeout anyway: a
// recovery with slow brokers ran to many times its budget.
int LookupMs(Clock::time_point deadline, const std::string& doing) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  if (left.count() <= 0) throw std::runtime_error("timed out " + doing);
  return static_cast<int>(std::min<long long>(left.count(), 3'600'000));
}

struct Consumer {
  rd_kafka_t* rk = nullptr;
  ~Consumer() {
    if (rk != nullptr) {
      rd_kafka_consumer_close(rk);
      rd_kafka_destroy(rk);
    }
  }
};

std::unique_ptr<Consumer> MakeConsumer(const KafkaTarget& target, const char* isolation,
                                       const char* client_id) {
  rd_kafka_conf_t* conf = rd_kafka_conf_new();
  char err[512];
  auto set = [&](const std::string& name, const std::string& value) {
    if (rd_kafka_conf_set(conf, name.c_str(), value.c_str(), err, sizeof err) != RD_KAFKA_CONF_OK) {
      rd_kafka_conf_destroy(conf);
      throw std::runtime_error("kafka consumer property " + name + ": " + err);
    }
  };
  set("bootstrap.servers", target.brokers);
  for (const auto& [name, value] : target.producer) {
    if (kafka_detail::IsConnectionProperty(name)) set(name, value);
  }
  set("group.id", client_id);  // assign() only: nothing is joined or committed
  set("enable.auto.commit", "false");
  set("enable.auto.offset.store", "false");
  set("enable.partition.eof", "true");
  set("isolation.level", isolation);
  set("client.id", client_id);
  auto consumer = std::make_unique<Consumer>();
  consumer->rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof err);
  if (consumer->rk == nullptr) {
    rd_kafka_conf_destroy(conf);
    throw std::runtime_error(std::string("kafka consumer: ") + err);
  }
  rd_kafka_poll_set_consumer(consumer->rk);
  return consumer;
}

/// The broker does not know the topic (and did not come to know it for a while).
struct UnknownTopic : std::runtime_error {
  using std::runtime_error::runtime_error;
};

int PartitionCount(rd_kafka_t* rk, const std::string& topic, Clock::time_point deadline) {
  rd_kafka_topic_t* t = rd_kafka_topic_new(rk, topic.c_str(), nullptr);
  std::string last_error = "timed out";
  // A topic the broker does not know may be a moment from existing (just created): asked
  // again for a while. One the relay may not read, or an invalid name, fails at once.
  const auto unknown_until = std::min(deadline, Clock::now() + std::chrono::seconds(2));
  bool unknown_at_end = false;
  while (Clock::now() < deadline) {
    const rd_kafka_metadata_t* md = nullptr;
    const rd_kafka_resp_err_t e =
        rd_kafka_metadata(rk, 0, t, &md, std::max(RemainingMs(deadline), 1));
    rd_kafka_resp_err_t topic_error = RD_KAFKA_RESP_ERR_NO_ERROR;
    if (e == RD_KAFKA_RESP_ERR_NO_ERROR && md->topic_cnt == 1) {
      const auto& tm = md->topics[0];
      const int n = tm.err == RD_KAFKA_RESP_ERR_NO_ERROR ? tm.partition_cnt : -1;
      topic_error = tm.err;
      if (tm.err != RD_KAFKA_RESP_ERR_NO_ERROR) last_error = rd_kafka_err2str(tm.err);
      rd_kafka_metadata_destroy(md);
      if (n > 0) {
        rd_kafka_topic_destroy(t);
        return n;
      }
    } else {
      if (md != nullptr) rd_kafka_metadata_destroy(md);
      last_error = rd_kafka_err2str(e);
    }
    const bool unknown = topic_error == RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART ||
                         topic_error == RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC;
    const bool final = (topic_error != RD_KAFKA_RESP_ERR_NO_ERROR && !unknown &&
                        topic_error != RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE) ||
                       (unknown && Clock::now() >= unknown_until);
    unknown_at_end = unknown;
    if (final) break;
    std::this_thread::sleep_for(
        std::min(std::chrono::milliseconds(100), std::chrono::milliseconds(RemainingMs(deadline))));
  }
  rd_kafka_topic_destroy(t);
  const std::string what = "topic " + topic + ": no partitions found (" + last_error +
                           "); check the brokers, the topic name and the relay's permissions";
  if (unknown_at_end) throw UnknownTopic(what);
  throw std::runtime_error(what);
}

std::vector<std::string> TopicsOf(const Destination& d, const KafkaTarget& target,
                                  const ReadBackOptions& options) {
  if (!options.streams.empty()) return options.streams;
  if (target.topic.find('{') == std::string::npos) return {target.topic};
  // Under a prefix the template reaches topics the allow-list does not name (the router takes
  // either), so the list is not all of them.
  if (!target.allowed_topics.empty() && target.topic_prefix.empty()) return target.allowed_topics;
  throw std::invalid_argument("destination " + d.name + " routes to topics by the template \"" +
                              target.topic +
                              "\" under a prefix, which cannot be listed; name the topics to "
                              "read with --topic");
}

// The timestamp of the last record of a partition whose end is `high`, or -1 (empty, or its
// last entry is a transaction marker). Read with its own assignment of `rk`.
std::int64_t LastRecordTimestamp(rd_kafka_t* rk, const std::string& topic, int partition,
                                 std::int64_t high, Clock::time_point deadline) {
  if (high <= 0) return -1;
  rd_kafka_topic_partition_list_t* one = rd_kafka_topic_partition_list_new(1);
  rd_kafka_topic_partition_list_add(one, topic.c_str(), partition)->offset = high - 1;
  const rd_kafka_resp_err_t e = rd_kafka_assign(rk, one);
  rd_kafka_topic_partition_list_destroy(one);
  if (e != RD_KAFKA_RESP_ERR_NO_ERROR) return -1;
  std::int64_t timestamp = -1;
  while (Clock::now() < deadline) {
    rd_kafka_message_t* m = rd_kafka_consumer_poll(rk, std::max(RemainingMs(deadline), 1));
    if (m == nullptr) continue;
    const bool eof = m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF;
    if (m->err == RD_KAFKA_RESP_ERR_NO_ERROR) timestamp = rd_kafka_message_timestamp(m, nullptr);
    rd_kafka_message_destroy(m);
    if (eof || timestamp >= 0) break;
  }
  rd_kafka_assign(rk, nullptr);
  return timestamp;
}

// Reads `topics` with a read_committed consumer, every partition from the first record at or
// after `since` (all of it when epoch) to the high watermark it had when the read began
// (kafka_detail::PartitionEnd), and hands each record to `on_record`: records committed
// before the call are read even behind a transaction still open.
// `wanted`, when given, picks the partitions of a topic to read (topic, partition, count).
using PartitionFilter = std::function<bool(const std::string&, int, int)>;

// `may_be_missing`: topics the broker need not know (the allowed topics of a template); one it
// does not is added to `missing` and read as empty.
void ReadTopics(const KafkaTarget& target, const std::vector<std::string>& topics,
                std::chrono::system_clock::time_point since, std::chrono::milliseconds timeout,
                const char* client_id,
                const std::function<void(ReadBackRecord)>& on_record,
                std::vector<std::string>* streams_read, const PartitionFilter& wanted = {},
                const std::set<std::string>& may_be_missing = {},
                std::vector<std::string>* missing = nullptr) {
  const auto deadline = Clock::now() + timeout;
  const auto consumer = MakeConsumer(target, "read_committed", client_id);
  rd_kafka_t* rk = consumer->rk;

  rd_kafka_topic_partition_list_t* assignment = rd_kafka_topic_partition_list_new(8);
  const bool from_start = since.time_since_epoch().count() == 0;
  const auto since_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(since.time_since_epoch()).count();
  // "<topic>/<partition>" -> whether it has been read (kafka_detail::PartitionEnd)
  std::map<std::string, kafka_detail::PartitionEnd> ends;
  try {
    // The high watermarks when the read begins: a busy partition's read ends at its mark,
    // since its end may never be reported (PartitionEnd).
    const auto uncommitted = MakeConsumer(target, "read_uncommitted", client_id);
    for (const auto& topic : topics) {
      int partitions = 0;
      try {
        partitions = PartitionCount(rk, topic, deadline);
      } catch (const UnknownTopic&) {
        if (!may_be_missing.count(topic) || missing == nullptr) throw;
        missing->push_back(topic);
        continue;
      }
      for (int p = 0; p < partitions; ++p) {
        if (wanted && !wanted(topic, p, partitions)) continue;
        // offsets_for_times takes the timestamp in the offset field.
        rd_kafka_topic_partition_list_add(assignment, topic.c_str(), p)->offset =
            from_start ? RD_KAFKA_OFFSET_BEGINNING : since_ms;
        const std::string stream = topic + "/" + std::to_string(p);
        if (streams_read != nullptr) streams_read->push_back(stream);
        std::int64_t low = 0, high = 0;
        const rd_kafka_resp_err_t e = rd_kafka_query_watermark_offsets(
            uncommitted->rk, topic.c_str(), p, &low, &high,
            LookupMs(deadline, "finding the end of " + stream));
        if (e != RD_KAFKA_RESP_ERR_NO_ERROR) {
          throw std::runtime_error("finding the end of " + stream + ": " + rd_kafka_err2str(e));
        }
        ends.emplace(stream, kafka_detail::PartitionEnd(high));
      }
    }
    if (!from_start) {
      // Looked up read_uncommitted, as the watermarks are: a broker answers a read_committed
      // lookup only below the last stable offset, so behind a transaction left open the
      // start fell to the partition's end, which is worked out only when fetching begins:
      // once the broker aborted that transaction, past a record committed after it began,
      // which the exactly-once recovery then took for absent and produced again (review;
      // the mock cluster keeps no transaction open, so no test here shows it). The consumer
      // started there still reads only committed records.
      const rd_kafka_resp_err_t e = rd_kafka_offsets_for_times(
          uncommitted->rk, assignment, LookupMs(deadline, "finding the offsets at --since"));
      if (e != RD_KAFKA_RESP_ERR_NO_ERROR) {
        throw std::runtime_error(std::string("finding the offsets at --since: ") +
                                 rd_kafka_err2str(e));
      }
      std::unique_ptr<Consumer> probe;
      for (int i = 0; i < assignment->cnt; ++i) {
        auto& elem = assignment->elems[i];
        if (elem.offset >= 0) continue;
        // No record at or after the time: start at the end (nothing to read there). Unless
        // the partition's last record is that recent: then the broker cannot look records up
        // by time (librdkafka's mock cluster), and the partition is read from its start.
        elem.offset = RD_KAFKA_OFFSET_END;
        std::int64_t low = 0, high = 0;
        if (rd_kafka_query_watermark_offsets(
                uncommitted->rk, elem.topic, elem.partition, &low, &high,
                LookupMs(deadline, std::string("finding where ") + elem.topic + "/" +
                                       std::to_string(elem.partition) + " ends")) !=
                RD_KAFKA_RESP_ERR_NO_ERROR ||
            high <= low) {
          continue;
        }
        elem.offset = high;  // the end as it was now, not when fetching begins
        if (!probe) probe = MakeConsumer(target, "read_uncommitted", client_id);
        if (LastRecordTimestamp(probe->rk, elem.topic, elem.partition, high, deadline) >=
            since_ms) {
          elem.offset = RD_KAFKA_OFFSET_BEGINNING;
        }
      }
    }
    const rd_kafka_resp_err_t e = rd_kafka_assign(rk, assignment);
    if (e != RD_KAFKA_RESP_ERR_NO_ERROR) {
      throw std::runtime_error(std::string("assigning the partitions: ") + rd_kafka_err2str(e));
    }
  } catch (...) {
    rd_kafka_topic_partition_list_destroy(assignment);
    throw;
  }
  rd_kafka_topic_partition_list_destroy(assignment);

  // A partition is read once the consumer reports its end at or past the high watermark, or
  // once a record at or past that mark arrives; it is paused then, and what it still brings is
  // not read.
  std::size_t ended = 0;
  const auto finished = [&](rd_kafka_message_t* m) {
    ++ended;
    rd_kafka_topic_partition_list_t* one = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(one, rd_kafka_topic_name(m->rkt), m->partition);
    rd_kafka_pause_partitions(rk, one);
    rd_kafka_topic_partition_list_destroy(one);
  };
  while (ended < ends.size()) {
    if (Clock::now() >= deadline) {
      throw std::runtime_error("reading the topics did not finish within " +
                               std::to_string(timeout.count()) +
                               " ms; raise --timeout-ms or narrow the window with --since (a "
                               "transaction left open, by a producer killed in it, holds the "
                               "read until the broker aborts it: transaction.timeout.ms)");
    }
    rd_kafka_message_t* m = rd_kafka_consumer_poll(rk, std::max(RemainingMs(deadline), 1));
    if (m == nullptr) continue;
    const std::string stream =
        std::string(rd_kafka_topic_name(m->rkt)) + "/" + std::to_string(m->partition);
    const auto end = ends.find(stream);
    if (end == ends.end() || end->second.done()) {
      // Not asked for, or read already: what it still brought is past the read.
    } else if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) {
      if (end->second.OnEnd(m->offset)) finished(m);
    } else if (m->err != RD_KAFKA_RESP_ERR_NO_ERROR) {
      const std::string what = rd_kafka_message_errstr(m);
      rd_kafka_message_destroy(m);
      throw std::runtime_error("reading " + stream + ": " + what);
    } else {
      ReadBackRecord r;
      r.stream = stream;
      r.position = m->offset;
      if (m->key != nullptr) r.key = std::string(static_cast<const char*>(m->key), m->key_len);
      rd_kafka_headers_t* headers = nullptr;
      if (rd_kafka_message_headers(m, &headers) == RD_KAFKA_RESP_ERR_NO_ERROR) {
        const void* value = nullptr;
        std::size_t size = 0;
        if (rd_kafka_header_get_last(headers, "outbox-id", &value, &size) ==
                RD_KAFKA_RESP_ERR_NO_ERROR &&
            value != nullptr) {
          const std::string text(static_cast<const char*>(value), size);
          char* end = nullptr;
          const long long id = std::strtoll(text.c_str(), &end, 10);
          if (end != text.c_str() && *end == '\0') r.outbox_id = id;
        }
        if (rd_kafka_header_get_last(headers, "idempotency-key", &value, &size) ==
                RD_KAFKA_RESP_ERR_NO_ERROR &&
            value != nullptr) {
          r.idempotency_key.assign(static_cast<const char*>(value), size);
        }
      }
      on_record(std::move(r));
      if (end->second.OnRecord(m->offset)) finished(m);
    }
    rd_kafka_message_destroy(m);
  }
}

}  // namespace

ReadBackResult ReadBackKafka(const Destination& d, const ReadBackOptions& options) {
  const KafkaTarget& target = d.target.Get<KafkaTarget>();
  ReadBackResult result;
  const auto topics = TopicsOf(d, target, options);
  // A template's allowed topics exist once something was routed there (or an operator made
  // them); a topic named with --topic, or the destination's one topic, has to exist.
  std::set<std::string> may_be_missing;
  if (options.streams.empty() && target.topic.find('{') != std::string::npos) {
    may_be_missing.insert(topics.begin(), topics.end());
  }
  ReadTopics(
      target, topics, options.since, options.timeout,
      "outbox-relay-verify", [&](ReadBackRecord r) { result.records.push_back(std::move(r)); },
      &result.streams_read, {}, may_be_missing, &result.missing);
  return result;
}

namespace kafka_detail {

RecordedFound FindRecorded(const KafkaTarget& target, const KeysByTopic& topics,
                           std::chrono::system_clock::time_point since, const LookedFor& looked_for,
                           std::chrono::milliseconds timeout) {
  RecordedFound out;
  if (looked_for.empty() || topics.empty()) return out;
  // With the relay's partitioner (murmur2_random, the Java client's hashing) a keyed record is
  // in the partition its key hashes to: a topic whose records all have keys is read there only.
  const auto partitioner = target.producer.find("partitioner");
  const bool murmur2 = partitioner == target.producer.end() ||
                       partitioner->second == "murmur2_random" || partitioner->second == "murmur2";
  const PartitionFilter wanted = [&](const std::string& topic, int partition, int count) {
    const auto& keys = topics.at(topic);
    if (!murmur2) return true;
    for (const auto& key : keys) {
      if (!key) return true;  // a record without a key may be in any partition
      if (rd_kafka_msg_partitioner_murmur2(nullptr, key->data(), key->size(), count, nullptr,
                                           nullptr) == partition) {
        return true;
      }
    }
    return false;
  };
  std::vector<std::string> names;
  for (const auto& [topic, keys] : topics) names.push_back(topic);
  ReadTopics(
      target, names, since, timeout, "outbox-relay-recovery",
      [&](ReadBackRecord r) {
        const auto it = looked_for.find(r.idempotency_key);
        if (it != looked_for.end() && r.outbox_id == it->second) {
          out.found.insert(std::move(r.idempotency_key));
        }
      },
      &out.partitions_read, wanted);
  return out;
}

}  // namespace kafka_detail

}  // namespace outbox::relay
