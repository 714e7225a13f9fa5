// outbox-dev-broker: a local Kafka-protocol broker for development and the quickstart.
// It is librdkafka's mock cluster: it speaks the real protocol on loopback ports, keeps
// everything in memory, and is gone when this process exits. Never use it in production.
#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <iostream>

int main(int argc, char** argv) {
  CLI::App app{
      "outbox-dev-broker: in-memory Kafka-protocol broker (librdkafka mock cluster) for local use"};
  int brokers = 1;
  int partitions = 3;
  std::vector<std::string> topics;
  std::string bootstrap_file;
  app.add_option("--brokers", brokers, "Number of brokers")->check(CLI::Range(1, 9));
  app.add_option("--partitions", partitions, "Partitions per topic")->check(CLI::Range(1, 64));
  app.add_option("--topic,-t", topics, "Topic to create (repeatable)");
  app.add_option("--bootstrap-file", bootstrap_file, "Write bootstrap.servers to this file");
  CLI11_PARSE(app, argc, argv);

  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);

  char err[512];
  rd_kafka_conf_t* conf = rd_kafka_conf_new();
  rd_kafka_t* rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof err);
  if (!rk) {
    std::cerr << "error: " << err << "\n";
    return 1;
  }
  rd_kafka_mock_cluster_t* mc = rd_kafka_mock_cluster_new(rk, brokers);
  if (!mc) {
    std::cerr << "error: could not start the mock cluster\n";
    return 1;
  }
  for (const auto& t : topics) {
    if (rd_kafka_mock_topic_create(mc, t.c_str(), partitions, 1) != RD_KAFKA_RESP_ERR_NO_ERROR) {
      std::cerr << "error: could not create topic " << t << "\n";
      return 1;
    }
  }
  const std::string bootstraps = rd_kafka_mock_cluster_bootstraps(mc);
  if (!bootstrap_file.empty()) {
    std::ofstream(bootstrap_file) << bootstraps << "\n";
  }
  std::cout << "outbox-dev-broker: listening on " << bootstraps << " (Ctrl-C to stop)" << std::endl;
  int sig = 0;
  sigwait(&set, &sig);
  rd_kafka_mock_cluster_destroy(mc);
  rd_kafka_destroy(rk);
  std::cout << "outbox-dev-broker: stopped" << std::endl;
  return 0;
}
