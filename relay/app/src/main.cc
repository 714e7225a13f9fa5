// outbox-relay: moves committed outbox messages from PostgreSQL to Kafka and webhooks.
#include <CLI/CLI.hpp>
#include <cstdlib>
#include <iostream>

#include "build_info.h"
#include "commands.h"
#include "outbox_relay/migrate.h"

namespace {

std::string EnvOr(const char* name, const std::string& fallback = "") {
  const char* v = std::getenv(name);
  return v ? std::string(v) : fallback;
}

}  // namespace

// LeakSanitizer (the asan preset): libpqxx 6.4 leaks the libpq result of a query that ran on a
// connection the server had killed (after a PostgreSQL restart). Not ours to fix; our own
// leaks are still reported. Read only by sanitizer builds.
extern "C" const char* __lsan_default_suppressions() { return "leak:libpq.so\n"; }

int main(int argc, char** argv) {
  using namespace outbox::relay::app;
  CLI::App app{
      "outbox-relay: delivers transactional outbox messages from PostgreSQL to Kafka and webhooks"};
  app.require_subcommand(1);
  app.set_version_flag("--version", OUTBOX_RELAY_VERSION);

  std::string database_url;
  std::string config_path;
  auto add_db = [&](CLI::App* cmd) {
    cmd->add_option("--database-url", database_url,
                    "PostgreSQL URL (default: the --config file's, else $OUTBOX_DATABASE_URL)");
  };
  // Operator commands also take the relay's config file, which names the database.
  auto add_config = [&](CLI::App* cmd) {
    // No CLI11 existence check: the config loader's error names the file and the fix in one
    // line, where CLI11 prints two and exits 105.
    cmd->add_option("--config,-c", config_path, "Relay config file, for its database_url");
  };

  auto* version =
      app.add_subcommand("version", "Print the version and the schema version it carries");

  auto* migrate = app.add_subcommand(
      "migrate", "Apply pending schema migrations (idempotent, safe to run concurrently)");
  add_db(migrate);
  add_config(migrate);

  auto* run = app.add_subcommand("run", "Run the relay until SIGINT/SIGTERM");
  run->add_option("--config,-c", config_path, "YAML config file")->required();
  add_db(run);

  bool status_json = false;
  auto* status = app.add_subcommand(
      "status",
      "Queue depth, age, in flight, retrying and dead letters per destination, and health signals");
  add_db(status);
  add_config(status);
  status->add_flag("--json", status_json, "JSON instead of a table");

  auto* check = app.add_subcommand("check-config", "Validate a config file and exit");
  check->add_option("--config,-c", config_path, "YAML config file")->required();

  DlqArgs dlq;
  auto* dlq_cmd = app.add_subcommand("dlq", "Inspect, replay and purge dead letters");
  dlq_cmd->require_subcommand(1);
  auto add_dlq_common = [&](CLI::App* cmd) {
    cmd->add_option("--database-url", dlq.database_url,
                    "PostgreSQL URL (default: the --config file's, else $OUTBOX_DATABASE_URL)");
    add_config(cmd);
    cmd->add_option("--destination,-d", dlq.destination, "Only this destination");
  };
  auto* dlq_list = dlq_cmd->add_subcommand("list", "List dead letters, newest first");
  add_dlq_common(dlq_list);
  dlq_list->add_option("--limit,-n", dlq.limit, "At most this many")->check(CLI::PositiveNumber);
  dlq_list->add_flag("--json", dlq.json, "JSON lines instead of a table");
  auto* dlq_show = dlq_cmd->add_subcommand("show", "Show one dead letter with its payload");
  add_dlq_common(dlq_show);
  dlq_show->add_option("id", dlq.ids, "Dead letter id")->required()->expected(1);
  auto* dlq_replay = dlq_cmd->add_subcommand(
      "replay", "Put dead letters back in the queue (same idempotency keys)");
  add_dlq_common(dlq_replay);
  dlq_replay->add_option("ids", dlq.ids, "Dead letter ids");
  dlq_replay->add_flag("--all", dlq.all, "Every dead letter (of --destination if given)");
  auto* dlq_purge = dlq_cmd->add_subcommand("purge", "Delete dead letters for good");
  add_dlq_common(dlq_purge);
  dlq_purge->add_option("ids", dlq.ids, "Dead letter ids");
  dlq_purge->add_option("--older-than", dlq.older_than,
                        "Only those dead longer than this interval, e.g. '7 days'");

  auto* dlq_bury = dlq_cmd->add_subcommand(
      "bury", "Move every queued message of a destination no relay serves to the dead letters");
  add_dlq_common(dlq_bury);
  dlq_bury->add_flag("--force", dlq.force, "Even while a running relay serves the destination");
  dlq_bury->add_option("--reason", dlq.reason, "Recorded on each dead letter");

  std::string pause_destination, pause_reason;
  auto* pause = app.add_subcommand(
      "pause",
      "Stop every relay claiming a destination (endpoint down, maintenance) until resumed");
  add_db(pause);
  add_config(pause);
  pause->add_option("destination", pause_destination, "Destination name")->required();
  pause->add_option("--reason", pause_reason, "Shown in status and in the relays' logs");
  auto* resume = app.add_subcommand("resume", "Let relays claim a paused destination again");
  add_db(resume);
  add_config(resume);
  resume->add_option("destination", pause_destination, "Destination name")->required();

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  SetupLogging(EnvOr("OUTBOX_LOG_LEVEL", "info"), EnvOr("OUTBOX_LOG_FORMAT") == "json");
  if (*version) {
    std::cout << "outbox-relay " << OUTBOX_RELAY_VERSION << " (schema version "
              << outbox::relay::LatestMigrationVersion() << ")\n";
    return 0;
  }
  if (*check) return RunCheckConfig(config_path);
  if (*run) return RunRelay(config_path, database_url);
  if (*status) {
    database_url = DatabaseUrlFor(database_url, config_path);
    return database_url.empty() ? 2 : RunStatus(database_url, status_json);
  }
  if (*migrate) {
    database_url = DatabaseUrlFor(database_url, config_path);
    return database_url.empty() ? 2 : RunMigrate(database_url);
  }
  if (*pause || *resume) {
    database_url = DatabaseUrlFor(database_url, config_path);
    if (database_url.empty()) return 2;
    return *pause ? RunPause(database_url, pause_destination, pause_reason)
                  : RunResume(database_url, pause_destination);
  }
  if (*dlq_cmd) {
    dlq.database_url = DatabaseUrlFor(dlq.database_url, config_path);
    if (dlq.database_url.empty()) return 2;
    if (*dlq_list) return RunDlqList(dlq);
    if (*dlq_show) return RunDlqShow(dlq);
    if (*dlq_replay) return RunDlqReplay(dlq);
    if (*dlq_purge) return RunDlqPurge(dlq);
    if (*dlq_bury) return RunDlqBury(dlq);
  }
  return 2;
}
