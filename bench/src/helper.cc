#include "helper.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <iostream>
#include <stdexcept>

#include "common.h"

extern char** environ;

namespace outbox::bench {

Helper::Helper(const std::string& role) : role_(role) {
  int in[2], out[2];
  if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0) {
    throw std::runtime_error("pipe2 failed");
  }
  char exe[PATH_MAX];
  const ssize_t len = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (len <= 0) throw std::runtime_error("cannot read /proc/self/exe");
  exe[len] = '\0';

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in[0], 0);   // dup2 clears O_CLOEXEC
  posix_spawn_file_actions_adddup2(&actions, out[1], 1);
  std::string flag = "--helper", role_arg = role;
  char* argv[] = {exe, flag.data(), role_arg.data(), nullptr};
  const int rc = posix_spawn(&pid_, exe, &actions, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(in[0]);
  ::close(out[1]);
  if (rc != 0) throw std::runtime_error("cannot start the " + role + " helper");
  to_child_ = in[1];
  from_child_ = out[0];
}

Helper::~Helper() {
  if (to_child_ >= 0) ::close(to_child_);
  if (pid_ > 0) {
    // The child exits on EOF; give it a few seconds (the mock cluster shuts down), then kill.
    for (int i = 0; i < 100; ++i) {
      if (::waitpid(pid_, nullptr, WNOHANG) == pid_) {
        pid_ = -1;
        break;
      }
      ::usleep(50'000);
    }
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  if (from_child_ >= 0) ::close(from_child_);
}

std::string Helper::Call(const std::string& command, double timeout_s) {
  const std::string line = command + "\n";
  for (std::size_t off = 0; off < line.size();) {
    const ssize_t n = ::write(to_child_, line.data() + off, line.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw std::runtime_error(role_ + " helper is gone (write failed)");
    off += static_cast<std::size_t>(n);
  }
  const double deadline = MonoSeconds() + timeout_s;
  while (true) {
    const auto nl = buffer_.find('\n');
    if (nl != std::string::npos) {
      std::string reply = buffer_.substr(0, nl);
      buffer_.erase(0, nl + 1);
      if (reply.rfind("OK", 0) == 0) return reply.size() > 3 ? reply.substr(3) : "";
      throw std::runtime_error(role_ + " helper: " + command.substr(0, command.find(' ')) +
                               ": " + reply);
    }
    const double left = deadline - MonoSeconds();
    if (left <= 0) throw std::runtime_error(role_ + " helper did not answer: " + command);
    pollfd p{from_child_, POLLIN, 0};
    const int rc = ::poll(&p, 1, static_cast<int>(std::min(left, 1.0) * 1000) + 1);
    if (rc < 0 && errno == EINTR) continue;
    if (rc <= 0) continue;
    char buf[65536];
    const ssize_t n = ::read(from_child_, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw std::runtime_error(role_ + " helper exited (see its stderr above)");
    buffer_.append(buf, static_cast<std::size_t>(n));
  }
}

nlohmann::json LatencySummary(std::vector<std::int64_t> latencies_us) {
  std::int64_t over_20ms = 0, over_100ms = 0, over_1s = 0;
  for (const auto us : latencies_us) {
    over_20ms += us > 20'000;
    over_100ms += us > 100'000;
    over_1s += us > 1'000'000;
  }
  const Percentiles p = Summarize(std::move(latencies_us));
  return {{"count", p.count},         {"p50_ms", p.p50_ms},         {"p95_ms", p.p95_ms},
          {"p99_ms", p.p99_ms},       {"max_ms", p.max_ms},         {"over_20ms", over_20ms},
          {"over_100ms", over_100ms}, {"over_1s", over_1s}};
}

int ServeCommands(const std::function<std::string(const std::vector<std::string>&)>& handler) {
  std::string line;
  while (std::getline(std::cin, line)) {
    const auto words = SplitWords(line);
    if (words.empty()) continue;
    std::string reply;
    try {
      reply = "OK " + handler(words);
    } catch (const std::exception& e) {
      reply = std::string("ERR ") + e.what();
    }
    for (char& c : reply) {
      if (c == '\n') c = ' ';
    }
    std::cout << reply << std::endl;
  }
  return 0;
}

int RunHelper(const std::string& role) {
  ::signal(SIGPIPE, SIG_IGN);
  ::signal(SIGINT, SIG_IGN);  // Ctrl-C goes to the parent, which then closes our stdin
  if (role == "kafka") return RunKafkaHelper();
  if (role == "http") return RunHttpHelper();
  if (role == "producer") return RunProducerHelper();
  std::cerr << "unknown helper role " << role << "\n";
  return 2;
}

}  // namespace outbox::bench
