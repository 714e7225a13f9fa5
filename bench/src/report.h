// What a run leaves behind: a markdown summary, JSON lines, and TSV files for bench/plot.sh.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "scenarios.h"

namespace outbox::bench {

/// nproc, memory, CPU model, kernel, and the Postgres/librdkafka/cpp-httplib versions.
std::string MachineDescription(const std::string& postgres);

/// The results table, then every target with PASS/MISS, as markdown.
std::string MarkdownReport(const std::vector<ScenarioResult>& results);

/// Writes into `dir` (created if missing): results.jsonl, results.md (machine, command,
/// table), throughput.tsv, latency.tsv and timeline_<scenario>.tsv for each timeline.
void WriteResults(const std::string& dir, const std::vector<ScenarioResult>& results,
                  const std::vector<std::pair<std::string, std::vector<Sample>>>& timelines,
                  const std::string& machine, const std::string& command);

}  // namespace outbox::bench
