#!/usr/bin/env bash
# Installs dependencies, builds, and runs the whole test suite.
# Usage: scripts/test.sh [preset]   (preset: default | asan; default: default)
set -euo pipefail
cd "$(dirname "$0")/.."
PRESET="${1:-default}"
scripts/install-deps.sh
cmake --preset "$PRESET" >/dev/null
cmake --build --preset "$PRESET" -j"$(nproc)"
ctest --preset "$PRESET"
