// The Kafka side, in its own process: librdkafka's mock cluster (the real protocol on
// loopback) and a consumer that timestamps every record it reads.
//
// Commands:
//   START brokers                     -> OK <bootstrap.servers>
//   TOPIC name partitions             -> OK
//   CONSUME name partitions           -> OK     (reads the topic from the beginning)
//   COUNT                             -> OK <records read>
//   FINISH expected timeout_s db_url|- ref_us
//       waits until `expected` records were read (or the timeout), stops the consumer and
//       answers OK <json>: counts, duplicates, per-key order violations and the
//       enqueue-to-delivery latency of every record. Its start is the message's exact
//       created_at from bench.created when db_url has it, else the created-at header (ms
//       resolution, so up to 1 ms too long); with ref_us > 0 it is that instant instead
//       (a burst's deliver time).
#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <atomic>
#include <cstdio>
#include <ctime>
#include <memory>
#include <stdexcept>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common.h"
#include "helper.h"
#include "workload.h"

namespace outbox::bench {
namespace {

void Set(rd_kafka_conf_t* conf, const char* name, const std::string& value) {
  char err[512];
  if (rd_kafka_conf_set(conf, name, value.c_str(), err, sizeof err) != RD_KAFKA_CONF_OK) {
    throw std::runtime_error(std::string(name) + ": " + err);
  }
}

rd_kafka_t* NewClient(rd_kafka_type_t type, rd_kafka_conf_t* conf) {
  char err[512];
  rd_kafka_t* rk = rd_kafka_new(type, conf, err, sizeof err);
  if (rk == nullptr) throw std::runtime_error(std::string("rd_kafka_new: ") + err);
  return rk;
}

// "2024-05-01T12:34:56.789Z" -> microseconds since the epoch; 0 if malformed.
std::int64_t ParseCreatedAt(const std::string& text) {
  std::tm tm{};
  int ms = 0;
  if (std::sscanf(text.c_str(), "%d-%d-%dT%d:%d:%d.%dZ", &tm.tm_year, &tm.tm_mon, &tm.tm_mday,
                  &tm.tm_hour, &tm.tm_min, &tm.tm_sec, &ms) != 7) {
    return 0;
  }
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  return static_cast<std::int64_t>(timegm(&tm)) * 1'000'000 + ms * 1000;
}

std::string Header(rd_kafka_headers_t* headers, const char* name) {
  const void* value = nullptr;
  std::size_t size = 0;
  if (headers == nullptr ||
      rd_kafka_header_get_last(headers, name, &value, &size) != RD_KAFKA_RESP_ERR_NO_ERROR) {
    return "";
  }
  return std::string(static_cast<const char*>(value), size);
}

struct Arrival {
  std::int64_t id = 0;
  std::int64_t header_created_us = 0;
  std::int64_t at_us = 0;
};

class Consumer {
 public:
  Consumer(const std::string& bootstraps, const std::string& topic, int partitions) {
    static int counter = 0;
    rd_kafka_conf_t* conf = rd_kafka_conf_new();
    Set(conf, "bootstrap.servers", bootstraps);
    Set(conf, "group.id", "outbox-bench-" + std::to_string(::getpid()) + "-" + std::to_string(++counter));
    Set(conf, "enable.auto.commit", "false");
    Set(conf, "auto.offset.reset", "earliest");
    // The mock broker holds an empty fetch for the whole fetch.wait.max.ms instead of
    // answering when data arrives, so this bounds what the consumer adds to latencies.
    Set(conf, "fetch.wait.max.ms", "1");
    Set(conf, "log_level", "3");
    rk_ = NewClient(RD_KAFKA_CONSUMER, conf);
    rd_kafka_poll_set_consumer(rk_);
    rd_kafka_topic_partition_list_t* list = rd_kafka_topic_partition_list_new(partitions);
    for (int p = 0; p < partitions; ++p) {
      rd_kafka_topic_partition_list_add(list, topic.c_str(), p)->offset = RD_KAFKA_OFFSET_BEGINNING;
    }
    rd_kafka_assign(rk_, list);
    rd_kafka_topic_partition_list_destroy(list);
    arrivals_.reserve(1 << 20);
    thread_ = std::thread([this] { Run(); });
  }

  ~Consumer() {
    Stop();
    rd_kafka_consumer_close(rk_);
    rd_kafka_destroy(rk_);
  }

  std::size_t count() const { return count_.load(); }

  void Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }

  // Valid after Stop().
  const std::vector<Arrival>& arrivals() const { return arrivals_; }
  std::int64_t order_violations() const { return order_violations_; }

