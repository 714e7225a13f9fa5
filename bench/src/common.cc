#include "common.h"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <thread>

namespace outbox::bench {
namespace {

const double kStart = MonoSeconds();

// Fields of /proc/<pid>/stat after the parenthesised command name, which may contain spaces.
std::vector<std::string> StatFields(int pid) {
  const std::string text = ReadTextFile("/proc/" + std::to_string(pid) + "/stat");
  const auto close = text.rfind(')');
  if (close == std::string::npos) return {};
  return SplitWords(text.substr(close + 1));
}

std::int64_t StatusKb(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const std::string prefix = std::string(key) + ":";
  while (std::getline(in, line)) {
    if (line.rfind(prefix, 0) == 0) return std::stoll(line.substr(prefix.size()));
  }
  return 0;
}

}  // namespace

std::int64_t WallMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

double MonoSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

Percentiles Summarize(std::vector<std::int64_t> values_us) {
  Percentiles p;
  p.count = values_us.size();
  if (values_us.empty()) return p;
  std::sort(values_us.begin(), values_us.end());
  const auto at = [&](double q) {
    const auto rank =
        static_cast<std::size_t>(std::ceil(q * static_cast<double>(values_us.size())));
    return static_cast<double>(values_us[std::max<std::size_t>(rank, 1) - 1]) / 1000.0;
  };
  p.p50_ms = at(0.50);
  p.p95_ms = at(0.95);
  p.p99_ms = at(0.99);
  p.max_ms = static_cast<double>(values_us.back()) / 1000.0;
  return p;
}

std::int64_t SelfCpuMicros() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  const auto us = [](const timeval& tv) {
    return static_cast<std::int64_t>(tv.tv_sec) * 1'000'000 + tv.tv_usec;
  };
  return us(ru.ru_utime) + us(ru.ru_stime);
}

std::int64_t PidCpuMicros(int pid) {
  const auto f = StatFields(pid);
  // After the name: state(0) ppid(1) ... utime(11) stime(12).
  if (f.size() < 13) return -1;
  const long ticks = sysconf(_SC_CLK_TCK);
  return (std::stoll(f[11]) + std::stoll(f[12])) * 1'000'000 / ticks;
}

std::map<int, ThreadCpu> SelfThreadsCpu() {
  std::map<int, ThreadCpu> out;
  const long ticks = sysconf(_SC_CLK_TCK);
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/task", ec)) {
    const std::string dir = entry.path().string();
    int tid = 0;
    try {
      tid = std::stoi(entry.path().filename().string());
    } catch (const std::exception&) {
      continue;
    }
    std::string name = ReadTextFile(dir + "/comm");
    while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
    // schedstat's first field is the thread's time on a CPU in nanoseconds, exact; stat's
    // utime + stime come in clock ticks (10 ms), too coarse for 32 threads of a few seconds.
    const auto run = SplitWords(ReadTextFile(dir + "/schedstat"));
    if (!run.empty()) {
      try {
        out[tid] = ThreadCpu{name, std::stoll(run[0]) / 1000};
        continue;
      } catch (const std::exception&) {
      }
    }
    const std::string text = ReadTextFile(dir + "/stat");
    const auto close = text.rfind(')');
    if (close == std::string::npos) continue;  // the thread ended meanwhile
    const auto f = SplitWords(text.substr(close + 1));
    if (f.size() < 13) continue;
    out[tid] = ThreadCpu{name, (std::stoll(f[11]) + std::stoll(f[12])) * 1'000'000 / ticks};
  }
  return out;
}

int ParentPid(int pid) {
  const auto f = StatFields(pid);
  return f.size() < 2 ? -1 : std::stoi(f[1]);
}

std::string ProcessName(int pid) {
  std::string name = ReadTextFile("/proc/" + std::to_string(pid) + "/comm");
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
  return name;
}

