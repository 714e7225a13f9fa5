#!/usr/bin/env bash
# Installs dependencies, builds, and runs the whole test suite.
# Usage: scripts/test.sh [preset]   (preset: default | asan | tsan; default: default)
#   tsan runs the unit tests only: libpq and librdkafka are not built with ThreadSanitizer, so
#   tests that run their threads would report races inside them that are not ours.
set -euo pipefail
cd "$(dirname "$0")/.."
PRESET="${1:-default}"
scripts/install-deps.sh
cmake --preset "$PRESET" >/dev/null
cmake --build --preset "$PRESET" -j"$(nproc)"
ctest --preset "$PRESET"
# The README's first command, end to end, so it can never silently break (issue 15).
if [ "$PRESET" = default ]; then
  scripts/quickstart.sh --once
  # And stopped with SIGTERM while it runs: everything it started stops, its data goes.
  tests/scripts/quickstart_stop_test.sh
fi
