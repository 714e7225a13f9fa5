#include <arpa/inet.h>
#include <dirent.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <pqxx/pqxx>
#include <sstream>
#include <string>

#include "outbox_relay/migrate.h"
#include "outbox_test/pg.h"
#include "outbox_test/wait.h"

namespace outbox::testing {
namespace {

using namespace std::chrono_literals;

bool TableExists(const std::string& url, const std::string& table) {
  pqxx::connection conn(url);
  pqxx::work tx(conn);
  return tx.exec1("SELECT to_regclass(" + tx.quote(table) + ") IS NOT NULL")[0].as<bool>();
}

bool CanConnect(const std::string& url) {
  try {
    pqxx::connection conn(url);
    pqxx::nontransaction(conn).exec("SELECT 1");
    return true;
  } catch (const pqxx::broken_connection&) {
    return false;
  }
}

bool PortAcceptsTcp(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  ::close(fd);
  return ok;
}

// Whether any process has `needle` in its command line (the watchdog's script names the
// cluster's temp dir).
bool AnyProcessMentions(const std::string& needle) {
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return false;
  bool found = false;
  while (dirent* e = ::readdir(proc)) {
    const std::string name = e->d_name;
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in("/proc/" + name + "/cmdline", std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    if (ss.str().find(needle) != std::string::npos) {
      found = true;
      break;
    }
  }
  ::closedir(proc);
  return found;
}

// popen runs the helper through sh, which may report a signal death as exit code 128+sig.
bool KilledBy(int status, int sig) {
  return (WIFSIGNALED(status) && WTERMSIG(status) == sig) ||
         (WIFEXITED(status) && WEXITSTATUS(status) == 128 + sig);
}

struct ChildCluster {
  int port = 0;
  std::string base_dir;
  int wait_status = 0;
};

// Runs the helper binary in `mode`; returns what it printed and how it ended.
ChildCluster RunWatchdogChild(const std::string& mode) {
  const std::string cmd = std::string(OUTBOX_WATCHDOG_CHILD) + " " + mode;
  FILE* pipe = ::popen(cmd.c_str(), "r");
  EXPECT_NE(pipe, nullptr);
  ChildCluster child;
  if (pipe == nullptr) return child;
  char buf[4096] = {};
  if (std::fgets(buf, sizeof buf, pipe) != nullptr) {
    std::istringstream line(buf);
    line >> child.port >> child.base_dir;
  }
  child.wait_status = ::pclose(pipe);
  return child;
}

TEST(PgClusterTest, StartsPostgres15AndAcceptsConnections) {
  auto& pg = PgCluster::Instance();
  EXPECT_GT(pg.port(), 0);
  EXPECT_EQ(pg.Url("postgres"),
            "postgresql://postgres@127.0.0.1:" + std::to_string(pg.port()) + "/postgres");
  EXPECT_TRUE(std::filesystem::is_directory(pg.base_dir() + "/data"));
  pqxx::connection conn(pg.Url("postgres"));
  pqxx::work tx(conn);
  EXPECT_EQ(tx.exec1("SHOW server_version_num")[0].as<int>() / 10000, 15);
  EXPECT_EQ(tx.exec1("SELECT current_user")[0].as<std::string>(), "postgres");
  EXPECT_EQ(tx.exec1("SHOW fsync")[0].as<std::string>(), "off");
  EXPECT_EQ(tx.exec1("SHOW max_connections")[0].as<int>(), 200);
}

TEST(PgClusterTest, CreateDatabaseGivesDistinctEmptyDatabases) {
  auto& pg = PgCluster::Instance();
  const std::string a = pg.CreateDatabase();
  const std::string b = pg.CreateDatabase();
  EXPECT_NE(a, b);
  EXPECT_EQ(a.rfind(pg.Url(""), 0), 0u) << a;
  EXPECT_TRUE(CanConnect(a));
  EXPECT_TRUE(CanConnect(b));
  EXPECT_FALSE(TableExists(a, "outbox.messages"));
}

TEST(PgClusterTest, MigratedDatabasesAreIndependentCopies) {
  auto& pg = PgCluster::Instance();
  const std::string a = pg.CreateMigratedDatabase();
  const std::string b = pg.CreateMigratedDatabase();
  ASSERT_NE(a, b);
  EXPECT_TRUE(TableExists(a, "outbox.messages"));
  EXPECT_EQ(outbox::relay::CurrentSchemaVersion(a), outbox::relay::LatestMigrationVersion());
  {
    pqxx::connection conn(a);
    pqxx::work tx(conn);
    tx.exec("CREATE TABLE public.only_in_a (x int)");
    tx.commit();
  }
  EXPECT_TRUE(TableExists(a, "public.only_in_a"));
  EXPECT_FALSE(TableExists(b, "public.only_in_a"));
  EXPECT_TRUE(TableExists(b, "outbox.messages"));
  // The template is closed to connections so that cloning it never fails.
  EXPECT_FALSE(CanConnect(pg.Url("outbox_template")));
}

class PgFixtureTest : public PgTest {};

TEST_F(PgFixtureTest, SetUpGivesMigratedDatabase) {
  ASSERT_FALSE(db_url_.empty());
  EXPECT_TRUE(TableExists(db_url_, "outbox.messages"));
  EXPECT_TRUE(TableExists(db_url_, "outbox.schema_migrations"));
}

TEST_F(PgFixtureTest, EachTestGetsItsOwnDatabase) {
  pqxx::connection conn(db_url_);
  pqxx::work tx(conn);
  // Would fail if a previous test's database were reused and had the table already.
  tx.exec("CREATE TABLE public.fixture_marker (x int)");
  tx.commit();
}

TEST_F(PgFixtureTest, EachTestGetsItsOwnDatabaseAgain) {
  EXPECT_FALSE(TableExists(db_url_, "public.fixture_marker"));
}

TEST_F(PgFixtureTest, RestartCutsConnectionsAndKeepsData) {
  pqxx::connection before(db_url_);
  {
    pqxx::work tx(before);
    tx.exec("CREATE TABLE public.survives (x int); INSERT INTO public.survives VALUES (7)");
    tx.commit();
  }
  PgCluster::Instance().Restart();
  EXPECT_ANY_THROW(pqxx::nontransaction(before).exec("SELECT 1"));
  pqxx::connection after(db_url_);
  pqxx::work tx(after);
  EXPECT_EQ(tx.exec1("SELECT x FROM public.survives")[0].as<int>(), 7);
}

TEST_F(PgFixtureTest, StopThenStart) {
  auto& pg = PgCluster::Instance();
  pg.Stop();
  EXPECT_FALSE(CanConnect(db_url_));
  EXPECT_FALSE(PortAcceptsTcp(pg.port()));
  pg.Start();
  EXPECT_TRUE(CanConnect(db_url_));
}

TEST(PgClusterTest, CreateDatabaseStartsAStoppedCluster) {
  auto& pg = PgCluster::Instance();
  pg.Stop();
  const std::string url = pg.CreateMigratedDatabase();
  EXPECT_TRUE(TableExists(url, "outbox.messages"));
}

TEST(PgWatchdogTest, NormalExitRemovesEverythingAndLeavesNoWatchdog) {
  const ChildCluster child = RunWatchdogChild("exit");
  ASSERT_TRUE(WIFEXITED(child.wait_status) && WEXITSTATUS(child.wait_status) == 0)
      << "status " << child.wait_status;
  ASSERT_GT(child.port, 0);
  ASSERT_EQ(child.base_dir.rfind("/tmp/outbox-pg-", 0), 0u) << child.base_dir;
  // Teardown is synchronous: nothing to wait for.
  EXPECT_FALSE(std::filesystem::exists(child.base_dir));
  EXPECT_FALSE(PortAcceptsTcp(child.port));
  EXPECT_FALSE(AnyProcessMentions(child.base_dir));
}

TEST(PgWatchdogTest, SigkillIsCleanedUpByWatchdog) {
  const ChildCluster child = RunWatchdogChild("kill");
  ASSERT_TRUE(KilledBy(child.wait_status, SIGKILL)) << "status " << child.wait_status;
  ASSERT_GT(child.port, 0);
  ASSERT_EQ(child.base_dir.rfind("/tmp/outbox-pg-", 0), 0u) << child.base_dir;
  EXPECT_TRUE(WaitFor(
      [&] {
        return !std::filesystem::exists(child.base_dir) && !PortAcceptsTcp(child.port) &&
               !AnyProcessMentions(child.base_dir);
      },
      30s, 50ms))
      << "leftover: dir=" << std::filesystem::exists(child.base_dir)
      << " port=" << PortAcceptsTcp(child.port);
}

TEST(PgWatchdogTest, AbortIsCleanedUpByWatchdog) {
  const ChildCluster child = RunWatchdogChild("abort");
  ASSERT_TRUE(KilledBy(child.wait_status, SIGABRT)) << "status " << child.wait_status;
  ASSERT_GT(child.port, 0);
  EXPECT_TRUE(WaitFor(
      [&] {
        return !std::filesystem::exists(child.base_dir) && !PortAcceptsTcp(child.port) &&
               !AnyProcessMentions(child.base_dir);
      },
      30s, 50ms));
}

}  // namespace
}  // namespace outbox::testing
