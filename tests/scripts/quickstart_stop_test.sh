#!/usr/bin/env bash
# The quickstart without --once, stopped as a service manager or `kill` stops it: SIGTERM to
# the script alone. It must stop everything it started and remove its throwaway data. (It
# followed the logs with a foreground `tail -f`, and bash runs a trap only once the foreground
# command ends: the script, PostgreSQL, the broker, the receiver and the relay kept running.)
# Run by scripts/test.sh after `quickstart.sh --once` (the build is then done).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=$(mktemp /tmp/quickstart-stop-test.XXXXXX)
before=$(ls -d /tmp/outbox-quickstart.* 2>/dev/null | sort || true)
scripts/quickstart.sh >"$out" 2>&1 &
pid=$!
fail() { echo "quickstart_stop_test: $*"; echo "--- quickstart output:"; cat "$out"; kill -KILL "$pid" 2>/dev/null || true; exit 1; }
for _ in $(seq 1 1200); do
  grep -q "== all running" "$out" && break
  kill -0 "$pid" 2>/dev/null || fail "the quickstart exited before it was running"
  sleep 0.1
done
grep -q "== all running" "$out" || fail "not running after 120 s"
work=$(comm -13 <(echo "$before") <(ls -d /tmp/outbox-quickstart.* 2>/dev/null | sort) | head -1)
[ -n "$work" ] || fail "no throwaway directory found"
kill -TERM "$pid"
for _ in $(seq 1 200); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
kill -0 "$pid" 2>/dev/null && fail "still running 20 s after SIGTERM"
set +e
wait "$pid"
code=$?
set -e
[ "$code" -ne 0 ] || fail "exit status 0 after SIGTERM (expected 143)"
[ ! -e "$work" ] || fail "$work was not removed"
if pgrep -f -- "$work" >/dev/null; then
  pgrep -af -- "$work"
  fail "processes of $work still run"
fi
grep -q "== stopped, throwaway data removed" "$out" || fail "no stop message"
rm -f "$out"
echo "quickstart_stop_test: ok (exit $code)"
