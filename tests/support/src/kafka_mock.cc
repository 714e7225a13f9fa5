#include "outbox_test/kafka_mock.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace outbox::testing {
namespace {

using Clock = std::chrono::steady_clock;

std::atomic<unsigned> g_consumer_counter{0};

void SetConf(rd_kafka_conf_t* conf, const char* name, const std::string& value) {
  char errstr[512];
  if (rd_kafka_conf_set(conf, name, value.c_str(), errstr, sizeof errstr) != RD_KAFKA_CONF_OK) {
    rd_kafka_conf_destroy(conf);
    throw std::runtime_error(std::string("rd_kafka_conf_set ") + name + ": " + errstr);
  }
}

rd_kafka_t* NewClient(rd_kafka_type_t type, rd_kafka_conf_t* conf) {
  char errstr[512];
  rd_kafka_t* rk = rd_kafka_new(type, conf, errstr, sizeof errstr);
  if (rk == nullptr) {
    rd_kafka_conf_destroy(conf);
    throw std::runtime_error(std::string("rd_kafka_new: ") + errstr);
  }
  return rk;  // rk owns conf now
}

int RemainingMs(Clock::time_point deadline, int cap_ms) {
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, cap_ms));
}

// Partition count of `topic` from metadata, retried until the mock knows the topic or the
// deadline passes (then 0).
int PartitionCount(rd_kafka_t* rk, const std::string& topic, Clock::time_point deadline) {
  rd_kafka_topic_t* rkt = rd_kafka_topic_new(rk, topic.c_str(), nullptr);
  if (rkt == nullptr) throw std::runtime_error("rd_kafka_topic_new(" + topic + ") failed");
  int partitions = 0;
  while (true) {
    const rd_kafka_metadata_t* md = nullptr;
    const rd_kafka_resp_err_t err =
        rd_kafka_metadata(rk, 0, rkt, &md, std::max(RemainingMs(deadline, 2000), 100));
    if (err == RD_KAFKA_RESP_ERR_NO_ERROR && md != nullptr) {
      if (md->topic_cnt == 1 && md->topics[0].err == RD_KAFKA_RESP_ERR_NO_ERROR) {
        partitions = md->topics[0].partition_cnt;
      }
      rd_kafka_metadata_destroy(md);
    }
    if (partitions > 0 || Clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // poll interval, not a wait
  }
  rd_kafka_topic_destroy(rkt);
  return partitions;
}

}  // namespace

KafkaMockCluster::KafkaMockCluster(int brokers) : brokers_(brokers) {
  if (brokers < 1) throw std::invalid_argument("KafkaMockCluster needs at least one broker");
  rd_kafka_conf_t* conf = rd_kafka_conf_new();
  // This handle only hosts the mock brokers; it has no bootstrap.servers on purpose, which
  // librdkafka would warn about at level 4.
  SetConf(conf, "log_level", "3");
  owner_ = NewClient(RD_KAFKA_PRODUCER, conf);
  cluster_ = rd_kafka_mock_cluster_new(owner_, brokers);
  if (cluster_ == nullptr) {
    rd_kafka_destroy(owner_);
    owner_ = nullptr;
    throw std::runtime_error("rd_kafka_mock_cluster_new failed");
  }
}

KafkaMockCluster::~KafkaMockCluster() {
  if (cluster_ != nullptr) rd_kafka_mock_cluster_destroy(cluster_);
  if (owner_ != nullptr) rd_kafka_destroy(owner_);
}

std::string KafkaMockCluster::bootstraps() const {
  return rd_kafka_mock_cluster_bootstraps(cluster_);
}

void KafkaMockCluster::CreateTopic(const std::string& topic, int partitions, int replication) {
  const rd_kafka_resp_err_t err =
      rd_kafka_mock_topic_create(cluster_, topic.c_str(), partitions, replication);
  if (err != RD_KAFKA_RESP_ERR_NO_ERROR) {
    throw std::runtime_error("rd_kafka_mock_topic_create(" + topic + "): " + rd_kafka_err2str(err));
  }
}

void KafkaMockCluster::SetBrokerDown(int broker_id, bool down) {
  if (broker_id < 1 || broker_id > brokers_) {
    throw std::out_of_range("mock broker id " + std::to_string(broker_id) + " not in 1.." +
                            std::to_string(brokers_));
  }
  const rd_kafka_resp_err_t err = down ? rd_kafka_mock_broker_set_down(cluster_, broker_id)
                                       : rd_kafka_mock_broker_set_up(cluster_, broker_id);
  if (err != RD_KAFKA_RESP_ERR_NO_ERROR) {
    throw std::runtime_error("rd_kafka_mock_broker_set_" + std::string(down ? "down" : "up") +
                             ": " + rd_kafka_err2str(err));
  }
}

void KafkaMockCluster::SetAllBrokersDown(bool down) {
  for (int id = 1; id <= brokers_; ++id) SetBrokerDown(id, down);
}

