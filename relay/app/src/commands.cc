#include "commands.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <csignal>
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <pqxx/except>
#include <set>

#include "build_info.h"
#include "outbox_relay/admin_server.h"
#include "outbox_relay/config.h"
#include "outbox_relay/config_sources.h"
#include "outbox_relay/dead_letters.h"
#include "outbox_relay/dispatcher.h"
#include "outbox_relay/kafka_sink.h"
#include "outbox_relay/logging.h"
#include "outbox_relay/management_api.h"
#include "outbox_relay/metrics.h"
#include "outbox_relay/migrate.h"
#include "outbox_relay/retry.h"
#include "outbox_relay/sink_registry.h"
#include "outbox_relay/status.h"
#include "outbox_relay/status_render.h"
#include "outbox_relay/store.h"
#include "outbox_relay/webhook_sink.h"

namespace outbox::relay::app {

void SetupLogging(const std::string& level, bool json) { ConfigureLogging(level, json); }

namespace {

// "850ms", "14m 7s", "2h 5m", "3d 4h": the two largest units.
std::string FormatDuration(Millis d) {
  long long ms = d.count();
  if (ms < 1000) return std::to_string(ms) + "ms";
  const std::pair<long long, const char*> units[] = {
      {86'400'000, "d"}, {3'600'000, "h"}, {60'000, "m"}, {1'000, "s"}};
  std::string out;
  int shown = 0;
  for (const auto& [size, unit] : units) {
    if (ms < size && shown == 0) continue;
    const long long n = ms / size;
    ms %= size;
    if (shown == 1 && n == 0) break;
    if (!out.empty()) out += ' ';
    out += std::to_string(n) + unit;
    if (++shown == 2) break;
  }
  return out;
}

// One line per error, so systemd's journal and `kubectl logs` show it whole: libpq's
// messages come with a second, tab-indented line ("Is the server running on that host...").
int Fail(const std::string& msg) {
  std::string line;
  line.reserve(msg.size());
  for (std::size_t i = 0; i < msg.size(); ++i) {
    if (msg[i] != '\n' && msg[i] != '\r') {
      line += msg[i];
      continue;
    }
    while (i + 1 < msg.size() && (msg[i + 1] == '\t' || msg[i + 1] == ' ')) ++i;
    if (i + 1 < msg.size() && !line.empty() && line.back() != ' ') line += ' ';
  }
  while (!line.empty() && line.back() == ' ') line.pop_back();
  std::cerr << "error: " << line << "\n";
  return 1;
}

bool CheckSchema(const std::string& url) {
  const int have = CurrentSchemaVersion(url);
  const int want = LatestMigrationVersion();
  if (have < want) {
    spdlog::error(
        "database schema is at version {}, this relay needs {}: run `outbox-relay migrate` first",
        have, want);
    return false;
  }
  if (have > want) {
    spdlog::error(
        "database schema is at version {}, newer than this relay knows ({}): upgrade outbox-relay",
        have, want);
    return false;
  }
  return true;
}

// What the sinks themselves refuse (librdkafka's view of the producer properties, the
// webhook URL's credentials, secrets, ca_file), checked without connecting. check-config and
// run both ask here, so check-config accepts exactly what run starts with.
std::optional<std::string> SinkConfigProblem(const std::string& config_path,
                                             const RelayConfig& cfg) {
  try {
    for (const auto& [name, dest] : cfg.destinations) ValidateSink(dest);
  } catch (const std::invalid_argument& e) {
    return config_path + ": destinations: " + e.what();
  }
  return std::nullopt;
}

}  // namespace

int PrintError(const std::string& msg) { return Fail(msg); }

EndpointUrlCheck EndpointUrlCheckOfFile(const std::string& config_path,
                                        const std::string& database_url) {
  try {
    return EndpointUrlCheckOf(LoadConfigFile(config_path, ProcessEnvWithDatabaseUrl(database_url)));
  } catch (const std::exception& e) {
    std::cerr << "warning: the URL is not checked against the destination's SSRF guard: "
              << e.what() << "\n";
    return {};
  }
}

EndpointUrlCheck EndpointUrlCheckOf(const RelayConfig& cfg) {
  std::map<std::string, WebhookTarget> services;
  for (const auto& [name, d] : cfg.destinations) {
    if (const auto* w = d.target.As<WebhookTarget>(); w && w->endpoints_from_database) {
      services.emplace(name, *w);
    }
  }
  return [services = std::move(services)](const std::string& destination,
                                          const std::string& url) -> std::optional<std::string> {
    const auto it = services.find(destination);
    return it == services.end() ? std::nullopt : EndpointUrlProblem(destination, it->second, url);
  };
}

int RunCheckConfig(const std::string& config_path) {
  try {
    const RelayConfig cfg = LoadConfigFile(config_path, ProcessEnv());
    if (auto problem = SinkConfigProblem(config_path, cfg)) return Fail(*problem);
    std::cout << config_path << ": ok, " << cfg.destinations.size() << " destination(s)\n";
    // How long each destination keeps trying: what decides whether an outage of the target
    // ends in dead letters.
    for (const auto& [name, dest] : cfg.destinations) {
      const SinkFactory& factory = SinkFactoryFor(dest);
      const std::string described = factory.describe ? factory.describe(dest) : "";
      std::cout << "  " << name << " (" << factory.kind
                << (described.empty() ? "" : ", " + described) << "): " << dest.retry.max_attempts
                << " attempt(s), then dead letters; retries wait up to "
                << FormatDuration(RetryHorizon(dest.retry)) << " in all (about "
                << FormatDuration(AverageRetryHorizon(dest.retry)) << " on average)\n";
    }
    return 0;
  } catch (const ConfigError& e) {
    return Fail(e.what());
  }
}

EnvLookup ProcessEnvWithDatabaseUrl(const std::string& database_url_flag) {
  if (database_url_flag.empty()) return ProcessEnv();
  return [process_env = ProcessEnv(),
          database_url_flag](const std::string& name) -> std::optional<std::string> {
    if (name == "OUTBOX_DATABASE_URL") return database_url_flag;
    return process_env(name);
  };
}

int RunRelay(const std::string& config_path, const std::string& database_url_override) {
  // Signals are taken synchronously by this thread, blocked from the start: one that comes
  // during start-up (a slow database connect) waits for sigwait below instead of taking its
  // default action, which as PID 1 of a container is to be dropped (the relay then ran until
  // SIGKILL). Every thread started below (the sinks' first) inherits the blocked mask.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);

  RelayConfig cfg;
  try {
    cfg = LoadConfigFile(config_path, ProcessEnvWithDatabaseUrl(database_url_override));
  } catch (const ConfigError& e) {
    return Fail(e.what());
  }
  if (auto problem = SinkConfigProblem(config_path, cfg)) return Fail(*problem);
  SetupLogging(cfg.log_level, cfg.log_format == LogFormat::kJson);

  try {
    if (!CheckSchema(cfg.database_url)) return 1;
  } catch (const std::exception& e) {
    if (const auto* refused = dynamic_cast<const StoreError*>(&e);
        refused != nullptr && refused->sqlstate() == "42501") {
      // Reached, and refused: not a connection problem.
      return Fail(std::string("the database refused the relay's login: ") + e.what() +
                  " (grant it the outbox_relay role: GRANT outbox_relay TO <login>; "
                  "docs/roles.md; and run `outbox-relay migrate` as the schema owner)");
    }
    return Fail(std::string("cannot reach the database: ") + e.what() +
                " (check database_url / OUTBOX_DATABASE_URL)");
  }

  std::map<std::string, SinkPtr> sinks;
  try {
    for (const auto& [name, dest] : cfg.destinations) sinks.emplace(name, MakeSink(dest));
  } catch (const std::exception& e) {
    return Fail(std::string("cannot create sink: ") + e.what());
  }

  // The write-time guard of unknown destinations (when the schema owner turned it on) accepts
  // what some relay's config names.
  try {
    Store store(cfg.database_url);
    std::vector<std::string> names;
    for (const auto& [name, dest] : cfg.destinations) names.push_back(name);
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    RegisterDestinations(store, names,
                         "relay " + std::string(host) + ":" + std::to_string(::getpid()));
  } catch (const std::exception& e) {
    spdlog::warn("could not register the config's destinations in outbox.destinations: {}",
                 e.what());
  }
  // What writers can queue against what each Kafka producer sends; and what the claim loops'
  // first claims expect each payload to be (max_in_flight_bytes).
  std::int64_t max_payload = 0;
  try {
    Store store(cfg.database_url);
    max_payload = MaxPayloadBytes(store);
    for (const auto& [name, dest] : cfg.destinations) {
      if (const auto* k = dest.target.As<KafkaTarget>()) {
        if (auto problem = PayloadLimitMismatch(name, *k, max_payload)) spdlog::warn(*problem);
      }
    }
  } catch (const std::exception& e) {
    spdlog::warn("could not read outbox.settings.max_payload_bytes: {}", e.what());
  }

  RelayMetrics metrics(OUTBOX_RELAY_VERSION);
  for (const auto& [name, sink] : sinks) {
    if (sink->ClientQueueLength()) {
      const Sink* s = sink.get();
      metrics.SetKafkaProducerQueueLength(
          name, [s] { return static_cast<double>(s->ClientQueueLength().value_or(0)); });
    }
  }
  DispatcherEnv dispatcher_env;
  dispatcher_env.metrics = &metrics;
  dispatcher_env.max_payload_bytes = max_payload;
  Dispatcher dispatcher(cfg, std::move(sinks), std::move(dispatcher_env));
  std::unique_ptr<AdminServer> admin;
  if (!cfg.admin_listen.empty()) {
    admin = std::make_unique<AdminServer>(
        cfg.admin_listen, metrics, [&dispatcher] { return dispatcher.Ready(); },
        // Only the reason: the admin server writes "not ready: " before it.
        [&dispatcher] { return dispatcher.WhyNotReady(); });
    try {
      admin->Start();
    } catch (const std::exception& e) {
      return Fail(std::string("admin_listen ") + cfg.admin_listen + ": " + e.what() +
                  " (choose a free host:port, or leave admin_listen empty)");
    }
    // The port it bound (admin_listen may say port 0).
    spdlog::info("admin server on {}:{} (/metrics, /healthz, /readyz)",
                 cfg.admin_listen.substr(0, cfg.admin_listen.rfind(':')), admin->port());
  }
  std::unique_ptr<ManagementApi> api;
  if (!cfg.management_api.listen.empty()) {
    api = std::make_unique<ManagementApi>(cfg.management_api.listen, cfg.management_api.token,
                                          cfg.database_url);
    // This config's destinations that are no webhook service: endpoints moved or added there
    // would be delivered as that destination's messages (a Kafka topic, a fixed URL), with
    // ordering keys and idempotency keys of their own (review).
    std::map<std::string, std::string> others;
    for (const auto& [name, d] : cfg.destinations) {
      if (const auto* w = d.target.As<WebhookTarget>(); !w || !w->endpoints_from_database) {
        others.emplace(name, d.target.As<WebhookTarget>() ? "a webhook destination with its URL "
                                                            "in the config"
                                                          : "a Kafka destination");
      }
    }
    api->SetDestinationCheck(
        [others = std::move(others)](const std::string& destination) -> std::optional<std::string> {
          const auto it = others.find(destination);
          if (it == others.end()) return std::nullopt;
          return "destination \"" + destination + "\" is " + it->second +
                 " of this relay, not a webhook service; endpoints belong to a destination "
                 "with `webhook: {endpoints: database}`";
        });
    // An endpoint of a webhook service this config runs meets its destination's SSRF guard
    // when it is added; other destinations' settings are not known here.
    api->SetUrlCheck(EndpointUrlCheckOf(cfg));
    try {
      api->Start();
    } catch (const std::exception& e) {
      return Fail(std::string("management_api.listen ") + cfg.management_api.listen + ": " +
                  e.what() + " (choose a free host:port)");
    }
    spdlog::info("management API on port {} ({}; /v1/endpoints, /v1/attempts)", api->port(),
                 cfg.management_api.listen);
  }
  // Asked to stop during start-up: nothing claimed yet, nothing to hand back.
  sigset_t pending;
  sigpending(&pending);
  if (sigismember(&pending, SIGTERM) || sigismember(&pending, SIGINT)) {
    spdlog::info("received {} during start-up; stopping without starting",
                 sigismember(&pending, SIGINT) ? "SIGINT" : "SIGTERM");
    if (api) api->Stop();
    if (admin) admin->Stop();
    return 0;
  }
  dispatcher.Start();
  spdlog::info("outbox-relay {} running: {} destination(s), batch {}, lease {} ms",
               OUTBOX_RELAY_VERSION, cfg.destinations.size(), cfg.batch_size, cfg.lease.count());
  int sig = 0;
  sigwait(&set, &sig);
  spdlog::info("received {}, shutting down (up to {} ms)", sig == SIGINT ? "SIGINT" : "SIGTERM",
               cfg.shutdown_timeout.count());
  // The dispatcher first: its leases are what a late stop costs (they expire and the reaper
  // counts an attempt). The API's requests are cut a second after it stops.
  const bool clean = dispatcher.Stop();
  if (api) api->Stop();
  if (admin) admin->Stop();
  const DispatcherStats s = dispatcher.stats();
  spdlog::info(
      "stopped: delivered {}, retried {}, dead-lettered {}, released {}{}", s.delivered, s.retried,
      s.dead, s.released,
      clean ? "" : " (some outcomes unsettled: their leases expire and they are redelivered)");
  return 0;
}

std::string DatabaseUrlFor(const std::string& flag, const std::string& config_path) {
  if (!flag.empty()) return flag;
  if (!config_path.empty()) {
    try {
      return LoadDatabaseUrl(config_path, ProcessEnv());
    } catch (const ConfigError& e) {
      Fail(e.what());
      return "";
    }
  }
  if (auto url = ProcessEnv()("OUTBOX_DATABASE_URL")) {
    // As the config reads it: no trailing newline (a Secret made with `echo ... | base64`).
    if (std::string trimmed = cfg::TrimTrailingNewlines(*url); !trimmed.empty()) return trimmed;
  }
  Fail("no database: pass --config relay.yaml or --database-url, or set OUTBOX_DATABASE_URL");
  return "";
}

int RunMigrate(const std::string& database_url) {
  try {
    const auto r = Migrate(database_url);
    if (r.applied.empty()) {
      std::cout << "schema is up to date at version " << r.to_version << "\n";
    } else {
      for (const auto& name : r.applied) std::cout << "applied " << name << "\n";
      std::cout << "schema migrated from version " << r.from_version << " to " << r.to_version
                << "\n";
    }
    return 0;
  } catch (const MigrationError& e) {
    return Fail(e.what());
  } catch (const std::exception& e) {
    // Migrate names the migration that failed and the version the schema is at.
    return Fail(std::string("migrate: ") + e.what());
  }
}

namespace {

nlohmann::json ToJson(const DeadLetter& d) {
  return {
      {"id", d.id},
      {"destination", d.destination},
      {"ordering_key", d.ordering_key ? nlohmann::json(*d.ordering_key) : nlohmann::json(nullptr)},
      {"idempotency_key", d.idempotency_key},
      {"event_type", d.event_type},
      {"headers", nlohmann::json::parse(d.headers)},
      {"payload", d.payload},
      {"attempts", d.attempts},
      {"reason", d.reason},
      {"last_error", d.last_error ? nlohmann::json(*d.last_error) : nlohmann::json(nullptr)},
      {"created_at", d.created_at},
      {"dead_at", d.dead_at}};
}

}  // namespace

std::string WithRoleHint(const std::exception& e) {
  const auto* store_error = dynamic_cast<const StoreError*>(&e);
  const bool refused = (store_error != nullptr && store_error->sqlstate() == "42501") ||
                       dynamic_cast<const pqxx::insufficient_privilege*>(&e) != nullptr;
  if (!refused) return e.what();
  std::string what = e.what();
  while (!what.empty() && (what.back() == '\n' || what.back() == ' ')) what.pop_back();
  return what +
         " (the login lacks a role: GRANT outbox_reader TO <login> lets it run status, dlq list "
         "/ show, attempts, endpoints replays and verify; a command that changes the outbox "
         "(pause, resume, dlq "
         "replay / purge, endpoints, destinations) needs GRANT outbox_relay TO <login>; "
         "docs/roles.md)";
}

int RunStatus(const std::string& database_url, bool json) {
  return WithStore(database_url, [&](Store& c) {
    const StatusSnapshot snapshot = ReadStatus(c);
    if (json) {
      std::cout << StatusToJson(snapshot).dump(2) << "\n";
    } else {
      std::cout << RenderStatusTable(snapshot);
    }
    return 0;
  });
}

int RunDlqList(const DlqArgs& a) {
  return WithStore(a.database_url, [&](Store& c) {
    const auto rows = ListDeadLetters(c, a.destination, a.limit);
    if (a.json) {
      for (const auto& d : rows) std::cout << ToJson(d).dump() << "\n";
      return 0;
    }
    std::cout << std::left << std::setw(10) << "ID" << std::setw(20) << "DESTINATION"
              << std::setw(9) << "ATTEMPTS" << std::setw(26) << "DEAD AT"
              << "REASON\n";
    for (const auto& d : rows) {
      std::string reason = d.reason.substr(0, 80);
      std::cout << std::left << std::setw(10) << d.id << std::setw(20) << d.destination
                << std::setw(9) << d.attempts << std::setw(26) << d.dead_at << reason << "\n";
    }
    // The page is the newest --limit; say how many there are in all.
    const auto total = rows.size() < static_cast<std::size_t>(a.limit)
                           ? static_cast<std::int64_t>(rows.size())
                           : CountDeadLetters(c, a.destination);
    if (total > static_cast<std::int64_t>(rows.size())) {
      std::cout << rows.size() << " of " << total
                << " dead letter(s), newest first (--limit shows more)\n";
    } else {
      std::cout << rows.size() << " dead letter(s)\n";
    }
    return 0;
  });
}

int RunDlqShow(const DlqArgs& a) {
  return WithStore(a.database_url, [&](Store& c) {
    const auto d = GetDeadLetter(c, a.ids.at(0));
    if (!d)
      return Fail("no dead letter with id " + std::to_string(a.ids.at(0)) +
                  " (see `outbox-relay dlq list`)");
    std::cout << ToJson(*d).dump(2) << "\n";
    return 0;
  });
}

int RunDlqReplay(const DlqArgs& a) {
  if (a.ids.empty() && !a.all) return Fail("name the dead letters to replay, or pass --all");
  if (!a.ids.empty() && a.all) return Fail("pass either ids or --all, not both");
  return WithStore(a.database_url, [&](Store& c) {
    const auto r = ReplayDeadLetters(c, a.ids, a.destination);
    std::cout << "replayed " << r.ids.size() << " message(s)\n";
    int code = 0;
    if (!r.held_back.empty()) {
      std::string ids;
      for (const auto id : r.held_back) ids += " " + std::to_string(id);
      std::cerr << "error: " << r.held_back.size()
                << " dead letter(s) held back, their idempotency key is queued or was replayed "
                   "now with an older dead letter:"
                << ids
                << "; they stay dead letters: replay them once that message is delivered, or "
                   "purge them\n";
      code = 1;
    }
    if (!r.of_deleted_endpoints.empty()) {
      std::string ids;
      for (const auto id : r.of_deleted_endpoints) ids += " " + std::to_string(id);
      std::cerr << "error: " << r.of_deleted_endpoints.size()
                << " dead letter(s) of a webhook endpoint that was deleted held back (an "
                   "endpoint added since with its id is another, and does not get them):"
                << ids << "; they stay dead letters: purge them with `outbox-relay dlq purge`\n";
      code = 1;
    }
    const std::size_t found = r.ids.size() + r.held_back.size() + r.of_deleted_endpoints.size();
    // An id given twice is one dead letter.
    const std::size_t given = std::set<std::int64_t>(a.ids.begin(), a.ids.end()).size();
    if (!a.ids.empty() && found != given) {
      std::cerr << "error: " << given - found
                << " of the given ids are not dead letters (see `outbox-relay dlq list`)\n";
      code = 1;
    }
    return code;
  });
}

int RunDlqPurge(const DlqArgs& a) {
  return WithStore(a.database_url, [&](Store& c) {
    const auto n = PurgeDeadLetters(c, a.ids, a.older_than, a.destination);
    std::cout << "purged " << n << " dead letter(s)\n";
    // As replay: ids that matched nothing (no such dead letter, or excluded by --destination
    // or --older-than) are an error, not "purged 0". An id given twice is one dead letter.
    const auto given = static_cast<std::int64_t>(
        std::set<std::int64_t>(a.ids.begin(), a.ids.end()).size());
    if (!a.ids.empty() && n != given) {
      std::cerr << "error: " << given - n
                << " of the given ids are not dead letters (or not of the --destination / "
                   "--older-than given; see `outbox-relay dlq list`)\n";
      return 1;
    }
    return 0;
  });
}

int RunDlqBury(const DlqArgs& a) {
  if (a.destination.empty()) return Fail("name the destination: dlq bury --destination NAME");
  return WithStore(a.database_url, [&](Store& c) {
    const auto live = LiveRelaysByDestination(c, StatusOptions{}.relay_heartbeat_expiry);
    if (const auto it = live.find(a.destination); it != live.end() && !a.force) {
      return Fail("destination \"" + a.destination + "\" is served by " +
                  std::to_string(it->second) +
                  " running relay(s), which deliver its messages; stop them first, or pass "
                  "--force to dead-letter what is queued anyway");
    }
    const std::string reason =
        a.reason.empty() ? "dead-lettered by an operator (outbox-relay dlq bury): no relay "
                           "serves destination \"" +
                               a.destination + "\""
                         : a.reason;
    const auto n = BuryDestination(c, a.destination, reason);
    std::cout << "moved " << n << " message(s) of \"" << a.destination
              << "\" to the dead letters; `outbox-relay dlq replay --all --destination "
              << a.destination << "` puts them back\n";
    return 0;
  });
}

int RunPause(const std::string& database_url, const std::string& destination,
             const std::string& reason) {
  if (destination.empty()) return Fail("name the destination: pause DESTINATION");
  return WithStore(database_url, [&](Store& c) {
    PauseDestination(c, destination, reason);
    std::cout << "paused \"" << destination
              << "\": relays claim nothing for it within a second (what is in flight finishes); "
                 "`outbox-relay resume "
              << destination << "` undoes it\n";
    return 0;
  });
}

int RunDestinationsList(const std::string& database_url) {
  return WithStore(database_url, [&](Store& c) {
    const DestinationRegistry r = ListRegisteredDestinations(c);
    std::cout << "write-time guard of unknown destinations: " << (r.guard ? "on" : "off")
              << " (outbox.settings.refuse_unknown_destinations)\n";
    if (r.destinations.empty()) {
      std::cout << "no destination registered yet (a relay registers its config's at start)\n";
      return 0;
    }
    std::cout << std::left << std::setw(32) << "DESTINATION" << std::setw(32) << "REGISTERED BY"
              << "AT\n";
    for (const auto& d : r.destinations) {
      std::cout << std::setw(32) << d.name << std::setw(32) << d.registered_by << d.registered_at
                << "\n";
    }
    return 0;
  });
}

int RunDestinationsAdd(const std::string& database_url, const std::vector<std::string>& names) {
  for (const auto& n : names) {
    if (n.empty() || Utf8Length(n) > kMaxDestinationChars) {
      return Fail("a destination name has 1 to 255 characters; got \"" + n.substr(0, 40) + "\"");
    }
  }
  return WithStore(database_url, [&](Store& c) {
    RegisterDestinations(c, names, "operator");
    std::cout << "registered " << names.size()
              << " destination(s); writers may use them while the guard is on\n";
    return 0;
  });
}

int RunResume(const std::string& database_url, const std::string& destination) {
  if (destination.empty()) return Fail("name the destination: resume DESTINATION");
  return WithStore(database_url, [&](Store& c) {
    if (!ResumeDestination(c, destination)) {
      std::cout << "\"" << destination << "\" was not paused; nothing to do\n";
      return 0;
    }
    std::cout << "resumed \"" << destination << "\": relays claim it again within a second\n";
    return 0;
  });
}

}  // namespace outbox::relay::app
