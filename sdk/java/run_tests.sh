#!/usr/bin/env bash
# Compiles the Java writer and its tests with javac and runs them against a throwaway
# PostgreSQL 15 migrated by the relay, offline: the JDK and the JDBC driver come from Debian
# (default-jdk-headless, libpostgresql-jdbc-java; see scripts/install-deps.sh).
# Usage: sdk/java/run_tests.sh PATH/TO/outbox-relay   (ctest passes the built one)
set -euo pipefail
RELAY=$1
HERE="$(cd "$(dirname "$0")" && pwd)"
. "$HERE/../../scripts/lib/pg.sh"
JDBC=/usr/share/java/postgresql.jar
command -v javac >/dev/null || { echo "javac is missing: run scripts/install-deps.sh" >&2; exit 1; }
[ -f "$JDBC" ] || { echo "$JDBC is missing (libpostgresql-jdbc-java): run scripts/install-deps.sh" >&2; exit 1; }
WORK=$(mktemp -d)
trap 'pg_throwaway_stop "$WORK"; rm -rf "$WORK"' EXIT
chmod 755 "$WORK"
javac -Xlint:all -Werror -d "$WORK/classes" -cp "$JDBC" \
  $(find "$HERE/src" "$HERE/examples" -name '*.java')
pg_throwaway_start "$WORK"
"$RELAY" migrate --database-url "$PG_URL" >/dev/null
# JDBC's URL form of the throwaway server.
export OUTBOX_TEST_DATABASE_URL="jdbc:postgresql://127.0.0.1:$PG_PORT/postgres?user=postgres"
java -cp "$WORK/classes:$JDBC" io.github.outboxrelay.writer.WriterTest
