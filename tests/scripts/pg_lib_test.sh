#!/usr/bin/env bash
# scripts/lib/pg.sh, which the writer tests and the quickstart start their PostgreSQL with:
# the cluster starts even when the port it picked was taken before the server bound it (by
# another test's server, or as a client's ephemeral port: seen as java_writer_test failing
# with "could not bind IPv4 address: Address already in use" under ctest -j).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../../scripts/lib/pg.sh
source "$HERE/../../scripts/lib/pg.sh"
fail() { echo "FAIL: $*" >&2; exit 1; }

WORK=$(mktemp -d)
chmod 755 "$WORK"
HOLDER=
trap '[ -n "$HOLDER" ] && kill "$HOLDER" 2>/dev/null; pg_throwaway_stop "$WORK/pg"; rm -rf "$WORK"' EXIT

# A port someone else listens on.
python3 -c '
import socket, sys, time
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen()
print(s.getsockname()[1], flush=True)
time.sleep(300)
' >"$WORK/taken" &
HOLDER=$!
for _ in $(seq 1 100); do [ -s "$WORK/taken" ] && break; sleep 0.1; done
TAKEN=$(cat "$WORK/taken")
[ -n "$TAKEN" ] || fail "the port holder did not start"

# free_port answers that port first, as if it had been free when checked and was taken
# before the server's bind; then it answers as usual.
eval "original_$(declare -f free_port)"
free_port() {
  if [ ! -e "$WORK/answered" ]; then
    touch "$WORK/answered"
    echo "$TAKEN"
  else
    original_free_port
  fi
}

pg_throwaway_start "$WORK/pg" || fail "the cluster did not start after its first port was taken"
[ "$PG_PORT" != "$TAKEN" ] || fail "PG_PORT is the taken port $TAKEN"
OUT=$(psql "$PG_URL" -Atc 'SELECT 41 + 1') || fail "cannot connect to $PG_URL"
[ "$OUT" = 42 ] || fail "SELECT printed $OUT"
echo "ok: port $TAKEN was taken, the cluster listens on $PG_PORT"
