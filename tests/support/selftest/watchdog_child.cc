// Helper process for the PgCluster watchdog self-test: starts the cluster, prints
// "PORT BASE_DIR", then ends as told: `kill` (SIGKILL itself), `abort`, or `exit` (normal).
#include <signal.h>
#include <sys/resource.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "outbox_test/pg.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s kill|abort|exit\n", argv[0]);
    return 2;
  }
  auto& pg = outbox::testing::PgCluster::Instance();
  pg.CreateDatabase();
  std::printf("%d %s\n", pg.port(), pg.base_dir().c_str());
  std::fflush(stdout);
  if (std::strcmp(argv[1], "kill") == 0) ::raise(SIGKILL);
  if (std::strcmp(argv[1], "abort") == 0) {
    const rlimit no_core{0, 0};
    ::setrlimit(RLIMIT_CORE, &no_core);  // no core file in the test's working directory
    std::abort();
  }
  return 0;
}
