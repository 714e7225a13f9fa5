#!/usr/bin/env bash
# The benchmark in one command: installs what it needs (Debian packages, gnuplot), builds
# outbox-bench with the default preset, runs it and plots the results.
#
#   bench/run.sh --quick          # ~6 minutes on 2 cores: 100k backlog, 15 s sustained load
#   bench/run.sh                  # the full run (1M backlog, 60 s sustained): ~25 minutes
#   bench/run.sh --only sql_ceiling,kafka_drain
#
# Every argument goes to outbox-bench (build/bench/outbox-bench --help). Results go to
# build/bench-results/<UTC time>/ unless --out DIR is given: results.md (the table),
# results.jsonl (one JSON object per scenario), TSVs and benchmarks.png.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh
if ! command -v gnuplot >/dev/null; then
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  echo "bench/run.sh: installing gnuplot-nox for the plot"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends gnuplot-nox >/dev/null \
    || { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends gnuplot-nox >/dev/null; }
fi

cmake --preset default >/dev/null
cmake --build --preset default --target outbox-bench -j"$(nproc)"

out=""
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case "${args[$i]}" in
    --out) out="${args[$((i + 1))]:-}" ;;
    --out=*) out="${args[$i]#--out=}" ;;
  esac
done
if [ -z "$out" ]; then
  out="build/bench-results/$(date -u +%Y%m%dT%H%M%SZ)"
  args+=(--out "$out")
fi

status=0
build/bench/outbox-bench "${args[@]}" || status=$?
if [ -f "$out/throughput.tsv" ]; then
  bench/plot.sh "$out"
  echo "bench/run.sh: results in $out (results.md, results.jsonl, benchmarks.png)"
fi
exit "$status"
