#!/usr/bin/env bash
# The main job on an embedded default, in one command:
# installs dependencies, builds, starts a throwaway PostgreSQL, a local Kafka-protocol broker
# (librdkafka's mock cluster) and a sample webhook receiver, migrates, runs the relay,
# publishes sample events through the SDK, and shows them arriving: on Kafka through an
# independent consumer (kcat), on the webhook receiver with verified signatures.
# Ctrl-C stops everything and removes the throwaway data. `--once` exits after showing.
set -euo pipefail
cd "$(dirname "$0")/.."
ONCE=0
[ "${1:-}" = "--once" ] && ONCE=1

scripts/install-deps.sh
cmake --preset default >/dev/null
cmake --build --preset default -j"$(nproc)" --target outbox-relay outbox-dev-broker \
  outbox-sample-receiver outbox-example-publish
BIN=build
. scripts/lib/pg.sh

WORK=$(mktemp -d /tmp/outbox-quickstart.XXXXXX)
chmod 755 "$WORK"
PIDS=()
cleanup() {
  trap - INT TERM EXIT
  echo
  echo "== stopping"
  if [ -n "${RELAY_PID:-}" ]; then kill -TERM "$RELAY_PID" 2>/dev/null || true; wait "$RELAY_PID" 2>/dev/null || true; fi
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  pg_throwaway_stop "$WORK/pg"
  rm -rf "$WORK"
  echo "== stopped, throwaway data removed"
}
# Stopped by a signal, it stops everything and exits as the signal says (130, 143); bash runs
# these only once a foreground command ends, so what waits below waits in the background.
trap cleanup EXIT
trap 'cleanup; exit 130' INT
trap 'cleanup; exit 143' TERM
# A process it started that is gone: its log says why (printed before cleanup removes it).
died() {
  echo "error: $1 exited; its log ($2):"
  cat "$2" 2>/dev/null || true
  exit 1
}

echo "== starting a throwaway PostgreSQL"
pg_throwaway_start "$WORK/pg"
echo "   $PG_URL"

echo "== starting a local Kafka-protocol broker (librdkafka mock cluster)"
"$BIN/relay/app/outbox-dev-broker" --topic orders --bootstrap-file "$WORK/bootstrap" >"$WORK/broker.log" 2>&1 &
BROKER_PID=$!
PIDS+=("$BROKER_PID")
for _ in $(seq 1 100); do
  [ -s "$WORK/bootstrap" ] && break
  kill -0 "$BROKER_PID" 2>/dev/null || died "the broker" "$WORK/broker.log"
  sleep 0.1
done
[ -s "$WORK/bootstrap" ] || died "the broker did not start in 10 s and" "$WORK/broker.log"
BOOTSTRAP=$(cat "$WORK/bootstrap")
echo "   $BOOTSTRAP"

SECRET="whsec_$(head -c 24 /dev/urandom | base64)"
HOOK_PORT=$(free_port)
echo "== starting the sample webhook receiver on 127.0.0.1:$HOOK_PORT"
"$BIN/relay/app/outbox-sample-receiver" --port "$HOOK_PORT" --secret "$SECRET" >"$WORK/receiver.log" 2>&1 &
RECEIVER_PID=$!
PIDS+=("$RECEIVER_PID")
for _ in $(seq 1 100); do
  grep -q "listening on" "$WORK/receiver.log" && break
  kill -0 "$RECEIVER_PID" 2>/dev/null || died "the webhook receiver" "$WORK/receiver.log"
  sleep 0.1
done

cat >"$WORK/relay.yaml" <<YAML
database_url: $PG_URL
batch_size: 500
destinations:
  orders:
    kafka:
      brokers: "$BOOTSTRAP"
      topic: orders
  billing-hooks:
    webhook:
      url: http://127.0.0.1:$HOOK_PORT/hooks/billing
      allow_private_networks: true   # the sample receiver is on loopback; the SSRF guard refuses it otherwise
      secret_env: QUICKSTART_WEBHOOK_SECRET
      timeout_ms: 5000
      max_in_flight: 8
YAML
export QUICKSTART_WEBHOOK_SECRET="$SECRET"

echo "== migrating"
"$BIN/relay/app/outbox-relay" migrate --database-url "$PG_URL"

echo "== running the relay (log: $WORK/relay.log)"
"$BIN/relay/app/outbox-relay" run --config "$WORK/relay.yaml" >"$WORK/relay.log" 2>&1 &
RELAY_PID=$!

echo "== publishing sample events through the SDK"
"$BIN/sdk/outbox-example-publish" --database-url "$PG_URL" --orders 10 --invoices 5

echo "== consuming topic 'orders' with kcat (an independent Kafka client)"
# --foreground: Ctrl-C reaches kcat (timeout otherwise runs it in a process group of its own).
timeout --foreground 30 kcat -C -b "$BOOTSTRAP" -t orders -o beginning -c 10 -q \
  -f 'partition=%p offset=%o key=%k headers=%h\n    value=%s\n' || {
  echo "kcat did not read 10 messages in 30 s; relay log:"; cat "$WORK/relay.log"; exit 1; }

echo "== the webhook receiver verified:"
for _ in $(seq 1 300); do
  [ "$(grep -c '^verified' "$WORK/receiver.log" || true)" -ge 5 ] && break
  sleep 0.1
done
grep -E '^(verified|REJECTED|duplicate)' "$WORK/receiver.log" | sed 's/^/    /'
[ "$(grep -c '^verified' "$WORK/receiver.log" || true)" -ge 5 ] || { echo "receiver did not verify 5 deliveries"; cat "$WORK/relay.log"; exit 1; }

if [ "$ONCE" = 1 ]; then exit 0; fi
echo
echo "== all running. Publish more with:"
echo "   $BIN/sdk/outbox-example-publish --database-url $PG_URL --orders 4 --invoices 2"
echo "   or: psql '$PG_URL' -c \"SELECT outbox.enqueue('orders', '{\\\"hello\\\": 1}'::jsonb)\""
echo "   Ctrl-C stops everything. Relay log follows:"
tail -n +1 -f "$WORK/relay.log" "$WORK/receiver.log" &
PIDS+=($!)
wait "$RELAY_PID" || true  # a signal ends this wait and runs the trap
echo "error: the relay exited; its log is above"
exit 1
