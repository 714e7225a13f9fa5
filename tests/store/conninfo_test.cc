// The relay's connection strings: libpq's network timeouts added where the configured
// database_url sets none, and a connection to a server that never answers fails in seconds.
#include "outbox_relay/conninfo.h"

#include <gtest/gtest.h>
#include <libpq-fe.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <future>
#include <map>
#include <string>

#include "outbox_relay/migrate.h"
#include "outbox_relay/store.h"

namespace outbox::relay {
namespace {

using namespace std::chrono_literals;

/// Clears PGSERVICE and PGCONNECT_TIMEOUT for a test (they change what is added), and puts
/// back what the environment had.
class CleanEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    for (const char* name : {"PGSERVICE", "PGCONNECT_TIMEOUT"}) {
      if (const char* v = std::getenv(name)) saved_[name] = v;
      unsetenv(name);
    }
  }
  void TearDown() override {
    for (const auto& [name, value] : saved_) setenv(name.c_str(), value.c_str(), 1);
  }

 private:
  std::map<std::string, std::string> saved_;
};
const auto* const kCleanEnvironment = ::testing::AddGlobalTestEnvironment(new CleanEnvironment);

std::map<std::string, std::string> Parsed(const std::string& conninfo) {
  char* error = nullptr;
  PQconninfoOption* options = PQconninfoParse(conninfo.c_str(), &error);
  if (error != nullptr) {
    ADD_FAILURE() << "libpq cannot parse " << conninfo << ": " << error;
    PQfreemem(error);
  }
  std::map<std::string, std::string> out;
  if (options == nullptr) return out;
  for (const PQconninfoOption* o = options; o->keyword != nullptr; ++o) {
    if (o->val != nullptr) out[o->keyword] = o->val;
  }
  PQconninfoFree(options);
  return out;
}

TEST(WithConnectionDefaults, AddsNetworkTimeoutsToAUri) {
  const auto got = Parsed(WithConnectionDefaults(
      "postgresql://relay:s3cr%27et@db.internal:6432/app?sslmode=require&application_name=r"));
  EXPECT_EQ(got.at("host"), "db.internal");
  EXPECT_EQ(got.at("port"), "6432");
  EXPECT_EQ(got.at("dbname"), "app");
  EXPECT_EQ(got.at("user"), "relay");
  EXPECT_EQ(got.at("password"), "s3cr'et");
  EXPECT_EQ(got.at("sslmode"), "require");
  EXPECT_EQ(got.at("application_name"), "r");
  EXPECT_EQ(got.at("connect_timeout"), "10");
  EXPECT_EQ(got.at("keepalives_idle"), "30");
  EXPECT_EQ(got.at("keepalives_interval"), "10");
  EXPECT_EQ(got.at("keepalives_count"), "3");
  EXPECT_EQ(got.at("tcp_user_timeout"), "30000");
}

TEST(WithConnectionDefaults, KeepsWhatTheUrlSetsAndKeyValueQuoting) {
  const auto got = Parsed(WithConnectionDefaults(
      "host=/tmp/pg port=5433 dbname=app password='a b\\'c\\\\d' connect_timeout=3 "
      "tcp_user_timeout=0"));
  EXPECT_EQ(got.at("host"), "/tmp/pg");
  EXPECT_EQ(got.at("password"), "a b'c\\d");
  EXPECT_EQ(got.at("connect_timeout"), "3");
  EXPECT_EQ(got.at("tcp_user_timeout"), "0");
  EXPECT_EQ(got.at("keepalives_idle"), "30");
  // Several hosts stay several hosts.
  const auto multi = Parsed(WithConnectionDefaults("postgresql://a:5432,b:5433/app"));
  EXPECT_EQ(multi.at("host"), "a,b");
  EXPECT_EQ(multi.at("port"), "5432,5433");
}

// libpq applies a service's values and then the environment's only to options the string
// leaves unset: a default written into the string would silently override them.
TEST(WithConnectionDefaults, LeavesServicesAndPgConnectTimeoutTheirSay) {
  EXPECT_EQ(WithConnectionDefaults("service=app dbname=x"), "service=app dbname=x");
  EXPECT_EQ(WithConnectionDefaults("postgresql:///x?service=app"), "postgresql:///x?service=app");
  setenv("PGSERVICE", "app", 1);
  EXPECT_EQ(WithConnectionDefaults("dbname=x"), "dbname=x");
  unsetenv("PGSERVICE");
  setenv("PGCONNECT_TIMEOUT", "60", 1);
  const auto got = Parsed(WithConnectionDefaults("dbname=x"));
  unsetenv("PGCONNECT_TIMEOUT");
  EXPECT_EQ(got.count("connect_timeout"), 0u);
  EXPECT_EQ(got.at("tcp_user_timeout"), "30000");
}

// What libpq cannot parse is refused before connecting, naming the problem without the
// secret: libpq's own error quotes the token it stopped at, in a URI often the password (a
// raw '%' in it), and `run`, `status` and `dlq` printed it.
TEST(WithConnectionDefaults, RefusesWhatLibpqCannotParseWithoutEchoingTheSecret) {
  auto error_of = [](const std::string& url) -> std::string {
    try {
      WithConnectionDefaults(url);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "(no error)";
  };
  const std::string percent = error_of("postgresql://app:Sup3rS%ZZecret@127.0.0.1:1/app");
  EXPECT_NE(percent.find("database_url is not a valid connection string"), std::string::npos)
      << percent;
  EXPECT_NE(percent.find("%25"), std::string::npos) << percent;
  EXPECT_EQ(percent.find("Sup3rS"), std::string::npos) << percent;
  const std::string option = error_of("host=x no_such_option=1");
  EXPECT_NE(option.find("\"no_such_option\""), std::string::npos)
      << "what is not a secret is still named: " << option;
  EXPECT_EQ(error_of("postgresql://x/app?password=hunter%2&no_such_option=1").find("hunter"),
            std::string::npos);
}

/// A TCP listener that accepts connections and never says a word (a wedged proxy, a load
/// balancer with no backend behind it).
class SilentServer {
 public:
  SilentServer() {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    if (bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || listen(fd_, 16) != 0) {
      ADD_FAILURE() << "cannot listen on 127.0.0.1";
    }
    socklen_t len = sizeof addr;
    getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
  }
  ~SilentServer() { Close(); }
  int port() const { return port_; }
  /// Resets the connections waiting to be accepted (the kernel completed their handshakes).
  void Close() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
  int port_ = 0;
};

// Before, the connection waited for the server's first answer forever: `run` hung at
// startup, and a relay whose connection was re-made while the server hung hung with it.
TEST(WithConnectionDefaults, AConnectionToAServerThatNeverAnswersFailsInSeconds) {
  SilentServer server;
  const std::string url =
      "postgresql://relay@127.0.0.1:" + std::to_string(server.port()) + "/app?sslmode=disable";
  const auto start = std::chrono::steady_clock::now();
  auto attempt = std::async(std::launch::async, [&]() -> std::string {
    try {
      CurrentSchemaVersion(url);
      return "connected";
    } catch (const std::exception& e) {
      return e.what();
    }
  });
  const bool ended = attempt.wait_for(60s) == std::future_status::ready;
  if (!ended) server.Close();  // the attempt then fails, and the test can end
  ASSERT_TRUE(ended) << "still connecting after 60 s";
  const std::string error = attempt.get();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 30s);
  EXPECT_NE(error.find("timeout"), std::string::npos) << error;
}

}  // namespace
}  // namespace outbox::relay