std::int64_t ProcessTreeCpuMicros(int parent_pid) {
  if (parent_pid <= 0) return 0;
  const long ticks = sysconf(_SC_CLK_TCK);
  // The parent's own time and, in cutime + cstime (fields 13 and 14), that of every child it has
  // reaped: a child's time moves there from the live sum below when it exits, so a child that
  // ends inside a measured interval neither vanishes nor takes its earlier time with it. A
  // child reaped while /proc is being read would be in neither sum: read again if the reaped
  // time moved meanwhile.
  const auto own_and_reaped = [&]() -> std::optional<std::pair<std::int64_t, std::int64_t>> {
    const auto f = StatFields(parent_pid);
    if (f.size() < 15) return std::nullopt;
    return std::pair{(std::stoll(f[11]) + std::stoll(f[12])) * 1'000'000 / ticks,
                     (std::stoll(f[13]) + std::stoll(f[14])) * 1'000'000 / ticks};
  };
  std::int64_t total = 0;
  for (int attempt = 0; attempt < 5; ++attempt) {
    const auto before = own_and_reaped();
    if (!before) return 0;
    std::int64_t live = 0;
    if (DIR* dir = opendir("/proc")) {
      while (const dirent* e = readdir(dir)) {
        if (e->d_name[0] < '1' || e->d_name[0] > '9') continue;
        const int pid = std::atoi(e->d_name);
        if (ParentPid(pid) == parent_pid) live += std::max<std::int64_t>(PidCpuMicros(pid), 0);
      }
      closedir(dir);
    }
    const auto after = own_and_reaped();
    total = (after ? after->first + after->second : before->first + before->second) + live;
    if (after && after->second == before->second) break;
  }
  return total;
}

std::map<int, std::int64_t> ChildrenCpuMicros(int parent_pid) {
  std::map<int, std::int64_t> out;
  if (parent_pid <= 0) return out;
  if (DIR* dir = opendir("/proc")) {
    while (const dirent* e = readdir(dir)) {
      if (e->d_name[0] < '1' || e->d_name[0] > '9') continue;
      const int pid = std::atoi(e->d_name);
      if (ParentPid(pid) != parent_pid) continue;
      if (const auto us = PidCpuMicros(pid); us >= 0) out[pid] = us;
    }
    closedir(dir);
  }
  return out;
}

std::int64_t RssBytes() { return StatusKb("VmRSS") * 1024; }
std::int64_t PeakRssBytes() { return StatusKb("VmHWM") * 1024; }

bool ResetPeakRss() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
  out.flush();
  return static_cast<bool>(out);
}

double LoadAverage() {
  const auto words = SplitWords(ReadTextFile("/proc/loadavg"));
  return words.empty() ? 0 : std::stod(words[0]);
}

double Slope(const std::vector<double>& x, const std::vector<double>& y) {
  const std::size_t n = std::min(x.size(), y.size());
  if (n < 2) return 0;
  double mx = 0, my = 0;
  for (std::size_t i = 0; i < n; ++i) {
    mx += x[i];
    my += y[i];
  }
  mx /= static_cast<double>(n);
  my /= static_cast<double>(n);
  double num = 0, den = 0;
  for (std::size_t i = 0; i < n; ++i) {
    num += (x[i] - mx) * (y[i] - my);
    den += (x[i] - mx) * (x[i] - mx);
  }
  return den == 0 ? 0 : num / den;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

bool WaitUntil(const std::function<bool()>& done, double timeout_s, int poll_ms) {
  const double deadline = MonoSeconds() + timeout_s;
  while (!done()) {
    if (MonoSeconds() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(poll_ms));
  }
  return true;
}

std::string Fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

void Say(const std::string& line) {
  char prefix[32];
  std::snprintf(prefix, sizeof prefix, "[bench %7.1fs] ", MonoSeconds() - kStart);
  std::cerr << prefix << line << std::endl;
}

std::string ReadTextFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<std::string> SplitWords(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> out;
  std::string w;
  while (in >> w) out.push_back(w);
  return out;
}

}  // namespace outbox::bench
