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

// Kafka protocol API keys for PushRequestErrors. librdkafka defines these in its private
// rdkafka_protocol.h, which the Debian package does not install; same names and values.
#ifndef RD_KAFKAP_Produce
#define RD_KAFKAP_Produce 0
#define RD_KAFKAP_Fetch 1
#define RD_KAFKAP_ListOffsets 2
#define RD_KAFKAP_Metadata 3
#define RD_KAFKAP_OffsetCommit 8
#define RD_KAFKAP_OffsetFetch 9
#define RD_KAFKAP_FindCoordinator 10
#define RD_KAFKAP_JoinGroup 11
#define RD_KAFKAP_Heartbeat 12
#define RD_KAFKAP_LeaveGroup 13
#define RD_KAFKAP_SyncGroup 14
#define RD_KAFKAP_ApiVersion 18
#define RD_KAFKAP_CreateTopics 19
#define RD_KAFKAP_InitProducerId 22
#define RD_KAFKAP_AddPartitionsToTxn 24
#define RD_KAFKAP_AddOffsetsToTxn 25
#define RD_KAFKAP_EndTxn 26
#define RD_KAFKAP_TxnOffsetCommit 28
#endif

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
  /// Every broker answers each request `rtt` late (0: at once), a slow network or broker.
  void SetAllBrokersRtt(std::chrono::milliseconds rtt);
  /// The next requests of `api_key` (e.g. RD_KAFKAP_Produce) fail with these errors, in order.
  /// Produce errors and the idempotent producer: the mock (librdkafka 2.0.2) checks sequence
  /// numbers only for transactional producers, so it stores a Produce request sent behind one
  /// it failed; librdkafka then takes the failed request's records as stored and reports them
  /// delivered (debug "eos": IMPLICITACK; offset -1001). A producer that gets injected Produce
  /// errors needs max.in.flight.requests.per.connection=1, or records are lost in the test.
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