void KafkaMockCluster::SetAllBrokersRtt(std::chrono::milliseconds rtt) {
  for (int id = 1; id <= brokers_; ++id) {
    const rd_kafka_resp_err_t err =
        rd_kafka_mock_broker_set_rtt(cluster_, id, static_cast<int>(rtt.count()));
    if (err != RD_KAFKA_RESP_ERR_NO_ERROR) {
      throw std::runtime_error("rd_kafka_mock_broker_set_rtt: " + std::string(rd_kafka_err2str(err)));
    }
  }
}

void KafkaMockCluster::PushRequestErrors(int16_t api_key,
                                         const std::vector<rd_kafka_resp_err_t>& errors) {
  if (errors.empty()) return;
  rd_kafka_mock_push_request_errors_array(cluster_, api_key, errors.size(), errors.data());
}

rd_kafka_mock_cluster_t* KafkaMockCluster::raw() const { return cluster_; }

std::vector<ConsumedRecord> KafkaMockCluster::ConsumeAll(const std::string& topic,
                                                         std::size_t min_count,
                                                         std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  rd_kafka_conf_t* conf = rd_kafka_conf_new();
  SetConf(conf, "bootstrap.servers", bootstraps());
  SetConf(conf, "group.id",
          "outbox-test-consume-all-" + std::to_string(::getpid()) + "-" +
              std::to_string(g_consumer_counter.fetch_add(1)));
  SetConf(conf, "auto.offset.reset", "earliest");
  SetConf(conf, "enable.auto.commit", "false");
  SetConf(conf, "enable.auto.offset.store", "false");
  SetConf(conf, "enable.partition.eof", "true");
  SetConf(conf, "fetch.wait.max.ms", "10");  // reach end-of-partition quickly
  rd_kafka_t* rk = NewClient(RD_KAFKA_CONSUMER, conf);
  rd_kafka_poll_set_consumer(rk);

  std::vector<ConsumedRecord> records;
  try {
    const int partitions = PartitionCount(rk, topic, deadline);
    if (partitions > 0) {
      rd_kafka_topic_partition_list_t* assignment = rd_kafka_topic_partition_list_new(partitions);
      for (int p = 0; p < partitions; ++p) {
        rd_kafka_topic_partition_list_add(assignment, topic.c_str(), p)->offset =
            RD_KAFKA_OFFSET_BEGINNING;
      }
      const rd_kafka_resp_err_t err = rd_kafka_assign(rk, assignment);
      rd_kafka_topic_partition_list_destroy(assignment);
      if (err != RD_KAFKA_RESP_ERR_NO_ERROR) {
        throw std::runtime_error(std::string("rd_kafka_assign: ") + rd_kafka_err2str(err));
      }

      // A partition counts as drained after an end-of-partition event with no record since.
      std::vector<bool> at_end(static_cast<std::size_t>(partitions), false);
      while (true) {
        const bool all_at_end = std::all_of(at_end.begin(), at_end.end(), [](bool b) { return b; });
        if (records.size() >= min_count && all_at_end) break;
        if (Clock::now() >= deadline) break;
        rd_kafka_message_t* msg =
            rd_kafka_consumer_poll(rk, std::max(RemainingMs(deadline, 100), 1));
        if (msg == nullptr) continue;
        const auto part = static_cast<std::size_t>(msg->partition);
        if (msg->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) {
          if (part < at_end.size()) at_end[part] = true;
        } else if (msg->err == RD_KAFKA_RESP_ERR_NO_ERROR) {
          if (part < at_end.size()) at_end[part] = false;
          ConsumedRecord rec;
          rec.topic = msg->rkt != nullptr ? rd_kafka_topic_name(msg->rkt) : topic;
          rec.partition = msg->partition;
          rec.offset = msg->offset;
          if (msg->key != nullptr) {
            rec.key = std::string(static_cast<const char*>(msg->key), msg->key_len);
          }
          if (msg->payload != nullptr) {
            rec.value.assign(static_cast<const char*>(msg->payload), msg->len);
          }
          rd_kafka_headers_t* hdrs = nullptr;
          if (rd_kafka_message_headers(msg, &hdrs) == RD_KAFKA_RESP_ERR_NO_ERROR &&
              hdrs != nullptr) {
            const char* name = nullptr;
            const void* value = nullptr;
            size_t size = 0;
            for (size_t i = 0; rd_kafka_header_get_all(hdrs, i, &name, &value, &size) ==
                               RD_KAFKA_RESP_ERR_NO_ERROR;
                 ++i) {
              rec.headers[name] = value != nullptr
                                      ? std::string(static_cast<const char*>(value), size)
                                      : std::string();
            }
          }
          records.push_back(std::move(rec));
        }
        // Other errors (broker down, transport) are transient for this purpose: keep polling.
        rd_kafka_message_destroy(msg);
      }
    }
  } catch (...) {
    rd_kafka_consumer_close(rk);
    rd_kafka_destroy(rk);
    throw;
  }
  rd_kafka_consumer_close(rk);
  rd_kafka_destroy(rk);
  return records;
}

}  // namespace outbox::testing
