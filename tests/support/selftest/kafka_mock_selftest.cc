#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "outbox_test/kafka_mock.h"
#include "outbox_test/wait.h"

namespace outbox::testing {
namespace {

using namespace std::chrono_literals;

// A plain librdkafka producer that records delivery reports.
class Producer {
 public:
  Producer(const std::string& bootstraps, const std::map<std::string, std::string>& extra = {}) {
    rd_kafka_conf_t* conf = rd_kafka_conf_new();
    char errstr[512];
    std::map<std::string, std::string> settings{
        {"bootstrap.servers", bootstraps}, {"retry.backoff.ms", "10"}, {"linger.ms", "0"}};
    for (const auto& [k, v] : extra) settings[k] = v;
    for (const auto& [k, v] : settings) {
      if (rd_kafka_conf_set(conf, k.c_str(), v.c_str(), errstr, sizeof errstr) !=
          RD_KAFKA_CONF_OK) {
        ADD_FAILURE() << k << ": " << errstr;
      }
    }
    rd_kafka_conf_set_opaque(conf, this);
    rd_kafka_conf_set_dr_msg_cb(conf, [](rd_kafka_t* rk, const rd_kafka_message_t* msg, void*) {
      auto* self = static_cast<Producer*>(rd_kafka_opaque(rk));
      std::lock_guard<std::mutex> lock(self->mu_);
      self->reports_.push_back(msg->err);
    });
    rk_ = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof errstr);
    if (rk_ == nullptr) ADD_FAILURE() << "rd_kafka_new: " << errstr;
  }
  ~Producer() {
    rd_kafka_flush(rk_, 5000);
    rd_kafka_destroy(rk_);
  }

  void Produce(const std::string& topic, const std::optional<std::string>& key,
               const std::string& value,
               const std::vector<std::pair<std::string, std::string>>& headers = {}) {
    rd_kafka_headers_t* hdrs = rd_kafka_headers_new(headers.size());
    for (const auto& [name, val] : headers) {
      rd_kafka_header_add(hdrs, name.data(), static_cast<ssize_t>(name.size()), val.data(),
                          static_cast<ssize_t>(val.size()));
    }
    void* key_ptr = key ? const_cast<char*>(key->data()) : nullptr;
    const std::size_t key_len = key ? key->size() : 0;
    const rd_kafka_resp_err_t err = rd_kafka_producev(
        rk_, RD_KAFKA_V_TOPIC(topic.c_str()), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
        RD_KAFKA_V_KEY(key_ptr, key_len),
        RD_KAFKA_V_VALUE(const_cast<char*>(value.data()), value.size()), RD_KAFKA_V_HEADERS(hdrs),
        RD_KAFKA_V_END);
    if (err != RD_KAFKA_RESP_ERR_NO_ERROR) {
      rd_kafka_headers_destroy(hdrs);
      ADD_FAILURE() << "producev: " << rd_kafka_err2str(err);
    }
  }

  // Waits until `n` delivery reports arrived; returns them.
  std::vector<rd_kafka_resp_err_t> WaitReports(std::size_t n, std::chrono::milliseconds timeout) {
    WaitFor(
        [&] {
          rd_kafka_poll(rk_, 10);
          std::lock_guard<std::mutex> lock(mu_);
          return reports_.size() >= n;
        },
        timeout, 1ms);
    std::lock_guard<std::mutex> lock(mu_);
    return reports_;
  }

