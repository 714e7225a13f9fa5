// Reads back a Kafka destination's topics for `outbox-relay verify`: a read_committed consumer
// assigned to every partition, from the first offset at or after `since` to the end.
#include <librdkafka/rdkafka.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "outbox_relay/kafka_sink.h"
#include "outbox_relay/read_back.h"
#include "outbox_relay/thread_name.h"

namespace outbox::relay {
namespace {

using Clock = std::chrono::steady_clock;

int RemainingMs(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return static_cast<int>(std::clamp<long long>(left.count(), 0, 1'000));
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

// What the producer's config says about reaching the brokers applies to reading too.
bool IsConnectionProperty(const std::string& name) {
  for (const char* prefix : {"security.", "sasl.", "ssl.", "socket.", "broker.", "client.dns",
                             "api.version", "reconnect."}) {
    if (name.starts_with(prefix)) return true;
  }
  return false;
}

std::unique_ptr<Consumer> MakeConsumer(const KafkaTarget& target) {
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
    if (IsConnectionProperty(name)) set(name, value);
  }
  set("group.id", "outbox-relay-verify");  // assign() only: nothing is joined or committed
  set("enable.auto.commit", "false");
  set("enable.auto.offset.store", "false");
  set("enable.partition.eof", "true");
  set("isolation.level", "read_committed");
  set("client.id", "outbox-relay-verify");
  auto consumer = std::make_unique<Consumer>();
  consumer->rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof err);
  if (consumer->rk == nullptr) {
    rd_kafka_conf_destroy(conf);
    throw std::runtime_error(std::string("kafka consumer: ") + err);
  }
  rd_kafka_poll_set_consumer(consumer->rk);
  return consumer;
}

int PartitionCount(rd_kafka_t* rk, const std::string& topic, Clock::time_point deadline) {
  rd_kafka_topic_t* t = rd_kafka_topic_new(rk, topic.c_str(), nullptr);
  std::string last_error = "timed out";
  while (Clock::now() < deadline) {
    const rd_kafka_metadata_t* md = nullptr;
    const rd_kafka_resp_err_t e =
        rd_kafka_metadata(rk, 0, t, &md, std::max(RemainingMs(deadline), 1));
    if (e == RD_KAFKA_RESP_ERR_NO_ERROR && md->topic_cnt == 1) {
      const auto& tm = md->topics[0];
      const int n = tm.err == RD_KAFKA_RESP_ERR_NO_ERROR ? tm.partition_cnt : -1;
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
  }
  rd_kafka_topic_destroy(t);
  throw std::runtime_error("topic " + topic + ": no partitions found (" + last_error +
                           "); check the brokers and the topic name");
}

std::vector<std::string> TopicsOf(const Destination& d, const KafkaTarget& target,
                                  const ReadBackOptions& options) {
  if (!options.streams.empty()) return options.streams;
  if (target.topic.find('{') == std::string::npos) return {target.topic};
  if (!target.allowed_topics.empty()) return target.allowed_topics;
  throw std::invalid_argument("destination " + d.name + " routes to topics by the template \"" +
                              target.topic +
                              "\" under a prefix, which cannot be listed; name the topics to "
                              "read with --topic");
}

}  // namespace

ReadBackResult ReadBackKafka(const Destination& d, const ReadBackOptions& options) {
  const KafkaTarget& target = d.target.Get<KafkaTarget>();
  const auto deadline = Clock::now() + options.timeout;
  const auto consumer = MakeConsumer(target);
  rd_kafka_t* rk = consumer->rk;

  ReadBackResult result;
  rd_kafka_topic_partition_list_t* assignment = rd_kafka_topic_partition_list_new(8);
  const bool from_start = options.since.time_since_epoch().count() == 0;
  const auto since_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(options.since.time_since_epoch())
          .count();
  std::map<std::string, bool> at_end;  // "<topic>/<partition>" -> reached the end
  try {
    for (const auto& topic : TopicsOf(d, target, options)) {
      const int partitions = PartitionCount(rk, topic, deadline);
      for (int p = 0; p < partitions; ++p) {
        // offsets_for_times takes the timestamp in the offset field.
        rd_kafka_topic_partition_list_add(assignment, topic.c_str(), p)->offset =
            from_start ? RD_KAFKA_OFFSET_BEGINNING : since_ms;
        const std::string stream = topic + "/" + std::to_string(p);
        result.streams_read.push_back(stream);
        at_end[stream] = false;
      }
    }
    if (!from_start) {
      const rd_kafka_resp_err_t e =
          rd_kafka_offsets_for_times(rk, assignment, std::max(RemainingMs(deadline) * 10, 1000));
      if (e != RD_KAFKA_RESP_ERR_NO_ERROR) {
        throw std::runtime_error(std::string("finding the offsets at --since: ") +
                                 rd_kafka_err2str(e));
      }
      for (int i = 0; i < assignment->cnt; ++i) {
        // No record at or after the time: start at the end (nothing to read there).
        if (assignment->elems[i].offset < 0) assignment->elems[i].offset = RD_KAFKA_OFFSET_END;
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

  // A partition is read once the consumer reports its end (for read_committed: the last
  // stable offset, past which only open transactions lie).
  std::size_t ended = 0;
  while (ended < at_end.size()) {
    if (Clock::now() >= deadline) {
      throw std::runtime_error("reading the topics did not finish within " +
                               std::to_string(options.timeout.count()) +
                               " ms; raise --timeout-ms or narrow the window with --since");
    }
    rd_kafka_message_t* m = rd_kafka_consumer_poll(rk, std::max(RemainingMs(deadline), 1));
    if (m == nullptr) continue;
    const std::string stream =
        std::string(rd_kafka_topic_name(m->rkt)) + "/" + std::to_string(m->partition);
    if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) {
      if (!at_end[stream]) ++ended;
      at_end[stream] = true;
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
      result.records.push_back(std::move(r));
    }
    rd_kafka_message_destroy(m);
  }
  return result;
}

}  // namespace outbox::relay
