// outbox-relay: moves committed outbox messages from PostgreSQL to Kafka and webhooks.
#include <CLI/CLI.hpp>
#include <cstdlib>
#include <iostream>

#include "build_info.h"
#include "commands.h"
#include "outbox_relay/migrate.h"
#include "outbox_relay/postgres_endpoint_directory.h"

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
  // The webhook service reads its endpoints through the store (libpqxx stays in the store).
  outbox::relay::SetEndpointDirectoryFactory(outbox::relay::MakePostgresEndpointDirectory);
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
  dlq_list->add_option("--limit,-n", dlq.limit, "At most this many")->check(CLI::Range(1, 1000000));
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

  EndpointArgs ep;
  auto* endpoints = app.add_subcommand(
      "endpoints", "Manage the endpoints of webhook-service destinations (`endpoints: database`)");
  endpoints->require_subcommand(1);
  auto add_ep_db = [&](CLI::App* cmd) {
    cmd->add_option("--database-url", ep.database_url,
                    "PostgreSQL URL (default: the --config file's, else $OUTBOX_DATABASE_URL)");
    add_config(cmd);
  };
  auto add_ep_id = [&](CLI::App* cmd) { cmd->add_option("id", ep.id, "Endpoint id")->required(); };
  CLI::Option* opt_dest = nullptr;
  CLI::Option* opt_url = nullptr;
  CLI::Option* opt_desc = nullptr;
  CLI::Option* opt_meta = nullptr;
  CLI::Option* opt_types = nullptr;
  CLI::Option* opt_headers = nullptr;
  CLI::Option* opt_mif = nullptr;
  CLI::Option* opt_rate = nullptr;
  CLI::Option* opt_breaker = nullptr;
  CLI::Option* opt_adaptive = nullptr;
  bool all_events = false;
  bool no_headers = false;
  auto add_ep_fields = [&](CLI::App* cmd, bool adding) {
    opt_dest = cmd->add_option("--destination,-d", ep.destination,
                               "The destination whose messages it receives");
    opt_url = cmd->add_option("--url", ep.url, "Where to POST, http:// or https://");
    if (adding) {
      opt_dest->required();
      opt_url->required();
    }
    opt_desc = cmd->add_option("--description", ep.description, "Free text");
    opt_meta = cmd->add_option("--metadata", ep.metadata, "A JSON object, kept with it");
    opt_types = cmd->add_option("--event-type,-e", ep.event_types,
                                "Receive only these event types (repeat; 'invoice.*' for a "
                                "prefix); default: every event");
    opt_headers = cmd->add_option("--header,-H", ep.headers,
                                  "'Name: value' sent with every request (repeat)");
    opt_mif = cmd->add_option("--max-in-flight", ep.max_in_flight,
                              "Concurrent requests to it (default, or 0: the destination's)")
                  ->check(CLI::Range(0, 1024));
    opt_rate = cmd->add_option("--rate-limit", ep.rate_limit,
                               "Requests per second to it at most (default, or 0: the "
                               "destination's rate_limit)")
                   ->check(CLI::Range(0, 1000000));
    opt_breaker = cmd->add_option("--breaker", ep.breaker,
                                  "Its own circuit breaker, JSON: {\"failure_threshold\": 5, "
                                  "\"cooldown_ms\": 10000, \"max_cooldown_ms\": 300000, "
                                  "\"enabled\": true} (each key optional; {}: the destination's)");
    opt_adaptive = cmd->add_option("--adaptive-concurrency", ep.adaptive_concurrency,
                                   "true, false, or default (the destination's)")
                       ->check(CLI::IsMember({"true", "false", "default"}));
    if (!adding) {
      cmd->add_flag("--all-events", all_events, "Drop the event-type filter");
      cmd->add_flag("--no-headers", no_headers, "Drop its headers");
    }
  };
  auto* ep_add = endpoints->add_subcommand("add", "Add an endpoint; prints its secret once");
  add_ep_db(ep_add);
  add_ep_fields(ep_add, true);
  CLI::Option* add_types = opt_types;
  CLI::Option* add_headers = opt_headers;
  CLI::Option* add_meta = opt_meta;
  CLI::Option* add_desc = opt_desc;
  CLI::Option* add_mif = opt_mif;
  CLI::Option* add_rate = opt_rate;
  CLI::Option* add_breaker = opt_breaker;
  CLI::Option* add_adaptive = opt_adaptive;
  ep_add->add_option("--id", ep.id, "Its id (default: ep_<random>); letters, digits, _ . -");
  ep_add->add_option("--secret", ep.secret, "A whsec_ secret (default: a new random one)");
  ep_add->add_flag("--disabled", ep.disabled, "Add it disabled");
  ep_add
      ->add_option("--signature", ep.signature,
                   "hmac (default: whsec_ secret, v1 signatures) or ed25519 (Standard "
                   "Webhooks' asymmetric v1a signatures; prints the public key)")
      ->check(CLI::IsMember({"hmac", "ed25519"}));
  ep_add->add_flag("--json", ep.json, "JSON output");
  auto* ep_list = endpoints->add_subcommand("list", "List endpoints (never their secrets)");
  add_ep_db(ep_list);
  ep_list->add_option("--destination,-d", ep.destination, "Only this destination");
  ep_list->add_flag("--json", ep.json, "JSON output");
  auto* ep_show = endpoints->add_subcommand("show", "Show one endpoint with its backlog");
  add_ep_db(ep_show);
  add_ep_id(ep_show);
  ep_show->add_flag("--json", ep.json, "JSON output");
  auto* ep_update = endpoints->add_subcommand("update", "Change an endpoint; relays follow in 1 s");
  add_ep_db(ep_update);
  add_ep_id(ep_update);
  add_ep_fields(ep_update, false);
  auto* ep_disable =
      endpoints->add_subcommand("disable", "Stop sending to an endpoint; its messages wait for it");
  add_ep_db(ep_disable);
  add_ep_id(ep_disable);
  ep_disable->add_option("--reason", ep.reason, "Shown by list and show");
  auto* ep_enable =
      endpoints->add_subcommand("enable", "Send to an endpoint again, what waited first");
  add_ep_db(ep_enable);
  add_ep_id(ep_enable);
  auto* ep_delete = endpoints->add_subcommand("delete", "Delete an endpoint and its secrets");
  add_ep_db(ep_delete);
  add_ep_id(ep_delete);
  auto* ep_rotate = endpoints->add_subcommand(
      "rotate-secret", "New signing secret; the old one keeps signing during the overlap");
  add_ep_db(ep_rotate);
  add_ep_id(ep_rotate);
  ep_rotate->add_option(
      "--overlap", ep.overlap,
      "How long the previous secret still signs (default 24h; 0: stop now; at most 365d)");
  ep_rotate->add_option("--secret", ep.secret, "The new whsec_ secret (default: a random one)");
  ep_rotate->add_flag("--json", ep.json, "JSON output");
  auto* ep_replay = endpoints->add_subcommand(
      "replay", "Send archived messages to one endpoint again (retention.archive_delivered)");
  add_ep_db(ep_replay);
  add_ep_id(ep_replay);
  ep_replay->add_option("--since", ep.since, "Everything delivered since this time");
  ep_replay->add_option("--message", ep.message,
                        "Only this message (its idempotency key or delivery id)");
  ep_replay->add_flag("--restart", ep.restart,
                      "Start over, even where the same replay stopped part-way less than a day "
                      "ago (which is otherwise resumed)");
  auto* ep_replays = endpoints->add_subcommand(
      "replays", "One endpoint's replays of the last day: running, finished or failed");
  add_ep_db(ep_replays);
  add_ep_id(ep_replays);
  ep_replays->add_flag("--json", ep.json, "JSON lines");
  auto* ep_test = endpoints->add_subcommand(
      "test", "Send one endpoint a test event (it alone, whatever its event types)");
  add_ep_db(ep_test);
  add_ep_id(ep_test);
  ep_test->add_option("--event-type", ep.event_type_one, "Its event type (default webhook.test)");
  ep_test->add_option("--payload", ep.payload, "Its JSON payload (default: a small test object)");
  auto* ep_recover = endpoints->add_subcommand(
      "recover", "Send one endpoint its dead letters again: those that died since a time");
  add_ep_db(ep_recover);
  add_ep_id(ep_recover);
  ep_recover->add_option("--since", ep.since, "The dead letters that died since this time")
      ->required();

  auto* attempts = app.add_subcommand(
      "attempts", "The webhook service's delivery log: every attempt, newest first");
  add_ep_db(attempts);
  attempts->add_option("--endpoint", ep.id, "Only this endpoint");
  attempts->add_option("--message", ep.message,
                       "Only this message (its idempotency key or a delivery id)");
  attempts->add_option("--limit,-n", ep.limit, "At most this many")->check(CLI::Range(1, 1000000));
  attempts
      ->add_option("--before", ep.before,
                   "Only attempts older than the one with this id (--json shows ids): the "
                   "next page")
      ->check(CLI::PositiveNumber);
  attempts->add_flag("--json", ep.json, "JSON lines");

  std::vector<std::string> register_names;
  auto* destinations = app.add_subcommand(
      "destinations", "The destinations relays registered (the write-time guard's list)");
  destinations->require_subcommand(1);
  auto* dest_list = destinations->add_subcommand("list", "List registered destinations");
  add_db(dest_list);
  add_config(dest_list);
  auto* dest_add = destinations->add_subcommand(
      "add", "Register destinations before a relay serving them starts");
  add_db(dest_add);
  add_config(dest_add);
  dest_add->add_option("names", register_names, "Destination names")->required();

  VerifyArgs verify_args;
  auto* verify = app.add_subcommand(
      "verify",
      "Compare what a Kafka destination's topics hold with the delivered archive: gaps, "
      "duplicates, per-key order (exit 0 only when clean)");
  verify->add_option("--config,-c", verify_args.config_path, "YAML config file")->required();
  verify->add_option("--database-url", verify_args.database_url,
                     "PostgreSQL URL; wins over the config's database_url and "
                     "$OUTBOX_DATABASE_URL, as for run (default: the config's)");
  verify->add_option("--destination,-d", verify_args.destination,
                     "The destination (default: the config's only one)");
  verify->add_option("--since", verify_args.since,
                     "Only messages written since: a UTC time (2026-11-23T08:00:00Z) or an age "
                     "(90s, 15m, 2h, 7d); default: everything archived");
  verify->add_option("--topic", verify_args.topics,
                     "Read this topic (repeatable; default: the destination's topic or "
                     "allowed_topics)");
  verify->add_option("--json", verify_args.json_path, "Write the JSON report here (- for stdout)");
  verify->add_option("--timeout-ms", verify_args.timeout_ms, "Give up reading after this long")
      ->check(CLI::Range(1, 86400000));

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // Help and version are 0; a command line that cannot be taken is 2 (usage), whatever
    // CLI11's own code for it: verify documents 0 / 1 / 2, and 1 means findings there.
    return app.exit(e) == 0 ? 0 : 2;
  }

  SetupLogging(EnvOr("OUTBOX_LOG_LEVEL", "info"), EnvOr("OUTBOX_LOG_FORMAT") == "json");
  if (*version) {
    std::cout << "outbox-relay " << OUTBOX_RELAY_VERSION << " (schema version "
              << outbox::relay::LatestMigrationVersion() << ")\n";
    return 0;
  }
  if (*check) return RunCheckConfig(config_path);
  if (*verify) return RunVerify(verify_args);
  if (*destinations) {
    database_url = DatabaseUrlFor(database_url, config_path);
    if (database_url.empty()) return 2;
    return *dest_list ? RunDestinationsList(database_url)
                      : RunDestinationsAdd(database_url, register_names);
  }
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
  if (*endpoints) {
    ep.database_url = DatabaseUrlFor(ep.database_url, config_path);
    if (ep.database_url.empty()) return 2;
    // The destination's SSRF guard, as the management API applies it (without a config the
    // relay finds a refused URL when it makes the endpoint's sender: unusable, its rows wait).
    if (!config_path.empty() && (*ep_add || *ep_update)) {
      ep.url_check = EndpointUrlCheckOfFile(config_path, ep.database_url);
    }
    if (*ep_add) {
      ep.set_description = add_desc->count() > 0;
      ep.set_metadata = add_meta->count() > 0;
      ep.set_event_types = add_types->count() > 0;
      ep.set_headers = add_headers->count() > 0;
      ep.set_max_in_flight = add_mif->count() > 0;
      ep.set_rate_limit = add_rate->count() > 0;
      ep.set_breaker = add_breaker->count() > 0;
      ep.set_adaptive = add_adaptive->count() > 0;
      return RunEndpointsAdd(ep);
    }
    if (*ep_list) return RunEndpointsList(ep);
    if (*ep_show) return RunEndpointsShow(ep);
    if (*ep_update) {
      ep.set_destination = opt_dest->count() > 0;
      ep.set_url = opt_url->count() > 0;
      ep.set_description = opt_desc->count() > 0;
      ep.set_metadata = opt_meta->count() > 0;
      ep.set_event_types = opt_types->count() > 0 || all_events;
      ep.set_headers = opt_headers->count() > 0 || no_headers;
      ep.set_max_in_flight = opt_mif->count() > 0;
      ep.set_rate_limit = opt_rate->count() > 0;
      ep.set_breaker = opt_breaker->count() > 0;
      ep.set_adaptive = opt_adaptive->count() > 0;
      return RunEndpointsUpdate(ep);
    }
    if (*ep_disable || *ep_enable) return RunEndpointsEnable(ep, ep_enable->parsed());
    if (*ep_delete) return RunEndpointsDelete(ep);
    if (*ep_rotate) return RunEndpointsRotateSecret(ep);
    if (*ep_replay) return RunEndpointsReplay(ep);
    if (*ep_recover) return RunEndpointsRecover(ep);
    if (*ep_test) return RunEndpointsTest(ep);
    if (*ep_replays) return RunEndpointsReplays(ep);
  }
  if (*attempts) {
    ep.database_url = DatabaseUrlFor(ep.database_url, config_path);
    if (ep.database_url.empty()) return 2;
    return RunAttempts(ep);
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
