// outbox-bench: the relay's throughput and latency next to the ceilings of the same
// machine, measured in one run. See docs/benchmarks.md.
//
//   outbox-bench --quick --out bench-results/quick
//
// stdout: one JSON line per scenario as it finishes, then a markdown table. Progress goes
// to stderr. The exit status is 0 when every scenario ran (missed targets are results, not
// failures) and 1 when one could not run.
#include <signal.h>
#include <spdlog/cfg/env.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <cstring>
#include <iostream>
#include <sstream>

#include "call_probe.h"
#include "common.h"
#include "helper.h"
#include "outbox_relay/postgres_endpoint_directory.h"
#include "pg_server.h"
#include "report.h"
#include "scenarios.h"
#include "workload.h"

namespace {

using outbox::bench::Options;

std::string CommandLine(int argc, char** argv) {
  std::string out;
  for (int i = 0; i < argc; ++i) {
    if (i > 0) out += ' ';
    out += argv[i];
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::strcmp(argv[1], "--helper") == 0) return outbox::bench::RunHelper(argv[2]);
  ::signal(SIGPIPE, SIG_IGN);
  spdlog::set_level(spdlog::level::warn);
  spdlog::cfg::load_env_levels();  // SPDLOG_LEVEL=debug shows the relay's retries and reasons
  outbox::relay::SetEndpointDirectoryFactory(outbox::relay::MakePostgresEndpointDirectory);

  Options opt;
  std::string only;
  CLI::App app{"outbox-bench: relay throughput and latency against the ceilings of this machine"};
  app.add_flag("--quick", opt.quick,
               "Smaller run for development: 100k Kafka backlog, 50k webhook, burst and "
               "claim-mode drains, 15 s sustained, 10 s open loop (explicit sizes still win)");
  app.add_option("--database-url", opt.database_url,
                 "Use this database instead of a throwaway cluster (its outbox is emptied "
                 "before each scenario)");
  app.add_flag("--wipe", opt.wipe,
               "Allow --database-url to have queued messages (they are deleted)");
  app.add_option("--pg-bin", opt.pg_bin, "PostgreSQL 15 binaries for the throwaway cluster")
      ->capture_default_str();
  app.add_flag(
      "--statement-stats", opt.statement_stats,
      "Load pg_stat_statements in the throwaway cluster and report, per SQL ceiling, Kafka "
      "or webhook drain, open loop and sustained scenario, each statement's execution "
      "and planning time, WAL and shared buffers per delivered message "
      "(details.statements), and, but for the sustained scenario, the Postgres CPU of "
      "each process by what it ran (details.postgres_cpu_us_per_msg_by_process)");
  app.add_option("--pg-setting", opt.pg_settings,
                 "Extra server setting name=value for the throwaway cluster (repeatable)");
  std::string trace_claims;
  app.add_option("--trace-claims", trace_claims,
                 "Write every relay claim (cursor, sequence value, leased ids) to this file");
  app.add_option("--out", opt.out_dir,
                 "Also write results (JSON lines, markdown, TSV for plots) here");
  app.add_option("--only", only, "Comma-separated scenarios to run (default: all)");
  auto* kafka_n =
      app.add_option("--kafka-messages", opt.kafka_messages, "Kafka backlog (and SQL ceiling) size")
          ->capture_default_str();
  auto* webhook_n = app.add_option("--webhook-messages", opt.webhook_messages,
                                   "Webhook backlog and HTTP-ceiling requests")
                        ->capture_default_str();
  auto* burst_n = app.add_option("--burst-messages", opt.burst_messages, "Messages in the burst")
                      ->capture_default_str();
  auto* scale_n = app.add_option("--scale-messages", opt.scale_messages,
                                 "Backlog of each claim-mode drain (1/2/4 relays, both modes)")
                      ->capture_default_str();
  app.add_option("--scale-relays", opt.scale_relays, "Relay counts compared in each claim mode")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--keys", opt.keys, "Distinct ordering keys in the keyed scenarios")
      ->capture_default_str();
  std::size_t payload_bytes = 0;
  app.add_option("--payload-bytes", payload_bytes,
                 "Every message's payload this many bytes (its note padded; 0: a ~200-byte event), "
                 "e.g. --only webhook_drain --webhook-messages 3000 --payload-bytes 524288 to see "
                 "max_in_flight_bytes bound the relay's memory (peak RSS)")
      ->check(CLI::Range(std::size_t{0}, std::size_t{1} << 20));
  auto* sustained_s =
      app.add_option("--sustained-seconds", opt.sustained_seconds, "Sustained-load duration")
          ->capture_default_str();
  app.add_option("--producers", opt.producers, "Producer connections (sustained)")
      ->capture_default_str();
  app.add_option("--producer-batch", opt.producer_batch,
                 "Messages per producer transaction (sustained)")
      ->capture_default_str();
  app.add_option("--open-loop-rate", opt.open_loop_rate, "Messages per second (open loop)")
      ->capture_default_str();
  auto* open_loop_s =
      app.add_option("--open-loop-seconds", opt.open_loop_seconds, "Open-loop duration")
          ->capture_default_str();
  app.add_option("--webhook-connections", opt.webhook_connections,
                 "Relay max_in_flight and HTTP-ceiling client threads")
      ->capture_default_str();
  app.add_option("--webhook-sweep", opt.webhook_sweep,
                 "max_in_flight of each webhook_drain_mif<N> drain (half the webhook messages)")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option(
         "--claim-connections", opt.claim_connections,
         "claim_connections of the relays of every scenario but the _cc drains (exactly-once "
         "relays keep 1); 0: auto, the relay's default (a webhook sink asks for one claim loop "
         "per 8 of its max_in_flight, at most 4 and one per 4 CPUs)")
      ->check(CLI::Range(0, 16))
      ->capture_default_str();
  app.add_option("--claim-connections-sweep", opt.claim_connections_sweep,
                 "claim_connections of each kafka_drain_cc<N> and webhook_drain_cc<N> drain (one "
                 "relay; the Kafka and webhook backlogs)")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--kafka-brokers", opt.kafka_brokers, "Mock cluster brokers")
      ->capture_default_str();
  app.add_option("--kafka-partitions", opt.kafka_partitions, "Partitions per topic")
      ->capture_default_str();
  app.add_option("--timeout", opt.timeout_s, "Per-scenario timeout, seconds")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  outbox::bench::SetPayloadBytes(payload_bytes);

  if (opt.quick) {
    if (kafka_n->count() == 0) opt.kafka_messages = 100'000;
    if (webhook_n->count() == 0) opt.webhook_messages = 50'000;
    if (burst_n->count() == 0) opt.burst_messages = 50'000;
    if (scale_n->count() == 0) opt.scale_messages = 50'000;
    if (sustained_s->count() == 0) opt.sustained_seconds = 15;
    if (open_loop_s->count() == 0) opt.open_loop_seconds = 10;
  }
  std::stringstream names(only);
  for (std::string name; std::getline(names, name, ',');) {
    if (!name.empty()) opt.only.insert(name);
  }

  using namespace outbox::bench;
  if (!trace_claims.empty() && !TraceClaimsTo(trace_claims)) {
    std::cerr << "outbox-bench: cannot write " << trace_claims << "\n";
    return 1;
  }
  std::unique_ptr<PgServer> pg;
  try {
    if (opt.database_url.empty()) {
      Say("starting a throwaway PostgreSQL cluster");
      PgServer::Options pg_options;
      pg_options.bin_dir = opt.pg_bin;
      pg_options.settings = opt.pg_settings;
      if (opt.statement_stats) {
        pg_options.settings.push_back("shared_preload_libraries=pg_stat_statements");
        pg_options.settings.push_back("pg_stat_statements.track_planning=on");
      }
      pg = PgServer::StartThrowaway(pg_options);
    } else {
      pg = PgServer::UseExisting(opt.database_url, opt.wipe);
    }
  } catch (const std::exception& e) {
    std::cerr << "outbox-bench: " << e.what() << "\n";
    return 1;
  }

  const std::string machine = MachineDescription(pg->Describe());
  const std::string command = CommandLine(argc, argv);
  Say("machine:\n" + machine);

  Bench bench(opt, *pg);
  const auto results =
      bench.Run([](const ScenarioResult& r) { std::cout << ToJson(r).dump() << std::endl; });

  std::cout << "\n" << MarkdownReport(results);
  if (!opt.out_dir.empty()) {
    WriteResults(opt.out_dir, results, bench.timelines(), machine, command);
    Say("results written to " + opt.out_dir);
  }
  for (const auto& r : results) {
    if (r.details.contains("error")) return 1;
  }
  return 0;
}