 private:
  rd_kafka_t* rk_ = nullptr;
  std::mutex mu_;
  std::vector<rd_kafka_resp_err_t> reports_;
};

const ConsumedRecord* FindByValue(const std::vector<ConsumedRecord>& records,
                                  const std::string& value) {
  for (const auto& r : records) {
    if (r.value == value) return &r;
  }
  return nullptr;
}

TEST(KafkaMockTest, ProducedRecordsAreReadBackWithKeysAndHeaders) {
  KafkaMockCluster kafka(3);
  const std::string bootstraps = kafka.bootstraps();
  EXPECT_EQ(std::count(bootstraps.begin(), bootstraps.end(), ','), 2) << bootstraps;
  kafka.CreateTopic("orders", 3);
  Producer producer(kafka.bootstraps());
  producer.Produce("orders", std::string("k1"), "v1", {{"h1", "a"}, {"h2", "b"}, {"h1", "c"}});
  producer.Produce("orders", std::nullopt, "v2");
  const auto reports = producer.WaitReports(2, 20s);
  ASSERT_EQ(reports.size(), 2u);
  EXPECT_EQ(reports[0], RD_KAFKA_RESP_ERR_NO_ERROR);
  EXPECT_EQ(reports[1], RD_KAFKA_RESP_ERR_NO_ERROR);

  const auto records = kafka.ConsumeAll("orders", 2, 20s);
  ASSERT_EQ(records.size(), 2u);
  const ConsumedRecord* r1 = FindByValue(records, "v1");
  ASSERT_NE(r1, nullptr);
  EXPECT_EQ(r1->topic, "orders");
  EXPECT_EQ(r1->key, std::optional<std::string>("k1"));
  EXPECT_EQ(r1->headers, (std::map<std::string, std::string>{{"h1", "c"}, {"h2", "b"}}));
  EXPECT_GE(r1->partition, 0);
  EXPECT_LT(r1->partition, 3);
  const ConsumedRecord* r2 = FindByValue(records, "v2");
  ASSERT_NE(r2, nullptr);
  EXPECT_FALSE(r2->key.has_value());
  EXPECT_TRUE(r2->headers.empty());
}

TEST(KafkaMockTest, ConsumeAllReadsToTheEndAndReturnsEarlyOnEmptyTopic) {
  KafkaMockCluster kafka(1);
  kafka.CreateTopic("empty", 2);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(kafka.ConsumeAll("empty", 0, 30s).empty());
  EXPECT_LT(std::chrono::steady_clock::now() - start, 20s) << "should stop at end of partitions";

  kafka.CreateTopic("three", 2);
  Producer producer(kafka.bootstraps());
  for (const char* v : {"a", "b", "c"}) producer.Produce("three", std::nullopt, v);
  ASSERT_EQ(producer.WaitReports(3, 20s).size(), 3u);
  // min_count 1 still reads everything that is there.
  EXPECT_EQ(kafka.ConsumeAll("three", 1, 20s).size(), 3u);
  // Asking for more than exists returns what there is when the timeout passes.
  EXPECT_EQ(kafka.ConsumeAll("three", 4, 5s).size(), 3u);
}

TEST(KafkaMockTest, BrokerDownMakesProduceTimeOutUntilItIsUpAgain) {
  KafkaMockCluster kafka(1);
  kafka.CreateTopic("t", 1);
  kafka.SetBrokerDown(1, true);
  Producer producer(kafka.bootstraps(), {{"message.timeout.ms", "1500"}});
  producer.Produce("t", std::nullopt, "lost");
  auto reports = producer.WaitReports(1, 20s);
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0], RD_KAFKA_RESP_ERR__MSG_TIMED_OUT) << rd_kafka_err2str(reports[0]);

  kafka.SetBrokerDown(1, false);
  producer.Produce("t", std::nullopt, "delivered");
  reports = producer.WaitReports(2, 20s);
  ASSERT_EQ(reports.size(), 2u);
  EXPECT_EQ(reports[1], RD_KAFKA_RESP_ERR_NO_ERROR) << rd_kafka_err2str(reports[1]);
  const auto records = kafka.ConsumeAll("t", 1, 20s);
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0].value, "delivered");
  EXPECT_THROW(kafka.SetBrokerDown(2, true), std::out_of_range);
}

TEST(KafkaMockTest, AllBrokersDownAndUp) {
  KafkaMockCluster kafka(3);
  kafka.CreateTopic("t", 3);
  kafka.SetAllBrokersDown(true);
  Producer producer(kafka.bootstraps(), {{"message.timeout.ms", "1500"}});
  producer.Produce("t", std::nullopt, "lost");
  auto reports = producer.WaitReports(1, 20s);
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0], RD_KAFKA_RESP_ERR__MSG_TIMED_OUT) << rd_kafka_err2str(reports[0]);

  kafka.SetAllBrokersDown(false);
  producer.Produce("t", std::nullopt, "delivered");
  reports = producer.WaitReports(2, 20s);
  ASSERT_EQ(reports.size(), 2u);
  EXPECT_EQ(reports[1], RD_KAFKA_RESP_ERR_NO_ERROR) << rd_kafka_err2str(reports[1]);
}

TEST(KafkaMockTest, PushedProduceErrorsAreRetriedOrFatal) {
  KafkaMockCluster kafka(1);
  kafka.CreateTopic("t", 1);
  Producer producer(kafka.bootstraps());
  // Retriable errors: the producer retries and the record lands once.
  kafka.PushRequestErrors(RD_KAFKAP_Produce, {RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS,
                                              RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS});
  producer.Produce("t", std::nullopt, "retried");
  auto reports = producer.WaitReports(1, 20s);
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0], RD_KAFKA_RESP_ERR_NO_ERROR) << rd_kafka_err2str(reports[0]);

  // A permanent error fails the delivery.
  kafka.PushRequestErrors(RD_KAFKAP_Produce, {RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED});
  producer.Produce("t", std::nullopt, "refused");
  reports = producer.WaitReports(2, 20s);
  ASSERT_EQ(reports.size(), 2u);
  EXPECT_EQ(reports[1], RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED)
      << rd_kafka_err2str(reports[1]);

  const auto records = kafka.ConsumeAll("t", 1, 20s);
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0].value, "retried");
  EXPECT_NE(kafka.raw(), nullptr);
}

}  // namespace
}  // namespace outbox::testing
