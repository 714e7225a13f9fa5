// librdkafka's mock cluster: the real Kafka protocol on loopback ports, in-process.
#pragma once

#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace outbox::testing {

struct ConsumedRecord {
  std::string topic;
  int partition = 0;
  std::int64_t offset = 0;
  std::optional<std::string> key;
  std::string value;
  std::map<std::string, std::string> headers;  ///< Last value wins for repeated names.
};

class KafkaMockCluster {
 public:
  /// Starts a mock cluster with `brokers` brokers on 127.0.0.1.
  explicit KafkaMockCluster(int brokers = 3);
  ~KafkaMockCluster();
  KafkaMockCluster(const KafkaMockCluster&) = delete;
  KafkaMockCluster& operator=(const KafkaMockCluster&) = delete;

  /// bootstrap.servers for clients, e.g. "127.0.0.1:40001,127.0.0.1:40002".
  std::string bootstraps() const;
  void CreateTopic(const std::string& topic, int partitions = 3, int replication = 1);
  /// Take broker `broker_id` (1-based) down or bring it back up.
  void SetBrokerDown(int broker_id, bool down);
  /// Every broker down / up.
  void SetAllBrokersDown(bool down);
  /// The next requests of `api_key` (e.g. RD_KAFKAP_Produce) fail with these errors, in order.
  void PushRequestErrors(int16_t api_key, const std::vector<rd_kafka_resp_err_t>& errors);
  rd_kafka_mock_cluster_t* raw() const;

  /// Reads every record of `topic` from the beginning with an independent consumer until
  /// at least `min_count` were read or `timeout` passed; returns what was read.
  std::vector<ConsumedRecord> ConsumeAll(const std::string& topic, std::size_t min_count,
                                         std::chrono::milliseconds timeout);

 private:
  rd_kafka_t* owner_ = nullptr;  // the handle that owns the mock cluster
  rd_kafka_mock_cluster_t* cluster_ = nullptr;
  int brokers_ = 0;
};

}  // namespace outbox::testing
