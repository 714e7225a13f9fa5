// The scenarios of one benchmark run and what each one reports.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common.h"
#include "outbox_relay/config.h"
#include "tls_files.h"

namespace outbox::bench {

class PgServer;
class Helper;
struct Observation;

struct Options {
  bool quick = false;
  std::string database_url;  ///< Empty: start a throwaway cluster.
  bool wipe = false;
  std::string pg_bin = "/usr/lib/postgresql/15/bin";
  std::vector<std::string> pg_settings;
  /// Load pg_stat_statements and report each relay statement's Postgres time per message
  /// (Kafka drains, open loop, sustained: details.statements).
  bool statement_stats = false;
  std::string out_dir;
  std::set<std::string> only;  ///< Scenario names to run; empty: all.

  std::int64_t kafka_messages = 1'000'000;    ///< Backlog drained to Kafka (--quick: 100k).
  std::int64_t webhook_messages = 200'000;    ///< Backlog drained to the webhook (--quick: 50k).
  std::int64_t burst_messages = 200'000;      ///< Messages sharing one deliver time (--quick: 50k).
  int keys = 10'000;                          ///< Distinct ordering keys in the keyed scenarios.
  double sustained_seconds = 60;              ///< --quick: 15.
  int producers = 4;                          ///< Producer connections in the sustained scenario.
  int producer_batch = 10;                    ///< Messages per producer transaction (sustained).
  double open_loop_rate = 1000;               ///< Messages per second, open loop.
  double open_loop_seconds = 30;              ///< --quick: 10.
  std::int64_t scale_messages = 200'000;      ///< Backlog of each claim-mode drain (--quick: 50k).
  std::vector<int> scale_relays = {1, 2, 4};  ///< Relay instances compared in each claim mode.
  int webhook_connections = 32;  ///< Relay max_in_flight = HTTP-ceiling client threads.
  std::vector<int> webhook_sweep = {8, 32,
                                    128};  ///< max_in_flight of the webhook_drain_mif* drains.
  /// claim_connections of each kafka_drain_cc<N> and webhook_drain_cc<N> drain (one relay).
  std::vector<int> claim_connections_sweep = {2, 4};
  /// claim_connections of the relays of every other scenario (exactly-once ones keep 1); 0:
  /// auto, the relay's default.
  int claim_connections = 0;
  int kafka_brokers = 3;
  int kafka_partitions = 6;
  double timeout_s = 900;  ///< Per scenario; a scenario that times out reports what it did.
};

/// One issue target, checked against a baseline measured in the same run.
struct Target {
  std::string goal;          ///< e.g. "events/s >= 0.5 x SQL ceiling".
  std::string measured;      ///< e.g. "0.62 x".
  std::optional<bool> pass;  ///< Unset: could not be evaluated (baseline not run).
};

struct ScenarioResult {
  std::string name;
  std::string what;  ///< One line: what ran.
  std::string sink;  ///< "kafka", "webhook", "sql", "http".
  std::string claim_mode = "skip_locked";
  int relays = 1;  ///< Relay instances (Dispatchers) in this process.
  bool skipped = false;
  std::string skip_reason;
  bool completed = true;  ///< False when the scenario hit its timeout.

  std::int64_t messages = 0;
  int keys = 0;
  double seconds = 0;
  double events_per_s = 0;
  std::optional<double> x_sql_ceiling, x_http_ceiling;

  std::optional<Percentiles> latency;  ///< Enqueue (created_at) to consumer/receiver.
  std::string latency_source;
  std::optional<Percentiles> claim;  ///< Poll cycle: Store::Claim as the dispatcher called it.
  std::optional<Percentiles> settle;
  std::string claim_source;

  std::optional<double> relay_cpu_us_per_msg;  ///< This process (the relay) only.
  std::optional<double> pg_cpu_us_per_msg;  ///< Every Postgres process (incl. producers' backends).
  std::optional<double> helpers_cpu_us_per_msg;  ///< Mock Kafka + consumer / receiver / producers.
  std::optional<double> peak_rss_mib;            ///< This process, peak during the scenario.

  std::vector<Target> targets;
  nlohmann::json details = nlohmann::json::object();
};

/// Per-second samples of a relay scenario (written as a TSV for plots).
struct Sample {
  double t = 0;
  std::int64_t produced = 0, delivered = 0, backlog = 0;
  double rss_mib = 0;
  std::int64_t claims = 0;
  double claim_p99_ms = 0;
};

/// Runs the scenarios in order, each on a fresh database, reporting each as it finishes.
class Bench {
 public:
  Bench(Options options, PgServer& pg);
  ~Bench();

  /// All scenarios (or the --only subset) in order; `on_result` sees each one as it ends.
  std::vector<ScenarioResult> Run(const std::function<void(const ScenarioResult&)>& on_result);

  /// Timelines recorded by scenarios (name -> samples), for plotting.
  const std::vector<std::pair<std::string, std::vector<Sample>>>& timelines() const {
    return timelines_;
  }

