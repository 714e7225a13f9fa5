// Small measuring tools shared by the benchmark: clocks, percentiles, CPU and memory of
// processes (from getrusage and /proc), progress output.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace outbox::bench {

/// Wall clock in microseconds since the epoch. Postgres' created_at is on the same clock, so
/// enqueue-to-delivery latencies can subtract timestamps taken in different processes.
std::int64_t WallMicros();
/// Monotonic seconds, for intervals.
double MonoSeconds();

/// Nearest-rank percentiles, in milliseconds.
struct Percentiles {
  std::size_t count = 0;
  double p50_ms = 0, p95_ms = 0, p99_ms = 0, max_ms = 0;
};
/// Percentiles of durations given in microseconds (empty input: count 0, all zero).
Percentiles Summarize(std::vector<std::int64_t> values_us);

/// User + system CPU time of this process (all threads), microseconds.
std::int64_t SelfCpuMicros();
/// User + system CPU time of `pid` from /proc (all threads; clock-tick resolution); -1 if gone.
std::int64_t PidCpuMicros(int pid);
/// CPU time of `parent_pid`, its live direct children (a postmaster and its backends) and the
/// children it has reaped (cutime + cstime): monotonic, so the difference over an interval counts
/// children that exit inside it (a preload's backends, autovacuum workers) for exactly their part.
/// Grandchildren not reaped by their own parent are not counted.
std::int64_t ProcessTreeCpuMicros(int parent_pid);
// CPU time of each live child of `parent_pid`, by pid (the children that exited are not in it).
std::map<int, std::int64_t> ChildrenCpuMicros(int parent_pid);
/// Each live thread of this process: its name (/proc/self/task/<tid>/comm; the relay names its
/// threads "or-<role>") and its user + system CPU time in microseconds, by thread id.
struct ThreadCpu {
  std::string name;
  std::int64_t cpu_us = 0;
};
std::map<int, ThreadCpu> SelfThreadsCpu();
/// Parent pid of `pid` from /proc, or -1.
int ParentPid(int pid);
/// Short name of `pid` (/proc/<pid>/comm), or "".
std::string ProcessName(int pid);

/// Resident set size of this process now, bytes.
std::int64_t RssBytes();
/// Peak resident set size (VmHWM) since the last ResetPeakRss(), bytes.
std::int64_t PeakRssBytes();
/// Restarts the VmHWM peak (Linux: "5" into /proc/self/clear_refs). False if not supported.
bool ResetPeakRss();

/// 1-minute load average (/proc/loadavg).
double LoadAverage();

/// Least-squares slope of y over x; 0 with fewer than two points.
double Slope(const std::vector<double>& x, const std::vector<double>& y);
double Median(std::vector<double> v);

/// Polls `done` every `poll_ms` until it is true (returns true) or `timeout_s` passed.
bool WaitUntil(const std::function<bool()>& done, double timeout_s, int poll_ms = 5);

/// `v` with `digits` decimals ("%.*f").
std::string Fixed(double v, int digits);

/// One progress line on stderr, prefixed with the seconds since the program started.
void Say(const std::string& line);

std::string ReadTextFile(const std::string& path);
std::vector<std::string> SplitWords(const std::string& line);

}  // namespace outbox::bench
