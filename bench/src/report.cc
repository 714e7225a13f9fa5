#include "report.h"

#include "common.h"

#include <httplib.h>
#include <librdkafka/rdkafka.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace outbox::bench {
namespace {

// 123456.7 -> "123.5k"; small values keep their digits.
std::string Rate(double v) {
  if (v >= 10'000) return Fixed(v / 1000, 1) + "k";
  return Fixed(v, 0);
}

std::string Ms(double v) {
  if (v >= 1000) return Fixed(v / 1000, 1) + " s";
  if (v >= 100) return Fixed(v, 0);
  if (v >= 10) return Fixed(v, 1);
  return Fixed(v, 2);
}

std::string Opt(const std::optional<double>& v, int digits, const std::string& suffix = "") {
  return v ? Fixed(*v, digits) + suffix : "–";
}

std::string FirstLineWith(const std::string& path, const std::string& key) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) == 0) {
      const auto colon = line.find(':');
      std::string value = colon == std::string::npos ? line : line.substr(colon + 1);
      while (!value.empty() && value.front() == ' ') value.erase(0, 1);
      while (!value.empty() && (value.front() == '\t')) value.erase(0, 1);
      return value;
    }
  }
  return "?";
}

std::string Load(const ScenarioResult& r) {
  if (!r.details.contains("loadavg_1m")) return "–";
  const auto& l = r.details["loadavg_1m"];
  return Fixed(l["before"].get<double>(), 1) + "→" + Fixed(l["after"].get<double>(), 1);
}

std::string TargetsCell(const ScenarioResult& r) {
  std::string out;
  for (const auto& t : r.targets) {
    if (!out.empty()) out += "; ";
    out += !t.pass ? "n/a" : *t.pass ? "**PASS**" : "**MISS**";
  }
  return out.empty() ? "–" : out;
}

}  // namespace

std::string MachineDescription(const std::string& postgres) {
  utsname u{};
  uname(&u);
  std::ostringstream out;
  out << "- CPU: " << FirstLineWith("/proc/cpuinfo", "model name") << ", nproc "
      << sysconf(_SC_NPROCESSORS_ONLN) << "\n"
      << "- Memory: " << FirstLineWith("/proc/meminfo", "MemTotal") << "\n"
      << "- Kernel: " << u.sysname << " " << u.release << " " << u.machine << "\n"
      << "- " << postgres << "\n"
      << "- Load average (1 min) when the run started: " << LoadAverage()
      << " (other work on the machine; each scenario's row shows it before→after)\n"
      << "- librdkafka " << rd_kafka_version_str() << " (mock cluster), cpp-httplib "
      << CPPHTTPLIB_VERSION << "\n";
  return out.str();
}

std::string MarkdownReport(const std::vector<ScenarioResult>& results) {
  std::ostringstream out;
  out << "| scenario | messages | events/s | × SQL ceiling | × HTTP ceiling | "
         "latency p50 / p95 / p99 / max (ms) | claim p50 / p99 (ms) | relay CPU µs/msg | "
         "Postgres CPU µs/msg | peak RSS MiB | load 1m | targets |\n"
      << "|---|---:|---:|---:|---:|---|---|---:|---:|---:|---|---|\n";
  for (const auto& r : results) {
    if (r.skipped) {
      out << "| " << r.name << " | – | skipped | | | | | | | | | " << r.skip_reason << " |\n";
      continue;
    }
    if (r.details.contains("error")) {
      out << "| " << r.name << " | – | failed | | | | | | | | | " << r.details["error"].get<std::string>() << " |\n";
      continue;
    }
    out << "| " << r.name << (r.keys > 0 ? " (" + std::to_string(r.keys) + " keys)" : "")
        << (r.completed ? "" : " (timed out)") << " | " << r.messages << " | "
        << Rate(r.events_per_s) << " | " << Opt(r.x_sql_ceiling, 2) << " | "
        << Opt(r.x_http_ceiling, 2) << " | ";
    if (r.latency && r.latency->count > 0) {
      out << Ms(r.latency->p50_ms) << " / " << Ms(r.latency->p95_ms) << " / "
          << Ms(r.latency->p99_ms) << " / " << Ms(r.latency->max_ms);
    } else {
      out << "–";
    }
    out << " | ";
    if (r.claim && r.claim->count > 0) {
      out << Ms(r.claim->p50_ms) << " / " << Ms(r.claim->p99_ms);
    } else {
      out << "–";
    }
    out << " | " << Opt(r.relay_cpu_us_per_msg, 1) << " | " << Opt(r.pg_cpu_us_per_msg, 1) << " | "
        << Opt(r.peak_rss_mib, 0) << " | " << Load(r) << " | " << TargetsCell(r) << " |\n";
  }
  out << "\n| scenario | target | measured | result |\n|---|---|---|---|\n";
  for (const auto& r : results) {
    for (const auto& t : r.targets) {
      out << "| " << r.name << " | " << t.goal << " | " << t.measured << " | "
          << (!t.pass ? "n/a" : *t.pass ? "PASS" : "MISS") << " |\n";
    }
  }
  return out.str();
}

void WriteResults(const std::string& dir, const std::vector<ScenarioResult>& results,
                  const std::vector<std::pair<std::string, std::vector<Sample>>>& timelines,
                  const std::string& machine, const std::string& command) {
  std::filesystem::create_directories(dir);
  {
    std::ofstream out(dir + "/results.jsonl");
    for (const auto& r : results) out << ToJson(r).dump() << "\n";
  }
  {
    std::ofstream out(dir + "/results.md");
    out << "Command: `" << command << "`\n\n" << machine << "\n" << MarkdownReport(results);
  }
  {
    // name, events/s, x SQL ceiling (0 when not measured)
    std::ofstream out(dir + "/throughput.tsv");
    out << "# scenario\tevents_per_s\tx_sql_ceiling\n";
    for (const auto& r : results) {
      if (r.skipped || r.details.contains("error")) continue;
      out << r.name << "\t" << r.events_per_s << "\t" << r.x_sql_ceiling.value_or(0) << "\n";
    }
  }
  {
    std::ofstream out(dir + "/latency.tsv");
    out << "# scenario\tp50_ms\tp95_ms\tp99_ms\tmax_ms\n";
    for (const auto& r : results) {
      if (!r.latency || r.latency->count == 0) continue;
      out << r.name << "\t" << r.latency->p50_ms << "\t" << r.latency->p95_ms << "\t"
          << r.latency->p99_ms << "\t" << r.latency->max_ms << "\n";
    }
  }
  for (const auto& [name, samples] : timelines) {
    std::ofstream out(dir + "/timeline_" + name + ".tsv");
    out << "# t_s\tproduced\tdelivered\tbacklog\trss_mib\tclaims\tclaim_p99_ms\n";
    for (const auto& s : samples) {
      out << s.t << "\t" << s.produced << "\t" << s.delivered << "\t" << s.backlog << "\t"
          << s.rss_mib << "\t" << s.claims << "\t" << s.claim_p99_ms << "\n";
    }
  }
}

}  // namespace outbox::bench
