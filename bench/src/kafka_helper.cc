// The Kafka side, in its own process: librdkafka's mock cluster (the real protocol on
// loopback) and a consumer that timestamps every record it reads.
//
// Commands:
//   START brokers                     -> OK <bootstrap.servers>
//   TOPIC name partitions             -> OK
//   CONSUME name partitions           -> OK     (reads the topic from the beginning; answers
//                                                once its warm-up records arrived)
//   COUNT                             -> OK <records read>
//   PRODUCE name rate seconds         -> OK {"produced": n, "ack_latency": {...}}
//       The Kafka path without the relay: a producer with the Kafka sink's settings
//       (idempotent, acks=all, linger.ms=5, murmur2_random) writes ~200-byte records at a
//       fixed rate, each stamped with a bench-sent-us header that FINISH uses as its start.
//   FINISH expected timeout_s db_url|- ref_us
//       waits until `expected` records were read (or the timeout), stops the consumer and
//       answers OK <json>: counts, duplicates, per-key order violations and the
//       enqueue-to-delivery latency of every record. Its start is the message's exact
//       created_at from bench.created when db_url has rows there (records missing from it,
//       warm-ups, are left out), else the created-at header (ms resolution, so up to 1 ms
//       too long) or bench-sent-us; with ref_us > 0 it is that instant instead (a burst's
//       deliver time).
#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <atomic>
#include <cstdio>
#include <ctime>
#include <sstream>
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
// Named, so that its helpers do not meet those of the files built beside it in one unity
// translation unit (CMakeLists.txt).
namespace kafka_helper {
namespace {

void Set(rd_kafka_conf_t* conf, const char* name, const std::string& value) {
  char err[512];
  if (rd_kafka_conf_set(conf, name, value.c_str(), err, sizeof err) != RD_KAFKA_CONF_OK) {
    throw std::runtime_error(std::string(name) + ": " + err);
  }
}

// Extra "k=v,k=v" properties from an environment variable, for experiments with the rig.
void SetFromEnv(rd_kafka_conf_t* conf, const char* variable) {
  const char* extra = std::getenv(variable);
  if (extra == nullptr) return;
  std::stringstream in(extra);
  for (std::string kv; std::getline(in, kv, ',');) {
    const auto eq = kv.find('=');
    if (eq != std::string::npos) Set(conf, kv.substr(0, eq).c_str(), kv.substr(eq + 1));
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
  std::int64_t header_created_us = 0;  ///< created-at header, or bench-sent-us when present.
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
    SetFromEnv(conf, "OUTBOX_BENCH_CONSUMER_CONF");
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
  std::size_t warmups() const { return warmups_.load(); }

  void Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }

  // Valid after Stop().
  const std::vector<Arrival>& arrivals() const { return arrivals_; }
  std::int64_t order_violations() const { return order_violations_; }
  bool sent_stamped() const { return sent_stamped_; }

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
        if (!Header(headers, "bench-warmup").empty()) {
          ++warmups_;
          rd_kafka_message_destroy(m);
          continue;
        }
        const std::string sent = Header(headers, "bench-sent-us");
        if (!sent.empty()) sent_stamped_ = true;
        a.header_created_us = sent.empty() ? ParseCreatedAt(Header(headers, "created-at")) : std::stoll(sent);
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
  std::atomic<std::size_t> warmups_{0};
  std::vector<Arrival> arrivals_;
  std::unordered_map<std::string, std::int64_t> last_id_by_key_;
  std::int64_t order_violations_ = 0;
  bool sent_stamped_ = false;
};

nlohmann::json Summary(const Consumer& consumer, const std::string& db_url, std::int64_t ref_us) {
  const auto created = LoadCreatedAt(db_url);
  if (const char* path = std::getenv("OUTBOX_BENCH_DUMP_ARRIVALS")) {  // id, start, arrival (µs)
    if (FILE* f = std::fopen(path, "w")) {
      for (const auto& a : consumer.arrivals()) {
        const auto it = created.by_id.find(a.id);
        std::fprintf(f, "%lld\t%lld\t%lld\n", static_cast<long long>(a.id),
                     static_cast<long long>(it != created.by_id.end() ? it->second : a.header_created_us),
                     static_cast<long long>(a.at_us));
      }
      std::fclose(f);
    }
  }
  std::vector<std::int64_t> latencies;
  latencies.reserve(consumer.arrivals().size());
  std::unordered_set<std::int64_t> distinct;
  std::int64_t from_header = 0;
  for (const auto& a : consumer.arrivals()) {
    distinct.insert(a.id);
    std::int64_t start = ref_us;
    if (ref_us > 0 && a.at_us < ref_us) continue;  // a warm-up, delivered before the instant
    if (start <= 0) {
      if (auto it = created.by_id.find(a.id); it != created.by_id.end()) {
        start = it->second;
      } else if (created.by_id.empty()) {
        start = a.header_created_us;
        ++from_header;
      }  // else: not a measured message (a warm-up sent through the relay)
    }
    if (start > 0) latencies.push_back(a.at_us - start);
  }
  nlohmann::json j;
  j["received"] = consumer.arrivals().size();
  j["distinct"] = distinct.size();
  j["duplicates"] = consumer.arrivals().size() - distinct.size();
  j["order_violations"] = consumer.order_violations();
  j["latency_source"] = ref_us > 0              ? "deliver_after (burst instant)"
                        : created.by_id.empty() && from_header > 0 && consumer.sent_stamped()
                                                ? "produce() call (bench-sent-us header)"
                        : from_header == 0      ? "created_at (exact, bench.created)"
                                                : "created-at header (ms resolution)";
  j["latency"] = LatencySummary(std::move(latencies));
  return j;
}

// Produces `rate` records per second for `seconds` with the Kafka sink's producer settings
// (see relay/sinks/kafka/include/outbox_relay/kafka_sink.h); returns how many were acked
// and how long the acks took.
// A producer with the Kafka sink's settings (kafka_sink.h), plus OUTBOX_BENCH_PRODUCER_CONF.
rd_kafka_conf_t* SinkLikeProducerConf(const std::string& bootstraps) {
  rd_kafka_conf_t* conf = rd_kafka_conf_new();
  Set(conf, "bootstrap.servers", bootstraps);
  Set(conf, "enable.idempotence", "true");
  Set(conf, "acks", "all");
  Set(conf, "linger.ms", "5");
  Set(conf, "partitioner", "murmur2_random");
  Set(conf, "log_level", "3");
  SetFromEnv(conf, "OUTBOX_BENCH_PRODUCER_CONF");
  return conf;
}

// The consumer's first fetches of a fresh topic stall for ~0.5 s (measured: every record of
// the first half second arrived 0.05-0.54 s late, none after). One marker record per
// partition, waited for, gets that out of the way before anything is measured.
void WarmUp(const std::string& bootstraps, const std::string& topic, int partitions,
            const Consumer& consumer) {
  rd_kafka_t* rk = NewClient(RD_KAFKA_PRODUCER, SinkLikeProducerConf(bootstraps));
  for (int p = 0; p < partitions; ++p) {
    rd_kafka_producev(rk, RD_KAFKA_V_TOPIC(topic.c_str()), RD_KAFKA_V_PARTITION(p),
                      RD_KAFKA_V_VALUE(const_cast<char*>("warm-up"), 7),
                      RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                      RD_KAFKA_V_HEADER("bench-warmup", "1", 1), RD_KAFKA_V_END);
  }
  rd_kafka_flush(rk, 30'000);
  rd_kafka_destroy(rk);
  if (!WaitUntil([&] { return consumer.warmups() >= static_cast<std::size_t>(partitions); }, 30)) {
    throw std::runtime_error("the consumer did not see its warm-up records within 30 s");
  }
}

nlohmann::json ProduceDirect(const std::string& bootstraps, const std::string& topic, double rate,
                           double seconds) {
  rd_kafka_conf_t* conf = SinkLikeProducerConf(bootstraps);
  struct Acks {
    std::int64_t acked = 0;
    std::vector<std::int64_t> latency_us;  // produce() to delivery report
  } acks;
  rd_kafka_conf_set_opaque(conf, &acks);
  rd_kafka_conf_set_dr_msg_cb(conf, [](rd_kafka_t*, const rd_kafka_message_t* m, void* opaque) {
    auto* a = static_cast<Acks*>(opaque);  // only the poll thread runs this
    if (m->err != RD_KAFKA_RESP_ERR_NO_ERROR) return;
    ++a->acked;
    a->latency_us.push_back(WallMicros() - reinterpret_cast<std::intptr_t>(m->_private));
  });
  rd_kafka_t* rk = NewClient(RD_KAFKA_PRODUCER, conf);
  std::atomic<bool> stop{false};
  std::thread poller([&] {
    while (!stop) rd_kafka_poll(rk, 50);  // delivery reports, as the sink's poll thread
  });
  // Like the relay's sink before a scenario starts: connected, producer id acquired.
  for (int i = 0; i < 8; ++i) {
    rd_kafka_producev(rk, RD_KAFKA_V_TOPIC(topic.c_str()), RD_KAFKA_V_VALUE(const_cast<char*>("warm-up"), 7),
                      RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_HEADER("bench-warmup", "1", 1),
                      RD_KAFKA_V_OPAQUE(reinterpret_cast<void*>(static_cast<std::intptr_t>(WallMicros()))),
                      RD_KAFKA_V_END);
  }
  rd_kafka_flush(rk, 30'000);
  acks.acked = 0;
  acks.latency_us.clear();
  const auto total = static_cast<std::int64_t>(rate * seconds);
  const auto start = std::chrono::steady_clock::now();
  for (std::int64_t k = 0; k < total; ++k) {
    std::this_thread::sleep_until(start + std::chrono::microseconds(
                                              static_cast<std::int64_t>(static_cast<double>(k) * 1e6 / rate)));
    const std::string value = Payload(k);
    const std::int64_t sent_us = WallMicros();
    const std::string sent = std::to_string(sent_us);
    const std::string id = std::to_string(k + 1);
    rd_kafka_producev(rk, RD_KAFKA_V_TOPIC(topic.c_str()),
                      RD_KAFKA_V_VALUE(const_cast<char*>(value.data()), value.size()),
                      RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                      RD_KAFKA_V_OPAQUE(reinterpret_cast<void*>(static_cast<std::intptr_t>(sent_us))),
                      RD_KAFKA_V_HEADER("outbox-id", id.data(), static_cast<ssize_t>(id.size())),
                      RD_KAFKA_V_HEADER("bench-sent-us", sent.data(), static_cast<ssize_t>(sent.size())),
                      RD_KAFKA_V_END);
  }
  rd_kafka_flush(rk, 30'000);
  stop = true;
  poller.join();
  rd_kafka_destroy(rk);
  return {{"produced", acks.acked}, {"ack_latency", LatencySummary(std::move(acks.latency_us))}};
}

}  // namespace
}  // namespace kafka_helper

int RunKafkaHelper() {
  using namespace kafka_helper;
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
      WarmUp(bootstraps, w[1], std::stoi(w[2]), *consumer);
      return "";
    }
    if (cmd == "COUNT" && consumer) return std::to_string(consumer->count());
    if (cmd == "PRODUCE" && w.size() == 4 && cluster != nullptr) {
      return ProduceDirect(bootstraps, w[1], std::stod(w[2]), std::stod(w[3])).dump();
    }
    if (cmd == "FINISH" && w.size() == 5 && consumer) {
      const auto expected = static_cast<std::size_t>(std::stoll(w[1]));
      WaitUntil([&] { return consumer->count() >= expected; }, std::stod(w[2]), 20);
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
