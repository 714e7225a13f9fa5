#!/usr/bin/env bash
# Runs the Node writer's tests against a throwaway PostgreSQL 15 migrated by the relay, and
# type-checks index.d.ts with tsc. node-postgres and TypeScript come from the npm registry
# into a temporary folder (nothing is installed in the tree).
# Usage: sdk/node/run_tests.sh PATH/TO/outbox-relay   (ctest passes the built one)
set -euo pipefail
RELAY=$1
HERE="$(cd "$(dirname "$0")" && pwd)"
. "$HERE/../../scripts/lib/pg.sh"
command -v node >/dev/null && command -v npm >/dev/null ||
  { echo "node and npm are missing: run scripts/install-deps.sh" >&2; exit 1; }
WORK=$(mktemp -d)
trap 'pg_throwaway_stop "$WORK"; rm -rf "$WORK"' EXIT
chmod 755 "$WORK"
mkdir -p "$WORK/deps"
(cd "$WORK/deps" && npm install --no-audit --no-fund --silent --no-package-lock \
   pg@8 @types/pg@8 typescript@5 >/dev/null)
pg_throwaway_start "$WORK"
"$RELAY" migrate --database-url "$PG_URL" >/dev/null
# The package as its users see it: a copy next to its dependencies.
mkdir -p "$WORK/deps/node_modules/@outbox-relay"
cp -r "$HERE" "$WORK/deps/node_modules/@outbox-relay/writer"
cd "$WORK/deps/node_modules/@outbox-relay/writer"
"$WORK/deps/node_modules/.bin/tsc" --noEmit --strict --esModuleInterop --skipLibCheck false \
  --types node --typeRoots "$WORK/deps/node_modules/@types" test/types-check.ts
OUTBOX_TEST_DATABASE_URL="$PG_URL" node --test test/