 private:
  void Run() {
    while (!stop_) {
      rd_kafka_message_t* m = rd_kafka_consumer_poll(rk_, 100);
      if (m == nullptr) continue;
      if (m->err == RD_KAFKA_RESP_ERR_NO_ERROR) {
        Arrival a;
        a.at_us = WallMicros();
        rd_kafka_headers_t* headers = nullptr;
        if (rd_kafka_message_headers(m, &headers) != RD_KAFKA_RESP_ERR_NO_ERROR) headers = nullptr;
        const std::string id = Header(headers, "outbox-id");
        a.id = id.empty() ? 0 : std::stoll(id);
        a.header_created_us = ParseCreatedAt(Header(headers, "created-at"));
        if (m->key != nullptr) {
          // Per-key order: within a key, outbox ids must only go up.
          auto [it, fresh] = last_id_by_key_.try_emplace(
              std::string(static_cast<const char*>(m->key), m->key_len), a.id);
          if (!fresh) {
            if (a.id < it->second) ++order_violations_;
            it->second = std::max(it->second, a.id);
          }
        }
        arrivals_.push_back(a);
        ++count_;
      }
      rd_kafka_message_destroy(m);
    }
  }

  rd_kafka_t* rk_ = nullptr;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<std::size_t> count_{0};
  std::vector<Arrival> arrivals_;
  std::unordered_map<std::string, std::int64_t> last_id_by_key_;
  std::int64_t order_violations_ = 0;
};

nlohmann::json Summary(const Consumer& consumer, const std::string& db_url, std::int64_t ref_us) {
  const auto created = LoadCreatedAt(db_url);
  std::vector<std::int64_t> latencies;
  latencies.reserve(consumer.arrivals().size());
  std::unordered_set<std::int64_t> distinct;
  std::int64_t exact = 0, from_header = 0;
  for (const auto& a : consumer.arrivals()) {
    distinct.insert(a.id);
    std::int64_t start = ref_us;
    if (start <= 0) {
      if (auto it = created.by_id.find(a.id); it != created.by_id.end()) {
        start = it->second;
        ++exact;
      } else {
        start = a.header_created_us;
        ++from_header;
      }
    }
    if (start > 0) latencies.push_back(a.at_us - start);
  }
  nlohmann::json j;
  j["received"] = consumer.arrivals().size();
  j["distinct"] = distinct.size();
  j["duplicates"] = consumer.arrivals().size() - distinct.size();
  j["order_violations"] = consumer.order_violations();
  j["latency_source"] = ref_us > 0              ? "deliver_after (burst instant)"
                        : from_header == 0      ? "created_at (exact, bench.created)"
                        : exact == 0            ? "created-at header (ms resolution)"
                                                : "created_at exact + header for the rest";
  j["latency"] = LatencySummary(std::move(latencies));
  return j;
}

}  // namespace

int RunKafkaHelper() {
  rd_kafka_t* owner = nullptr;
  rd_kafka_mock_cluster_t* cluster = nullptr;
  std::string bootstraps;
  std::unique_ptr<Consumer> consumer;

  const int rc = ServeCommands([&](const std::vector<std::string>& w) -> std::string {
    const std::string& cmd = w[0];
    if (cmd == "START" && w.size() == 2 && cluster == nullptr) {
      rd_kafka_conf_t* conf = rd_kafka_conf_new();
      Set(conf, "log_level", "3");
      owner = NewClient(RD_KAFKA_PRODUCER, conf);
      cluster = rd_kafka_mock_cluster_new(owner, std::stoi(w[1]));
      if (cluster == nullptr) throw std::runtime_error("rd_kafka_mock_cluster_new failed");
      bootstraps = rd_kafka_mock_cluster_bootstraps(cluster);
      return bootstraps;
    }
    if (cmd == "TOPIC" && w.size() == 3 && cluster != nullptr) {
      const auto err = rd_kafka_mock_topic_create(cluster, w[1].c_str(), std::stoi(w[2]), 1);
      if (err != RD_KAFKA_RESP_ERR_NO_ERROR) throw std::runtime_error(rd_kafka_err2str(err));
      return "";
    }
    if (cmd == "CONSUME" && w.size() == 3 && cluster != nullptr) {
      consumer.reset();
      consumer = std::make_unique<Consumer>(bootstraps, w[1], std::stoi(w[2]));
      return "";
    }
    if (cmd == "COUNT" && consumer) return std::to_string(consumer->count());
    if (cmd == "FINISH" && w.size() == 5 && consumer) {
      const auto expected = static_cast<std::size_t>(std::stoll(w[1]));
      const double deadline = MonoSeconds() + std::stod(w[2]);
      while (consumer->count() < expected && MonoSeconds() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      consumer->Stop();
      const auto summary = Summary(*consumer, w[3] == "-" ? "" : w[3], std::stoll(w[4]));
      consumer.reset();
      return summary.dump();
    }
    throw std::runtime_error("bad command");
  });
  consumer.reset();
  if (cluster != nullptr) rd_kafka_mock_cluster_destroy(cluster);
  if (owner != nullptr) rd_kafka_destroy(owner);
  return rc;
}

}  // namespace outbox::bench
