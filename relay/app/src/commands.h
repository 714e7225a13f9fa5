// Subcommands of outbox-relay. Each returns the process exit code.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

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
};
int RunDlqList(const DlqArgs& a);
int RunDlqShow(const DlqArgs& a);
int RunDlqReplay(const DlqArgs& a);
int RunDlqPurge(const DlqArgs& a);

/// Sets up spdlog: level name and "text" or "json".
void SetupLogging(const std::string& level, bool json);

}  // namespace outbox::relay::app
