// Subcommands of outbox-relay. Each returns the process exit code.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "outbox_relay/config.h"
#include "outbox_relay/store.h"

namespace outbox::relay::app {

int RunRelay(const std::string& config_path, const std::string& database_url_override);
int RunMigrate(const std::string& database_url);
int RunCheckConfig(const std::string& config_path);
/// Queue status per destination and the queue table's health signals.
int RunStatus(const std::string& database_url, bool json);

struct DlqArgs {
  std::string database_url;
  std::string destination;
  std::vector<std::int64_t> ids;
  bool all = false;
  bool json = false;
  int limit = 50;
  std::string older_than;
  bool force = false;  ///< bury: even when a live relay serves the destination
  std::string reason;  ///< bury: recorded on each dead letter
};
int RunDlqList(const DlqArgs& a);
int RunDlqShow(const DlqArgs& a);
int RunDlqReplay(const DlqArgs& a);
int RunDlqPurge(const DlqArgs& a);
/// Moves every queued, unleased message of a destination to the dead letters: an operator's
/// decision for a destination no relay will serve. Refuses while a live relay serves it.
int RunDlqBury(const DlqArgs& a);

/// outbox-relay pause DEST: every relay stops claiming DEST within a second, until resumed.
int RunPause(const std::string& database_url, const std::string& destination,
             const std::string& reason);
/// outbox-relay resume DEST.
int RunResume(const std::string& database_url, const std::string& destination);

/// `outbox-relay destinations list`: what relays registered for the write-time guard.
int RunDestinationsList(const std::string& database_url);
/// `outbox-relay destinations add NAME...`: registers names before any relay serves them.
int RunDestinationsAdd(const std::string& database_url, const std::vector<std::string>& names);

/// `outbox-relay endpoints ...` (endpoint_commands.cc): the webhook service's endpoints.
/// Why an endpoint's URL is refused for `destination` (the SSRF guard of that webhook service
/// of the config: a host refused without asking DNS), or nullopt: fine, or a destination the
/// config does not run as a webhook service.
using EndpointUrlCheck = std::function<std::optional<std::string>(const std::string& destination,
                                                                  const std::string& url)>;
EndpointUrlCheck EndpointUrlCheckOf(const RelayConfig& cfg);
/// EndpointUrlCheckOf the config file at `config_path` (`endpoints add|update --config`); when
/// the file does not load as a relay config, says so on stderr and checks nothing (the URL
/// is then checked only when a relay makes the endpoint's sender).
EndpointUrlCheck EndpointUrlCheckOfFile(const std::string& config_path,
                                        const std::string& database_url);

struct EndpointArgs {
  std::string database_url;
  /// add, update: the URL check of the --config (EndpointUrlCheckOf); empty without one.
  EndpointUrlCheck url_check;
  std::string id;
  std::string destination;
  std::string url;
  std::string description;
  std::string metadata;
  std::vector<std::string> event_types;
  std::vector<std::string> headers;  ///< "Name: value"
  int max_in_flight = 0;
  int rate_limit = 0;
  std::string breaker;               ///< JSON object
  std::string adaptive_concurrency;  ///< true, false, default
  bool disabled = false;
  std::string secret;
  std::string signature;  ///< add: hmac or ed25519
  std::string reason;
  std::string overlap = "24h";
  bool json = false;
  std::string since;     ///< replay
  std::string message;   ///< replay, attempts
  std::string event_type_one;  ///< test
  std::string payload;         ///< test: JSON
  bool restart = false;  ///< replay: start over instead of resuming
  int limit = 50;        ///< attempts
  std::int64_t before = 0;  ///< attempts: older than this attempt's id (0: the newest)
  /// update: which of the fields above were given.
  bool set_destination = false, set_url = false, set_description = false, set_metadata = false,
       set_event_types = false, set_headers = false, set_max_in_flight = false,
       set_rate_limit = false, set_breaker = false, set_adaptive = false;
};
int RunEndpointsAdd(const EndpointArgs& a);
int RunEndpointsList(const EndpointArgs& a);
int RunEndpointsShow(const EndpointArgs& a);
int RunEndpointsUpdate(const EndpointArgs& a);
int RunEndpointsEnable(const EndpointArgs& a, bool enabled);
int RunEndpointsDelete(const EndpointArgs& a);
int RunEndpointsRotateSecret(const EndpointArgs& a);
int RunEndpointsReplay(const EndpointArgs& a);
int RunEndpointsReplays(const EndpointArgs& a);
int RunEndpointsRecover(const EndpointArgs& a);
int RunEndpointsTest(const EndpointArgs& a);
/// `outbox-relay attempts`: the delivery log, newest first (a.id: only that endpoint).
int RunAttempts(const EndpointArgs& a);

/// `outbox-relay verify` (verify_command.cc): the delivered archive against what the target
/// holds. Exit 0 clean, 1 findings (gaps, duplicates, order inversions), 2 could not verify.
struct VerifyArgs {
  std::string config_path;
  std::string database_url;
  std::string destination;
  std::string since;  ///< UTC time or an age (15m); empty: everything archived.
  std::vector<std::string> topics;
  std::string json_path;  ///< The JSON report; "-": stdout.
  int timeout_ms = 60'000;
};
int RunVerify(const VerifyArgs& a);

/// Prints `msg` as one line on stderr ("error: ..."); returns 1.
int PrintError(const std::string& msg);

/// Runs an operator command `f(Store&)` on a connection to `url`; any failure (bad input,
/// database errors) is printed as one line and gives exit code 1.
/// `e`'s message, and for a refused privilege (SQLSTATE 42501) which role the login needs.
std::string WithRoleHint(const std::exception& e);

template <class F>
int WithStore(const std::string& url, F f) {
  try {
    Store store(url);
    return f(store);
  } catch (const std::exception& e) {
    return PrintError(WithRoleHint(e));
  }
}

/// The database of an operator command: `flag` (--database-url) if given, else the
/// database_url of the config file at `config_path` (--config, with its environment
/// overrides), else $OUTBOX_DATABASE_URL. Empty, with the reason printed, when there is none
/// or the config file is invalid.
std::string DatabaseUrlFor(const std::string& flag, const std::string& config_path);

/// The process environment for LoadConfigFile, with --database-url (`database_url_flag`, when
/// not empty) standing in for OUTBOX_DATABASE_URL: the flag wins over the file and the
/// environment, and a config without database_url loads with it (run, verify).
EnvLookup ProcessEnvWithDatabaseUrl(const std::string& database_url_flag);

/// Sets up spdlog: level name and "text" or "json".
void SetupLogging(const std::string& level, bool json);

}  // namespace outbox::relay::app