 private:
  /// How the relay runs in a scenario: how many instances, which claim mode.
  struct Variant {
    std::string name;
    int keys = 0;
    int relays = 1;
    bool partitioned = false;
    /// The queue table as autoanalyze last saw it: empty (analyzed before the preload, with
    /// autovacuum off on it), so the planner believes a handful of rows.
    bool stale_stats = false;
    /// outbox.partitioning.bucket_count for the run (0: the default, 64).
    int buckets = 0;
    /// `delivery: exactly_once` (Kafka transactions, one producer per bucket).
    bool exactly_once = false;
    /// claim_connections of each relay; 0: --claim-connections.
    int claim_connections = 0;
    /// RelayConfig::bucket_leases (partitioned; one claim loop).
    bool bucket_leases = false;
  };
  static relay::ClaimMode Mode(const Variant& v);

  ScenarioResult SqlCeiling(const std::string& name, int connections);
  /// One connection claiming and settling in turn, with no relay or sink beside it: the
  /// relay's own statements (row leases, through relay::Store) or ADR 0003's bucket-lease
  /// prototype, against the ceiling in the same run.
  enum class LeaseForm { kRowLeases, kBucketLeases };
  ScenarioResult SqlCycle(const std::string& name, LeaseForm form);
  ScenarioResult KafkaDrain(const Variant& v, std::int64_t messages, bool with_target);
  /// `tls`: the same over HTTPS (https_ceiling), against the HTTPS receiver. `relay_client`:
  /// plain HTTP with the relay's own client (http_ceiling_relay_client) instead of cpp-httplib.
  ScenarioResult HttpCeiling(bool tls = false, bool relay_client = false);
  ScenarioResult WebhookDrain(const std::string& name, int max_in_flight, std::int64_t messages,
                              int claim_connections = 0, bool bucket_leases = false,
                              bool tls = false);
  /// `wanted`, or --claim-connections when 0; 1 for exactly-once relays (which refuse more).
  int ClaimConnections(int wanted, bool one_loop = false) const;
  ScenarioResult WebhookFanout(const std::string& name, int endpoints, bool delivery_log,
                               std::int64_t messages);
  ScenarioResult KafkaPathLatency();
  /// kDefault: skip_locked, 64 buckets, at least once; the others: partitioned, 8 buckets.
  enum class Delivery { kDefault, kAtLeastOnce, kExactlyOnce };
  ScenarioResult OpenLoop(const std::string& name, const std::string& sink, int keys,
                          Delivery delivery = Delivery::kDefault);
  ScenarioResult Burst(const Variant& v);
  ScenarioResult Sustained();
  static Target NoMessageWaitsForTheSweep(const ScenarioResult& r);

  Helper& Kafka();
  Helper& Http();
  /// The same receiver over HTTPS, in a process of its own, with a self-signed certificate
  /// (tls_files_) that the clients trust.
  Helper& Https();
  Helper& Producers();
  std::string NewTopic(const std::string& name);
  void FillCommon(ScenarioResult& r, const Observation& obs, std::int64_t delivered);
  void RatioToSqlCeiling(ScenarioResult& r);
  static void FillDelivery(ScenarioResult& r, const nlohmann::json& summary);

  Options opt_;
  PgServer& pg_;
  int postmaster_pid_ = -1;
  std::unique_ptr<Helper> kafka_, http_, https_, producers_;
  std::string bootstraps_;
  int http_port_ = 0;
  int https_port_ = 0;
  TlsFiles tls_files_;
  /// https_ceiling's rate, client CPU per request and mean request, as http_ceiling's below.
  std::optional<double> https_ceiling_, https_ceiling_cpu_us_, https_ceiling_mean_request_us_;
  std::optional<double> sql_ceiling_, http_ceiling_;
  std::optional<double> sql_ceiling_pg_cpu_us_;  ///< the baseline ceiling's Postgres CPU per row
  std::optional<double> http_ceiling_cpu_us_;
  std::optional<double> http_ceiling_mean_request_us_;  ///< connections / rate
  /// http_ceiling_relay_client's rate and client CPU per request.
  std::optional<double> relay_client_ceiling_, relay_client_ceiling_cpu_us_;
  /// webhook_drain's Postgres CPU per delivered request, for the fan-out scenarios' ratio.
  std::optional<double> webhook_drain_pg_cpu_us_;
  std::optional<double> fanout_nolog_pg_cpu_us_;  ///< webhook_fanout10_nolog's, for the log's cost
  std::map<int, double> sql_ceiling_by_connections_;  ///< sql_ceiling_x<N>: N -> rows/s.  ///< The
                                                      ///< HTTP-ceiling client's CPU per request.
  double preload_rate_ = 0;
  double kafka_drain_rate_ = 0;  ///< events/s of kafka_drain in this run (baseline of stale_stats)
  /// events/s of kafka_drain_partitioned_b8 (at least once): the exactly-once drain's baseline.
  double partitioned_b8_rate_ = 0;
  double partitioned_b8_pg_cpu_ = 0;  ///< its Postgres CPU per message (µs)
  std::vector<std::pair<std::string, std::vector<Sample>>> timelines_;
};

nlohmann::json ToJson(const ScenarioResult& r);

}  // namespace outbox::bench
