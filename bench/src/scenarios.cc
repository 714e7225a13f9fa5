#include "scenarios.h"

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <future>
#include <map>
#include <mutex>
#include <pqxx/pqxx>
#include <stdexcept>
#include <thread>

#include "call_probe.h"
#include "helper.h"
#include "outbox_relay/dispatcher.h"
#include "outbox_relay/fresh_cursor.h"
#include "outbox_relay/kafka_sink.h"
#include "outbox_relay/sink_registry.h"
#include "outbox_relay/store.h"
#include "outbox_relay/webhook_sink.h"
#include "pg_server.h"
#include "http_connection.h"
#include "workload.h"

namespace outbox::bench {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

// A Standard Webhooks secret ("whsec_" + base64 of 32 bytes); the receiver does not verify.
constexpr const char* kWebhookSecret = "whsec_b3V0Ym94LWJlbmNoLXdlYmhvb2stc2VjcmV0LTAwMDE=";

// The raw ceiling: claim and delete in one statement, 500 rows at a time, from the head of
// the primary key, returning what a relay needs to deliver.
constexpr const char* kCeilingSql =
    "-- ceiling: the raw claim-and-delete statement (--statement-stats names it by this)\n"
    "DELETE FROM outbox.messages WHERE id IN ("
    "SELECT id FROM outbox.messages ORDER BY id LIMIT 500 FOR UPDATE SKIP LOCKED) "
    "RETURNING id, destination, ordering_key, idempotency_key, event_type, headers, payload, "
    "payload_bytes, attempts, created_at";

std::string Rfc3339(std::int64_t us) {
  const std::time_t secs = static_cast<std::time_t>(us / 1'000'000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char out[64];
  std::snprintf(out, sizeof out, "%04d-%02d-%02dT%02d:%02d:%02d.%06lldZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                static_cast<long long>(us % 1'000'000));
  return out;
}

double Mib(std::int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

json PercentilesJson(const Percentiles& p) {
  return {{"count", p.count},
          {"p50_ms", p.p50_ms},
          {"p95_ms", p.p95_ms},
          {"p99_ms", p.p99_ms},
          {"max_ms", p.max_ms}};
}

Percentiles PercentilesFrom(const json& j) {
  Percentiles p;
  p.count = j.at("count").get<std::size_t>();
  p.p50_ms = j.at("p50_ms").get<double>();
  p.p95_ms = j.at("p95_ms").get<double>();
  p.p99_ms = j.at("p99_ms").get<double>();
  p.max_ms = j.at("max_ms").get<double>();
  return p;
}

relay::Destination KafkaDestination(const std::string& bootstraps, const std::string& topic,
                                    bool exactly_once = false) {
  relay::Destination d;
  d.name = kDestination;
  relay::KafkaTarget k;
  k.brokers = bootstraps;
  k.topic = topic;
  k.exactly_once = exactly_once;
  d.target = k;
  return d;
}

/// `ca_file`: over HTTPS, trusting that certificate.
relay::Destination WebhookDestination(int port, int connections, const std::string& ca_file = "") {
  relay::Destination d;
  d.name = kDestination;
  relay::WebhookTarget w;
  w.url = std::string(ca_file.empty() ? "http" : "https") + "://127.0.0.1:" +
          std::to_string(port) + "/hooks/bench";
  if (!ca_file.empty()) w.ca_file = ca_file;
  w.allow_private_networks = true;  // the benchmark's receiver is on loopback
  w.secrets = {kWebhookSecret};
  w.max_in_flight = connections;
  d.target = w;
  return d;
}

// The relay under test: `instances` real Dispatchers (each its own relay: own sink, own
// connections), default settings except the database URL, the one destination and the
// claim mode. Several instances in one process stand in for several relay processes; their
// CPU time adds up in this process.
class Relay {
 public:
  Relay(const std::string& db_url, const relay::Destination& dest, int instances = 1,
        relay::ClaimMode mode = relay::ClaimMode::kSkipLocked, int claim_connections = 0,
        bool bucket_leases = false) {
    for (int i = 0; i < instances; ++i) {
      relay::RelayConfig cfg;
      cfg.database_url = db_url;
      cfg.claim_mode = mode;
      cfg.claim_connections = claim_connections;
      cfg.bucket_leases = bucket_leases;
      relay::SinkPtr sink = relay::MakeSink(dest);
      // The clock starts at the first claim, not while the producer finds its brokers.
      if (!WaitUntil([&] { return sink->Ready(); }, 30)) {
        throw std::runtime_error("the sink did not become ready in 30 s");
      }
      sinks_.push_back(sink.get());  // owned by the dispatcher below, which outlives Stop()
      std::map<std::string, relay::SinkPtr> sinks;
      sinks.emplace(dest.name, std::move(sink));
      cfg.destinations.emplace(dest.name, dest);
      relay::DispatcherEnv env;
      env.stores = TimedStores(db_url);
      dispatchers_.push_back(
          std::make_unique<relay::Dispatcher>(std::move(cfg), std::move(sinks), std::move(env)));
    }
  }

  void Start() {
    for (auto& d : dispatchers_) d->Start();
  }
  /// The claim loops of the first instance's destination (claim_connections, or what its sink
  /// asked for under auto); 0 before Start.
  int ClaimLoops(const std::string& destination) const {
    return dispatchers_.empty() ? 0 : dispatchers_.front()->ClaimLoops(destination);
  }
  void Stop() {
    for (auto& d : dispatchers_) d->Stop();
  }

  /// Messages delivered since the relay started, not counting WarmUp's.
  std::int64_t delivered() const {
    return Sum([](const relay::DispatcherStats& s) { return s.delivered; }) - warmed_;
  }
  std::int64_t warmed() const { return warmed_; }

  /// Sends `n` messages through the relay and waits until they are delivered: connections
  /// made, the Kafka producer's id acquired, the consumer fetching. Latency scenarios start
  /// their clock after this; their latencies leave these messages out (not in bench.created).
  void WarmUp(const std::string& db_url, int n) {
    const std::int64_t before = delivered();
    Preload(db_url, n, {}, 1);
    if (!WaitUntil([&] { return delivered() - before >= n; }, 30)) {
      throw std::runtime_error("warm-up messages not delivered within 30 s");
    }
    warmed_ += n;
  }
  std::int64_t claims() const {
    return Sum([](const relay::DispatcherStats& s) { return s.claims; });
  }

  // Waits until every instance ran its first claim (connected, listening), up to 30 s.
  void WaitForFirstClaims() const {
    WaitUntil(
        [this] {
          for (const auto& d : dispatchers_) {
            if (d->stats().claims == 0) return false;
          }
          return true;
        },
        30);
  }

  json StatsJson() const {
    using S = relay::DispatcherStats;
    json j;
    const std::pair<const char*, std::int64_t S::*> fields[] = {
        {"claims", &S::claims},       {"empty_claims", &S::empty_claims},
        {"claimed", &S::claimed},     {"delivered", &S::delivered},
        {"retried", &S::retried},     {"dead", &S::dead},
        {"fenced", &S::fenced},       {"reaped", &S::reaped},
        {"db_errors", &S::db_errors}, {"sweep_found", &S::sweep_found}};
    for (const auto& [name, field] : fields) {
      j[name] = Sum([field](const S& s) { return s.*field; });
    }
    return j;
  }

  /// The sinks' own counts (Sink::EventCounts), summed over the instances.
  std::map<std::string, std::int64_t> SinkEvents() const {
    std::map<std::string, std::int64_t> total;
    for (const auto* sink : sinks_) {
      for (const auto& [event, n] : sink->EventCounts()) total[event] += n;
    }
    return total;
  }

 private:
  template <class F>
  std::int64_t Sum(F f) const {
    std::int64_t total = 0;
    for (const auto& d : dispatchers_) total += f(d->stats());
    return total;
  }

  std::vector<std::unique_ptr<relay::Dispatcher>> dispatchers_;
  std::vector<relay::Sink*> sinks_;
  std::int64_t warmed_ = 0;
};

constexpr int kWarmUpMessages = 20;

// Row-level counters of the queue table (pg_stat_user_tables) after a scenario: with
// n_tup_hot_upd / n_tup_upd they show whether the claim's lease update stayed HOT (no new
// index entries), as docs/adr/0001-claim-path.md intends. Read after the relay stopped, so
// its backends have flushed their statistics.
json TableStats(const std::string& url) {
  pqxx::connection c(url);
  pqxx::nontransaction tx(c);
  tx.exec("SELECT pg_stat_force_next_flush()");
  const auto row = tx.exec1(
      "SELECT n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del FROM pg_stat_user_tables "
      "WHERE schemaname = 'outbox' AND relname = 'messages'");
  const auto upd = row[1].as<std::int64_t>(), hot = row[2].as<std::int64_t>();
  return {{"inserted", row[0].as<std::int64_t>()},
          {"updated", upd},
          {"hot_updated", hot},
          {"deleted", row[3].as<std::int64_t>()},
          {"hot_ratio", upd > 0 ? static_cast<double>(hot) / static_cast<double>(upd) : 0.0}};
}

// --statement-stats: forget what pg_stat_statements holds, so that what it reports next is
// the measured interval alone. False where the extension cannot be had (not preloaded, not a
// superuser): the scenario then reports no statements.
bool ResetStatementStats(const std::string& url) {
  try {
    pqxx::connection c(url);
    pqxx::nontransaction tx(c);
    tx.exec("CREATE EXTENSION IF NOT EXISTS pg_stat_statements");
    tx.exec("SELECT pg_stat_statements_reset()");
    return true;
  } catch (const std::exception& e) {
    Say(std::string("--statement-stats: pg_stat_statements unavailable: ") + e.what());
    return false;
  }
}

// Postgres time of this database's statements since ResetStatementStats, grouped by the name
// in the relay statement's first line ("-- claim: ...", "-- settle: ..."; anything else is
// "other"), per delivered message: execution and planning, in microseconds, and what they
// wrote and touched: WAL records, full-page images and bytes, shared buffers hit, read and
// dirtied (a statement that writes each row once more than another shows it here).
json StatementStats(const std::string& url, std::int64_t delivered) {
  pqxx::connection c(url);
  pqxx::nontransaction tx(c);
  const auto rows = tx.exec(
      "SELECT query, calls, plans, rows, total_exec_time, total_plan_time, wal_records, wal_fpi, "
      "wal_bytes, shared_blks_hit, shared_blks_read, shared_blks_dirtied "
      "FROM pg_stat_statements "
      "WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())");
  struct Sum {
    std::int64_t calls = 0, plans = 0, rows = 0;
    double exec_ms = 0, plan_ms = 0;
    double wal_records = 0, wal_fpi = 0, wal_bytes = 0, blks_hit = 0, blks_read = 0,
           blks_dirtied = 0;
  };
  std::map<std::string, Sum> by_name;
  for (const auto& row : rows) {
    const std::string q = row[0].as<std::string>();
    std::string name = "other";
    if (q.rfind("-- ", 0) == 0) {
      const auto colon = q.find(':');
      if (colon != std::string::npos && colon < 40) name = q.substr(3, colon - 3);
    }
    auto& sum = by_name[name];
    sum.calls += row[1].as<std::int64_t>();
    sum.plans += row[2].as<std::int64_t>();
    sum.rows += row[3].as<std::int64_t>();
    sum.exec_ms += row[4].as<double>();
    sum.plan_ms += row[5].as<double>();
    sum.wal_records += row[6].as<double>();
    sum.wal_fpi += row[7].as<double>();
    sum.wal_bytes += row[8].as<double>();
    sum.blks_hit += row[9].as<double>();
    sum.blks_read += row[10].as<double>();
    sum.blks_dirtied += row[11].as<double>();
  }
  json out = json::object();
  const double n = static_cast<double>(std::max<std::int64_t>(delivered, 1));
  for (const auto& [name, sum] : by_name) {
    out[name] = {{"calls", sum.calls},
                 {"plans", sum.plans},
                 {"rows", sum.rows},
                 {"exec_us_per_msg", sum.exec_ms * 1000.0 / n},
                 {"plan_us_per_msg", sum.plan_ms * 1000.0 / n},
                 {"wal_records_per_msg", sum.wal_records / n},
                 {"wal_fpi_per_msg", sum.wal_fpi / n},
                 {"wal_bytes_per_msg", sum.wal_bytes / n},
                 {"blks_hit_per_msg", sum.blks_hit / n},
                 {"blks_read_per_msg", sum.blks_read / n},
                 {"blks_dirtied_per_msg", sum.blks_dirtied / n}};
  }
  return out;
}

// What each Postgres process is, by pid: a client backend by the name of the last statement it
// ran ("claim", "settle_delivered", "ceiling"...: the relay's connections each run mostly one),
// any other by its backend_type (walwriter, checkpointer, autovacuum launcher...).
std::map<int, std::string> PostgresRoles(const std::string& url) {
  std::map<int, std::string> roles;
  try {
    pqxx::connection c(url);
    pqxx::nontransaction tx(c);
    for (const auto& row :
         tx.exec("SELECT pid, backend_type, left(query, 60) FROM pg_stat_activity")) {
      std::string role = row[1].is_null() ? "unknown" : row[1].as<std::string>();
      if (role == "client backend") {
        const std::string q = row[2].is_null() ? "" : row[2].as<std::string>();
        const auto colon = q.find(':');
        role = q.rfind("-- ", 0) == 0 && colon != std::string::npos ? q.substr(3, colon - 3)
                                                                    : "client (other)";
      }
      roles[row[0].as<int>()] = role;
    }
  } catch (const std::exception& e) {
    Say(std::string("--statement-stats: pg_stat_activity unreadable: ") + e.what());
  }
  return roles;
}

// --statement-stats: where the measured interval's Postgres CPU went, per delivered message, by
// process (PostgresRoles, read at the interval's end); "exited" is what processes that ended
// within the interval spent (autovacuum workers, closed connections).
json PostgresCpuByRole(const std::map<int, std::string>& roles,
                       const std::map<int, std::int64_t>& before,
                       const std::map<int, std::int64_t>& after, std::int64_t total_us,
                       std::int64_t delivered) {
  std::map<std::string, std::int64_t> by_role;
  std::int64_t live = 0;
  for (const auto& [pid, us] : after) {
    const auto was = before.find(pid);
    const std::int64_t spent = us - (was == before.end() ? 0 : was->second);
    const auto role = roles.find(pid);
    by_role[role == roles.end() ? "unknown" : role->second] += spent;
    live += spent;
  }
  by_role["exited"] += std::max<std::int64_t>(total_us - live, 0);
  json out = json::object();
  const double n = static_cast<double>(std::max<std::int64_t>(delivered, 1));
  for (const auto& [role, us] : by_role) out[role] = static_cast<double>(us) / n;
  return out;
}

std::function<std::int64_t()> Delivered(const Relay& relay) {
  return [&relay] { return relay.delivered(); };
}

// A per-message CPU figure against a baseline of the same run: passes at most `limit` times the
// baseline (and only when `completed`), and shows the ratio with both figures.
Target CpuRatioTarget(std::string goal, std::optional<double> measured,
                      std::optional<double> baseline, double limit, bool completed,
                      const std::string& baseline_name) {
  Target t{std::move(goal), "", std::nullopt};
  if (baseline && measured && *baseline > 0) {
    const double x = *measured / *baseline;
    t.measured = Fixed(x, 2) + " x (" + Fixed(*measured, 1) + " vs " + Fixed(*baseline, 1) + " µs)";
    t.pass = completed && x <= limit;
  } else {
    t.measured = "n/a: " + baseline_name + " not run";
  }
  return t;
}

}  // namespace

// What the relay (this process), Postgres and the helpers spent over one measured interval,
// with the relay's claim and settle timings and per-second samples.
struct Observation {
  double t0 = 0, seconds = 0;
  std::int64_t cpu0 = 0, pg0 = 0, helpers0 = 0;
  std::int64_t relay_cpu_us = 0, pg_cpu_us = 0, helpers_cpu_us = 0;
  std::int64_t peak_rss = 0;
  int postmaster = -1;
  // Each live Postgres process's CPU at Begin and at End (PostgresCpuByRole).
  std::map<int, std::int64_t> pg_children0, pg_children1;
  // Set before End (--statement-stats): read what each Postgres process is from there while the
  // relay's connections are still open.
  std::string roles_url;
  std::map<int, std::string> pg_roles;
  std::vector<int> helper_pids;
  std::vector<std::int64_t> claim_us, settle_us;
  std::int64_t claim_rows = 0, settle_rows = 0;
  std::vector<Sample> timeline;
  std::map<int, ThreadCpu> threads0;
  // Per thread name: threads, CPU seconds, and the busiest single thread's share of a core.
  nlohmann::json threads = nlohmann::json::object();
  std::string busiest_thread;
  double busiest_share = 0;

  void Begin(int postmaster_pid, std::vector<int> helpers) {
    postmaster = postmaster_pid;
    helper_pids = std::move(helpers);
    ClaimProbe().Take();
    SettleProbe().Take();
    ResetPeakRss();
    pg0 = ProcessTreeCpuMicros(postmaster);
    pg_children0 = ChildrenCpuMicros(postmaster);
    helpers0 = HelpersCpu();
    threads0 = SelfThreadsCpu();
    cpu0 = SelfCpuMicros();
    t0 = MonoSeconds();
  }

  void End() {
    seconds = MonoSeconds() - t0;
    relay_cpu_us = SelfCpuMicros() - cpu0;
    SummarizeThreads();
    pg_cpu_us = ProcessTreeCpuMicros(postmaster) - pg0;
    pg_children1 = ChildrenCpuMicros(postmaster);
    if (!roles_url.empty()) pg_roles = PostgresRoles(roles_url);
    helpers_cpu_us = HelpersCpu() - helpers0;
    peak_rss = PeakRssBytes();
    TakeClaims();
    auto s = SettleProbe().Take();
    settle_us.insert(settle_us.end(), s.durations_us.begin(), s.durations_us.end());
    settle_rows += s.rows;
  }

  // Which threads of this process (the relay's, named or-*) spent the CPU: a single thread
  // near 100% of a core is the bottleneck, whatever the machine's size.
  void SummarizeThreads() {
    struct Group {
      int threads = 0;
      std::int64_t cpu_us = 0, max_us = 0;
    };
    std::map<std::string, Group> groups;
    for (const auto& [tid, t] : SelfThreadsCpu()) {
      const auto before = threads0.find(tid);
      const std::int64_t used =
          t.cpu_us -
          (before != threads0.end() && before->second.name == t.name ? before->second.cpu_us : 0);
      auto& g = groups[t.name];
      ++g.threads;
      g.cpu_us += used;
      g.max_us = std::max(g.max_us, used);
    }
    threads = nlohmann::json::object();
    busiest_share = 0;
    for (const auto& [name, g] : groups) {
      if (g.cpu_us <= 0) continue;
      const double share = seconds > 0 ? static_cast<double>(g.max_us) / 1e6 / seconds : 0;
      threads[name] = {{"threads", g.threads},
                       {"cpu_s", static_cast<double>(g.cpu_us) / 1e6},
                       {"busiest_thread_core_share", share}};
      if (share > busiest_share) {
        busiest_share = share;
        busiest_thread = name;
      }
    }
  }

  // Moves the claim timings recorded since the last call into claim_us; returns them.
  std::vector<std::int64_t> TakeClaims() {
    auto c = ClaimProbe().Take();
    claim_us.insert(claim_us.end(), c.durations_us.begin(), c.durations_us.end());
    claim_rows += c.rows;
    return std::move(c.durations_us);
  }

  std::int64_t HelpersCpu() const {
    std::int64_t total = 0;
    for (int pid : helper_pids) total += std::max<std::int64_t>(PidCpuMicros(pid), 0);
    return total;
  }

  // Polls every 10 ms until done() or timeout_s; once a second appends a Sample of
  // delivered() and (optional) produced(), messages written so far, for the backlog.
  bool Watch(const std::function<std::int64_t()>& delivered, double timeout_s,
             const std::function<bool()>& done,
             const std::function<std::int64_t()>& produced = {}) {
    const double start = MonoSeconds();
    double next_sample = (timeline.empty() ? t0 : t0 + timeline.back().t) + 1;
    while (!done()) {
      const double now = MonoSeconds();
      if (now - start > timeout_s) return false;
      if (now >= next_sample) {
        Sample s;
        s.t = now - t0;
        s.delivered = delivered();
        s.produced = produced ? produced() : 0;
        s.backlog = produced ? s.produced - s.delivered : 0;
        s.rss_mib = Mib(RssBytes());
        const auto claims = TakeClaims();
        s.claims = static_cast<std::int64_t>(claims.size());
        s.claim_p99_ms = Summarize(claims).p99_ms;
        timeline.push_back(s);
        next_sample += 1;
      }
      std::this_thread::sleep_for(10ms);
    }
    return true;
  }
};

namespace {

// --statement-stats: what the interval's statements cost and which Postgres processes spent
// its CPU, per delivered message, into r.details.
void AddStatementStats(ScenarioResult& r, const std::string& url, const Observation& obs,
                       std::int64_t delivered) {
  r.details["statements"] = StatementStats(url, delivered);
  r.details["postgres_cpu_us_per_msg_by_process"] =
      PostgresCpuByRole(obs.pg_roles, obs.pg_children0, obs.pg_children1, obs.pg_cpu_us, delivered);
}

}  // namespace

Bench::Bench(Options options, PgServer& pg) : opt_(std::move(options)), pg_(pg) {
  postmaster_pid_ = pg_.PostmasterPid();
}

Bench::~Bench() = default;

Helper& Bench::Kafka() {
  if (!kafka_) {
    kafka_ = std::make_unique<Helper>("kafka");
    bootstraps_ = kafka_->Call("START " + std::to_string(opt_.kafka_brokers));
  }
  return *kafka_;
}

Helper& Bench::Http() {
  if (!http_) {
    http_ = std::make_unique<Helper>("http");
    // One receiver thread per keep-alive connection (the largest max_in_flight any scenario
    // uses), plus a few spare: a thread-per-connection receiver with fewer threads leaves
    // connections unserved until they time out.
    int connections = opt_.webhook_connections;
    for (const int mif : opt_.webhook_sweep) connections = std::max(connections, mif);
    http_port_ = std::stoi(http_->Call("LISTEN " + std::to_string(connections + 8)));
  }
  return *http_;
}

Helper& Bench::Https() {
  if (!https_) {
    tls_files_ = MakeSelfSignedCertificate(opt_.out_dir);
    https_ = std::make_unique<Helper>("http");
    int connections = opt_.webhook_connections;  // as Http()
    for (const int mif : opt_.webhook_sweep) connections = std::max(connections, mif);
    https_port_ = std::stoi(https_->Call("LISTEN " + std::to_string(connections + 8) + " " +
                                         tls_files_.cert_path + " " + tls_files_.key_path));
  }
  return *https_;
}

Helper& Bench::Producers() {
  if (!producers_) producers_ = std::make_unique<Helper>("producer");
  return *producers_;
}

std::string Bench::NewTopic(const std::string& name) {
  Kafka().Call("TOPIC " + name + " " + std::to_string(opt_.kafka_partitions));
  Kafka().Call("CONSUME " + name + " " + std::to_string(opt_.kafka_partitions));
  return name;
}

void Bench::FillCommon(ScenarioResult& r, const Observation& obs, std::int64_t delivered) {
  r.seconds = obs.seconds;
  r.events_per_s = obs.seconds > 0 ? static_cast<double>(delivered) / obs.seconds : 0;
  if (delivered > 0) {
    const double n = static_cast<double>(delivered);
    r.relay_cpu_us_per_msg = static_cast<double>(obs.relay_cpu_us) / n;
    if (obs.postmaster > 0) r.pg_cpu_us_per_msg = static_cast<double>(obs.pg_cpu_us) / n;
    if (!obs.helper_pids.empty())
      r.helpers_cpu_us_per_msg = static_cast<double>(obs.helpers_cpu_us) / n;
  }
  r.peak_rss_mib = Mib(obs.peak_rss);
  if (!obs.claim_us.empty()) {
    r.claim = Summarize(obs.claim_us);
    r.claim_source = "Store::Claim as called by the dispatcher (timing decorator of its store)";
    r.details["rows_per_claim"] =
        static_cast<double>(obs.claim_rows) / static_cast<double>(obs.claim_us.size());
    if (!obs.settle_us.empty()) {
      r.settle = Summarize(obs.settle_us);
      r.details["rows_per_settle"] =
          static_cast<double>(obs.settle_rows) / static_cast<double>(obs.settle_us.size());
    }
  }
  r.details["postgres_cpu_note"] =
      "all Postgres processes: relay backends, autovacuum, checkpointer"
      " and, where producers run, their backends too";
  r.details["threads"] = obs.threads;
  if (!obs.busiest_thread.empty()) {
    r.details["busiest_thread"] = {{"name", obs.busiest_thread}, {"core_share", obs.busiest_share}};
  }
}

void Bench::RatioToSqlCeiling(ScenarioResult& r) {
  if (sql_ceiling_ && *sql_ceiling_ > 0) r.x_sql_ceiling = r.events_per_s / *sql_ceiling_;
  // N relays (or claim connections) against what N connections of raw statements reach
  // (sql_ceiling_x<N>).
  // The loops the relay ran (claim_loops, where auto chose them), else what it was given.
  const int connections =
      r.relays * r.details.value("claim_loops", r.details.value("claim_connections", 1));
  if (connections > 1) {
    if (auto it = sql_ceiling_by_connections_.find(connections);
        it != sql_ceiling_by_connections_.end() && it->second > 0) {
      r.details["x_sql_ceiling_same_connections"] = r.events_per_s / it->second;
    }
  }
}

ScenarioResult Bench::SqlCycle(const std::string& name, LeaseForm form) {
  const bool rows_leased = form == LeaseForm::kRowLeases;
  ScenarioResult r;
  r.name = name;
  r.sink = "sql";
  r.claim_mode = rows_leased ? "skip_locked" : "bucket leases";
  r.messages = opt_.kafka_messages;
  r.what = rows_leased
               ? "the relay's own claim and settle statements (claim.sql, settle_delivered.sql "
                 "through relay::Store, the relay's parsing included), 500 a claim, in turn on "
                 "one connection with nothing else running, until the preloaded table is empty"
               : "ADR 0003's bucket-lease statements (claim_owned.sql, which reads the fresh lane "
                 "and writes nothing, settle_owned_delivered.sql, fenced by the buckets' epochs, "
                 "through relay::Store), 500 a claim, in turn on one connection, one relay owning "
                 "all 64 buckets, until the preloaded table is empty";
  const std::string url = pg_.FreshDatabase(r.name);
  Say(r.name + ": preloading " + std::to_string(r.messages) + " messages");
  Preload(url, r.messages, {}, 2);
  PrepareTable(url);
  relay::Store store(url);  // the relay's store, its session settings included
  const std::string me = relay::NewUuid();
  std::vector<relay::BucketLease> owned;
  if (!rows_leased) {
    owned = store.Coordinate(me, std::chrono::milliseconds(600'000), false, "outbox-bench");
    r.details["buckets_owned"] = owned.size();
  }
  const bool statement_stats = opt_.statement_stats && ResetStatementStats(url);
  std::vector<std::int64_t> claim_us, settle_us;
  std::int64_t rows = 0;
  Observation obs;
  if (statement_stats) obs.roles_url = url;
  Say(r.name + ": measuring");
  obs.Begin(postmaster_pid_, {});
  relay::FreshCursor cursor;
  while (true) {
    const double t = MonoSeconds();
    std::vector<std::int64_t> ids;
    std::string token;
    if (rows_leased) {
      auto claim =
          store.Claim(kDestination, cursor.position(), 500, 250, std::chrono::milliseconds(30'000));
      cursor.Observe(claim.facts);
      token = claim.lease_token;
      for (const auto& m : claim.messages) ids.push_back(relay::Raw(m.id));
    } else {
      auto claim = store.ClaimOwned(kDestination, cursor.position(), 500, 250,
                                    std::chrono::milliseconds(30'000), me, owned);
      cursor.Observe(claim.facts);
      for (const auto& m : claim.messages) ids.push_back(relay::Raw(m.id));
    }
    claim_us.push_back(static_cast<std::int64_t>((MonoSeconds() - t) * 1e6));
    if (ids.empty()) break;
    rows += static_cast<std::int64_t>(ids.size());
    const double s = MonoSeconds();
    if (rows_leased) {
      std::vector<relay::Settlement> done;
      done.reserve(ids.size());
      for (const auto id : ids) {
        relay::Settlement st;
        st.id = relay::MessageId{id};
        st.lease_token = token;
        done.push_back(std::move(st));
      }
      store.Settle(done);
    } else {
      std::vector<relay::MessageId> done;
      done.reserve(ids.size());
      for (const auto id : ids) done.push_back(relay::MessageId{id});
      store.SettleOwnedDelivered(done, me, owned);
    }
    settle_us.push_back(static_cast<std::int64_t>((MonoSeconds() - s) * 1e6));
  }
  obs.End();
  FillCommon(r, obs, rows);
  r.completed = rows == r.messages;
  r.claim = Summarize(claim_us);
  r.settle = Summarize(settle_us);
  r.claim_source = "the claim statement as this loop calls it (500 rows)";
  r.details["rows"] = rows;
  r.details["cpu_note"] = "relay CPU column = this loop (its parsing included)";
  if (statement_stats) AddStatementStats(r, url, obs, rows);
  if (sql_ceiling_pg_cpu_us_ && *sql_ceiling_pg_cpu_us_ > 0 && r.pg_cpu_us_per_msg) {
    r.details["pg_cpu_x_sql_ceiling"] = *r.pg_cpu_us_per_msg / *sql_ceiling_pg_cpu_us_;
  }
  RatioToSqlCeiling(r);
  return r;
}

void Bench::FillDelivery(ScenarioResult& r, const json& summary) {
  const json& latency = summary.at("latency");
  r.latency = PercentilesFrom(latency);
  r.latency_source = summary.at("latency_source").get<std::string>();
  json d = summary;
  d.erase("latency");
  d.erase("latency_source");
  for (const char* tail : {"over_20ms", "over_100ms", "over_1s"})
    d["latency_" + std::string(tail)] = latency.at(tail);
  r.details["delivery"] = d;
}

// --- ceilings ----------------------------------------------------------------------------

ScenarioResult Bench::SqlCeiling(const std::string& name, int connections) {
  const bool baseline = !sql_ceiling_ && connections == 1;
  ScenarioResult r;
  r.name = name;
  r.sink = "sql";
  r.claim_mode = "-";
  r.messages = opt_.kafka_messages;
  r.what = connections > 1
               ? "raw ceiling with " + std::to_string(connections) +
                     " connections, each running the ceiling statement until the table is empty: "
                     "what the database can do for " +
                     std::to_string(connections) + " relays"
               : std::string(baseline ? ""
                                      : "the same again at the end of the run (drift of the "
                                        "machine): ") +
                     "raw ceiling: one connection, DELETE ... WHERE id IN (SELECT ... ORDER BY id "
                     "LIMIT 500 FOR UPDATE SKIP LOCKED) RETURNING the rows, until the preloaded "
                     "table is empty";
  const std::string url = pg_.FreshDatabase(r.name);
  Say(r.name + ": preloading " + std::to_string(r.messages) + " messages");
  const double preload_rate = Preload(url, r.messages, {}, 2);
  if (baseline) preload_rate_ = preload_rate;
  r.details["preload_rate"] = preload_rate;
  PrepareTable(url);

  std::vector<std::unique_ptr<pqxx::connection>> conns;
  for (int i = 0; i < connections; ++i) {
    conns.push_back(std::make_unique<pqxx::connection>(url));
    conns.back()->prepare("claim_delete", kCeilingSql);
  }
  const bool statement_stats = opt_.statement_stats && ResetStatementStats(url);
  std::vector<std::int64_t> statement_us;
  std::int64_t rows = 0;
  std::size_t bytes = 0;
  std::mutex mu;
  Observation obs;
  if (statement_stats) obs.roles_url = url;
  Say(r.name + ": measuring");
  obs.Begin(postmaster_pid_, {});
  std::vector<std::thread> threads;
  for (auto& conn : conns) {
    threads.emplace_back([&, c = conn.get()] {
      std::vector<std::int64_t> mine;
      std::int64_t my_rows = 0;
      std::size_t my_bytes = 0;
      while (true) {
        const double t = MonoSeconds();
        pqxx::nontransaction tx(*c);
        const pqxx::result batch = tx.exec_prepared("claim_delete");
        for (const auto& row : batch) my_bytes += row["payload"].size();  // read what a relay would
        mine.push_back(static_cast<std::int64_t>((MonoSeconds() - t) * 1e6));
        if (batch.empty()) break;
        my_rows += static_cast<std::int64_t>(batch.size());
      }
      std::lock_guard lk(mu);
      statement_us.insert(statement_us.end(), mine.begin(), mine.end());
      rows += my_rows;
      bytes += my_bytes;
    });
  }
  for (auto& t : threads) t.join();
  obs.End();
  FillCommon(r, obs, rows);
  r.claim = Summarize(statement_us);
  r.claim_source = "the ceiling statement itself (claim + delete, 500 rows)";
  r.details["rows"] = rows;
  r.details["payload_bytes_read"] = bytes;
  r.details["cpu_note"] = "relay CPU column = the benchmark's libpq client loop";
  if (statement_stats) AddStatementStats(r, url, obs, rows);
  // The first measurement is the baseline of every ratio; a later one shows how much the
  // machine drifted during the run.
  if (baseline) {
    sql_ceiling_ = r.events_per_s;
    sql_ceiling_pg_cpu_us_ = r.pg_cpu_us_per_msg;
  }
  if (connections > 1) sql_ceiling_by_connections_[connections] = r.events_per_s;
  RatioToSqlCeiling(r);
  return r;
}

ScenarioResult Bench::HttpCeiling(bool tls, bool relay_client) {
  ScenarioResult r;
  r.name = tls ? "https_ceiling" : relay_client ? "http_ceiling_relay_client" : "http_ceiling";
  r.sink = tls ? "https" : "http";
  r.claim_mode = "-";
  r.messages = opt_.webhook_messages;
  const int conns = opt_.webhook_connections;
  r.what = std::string("loopback HTTP") + (tls ? "S" : "") +
           " ceiling of the same receiver: " + std::to_string(conns) + " threads, one keep-alive " +
           (relay_client ? "connection of the relay's own plain-HTTP client (http_connection.h)"
                         : "cpp-httplib client") +
           " each" + (tls ? " (TLS, verifying the receiver's certificate)" : "") +
           ", POSTing the same ~200-byte bodies and headers as the relay (no database)";
  Helper& receiver = tls ? Https() : Http();
  const int port = tls ? https_port_ : http_port_;
  receiver.Call("RECORD");
  const std::string body = Payload(1);
  std::atomic<std::int64_t> next{0}, errors{0};
  Observation obs;
  obs.Begin(postmaster_pid_, {receiver.pid()});
  std::vector<std::thread> threads;
  for (int t = 0; t < conns && relay_client; ++t) {
    threads.emplace_back([&] {
      relay::webhook_detail::HttpConnection::Options options;
      options.timeout = std::chrono::seconds(10);
      relay::webhook_detail::HttpConnection connection(options);
      const std::string host = "127.0.0.1:" + std::to_string(port);
      std::string head;
      char id[64];
      for (std::int64_t k = next++; k < r.messages; k = next++) {
        std::snprintf(id, sizeof id, "00000000-0000-4000-8000-%012lld", static_cast<long long>(k));
        head.clear();
        head.append("POST /hooks/bench HTTP/1.1\r\nHost: ").append(host);
        head.append("\r\nwebhook-id: ").append(id);
        head.append("\r\nwebhook-timestamp: ").append(std::to_string(WallMicros() / 1'000'000));
        head.append("\r\nwebhook-signature: v1,K5oZfzN95Z9UVu1EsfQmfVNQhnkZ2pj9o9NDN/H/pI4=");
        head.append("\r\nIdempotency-Key: ").append(id);
        head.append("\r\nWebhook-Event-Type: order.updated\r\nUser-Agent: outbox-relay");
        head.append("\r\nContent-Type: application/json\r\nContent-Length: ");
        head.append(std::to_string(body.size())).append("\r\n\r\n");
        const auto answer = connection.Exchange(
            "127.0.0.1", port, head, body,
            std::chrono::steady_clock::now() + std::chrono::seconds(10), [] { return true; });
        if (answer.failure != relay::webhook_detail::HttpFailure::kNone || answer.status != 200)
          ++errors;
      }
    });
  }
  for (int t = 0; t < conns && !relay_client; ++t) {
    threads.emplace_back([&] {
      std::unique_ptr<httplib::ClientImpl> client;
      if (tls) {
        auto ssl = std::make_unique<httplib::SSLClient>("127.0.0.1", port);
        ssl->set_ca_cert_path(tls_files_.cert_path.c_str());
        ssl->enable_server_certificate_verification(true);
        client = std::move(ssl);
      } else {
        client = std::make_unique<httplib::ClientImpl>("127.0.0.1", port);
      }
      client->set_keep_alive(true);
      client->set_tcp_nodelay(true);
      client->set_read_timeout(10, 0);
      char id[64];
      for (std::int64_t k = next++; k < r.messages; k = next++) {
        std::snprintf(id, sizeof id, "00000000-0000-4000-8000-%012lld", static_cast<long long>(k));
        const httplib::Headers headers = {
            {"webhook-id", id},
            {"webhook-timestamp", std::to_string(WallMicros() / 1'000'000)},
            {"webhook-signature", "v1,K5oZfzN95Z9UVu1EsfQmfVNQhnkZ2pj9o9NDN/H/pI4="},
            {"Idempotency-Key", id},
            {"Webhook-Event-Type", "order.updated"},
            {"User-Agent", "outbox-relay"}};
        const auto res = client->Post("/hooks/bench", headers, body, "application/json");
        if (!res || res->status != 200) ++errors;
      }
    });
  }
  for (auto& t : threads) t.join();
  obs.End();
  const json summary =
      json::parse(receiver.Call("FINISH " + std::to_string(r.messages) + " 30 - 0"));
  FillCommon(r, obs, r.messages);
  r.details["errors"] = errors.load();
  r.details["connections"] = summary.at("connections");
  r.details["received"] = summary.at("received");
  r.details["cpu_note"] = std::string("relay CPU column = the benchmark's HTTP") +
                          (tls ? "S" : "") + " client threads";
  // Each client posts back to back: its mean request is the connections over the rate.
  std::optional<double> mean_request;
  if (r.events_per_s > 0) {
    mean_request = conns * 1e6 / r.events_per_s;
    r.details["mean_request_us"] = *mean_request;
  }
  if (tls) {
    https_ceiling_ = r.events_per_s;
    https_ceiling_cpu_us_ = r.relay_cpu_us_per_msg;
    https_ceiling_mean_request_us_ = mean_request;
  } else if (relay_client) {
    relay_client_ceiling_ = r.events_per_s;
    relay_client_ceiling_cpu_us_ = r.relay_cpu_us_per_msg;
  } else {
    http_ceiling_ = r.events_per_s;
    http_ceiling_cpu_us_ = r.relay_cpu_us_per_msg;
    http_ceiling_mean_request_us_ = mean_request;
  }
  r.x_http_ceiling = 1.0;
  if (relay_client) {  // against cpp-httplib's, when it ran
    r.x_http_ceiling = http_ceiling_ && *http_ceiling_ > 0
                           ? std::optional<double>(r.events_per_s / *http_ceiling_)
                           : std::nullopt;
  }
  RatioToSqlCeiling(r);
  return r;
}

// --- relay: backlog drains ---------------------------------------------------------------

ScenarioResult Bench::KafkaDrain(const Variant& v, std::int64_t messages, bool with_target) {
  ScenarioResult r;
  r.name = v.name;
  r.sink = "kafka";
  r.keys = v.keys;
  r.relays = v.relays;
  r.claim_mode = v.bucket_leases ? "bucket leases" : v.partitioned ? "partitioned" : "skip_locked";
  r.messages = messages;
  r.what = std::to_string(v.relays) + " relay" + (v.relays > 1 ? "s" : "") + " (" + r.claim_mode +
           ") drain a preloaded backlog to Kafka (mock cluster, " +
           std::to_string(opt_.kafka_brokers) + " brokers, " +
           std::to_string(opt_.kafka_partitions) + " partitions)" +
           (v.keys > 0 ? ", " + std::to_string(v.keys) + " ordering keys" : ", no ordering keys");
  if (const int cc = ClaimConnections(v.claim_connections, v.exactly_once); cc > 1) {
    r.what += "; claim_connections " + std::to_string(cc);
    r.details["claim_connections"] = cc;
  }
  const std::string url = pg_.FreshDatabase(v.name);
  if (v.buckets > 0) {
    r.what += "; " + std::to_string(v.buckets) + " buckets";
    pqxx::connection c(url);
    pqxx::nontransaction(c).exec("SELECT outbox.set_bucket_count(" + std::to_string(v.buckets) +
                                 ")");
  }
  if (v.exactly_once) r.what += "; delivery: exactly_once (a Kafka transaction per bucket)";
  if (v.bucket_leases) r.what += "; bucket_leases (claims read, settles fenced by bucket)";
  if (v.stale_stats) {
    r.what += "; statistics stale: analyzed while empty, autovacuum off on the table";
    pqxx::connection c(url);
    pqxx::nontransaction tx(c);
    tx.exec("ALTER TABLE outbox.messages SET (autovacuum_enabled = false)");
    tx.exec("ANALYZE outbox.messages");
  }
  Say(v.name + ": preloading " + std::to_string(r.messages) + " messages");
  MessageShape shape;
  shape.keys = v.keys;
  Preload(url, r.messages, shape, 2);
  if (v.stale_stats) {
    pqxx::connection c(url);
    pqxx::nontransaction(c).exec("CHECKPOINT");
  } else {
    PrepareTable(url);
  }
  const std::string topic = NewTopic(v.name);

  const bool statement_stats = opt_.statement_stats && ResetStatementStats(url);
  Relay relay(url, KafkaDestination(bootstraps_, topic, v.exactly_once), v.relays, Mode(v),
              ClaimConnections(v.claim_connections, v.exactly_once || v.bucket_leases),
              v.bucket_leases);
  Observation obs;
  if (statement_stats) obs.roles_url = url;
  Say(v.name + ": relay draining");
  obs.Begin(postmaster_pid_, {Kafka().pid()});
  relay.Start();
  r.completed =
      obs.Watch(Delivered(relay), opt_.timeout_s, [&] { return relay.delivered() >= r.messages; });
  obs.End();
  const std::int64_t delivered = relay.delivered();
  relay.Stop();
  r.details["dispatcher"] = relay.StatsJson();
  r.details["queue_table"] = TableStats(url);
  if (statement_stats) AddStatementStats(r, url, obs, delivered);
  FillCommon(r, obs, delivered);
  FillDelivery(r,
               json::parse(Kafka().Call("FINISH " + std::to_string(delivered) + " 120 - 0", 180)));
  r.latency_source += "; a drain's latency is mostly the wait in the backlog";
  RatioToSqlCeiling(r);
  if (v.stale_stats) {
    // The same drain with fresh statistics ran just before: the plan must not care.
    Target t{"events/s >= 0.8 x kafka_drain (statistics fresh)", "", std::nullopt};
    if (kafka_drain_rate_ > 0) {
      const double ratio = r.events_per_s / kafka_drain_rate_;
      r.details["x_kafka_drain"] = ratio;
      t.measured = Fixed(ratio, 2) + " x";
      t.pass = r.completed && ratio >= 0.8;
    } else {
      t.measured = "n/a: kafka_drain not run";
    }
    r.targets.push_back(t);
  } else if (v.name == "kafka_drain") {
    kafka_drain_rate_ = r.completed ? r.events_per_s : 0;
  } else if (v.name == "kafka_drain_partitioned_b8") {
    partitioned_b8_rate_ = r.completed ? r.events_per_s : 0;
    partitioned_b8_pg_cpu_ = r.pg_cpu_us_per_msg.value_or(0);
  } else if (v.exactly_once && partitioned_b8_rate_ > 0) {
    // The price of exactly once: the same drain, same buckets, at least once, just before.
    r.details["x_at_least_once"] = r.events_per_s / partitioned_b8_rate_;
    if (r.pg_cpu_us_per_msg && partitioned_b8_pg_cpu_ > 0)
      r.details["pg_cpu_x_at_least_once"] = *r.pg_cpu_us_per_msg / partitioned_b8_pg_cpu_;
  }
  // The drain's rate as a share of the same run's SQL ceiling, at least `share`.
  const auto rate_target = [&](const std::string& what, double share) {
    Target t{what, "", std::nullopt};
    if (r.x_sql_ceiling) {
      t.measured = Fixed(*r.x_sql_ceiling, 2) + " x";
      t.pass = r.completed && *r.x_sql_ceiling >= share;
    } else {
      t.measured = "n/a: sql_ceiling not run";
    }
    r.targets.push_back(t);
  };
  if (with_target) rate_target("events/s >= 0.5 x SQL ceiling", 0.5);
  if (v.name == "kafka_drain" || v.bucket_leases) {
    // Issue 18's targets for the Kafka bridge on 2 cores, against the same run's ceiling.
    rate_target("one relay events/s >= 0.55 x SQL ceiling", 0.55);
    r.targets.push_back(CpuRatioTarget("Postgres CPU/msg <= 2 x the SQL ceiling's",
                                       r.pg_cpu_us_per_msg, sql_ceiling_pg_cpu_us_, 2.0,
                                       r.completed, "sql_ceiling"));
  }
  timelines_.emplace_back(v.name, obs.timeline);
  return r;
}

int Bench::ClaimConnections(int wanted, bool one_loop) const {
  if (one_loop) return 1;
  return wanted > 0 ? wanted : opt_.claim_connections;
}

ScenarioResult Bench::WebhookDrain(const std::string& name, int max_in_flight,
                                   std::int64_t messages, int claim_connections,
                                   bool bucket_leases, bool tls) {
  claim_connections = ClaimConnections(claim_connections, bucket_leases);
  ScenarioResult r;
  r.name = name;
  r.sink = "webhook";
  r.messages = messages;
  r.what = "relay drains a preloaded backlog to the loopback webhook receiver, max_in_flight " +
           std::to_string(max_in_flight) +
           (max_in_flight == opt_.webhook_connections ? " (= HTTP-ceiling connections)"
                                                      : " (the max_in_flight sweep)") +
           (claim_connections > 1 ? ", claim_connections " + std::to_string(claim_connections)
                                  : std::string()) +
           (bucket_leases ? "; claim_mode partitioned, bucket_leases" : "") +
           (tls ? "; over HTTPS (its ratios against https_ceiling)" : "");
  if (claim_connections > 1) r.details["claim_connections"] = claim_connections;
  Helper& receiver = tls ? Https() : Http();
  const int port = tls ? https_port_ : http_port_;
  const auto& ceiling = tls ? https_ceiling_ : http_ceiling_;
  const auto& ceiling_cpu_us = tls ? https_ceiling_cpu_us_ : http_ceiling_cpu_us_;
  const auto& ceiling_mean_request_us =
      tls ? https_ceiling_mean_request_us_ : http_ceiling_mean_request_us_;
  const std::string ceiling_name = tls ? "https_ceiling" : "http_ceiling";
  const std::string ceiling_words = tls ? "HTTPS ceiling" : "HTTP ceiling";
  if (bucket_leases) r.claim_mode = "bucket leases";
  const std::string url = pg_.FreshDatabase(r.name);
  Say(r.name + ": preloading " + std::to_string(r.messages) + " messages");
  Preload(url, r.messages, {}, 2);
  RecordCreatedAt(url);
  PrepareTable(url);
  receiver.Call("RECORD");

  const bool statement_stats = opt_.statement_stats && ResetStatementStats(url);
  Relay relay(url, WebhookDestination(port, max_in_flight, tls ? tls_files_.cert_path : ""), 1,
              bucket_leases ? relay::ClaimMode::kPartitioned : relay::ClaimMode::kSkipLocked,
              claim_connections, bucket_leases);
  Observation obs;
  if (statement_stats) obs.roles_url = url;
  Say(r.name + ": relay draining");
  obs.Begin(postmaster_pid_, {receiver.pid()});
  auto events0 = relay.SinkEvents();
  relay.Start();
  // Under claim_connections auto (the default) the sink chose: one loop per 8 of max_in_flight,
  // at most 4 and one per 4 CPUs.
  r.details["claim_loops"] = relay.ClaimLoops(kDestination);
  r.completed =
      obs.Watch(Delivered(relay), opt_.timeout_s, [&] { return relay.delivered() >= r.messages; });
  obs.End();
  auto events = relay.SinkEvents();
  const std::int64_t delivered = relay.delivered();
  relay.Stop();
  r.details["dispatcher"] = relay.StatsJson();
  {
    // Whether the workers waited for the receiver or for claims: the mean request against the
    // ceiling client's (same receiver, same connections), and the share of the workers' time
    // spent with nothing queued.
    for (auto& [event, n] : events) n -= events0[event];
    json sink = events;
    const auto requests = events["requests"];
    if (requests > 0) sink["mean_request_us"] = static_cast<double>(events["request_us"]) / requests;
    if (obs.seconds > 0) {
      sink["idle_share"] = static_cast<double>(events["idle_us"]) /
                           (obs.seconds * 1e6 * static_cast<double>(max_in_flight));
    }
    if (ceiling_mean_request_us) sink["ceiling_mean_request_us"] = *ceiling_mean_request_us;
    r.details["sink"] = sink;
  }
  r.details["queue_table"] = TableStats(url);
  if (statement_stats) AddStatementStats(r, url, obs, delivered);
  FillCommon(r, obs, delivered);
  FillDelivery(r, json::parse(receiver.Call(
                      "FINISH " + std::to_string(delivered) + " 60 " + url + " 0", 120)));
  r.latency_source += "; a drain's latency is mostly the wait in the backlog";
  RatioToSqlCeiling(r);
  if (name == "webhook_drain" && r.pg_cpu_us_per_msg)
    webhook_drain_pg_cpu_us_ = r.pg_cpu_us_per_msg;
  Target t{"events/s >= 0.6 x " + ceiling_words, "", std::nullopt};
  if (ceiling && *ceiling > 0) {
    r.x_http_ceiling = r.events_per_s / *ceiling;
    t.measured = Fixed(*r.x_http_ceiling, 2) + " x";
    t.pass = r.completed && *r.x_http_ceiling >= 0.6;
  } else {
    t.measured = "n/a: " + ceiling_name + " not run";
  }
  r.targets.push_back(t);
  // Signing, JSON and bookkeeping must cost less than the HTTP exchange itself.
  r.targets.push_back(CpuRatioTarget("relay CPU/msg <= 1.3 x the " + ceiling_words +
                                         " client's",
                                     r.relay_cpu_us_per_msg, ceiling_cpu_us, 1.3,
                                     /*completed=*/true, ceiling_name));
  if (!tls && relay_client_ceiling_ && *relay_client_ceiling_ > 0) {
    // Against the ceiling of the relay's own HTTP client (no target: what the relay adds to
    // the exchange it makes, where http_ceiling's targets compare it with cpp-httplib's).
    json own{{"x_ceiling", r.events_per_s / *relay_client_ceiling_}};
    if (relay_client_ceiling_cpu_us_ && *relay_client_ceiling_cpu_us_ > 0 &&
        r.relay_cpu_us_per_msg) {
      own["x_client_cpu"] = *r.relay_cpu_us_per_msg / *relay_client_ceiling_cpu_us_;
    }
    r.details["vs_http_ceiling_relay_client"] = own;
  }
  if (!obs.busiest_thread.empty()) {
    // No single relay thread may be the bottleneck: a thread near a whole core caps the drain
    // on any machine.
    r.targets.push_back(Target{"busiest relay thread < 0.9 of a core",
                               obs.busiest_thread + " " + Fixed(obs.busiest_share, 2),
                               obs.busiest_share < 0.9});
  }
  timelines_.emplace_back(r.name, obs.timeline);
  return r;
}

// The webhook service: `endpoints` endpoints stored in Postgres (all on the loopback receiver),
// every message fanned out to each. An event is a delivered request. What it shows is what a
// fan-out costs the database per request next to the single-endpoint drain: one claim and one
// delete serve every endpoint, so it should be a fraction; the delivery log adds an insert per
// request (written in batches).
ScenarioResult Bench::WebhookFanout(const std::string& name, int endpoints, bool delivery_log,
                                    std::int64_t messages) {
  ScenarioResult r;
  r.name = name;
  r.sink = "webhook";
  r.messages = messages * endpoints;
  const int per_endpoint = std::max(1, opt_.webhook_connections / endpoints);
  r.what = "webhook service (endpoints: database): " + std::to_string(messages) +
           " preloaded messages fanned out to " + std::to_string(endpoints) +
           " endpoints on the loopback receiver, max_in_flight " + std::to_string(per_endpoint) +
           " each, delivery log " + (delivery_log ? "on" : "off") +
           "; an event is one delivered request";
  const std::string url = pg_.FreshDatabase(r.name);
  Say(r.name + ": preloading " + std::to_string(messages) + " messages, " +
      std::to_string(endpoints) + " endpoints");
  Preload(url, messages, {}, 2);
  Http();  // the receiver's port goes into the endpoints' URLs: started before they are written
  {
    pqxx::connection c(url);
    pqxx::work tx(c);
    for (int i = 0; i < endpoints; ++i) {
      const std::string id = "ep" + std::to_string(i);
      tx.exec_params("INSERT INTO outbox.endpoints (id, destination, url) VALUES ($1, $2, $3)", id,
                     kDestination,
                     "http://127.0.0.1:" + std::to_string(http_port_) + "/hooks/" + id);
      tx.exec_params("INSERT INTO outbox.endpoint_secrets (endpoint_id, secret) VALUES ($1, $2)",
                     id, kWebhookSecret);
    }
    tx.commit();
  }
  PrepareTable(url);
  Http().Call("RECORD");

  relay::Destination dest = WebhookDestination(http_port_, per_endpoint);
  auto& w = dest.target.Get<relay::WebhookTarget>();
  w.url.clear();
  w.secrets.clear();
  w.endpoints_from_database = true;
  w.database_url = url;
  w.delivery_log = delivery_log;
  Relay relay(url, dest, 1, relay::ClaimMode::kSkipLocked, ClaimConnections(0));
  Observation obs;
  Say(r.name + ": relay fanning out");
  obs.Begin(postmaster_pid_, {Http().pid()});
  relay.Start();
  r.completed =
      obs.Watch(Delivered(relay), opt_.timeout_s, [&] { return relay.delivered() >= messages; });
  obs.End();
  const std::int64_t requests = relay.delivered() * endpoints;
  relay.Stop();
  r.details["dispatcher"] = relay.StatsJson();
  r.details["queue_table"] = TableStats(url);
  r.details["endpoints"] = endpoints;
  r.details["endpoint_rows"] = [&] {
    pqxx::connection c(url);
    pqxx::nontransaction tx(c);
    return tx.exec1("SELECT count(*) FROM outbox.messages WHERE endpoint_id IS NOT NULL")[0]
        .as<std::int64_t>();
  }();
  FillCommon(r, obs, requests);
  FillDelivery(r, json::parse(Http().Call(
                      "FINISH " + std::to_string(r.messages) + " 60 " + url + " 0", 120)));
  r.latency_source = "none: the endpoints' delivery ids are not the messages' keys";
  if (webhook_drain_pg_cpu_us_ && r.pg_cpu_us_per_msg && *webhook_drain_pg_cpu_us_ > 0) {
    r.details["x_webhook_drain_pg_cpu"] = *r.pg_cpu_us_per_msg / *webhook_drain_pg_cpu_us_;
  }
  if (!delivery_log) {
    // The fan-out itself: one claim and one delete serve every endpoint.
    r.targets.push_back(CpuRatioTarget(
        "Postgres CPU per delivered request <= 0.6 x webhook_drain's (fan-out, no log)",
        r.pg_cpu_us_per_msg, webhook_drain_pg_cpu_us_, 0.6, r.completed, "webhook_drain"));
    if (r.pg_cpu_us_per_msg) fanout_nolog_pg_cpu_us_ = r.pg_cpu_us_per_msg;
  } else if (fanout_nolog_pg_cpu_us_ && r.pg_cpu_us_per_msg) {
    // What the delivery log adds: a row per request, written in batches.
    r.details["delivery_log_pg_cpu_us_per_request"] =
        *r.pg_cpu_us_per_msg - *fanout_nolog_pg_cpu_us_;
  }
  timelines_.emplace_back(r.name, obs.timeline);
  return r;
}

// --- relay: live traffic -----------------------------------------------------------------

ScenarioResult Bench::KafkaPathLatency() {
  ScenarioResult r;
  r.name = "kafka_path_latency";
  r.sink = "kafka";
  r.claim_mode = "-";
  r.relays = 0;
  r.what =
      "baseline for the open loop, no relay and no Postgres: a producer with the Kafka "
      "sink's settings writes " +
      Fixed(opt_.open_loop_rate, 0) + " records/s straight into the mock cluster for " +
      Fixed(opt_.open_loop_seconds, 0) + " s; latency from produce() to the same consumer";
  const std::string topic = NewTopic(r.name);
  Observation obs;
  Say(r.name + ": producing");
  obs.Begin(postmaster_pid_, {Kafka().pid()});
  const json produced =
      json::parse(Kafka().Call("PRODUCE " + topic + " " + Fixed(opt_.open_loop_rate, 3) + " " +
                                   Fixed(opt_.open_loop_seconds, 3),
                               opt_.open_loop_seconds + 120));
  obs.End();
  const auto n = produced.at("produced").get<std::int64_t>();
  r.messages = n;
  FillCommon(r, obs, n);
  r.relay_cpu_us_per_msg.reset();  // no relay ran
  r.pg_cpu_us_per_msg.reset();
  r.peak_rss_mib.reset();
  FillDelivery(r, json::parse(Kafka().Call("FINISH " + std::to_string(n) + " 60 - 0", 120)));
  r.details["producer_ack_latency"] = produced.at("ack_latency");
  return r;
}

relay::ClaimMode Bench::Mode(const Variant& v) {
  return v.partitioned ? relay::ClaimMode::kPartitioned : relay::ClaimMode::kSkipLocked;
}

ScenarioResult Bench::OpenLoop(const std::string& name, const std::string& sink, int keys,
                               Delivery delivery) {
  ScenarioResult r;
  r.name = name;
  r.sink = sink;
  r.keys = keys;
  if (const int cc = ClaimConnections(0, delivery == Delivery::kExactlyOnce); cc > 1) {
    r.details["claim_connections"] = cc;
  }
  r.what = "open loop: producers insert " + Fixed(opt_.open_loop_rate, 0) +
           " msg/s on a fixed schedule (one message per transaction) for " +
           Fixed(opt_.open_loop_seconds, 0) + " s while the relay runs" +
           (keys > 0 ? ", " + std::to_string(keys) + " ordering keys" : "");
  const std::string url = pg_.FreshDatabase(name);
  Helper& receiver = sink == "kafka" ? Kafka() : Http();
  std::unique_ptr<Relay> relay;
  if (delivery != Delivery::kDefault) {
    // The exactly-once drain's setting (8 buckets, partitioned) with both deliveries.
    r.what += "; claim_mode partitioned, 8 buckets, delivery " +
              std::string(delivery == Delivery::kExactlyOnce ? "exactly_once" : "at_least_once");
    r.claim_mode = "partitioned";
    pqxx::connection c(url);
    pqxx::nontransaction(c).exec("SELECT outbox.set_bucket_count(8)");
  }
  if (sink == "kafka") {
    relay = std::make_unique<Relay>(
        url, KafkaDestination(bootstraps_, NewTopic(name), delivery == Delivery::kExactlyOnce), 1,
        delivery == Delivery::kDefault ? relay::ClaimMode::kSkipLocked
                                       : relay::ClaimMode::kPartitioned,
        ClaimConnections(0, delivery == Delivery::kExactlyOnce));
  } else {
    Http().Call("RECORD");
    relay = std::make_unique<Relay>(url, WebhookDestination(http_port_, opt_.webhook_connections),
                                    1, relay::ClaimMode::kSkipLocked, ClaimConnections(0));
  }
  relay->Start();
  relay->WaitForFirstClaims();
  relay->WarmUp(url, kWarmUpMessages);
  const bool statement_stats = opt_.statement_stats && ResetStatementStats(url);

  Observation obs;
  if (statement_stats) obs.roles_url = url;
  Say(name + ": producing");
  obs.Begin(postmaster_pid_, {receiver.pid(), Producers().pid()});
  auto producer = std::async(std::launch::async, [&] {
    return Producers().Call("OPENLOOP " + url + " " + Fixed(opt_.open_loop_rate, 3) + " " +
                                Fixed(opt_.open_loop_seconds, 3) + " 4 " + std::to_string(keys),
                            opt_.open_loop_seconds + 300);
  });
  obs.Watch(Delivered(*relay), opt_.open_loop_seconds + 300,
            [&] { return producer.wait_for(0s) == std::future_status::ready; });
  const json produced = json::parse(producer.get());
  const auto inserted = produced.at("inserted").get<std::int64_t>();
  r.completed = obs.Watch(Delivered(*relay), 60, [&] { return relay->delivered() >= inserted; });
  obs.End();
  const std::int64_t delivered = relay->delivered();
  relay->Stop();
  r.details["queue_table"] = TableStats(url);
  if (statement_stats) AddStatementStats(r, url, obs, delivered);
  r.messages = inserted;
  r.details["producer"] = produced;
  r.details["dispatcher"] = relay->StatsJson();
  FillCommon(r, obs, delivered);
  FillDelivery(
      r, json::parse(receiver.Call(
             "FINISH " + std::to_string(inserted + relay->warmed()) + " 60 " + url + " 0", 120)));
  RatioToSqlCeiling(r);
  const json& tail = r.details["delivery"];
  Target t{"p99 enqueue-to-delivery < 20 ms",
           Fixed(r.latency->p99_ms, 1) + " ms (" + tail["latency_over_100ms"].dump() + " of " +
               std::to_string(inserted) + " over 100 ms, " + tail["latency_over_1s"].dump() +
               " over 1 s)",
           std::nullopt};
  t.pass = r.completed && r.latency->count > 0 && r.latency->p99_ms < 20.0;
  r.targets.push_back(t);
  r.targets.push_back(NoMessageWaitsForTheSweep(r));
  timelines_.emplace_back(name, obs.timeline);
  return r;
}

// Live traffic: no message takes over a second, and the full sweep found nothing the fresh
// lane had passed (docs/adr/0001-claim-path.md).
Target Bench::NoMessageWaitsForTheSweep(const ScenarioResult& r) {
  const auto over_1s = r.details["delivery"].value("latency_over_1s", std::int64_t{-1});
  const auto swept = r.details["dispatcher"].value("sweep_found", std::int64_t{-1});
  Target t{"0 messages over 1 s, 0 found by the sweep",
           std::to_string(over_1s) + " over 1 s (max " +
               Fixed(r.latency ? r.latency->max_ms : 0, 0) + " ms), " + std::to_string(swept) +
               " found by the sweep",
           std::nullopt};
  t.pass = r.completed && over_1s == 0 && swept == 0;
  return t;
}

ScenarioResult Bench::Burst(const Variant& v) {
  ScenarioResult r;
  r.name = v.name;
  r.sink = "kafka";
  if (const int cc = ClaimConnections(v.claim_connections); cc > 1) {
    r.details["claim_connections"] = cc;
  }
  r.relays = v.relays;
  r.claim_mode = v.partitioned ? "partitioned" : "skip_locked";
  r.messages = opt_.burst_messages;
  r.what = "burst: " + std::to_string(r.messages) +
           " messages preloaded with one deliver_after instant T; " + std::to_string(v.relays) +
           " relay" + (v.relays > 1 ? "s" : "") + " (" + r.claim_mode +
           ") run idle until T; latency and throughput from T";
  const std::string url = pg_.FreshDatabase(r.name);
  // T leaves room for the preload at the rate measured earlier (or a cautious guess).
  const double rate = preload_rate_ > 0 ? preload_rate_ : 5'000;
  const std::int64_t burst_at =
      WallMicros() +
      static_cast<std::int64_t>((static_cast<double>(r.messages) / rate * 1.5 + 15) * 1e6);
  MessageShape shape;
  shape.deliver_after = Rfc3339(burst_at);
  Say(r.name + ": preloading " + std::to_string(r.messages) + " messages due at " +
      shape.deliver_after);
  Preload(url, r.messages, shape, 2);
  PrepareTable(url);
  const std::string topic = NewTopic(r.name);
  Relay relay(url, KafkaDestination(bootstraps_, topic), v.relays, Mode(v),
              ClaimConnections(v.claim_connections));
  relay.Start();
  relay.WarmUp(url, kWarmUpMessages);
  const double slack_s = static_cast<double>(burst_at - WallMicros()) / 1e6;
  r.details["seconds_to_spare_before_T"] = slack_s;
  if (slack_s > 0) std::this_thread::sleep_for(std::chrono::microseconds(burst_at - WallMicros()));
  if (slack_s < 1) Say(r.name + ": the preload overran T; latencies include the overrun");

  Observation obs;
  Say(r.name + ": T reached, relay draining");
  obs.Begin(postmaster_pid_, {Kafka().pid()});
  r.completed =
      obs.Watch(Delivered(relay), opt_.timeout_s, [&] { return relay.delivered() >= r.messages; });
  obs.End();
  const std::int64_t delivered = relay.delivered();
  relay.Stop();
  r.details["dispatcher"] = relay.StatsJson();
  r.details["queue_table"] = TableStats(url);
  FillCommon(r, obs, delivered);
  FillDelivery(r, json::parse(Kafka().Call("FINISH " + std::to_string(delivered + relay.warmed()) +
                                               " 120 - " + std::to_string(burst_at),
                                           180)));
  RatioToSqlCeiling(r);
  timelines_.emplace_back(r.name, obs.timeline);
  return r;
}

ScenarioResult Bench::Sustained() {
  ScenarioResult r;
  r.name = "sustained_kafka";
  r.sink = "kafka";
  if (opt_.claim_connections > 1) r.details["claim_connections"] = opt_.claim_connections;
  r.what = std::to_string(opt_.producers) + " producer connections commit " +
           std::to_string(opt_.producer_batch) + "-message transactions as fast as Postgres " +
           "takes them (synchronous_commit off) for " + Fixed(opt_.sustained_seconds, 0) +
           " s while the relay delivers to Kafka";
  const std::string url = pg_.FreshDatabase(r.name);
  const std::string topic = NewTopic(r.name);
  Relay relay(url, KafkaDestination(bootstraps_, topic), 1, relay::ClaimMode::kSkipLocked,
              ClaimConnections(0));
  relay.Start();
  relay.WaitForFirstClaims();
  relay.WarmUp(url, kWarmUpMessages);
  pqxx::connection sampler(url);
  const std::int64_t ids_before = IdsHandedOut(sampler);
  const bool statement_stats = opt_.statement_stats && ResetStatementStats(url);

  Observation obs;
  Say(r.name + ": producing for " + Fixed(opt_.sustained_seconds, 0) + " s");
  obs.Begin(postmaster_pid_, {Kafka().pid(), Producers().pid()});
  auto producer = std::async(std::launch::async, [&] {
    return Producers().Call("SUSTAIN " + url + " " + std::to_string(opt_.producers) + " " +
                                std::to_string(opt_.producer_batch) + " " +
                                Fixed(opt_.sustained_seconds, 3) + " 0",
                            opt_.sustained_seconds + 300);
  });
  obs.Watch(
      Delivered(relay), opt_.sustained_seconds + 300,
      [&] { return producer.wait_for(0s) == std::future_status::ready; },
      [&] { return IdsHandedOut(sampler) - ids_before; });
  obs.End();
  const Observation producing = obs;  // CPU and claim timings of the producing phase only
  const json produced = json::parse(producer.get());
  const auto inserted = produced.at("inserted").get<std::int64_t>();
  const std::int64_t delivered = relay.delivered();
  const double produce_rate = produced.at("rate").get<double>();

  // After the producers stop: how long the relay takes to empty what is left.
  const double drain_start = MonoSeconds();
  r.completed = obs.Watch(
      Delivered(relay), opt_.timeout_s, [&] { return relay.delivered() >= inserted; },
      [&] { return IdsHandedOut(sampler) - ids_before; });
  const double catch_up_s = MonoSeconds() - drain_start;
  relay.Stop();
  if (statement_stats) {
    r.details["statements"] = StatementStats(url, relay.delivered());
  }
  r.details["queue_table"] = TableStats(url);
  r.messages = inserted;
  r.details["producer"] = produced;
  r.details["dispatcher"] = relay.StatsJson();
  FillCommon(r, producing, delivered);
  FillDelivery(r, json::parse(Kafka().Call(
                      "FINISH " + std::to_string(inserted + relay.warmed()) + " 120 - 0", 180)));
  RatioToSqlCeiling(r);

  // Bounded backlog: over the second half of the producing phase the backlog's trend is
  // under 2% of the produce rate, and what is left at the end is under two seconds' worth
  // (at least 10k: a few claim batches are always in flight).
  std::vector<double> t, backlog, rss_t, rss;
  std::int64_t max_backlog = 0;
  for (const auto& s : obs.timeline) {
    if (s.t > obs.seconds) break;
    max_backlog = std::max(max_backlog, s.backlog);
    if (s.t >= obs.seconds / 2) {
      t.push_back(s.t);
      backlog.push_back(static_cast<double>(s.backlog));
    }
    if (s.t >= obs.seconds * 0.2) rss.push_back(s.rss_mib);
  }
  const double slope = Slope(t, backlog);
  const std::int64_t backlog_at_end = inserted - delivered;
  const bool bounded = slope <= 0.02 * produce_rate &&
                       static_cast<double>(backlog_at_end) <= std::max(10'000.0, 2 * produce_rate);
  r.details["backlog"] = {{"max", max_backlog},
                          {"at_producer_stop", backlog_at_end},
                          {"trend_second_half_per_s", slope},
                          {"catch_up_s", catch_up_s}};
  r.targets.push_back({"backlog bounded under full producer load",
                       "trend " + Fixed(slope, 0) + "/s vs produce " + Fixed(produce_rate, 0) +
                           "/s, " + std::to_string(backlog_at_end) + " left at stop",
                       bounded});
  r.targets.push_back(NoMessageWaitsForTheSweep(r));

  // Flat RSS: after a 20% warm-up, the median of the last third is within max(4 MiB, 5%) of
  // the median of the first third.
  const std::size_t third = rss.size() / 3;
  if (third > 0) {
    const double first =
        Median(std::vector<double>(rss.begin(), rss.begin() + static_cast<long>(third)));
    const double last =
        Median(std::vector<double>(rss.end() - static_cast<long>(third), rss.end()));
    r.details["rss_mib"] = {{"first_third_median", first}, {"last_third_median", last}};
    r.targets.push_back({"relay RSS flat over the run",
                         Fixed(first, 1) + " -> " + Fixed(last, 1) + " MiB",
                         last - first <= std::max(4.0, 0.05 * first)});
  } else {
    r.targets.push_back({"relay RSS flat over the run", "n/a: run too short", std::nullopt});
  }
  timelines_.emplace_back(r.name, obs.timeline);
  return r;
}

std::vector<ScenarioResult> Bench::Run(
    const std::function<void(const ScenarioResult&)>& on_result) {
  // Baselines first: the relay scenarios report ratios to them. Then the relay on its own
  // (one instance, skip_locked), then the claim modes side by side with 1, 2 and 4 relays.
  std::vector<std::pair<std::string, std::function<ScenarioResult()>>> scenarios = {
      {"sql_ceiling", [&] { return SqlCeiling("sql_ceiling", 1); }},
      {"sql_ceiling_x2", [&] { return SqlCeiling("sql_ceiling_x2", 2); }},
      {"sql_ceiling_x4", [&] { return SqlCeiling("sql_ceiling_x4", 4); }},
      {"sql_row_leases", [&] { return SqlCycle("sql_row_leases", LeaseForm::kRowLeases); }},
      {"sql_bucket_leases",
       [&] { return SqlCycle("sql_bucket_leases", LeaseForm::kBucketLeases); }},
      {"kafka_drain", [&] { return KafkaDrain({"kafka_drain"}, opt_.kafka_messages, true); }},
      {"kafka_drain_bucket_leases",
       [&] {
         Variant v{"kafka_drain_bucket_leases", 0, 1, true};
         v.bucket_leases = true;
         return KafkaDrain(v, opt_.kafka_messages, false);
       }},
      {"kafka_drain_stale_stats",
       [&] {
         Variant v{"kafka_drain_stale_stats"};
         v.stale_stats = true;
         return KafkaDrain(v, opt_.kafka_messages, false);
       }},
      {"kafka_drain_keyed",
       [&] {
         return KafkaDrain({"kafka_drain_keyed", opt_.keys}, opt_.kafka_messages, false);
       }},
      {"kafka_drain_partitioned_b8",
       [&] {
         Variant v{"kafka_drain_partitioned_b8", 0, 1, true};
         v.buckets = 8;
         return KafkaDrain(v, opt_.kafka_messages, false);
       }},
      {"kafka_drain_exactly_once_b8",
       [&] {
         Variant v{"kafka_drain_exactly_once_b8", 0, 1, true};
         v.buckets = 8;
         v.exactly_once = true;
         return KafkaDrain(v, opt_.kafka_messages, false);
       }},
      {"http_ceiling", [&] { return HttpCeiling(); }},
      {"http_ceiling_relay_client",
       [&] { return HttpCeiling(/*tls=*/false, /*relay_client=*/true); }},
      {"webhook_drain",
       [&] {
         return WebhookDrain("webhook_drain", opt_.webhook_connections, opt_.webhook_messages);
       }},
      {"webhook_drain_bucket_leases",
       [&] {
         return WebhookDrain("webhook_drain_bucket_leases", opt_.webhook_connections,
                             opt_.webhook_messages, 0, /*bucket_leases=*/true);
       }},
      {"https_ceiling", [&] { return HttpCeiling(/*tls=*/true); }},
      {"webhook_drain_https",
       [&] {
         return WebhookDrain("webhook_drain_https", opt_.webhook_connections,
                             opt_.webhook_messages, 0, false, /*tls=*/true);
       }},
      {"webhook_fanout10_nolog",
       [&] {
         return WebhookFanout("webhook_fanout10_nolog", 10, false, opt_.webhook_messages / 10);
       }},
      {"webhook_fanout10",
       [&] { return WebhookFanout("webhook_fanout10", 10, true, opt_.webhook_messages / 10); }},
      {"kafka_path_latency", [&] { return KafkaPathLatency(); }},
      {"open_loop_kafka", [&] { return OpenLoop("open_loop_kafka", "kafka", 0); }},
      {"open_loop_kafka_keyed",
       [&] { return OpenLoop("open_loop_kafka_keyed", "kafka", opt_.keys); }},
      {"open_loop_webhook", [&] { return OpenLoop("open_loop_webhook", "webhook", 0); }},
      {"open_loop_kafka_partitioned_b8",
       [&] {
         return OpenLoop("open_loop_kafka_partitioned_b8", "kafka", 0, Delivery::kAtLeastOnce);
       }},
      {"open_loop_kafka_exactly_once_b8",
       [&] {
         return OpenLoop("open_loop_kafka_exactly_once_b8", "kafka", 0, Delivery::kExactlyOnce);
       }},
      {"burst_kafka", [&] { return Burst({"burst_kafka"}); }},
      {"sustained_kafka", [&] { return Sustained(); }},
  };
  for (bool partitioned : {false, true}) {
    for (int relays : opt_.scale_relays) {
      Variant v{
          std::string(partitioned ? "partitioned" : "skip_locked") + "_x" + std::to_string(relays),
          0, relays, partitioned};
      v.name = "kafka_drain_" + v.name;
      scenarios.emplace_back(v.name,
                             [this, v] { return KafkaDrain(v, opt_.scale_messages, false); });
    }
  }
  for (bool partitioned : {false, true}) {
    const int relays = opt_.scale_relays.empty() ? 1 : opt_.scale_relays.back();
    Variant v{std::string("burst_kafka_") + (partitioned ? "partitioned" : "skip_locked") + "_x" +
                  std::to_string(relays),
              0, relays, partitioned};
    scenarios.emplace_back(v.name, [this, v] { return Burst(v); });
  }
  // The webhook drain as max_in_flight grows: it should rise until the CPU or Postgres is the
  // limit, and the per-thread CPU shows which thread saturates first.
  for (const int mif : opt_.webhook_sweep) {
    const std::string name = "webhook_drain_mif" + std::to_string(mif);
    scenarios.emplace_back(
        name, [this, name, mif] { return WebhookDrain(name, mif, opt_.webhook_messages / 2); });
  }
  // One relay with several claim loops per destination (claim_connections): the drains above
  // again, against what as many connections of raw statements reach (sql_ceiling_x<N>).
  for (const int cc : opt_.claim_connections_sweep) {
    Variant v{"kafka_drain_cc" + std::to_string(cc)};
    v.claim_connections = cc;
    scenarios.emplace_back(v.name, [this, v] { return KafkaDrain(v, opt_.kafka_messages, false); });
    const std::string name = "webhook_drain_cc" + std::to_string(cc);
    scenarios.emplace_back(name, [this, name, cc] {
      return WebhookDrain(name, opt_.webhook_connections, opt_.webhook_messages, cc);
    });
  }
  scenarios.emplace_back("sql_ceiling_end", [&] { return SqlCeiling("sql_ceiling_end", 1); });
  std::vector<ScenarioResult> results;
  for (const auto& [name, run] : scenarios) {
    if (!opt_.only.empty() && !opt_.only.count(name)) continue;
    Say(name + ": start");
    // Other work on the machine moves every number; the load average says how much.
    const double load_before = LoadAverage();
    ScenarioResult r;
    try {
      r = run();
    } catch (const std::exception& e) {
      r = ScenarioResult{};
      r.name = name;
      r.completed = false;
      r.details["error"] = e.what();
      Say(name + ": FAILED: " + e.what());
    }
    r.details["loadavg_1m"] = {{"before", load_before}, {"after", LoadAverage()}};
    on_result(r);
    results.push_back(std::move(r));
  }
  return results;
}

json ToJson(const ScenarioResult& r) {
  json j;
  j["scenario"] = r.name;
  j["what"] = r.what;
  j["sink"] = r.sink;
  j["claim_mode"] = r.claim_mode;
  j["relays"] = r.relays;
  if (r.skipped) {
    j["skipped"] = true;
    j["reason"] = r.skip_reason;
    return j;
  }
  j["completed"] = r.completed;
  j["messages"] = r.messages;
  j["keys"] = r.keys;
  j["seconds"] = r.seconds;
  j["events_per_s"] = r.events_per_s;
  const auto opt = [](const std::optional<double>& v) { return v ? json(*v) : json(nullptr); };
  j["x_sql_ceiling"] = opt(r.x_sql_ceiling);
  j["x_http_ceiling"] = opt(r.x_http_ceiling);
  j["latency"] = r.latency ? PercentilesJson(*r.latency) : json(nullptr);
  j["latency_source"] = r.latency_source;
  j["claim"] = r.claim ? PercentilesJson(*r.claim) : json(nullptr);
  j["claim_source"] = r.claim_source;
  j["settle"] = r.settle ? PercentilesJson(*r.settle) : json(nullptr);
  j["relay_cpu_us_per_msg"] = opt(r.relay_cpu_us_per_msg);
  j["pg_cpu_us_per_msg"] = opt(r.pg_cpu_us_per_msg);
  j["helpers_cpu_us_per_msg"] = opt(r.helpers_cpu_us_per_msg);
  j["peak_rss_mib"] = opt(r.peak_rss_mib);
  j["targets"] = json::array();
  for (const auto& t : r.targets) {
    j["targets"].push_back({{"goal", t.goal},
                            {"measured", t.measured},
                            {"result", !t.pass   ? "n/a"
                                       : *t.pass ? "PASS"
                                                 : "MISS"}});
  }
  j["details"] = r.details;
  return j;
}

}  // namespace outbox::bench
