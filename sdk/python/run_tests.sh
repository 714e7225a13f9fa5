#!/usr/bin/env bash
# Runs the Python writer's tests against a throwaway PostgreSQL 15 migrated by the relay.
# Usage: sdk/python/run_tests.sh PATH/TO/outbox-relay   (ctest passes the built one)
set -euo pipefail
RELAY=$1
HERE="$(cd "$(dirname "$0")" && pwd)"
. "$HERE/../../scripts/lib/pg.sh"
PY=/usr/bin/python3   # Debian's, with python3-psycopg (scripts/install-deps.sh)
"$PY" -c "import psycopg" 2>/dev/null || { echo "python3-psycopg is missing: run scripts/install-deps.sh" >&2; exit 1; }
WORK=$(mktemp -d)
trap 'pg_throwaway_stop "$WORK"; rm -rf "$WORK"' EXIT
chmod 755 "$WORK"
pg_throwaway_start "$WORK"
"$RELAY" migrate --database-url "$PG_URL" >/dev/null
OUTBOX_TEST_DATABASE_URL="$PG_URL" "$PY" -m unittest discover -s "$HERE/tests" -v
