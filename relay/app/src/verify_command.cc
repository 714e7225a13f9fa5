// `outbox-relay verify`: after an incident, does the target hold every delivered message
// once, each key in order? (docs/operations.md, "Verify a destination").
#include <chrono>
#include <ctime>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <regex>

#include "commands.h"
#include "outbox_relay/archive.h"
#include "outbox_relay/cloudevents.h"
#include "outbox_relay/config.h"
#include "outbox_relay/sink_registry.h"
#include "outbox_relay/store.h"
#include "outbox_relay/verify.h"

namespace outbox::relay::app {
namespace {

using SystemTime = std::chrono::system_clock::time_point;

// Exit codes: 0 clean, 1 findings, 2 could not verify.
constexpr int kClean = 0;
constexpr int kFindings = 1;
constexpr int kCannotVerify = 2;

int CannotVerify(const std::string& why) {
  std::cerr << "error: " << why << "\n";
  return kCannotVerify;
}

// The latest whole second the clock holds (system_clock counts nanoseconds: 2262-04-11).
std::time_t LatestSecond() {
  return std::chrono::system_clock::to_time_t(
             std::chrono::time_point_cast<std::chrono::seconds>(SystemTime::max())) -
         1;
}

// "2026-11-23T08:00:00Z" (optionally with .fff), or an age: "90s", "15m", "2h", "7d". Either
// names a time from 1970-01-01T00:00:00Z on that the clock holds; a date or time of day that
// does not exist (February 31st, 25:61) is refused, never rolled over. Nullopt, with the
// reason in `problem`, when `text` is none of these.
std::optional<SystemTime> ParseSince(const std::string& text, SystemTime now,
                                     std::string& problem) {
  static const std::regex age(R"((\d{1,9})([smhd]))");
  static const std::regex stamp(
      R"((\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(\.(\d{1,3}))?Z)");
  std::smatch m;
  if (std::regex_match(text, m, age)) {
    const long long n = std::stoll(m[1]);
    const long long unit = m[2] == "s" ? 1 : m[2] == "m" ? 60 : m[2] == "h" ? 3600 : 86400;
    const long long back = n * unit;  // at most 999999999 days: fits
    const long long since_1970 =
        std::chrono::duration_cast<std::chrono::seconds>(now.time_since_epoch()).count();
    if (back > since_1970) {
      problem = "reaches back before 1970-01-01 (an age is at most " +
                std::to_string(since_1970 / 86400) + "d now)";
      return std::nullopt;
    }
    return now - std::chrono::seconds(back);
  }
  if (std::regex_match(text, m, stamp)) {
    std::tm tm{};
    tm.tm_year = std::stoi(m[1]) - 1900;
    tm.tm_mon = std::stoi(m[2]) - 1;
    tm.tm_mday = std::stoi(m[3]);
    tm.tm_hour = std::stoi(m[4]);
    tm.tm_min = std::stoi(m[5]);
    tm.tm_sec = std::stoi(m[6]);
    const std::tm asked = tm;
    const std::time_t t = timegm(&tm);  // normalises tm: a field out of range rolls over
    if (tm.tm_year != asked.tm_year || tm.tm_mon != asked.tm_mon || tm.tm_mday != asked.tm_mday ||
        tm.tm_hour != asked.tm_hour || tm.tm_min != asked.tm_min || tm.tm_sec != asked.tm_sec) {
      problem =
          "is no real UTC time (month 01-12, a day the month has, hour 00-23, minute and "
          "second 00-59)";
      return std::nullopt;
    }
    if (t < 0 || t > LatestSecond()) {
      problem = "is outside 1970-01-01T00:00:00Z to " +
                FormatRfc3339(std::chrono::system_clock::from_time_t(LatestSecond()));
      return std::nullopt;
    }
    std::string millis = m[8];
    while (!millis.empty() && millis.size() < 3) millis += '0';
    return std::chrono::system_clock::from_time_t(t) +
           std::chrono::milliseconds(millis.empty() ? 0 : std::stoi(millis));
  }
  problem = "is neither a UTC time nor an age";
  return std::nullopt;
}

nlohmann::json ToJson(const VerifyReport& r, const std::string& destination,
                      const std::string& since) {
  nlohmann::json j;
  j["destination"] = destination;
  j["since"] = since;
  j["clean"] = r.clean();
  j["archived"] = r.archived;
  j["records"] = r.records;
  j["foreign_records"] = r.foreign;
  j["records_outside_window"] = r.not_archived;
  j["gap_count"] = r.gaps.size();
  j["duplicate_count"] = r.duplicates.size();
  j["inversion_count"] = r.inversions.size();
  j["gaps"] = nlohmann::json::array();
  for (const auto& g : r.gaps) {
    j["gaps"].push_back({{"id", g.id},
                         {"idempotency_key", g.idempotency_key},
                         {"ordering_key", g.ordering_key ? nlohmann::json(*g.ordering_key)
                                                         : nlohmann::json(nullptr)}});
  }
  j["duplicates"] = nlohmann::json::array();
  for (const auto& d : r.duplicates) {
    nlohmann::json at = nlohmann::json::array();
    for (const auto& [stream, position] : d.at) {
      at.push_back({{"stream", stream}, {"position", position}});
    }
    j["duplicates"].push_back(
        {{"idempotency_key", d.idempotency_key}, {"outbox_ids", d.outbox_ids}, {"at", at}});
  }
  j["inversions"] = nlohmann::json::array();
  for (const auto& i : r.inversions) {
    j["inversions"].push_back({{"stream", i.stream},
                               {"ordering_key", i.ordering_key},
                               {"earlier_id", i.earlier_id},
                               {"earlier_position", i.earlier_position},
                               {"later_id", i.later_id},
                               {"later_position", i.later_position}});
  }
  j["missing"] = r.missing;
  j["streams"] = nlohmann::json::object();
  for (const auto& [stream, s] : r.streams) {
    j["streams"][stream] = {
        {"records", s.records}, {"duplicates", s.duplicates}, {"inversions", s.inversions}};
  }
  return j;
}

// The summary for people: on stdout, or on stderr when stdout carries the JSON report.
void PrintSummary(std::ostream& out, const VerifyReport& r, const std::string& destination,
                  const std::string& since) {
  out << "verify " << destination << " since " << since << ": " << r.streams.size()
      << " stream(s) read\n"
      << "  delivered (archived) " << r.archived << ", records read " << r.records
      << " (not the relay's " << r.foreign << ", of messages outside the window " << r.not_archived
      << ")\n"
      << "  gaps " << r.gaps.size() << ", duplicates " << r.duplicates.size()
      << ", order inversions " << r.inversions.size() << "\n";
  for (const auto& m : r.missing) {
    out << "  " << m << " does not exist in the target: nothing was delivered there\n";
  }
  constexpr std::size_t kShown = 20;
  for (std::size_t i = 0; i < r.gaps.size() && i < kShown; ++i) {
    out << "  gap: message " << r.gaps[i].id << " (" << r.gaps[i].idempotency_key
        << ") was delivered but is not in the target\n";
  }
  for (std::size_t i = 0; i < r.duplicates.size() && i < kShown; ++i) {
    out << "  duplicate: " << r.duplicates[i].idempotency_key << " found "
        << r.duplicates[i].at.size() << " times:";
    for (const auto& [stream, position] : r.duplicates[i].at) {
      out << " " << stream << "@" << position;
    }
    out << "\n";
  }
  for (std::size_t i = 0; i < r.inversions.size() && i < kShown; ++i) {
    const auto& v = r.inversions[i];
    out << "  inversion: key " << v.ordering_key << " in " << v.stream << ": message "
        << v.earlier_id << " at " << v.earlier_position << " after message " << v.later_id << " at "
        << v.later_position << "\n";
  }
  out << (r.clean() ? "CLEAN" : "NOT CLEAN (details: --json)") << "\n";
}

}  // namespace

int RunVerify(const VerifyArgs& a) {
  RelayConfig config;
  try {
    // --database-url as for `run`: it wins, and stands in for a config without database_url.
    config = LoadConfigFile(a.config_path, ProcessEnvWithDatabaseUrl(a.database_url));
  } catch (const std::exception& e) {
    return CannotVerify(e.what());
  }
  std::string name = a.destination;
  if (name.empty()) {
    if (config.destinations.size() != 1) {
      return CannotVerify("the config has " + std::to_string(config.destinations.size()) +
                          " destinations; name the one to verify with --destination");
    }
    name = config.destinations.begin()->first;
  }
  const auto it = config.destinations.find(name);
  if (it == config.destinations.end()) {
    return CannotVerify("no destination " + name + " in " + a.config_path +
                        "; name one of its destinations with --destination");
  }
  const Destination& destination = it->second;
  const SinkFactory& factory = SinkFactoryFor(destination);
  if (factory.read_back == nullptr) {
    return CannotVerify("destination " + name + " is a " + std::string(factory.kind) +
                        " destination, whose target cannot be read back; verify works on "
                        "Kafka destinations");
  }
  if (!config.retention.archive_delivered) {
    return CannotVerify(
        "verify compares the target with outbox.delivered_archive, which this config does not "
        "keep; set `retention: {archive_delivered: true}` (messages delivered from then on can "
        "be verified)");
  }
  const auto now = std::chrono::system_clock::now();
  SystemTime since{};
  std::string since_text = "the start";
  if (!a.since.empty()) {
    std::string problem;
    const auto parsed = ParseSince(a.since, now, problem);
    if (!parsed) {
      return CannotVerify("--since " + a.since + " " + problem +
                          "; give a UTC time (2026-11-23T08:00:00Z, optionally with "
                          "milliseconds: 2026-11-23T08:00:00.250Z) or an age (90s, 15m, 2h, 7d)");
    }
    since = *parsed;
    since_text = FormatRfc3339(since);
  }

  // The archive first: whatever it holds was produced before the topics are read.
  std::vector<ArchivedMessage> archived;
  try {
    Store store(config.database_url);
    archived = ReadArchive(store, name, since);
  } catch (const std::exception& e) {
    return CannotVerify("reading the delivered archive: " + WithRoleHint(e));
  }
  ReadBackOptions options;
  // The window is by delivery (the database's clock). A message's record was produced after it
  // was created, and maybe long before its delivery was written (a settle held up while the
  // database was away): the read starts at the earliest creation among the window's messages,
  // less a while, since a record's timestamp is the clock of the relay that produced it, which
  // may be behind (as the exactly-once recovery does). Records of messages outside the window
  // count as such, never as findings.
  constexpr auto kClockSlack = std::chrono::minutes(5);
  SystemTime read_from = since;
  for (const auto& m : archived) read_from = std::min(read_from, m.created_at);
  if (read_from.time_since_epoch() > kClockSlack) options.since = read_from - kClockSlack;
  options.timeout = std::chrono::milliseconds(a.timeout_ms);
  options.streams = a.topics;
  ReadBackResult read;
  try {
    read = factory.read_back(destination, options);
  } catch (const std::exception& e) {
    return CannotVerify("reading back " + name + ": " + e.what());
  }
  const VerifyReport report = Reconcile(archived, read);
  // `--json -`: stdout is the report alone (for jq and the like); the summary goes to stderr.
  PrintSummary(a.json_path == "-" ? std::cerr : std::cout, report, name, since_text);
  if (!a.json_path.empty()) {
    const std::string text = ToJson(report, name, since_text).dump(2) + "\n";
    if (a.json_path == "-") {
      std::cout << text;
    } else {
      std::ofstream out(a.json_path, std::ios::trunc);
      out << text;
      out.close();
      if (!out) return CannotVerify("cannot write the report to " + a.json_path);
    }
  }
  return report.clean() ? kClean : kFindings;
}

}  // namespace outbox::relay::app
