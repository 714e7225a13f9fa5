#!/usr/bin/env bash
# Runs the Go writer's tests against a throwaway PostgreSQL 15 migrated by the relay, offline:
# Go, pgx v4 and OpenTelemetry come from Debian (golang-go, golang-github-jackc-pgx-v4-dev,
# golang-opentelemetry-otel-dev; see
# scripts/install-deps.sh), built in GOPATH mode from /usr/share/gocode.
# Usage: sdk/go/run_tests.sh PATH/TO/outbox-relay   (ctest passes the built one)
set -euo pipefail
RELAY=$1
HERE="$(cd "$(dirname "$0")" && pwd)"
. "$HERE/../../scripts/lib/pg.sh"
command -v go >/dev/null || { echo "go is missing: run scripts/install-deps.sh" >&2; exit 1; }
[ -d /usr/share/gocode/src/github.com/jackc/pgx/v4 ] ||
  { echo "pgx v4 is missing (golang-github-jackc-pgx-v4-dev): run scripts/install-deps.sh" >&2; exit 1; }
[ -d /usr/share/gocode/src/go.opentelemetry.io/otel ] ||
  { echo "OpenTelemetry is missing (golang-opentelemetry-otel-dev): run scripts/install-deps.sh" >&2; exit 1; }
WORK=$(mktemp -d)
trap 'pg_throwaway_stop "$WORK"; rm -rf "$WORK"' EXIT
chmod 755 "$WORK"
# The package at its import path inside a GOPATH that also holds Debian's Go libraries.
PKG=github.com/outbox-relay/outbox-relay/sdk/go
mkdir -p "$WORK/gopath/src/$(dirname "$PKG")"
ln -s "$HERE" "$WORK/gopath/src/$PKG"
pg_throwaway_start "$WORK"
"$RELAY" migrate --database-url "$PG_URL" >/dev/null
cd "$WORK/gopath/src/$PKG"
export GO111MODULE=off GOPATH="$WORK/gopath:/usr/share/gocode" GOFLAGS= \
       GOCACHE="${GOCACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/outbox-relay-go-build}"
go vet . ./otel ./examples/...
# Sequentially: both packages use the one database.
OUTBOX_TEST_DATABASE_URL="$PG_URL" go test -p 1 -count=1 -v . ./otel 2>&1
