#!/usr/bin/env bash
# The 16-core checks of issues 16, 17 and 18 in one device call (../shared/device/README.md):
# each group runs outbox-bench against its own throwaway cluster, under its own time limit, and
# what it printed comes back in $OUT (<group>.out: JSON lines and the tables; results.md: every
# group's table). A group that runs out of time still returns the scenarios it finished (their
# JSON lines in <group>.out). The limits fit the 16-core machine (open_loop took 35 s there);
# on 2 cores the open_loop group alone needs about 140 s.
#
# Here, once the build is done:
#   echo /.devbundle/ >> .git/info/exclude
#   ../shared/device/bundle.sh build .devbundle
# Then the device calls, from the repo root, with `.devbundle` carried and a timeout above the
# sum of their groups' limits. All four (640 s) exceed one call's 600 s: run them as two calls,
#   bash bench/device_checks.sh drains open_loop          (timeout 400 s)
#   bash bench/device_checks.sh sustained claim_connections  (timeout 320 s)
# which fit a session's 15 minutes of device time with the machine's start (~40 s) each.
# `statements` (150 s; session 33) measures ADR 0003's bucket-lease statements against the
# relay's own (sql_row_leases, sql_bucket_leases) and the Kafka drain: run it with drains,
#   bash bench/device_checks.sh drains statements          (timeout 460 s)
# `webhooks` (~200 s; session 36) is issue 17's 16-core check: the default drain (claim_connections
# auto: 4 claim loops for the default 32 workers on 16 CPUs since session 36) against one loop
# (webhook_drain_cc1, the old default there) and bucket leases, and the same over HTTPS; since
# session 37 also the ceiling of the relay's own HTTP client (http_ceiling_relay_client), and
# since session 38 eight loops (webhook_drain_cc8: whether auto's cap of 4 is the limit there),
#   bash bench/device_checks.sh webhooks statements          (timeout 480 s)
# (Session 28 ran all four in one call with drains at 200 s and claim_connections at 140 s:
# both ran out of time before their last scenarios.)
set -u
B=/opt/ob/b
OUT=${OUT:-/tmp/device-out}
mkdir -p "$OUT"
id postgres >/dev/null 2>&1 || useradd -r -M postgres
[ -d $B ] || { mkdir -p /opt/ob && tar -C /opt/ob -xJf .devbundle/bundle.tar.xz; }
export LD_LIBRARY_PATH=$B/lib PATH=$B/bin:$PATH
echo "cores: $(nproc)"

run() {  # group time-limit outbox-bench-arguments...
  local group=$1 limit=$2
  shift 2
  echo "=== $group $(date +%T)"
  (cd /tmp && timeout -k 5 "$limit" outbox-bench --pg-bin $B/usr/lib/postgresql/15/bin \
     --pg-setting jit=off --pg-setting shared_buffers=1GB --timeout 100 "$@" --out "/tmp/$group" \
     2>"/tmp/$group.stderr") | tee "$OUT/$group.out" | grep -v '^{'
  echo "rc=${PIPESTATUS[0]} $(date +%T)"
  { echo "## $group"; cat "/tmp/$group/results.md"; } >>"$OUT/results.md" 2>/dev/null
  # Each webhook drain's workers: mean request vs the ceiling client's, and their idle share
  # (slow requests: the exchange is the limit; idle workers: the claims are).
  grep -o '"sink":{[^}]*}\|"scenario":"webhook_drain[a-z0-9_]*"' "$OUT/$group.out" | paste - - 2>/dev/null
  # And the plain-HTTP drain against the relay's own client's ceiling (http_ceiling_relay_client).
  grep -o '"vs_http_ceiling_relay_client":{[^}]*}' "$OUT/$group.out"
  tail -3 "/tmp/$group.stderr"
}

groups=("$@")
[ ${#groups[@]} -eq 0 ] && groups=(drains open_loop sustained claim_connections)
for group in "${groups[@]}"; do
  case $group in
    drains)  # issues 17 and 18: ceilings, one relay, the webhook max_in_flight sweep
      run drains 280 --only sql_ceiling,sql_ceiling_x2,sql_ceiling_x4,kafka_drain,kafka_drain_keyed,http_ceiling,webhook_drain,webhook_drain_mif8,webhook_drain_mif32,webhook_drain_mif128 \
        --kafka-messages 200000 --webhook-messages 200000 ;;
    open_loop)  # issue 16: no message over 1 s at 5k msg/s
      run open_loop 100 --quick --only open_loop_kafka,open_loop_kafka_keyed,open_loop_webhook \
        --open-loop-rate 5000 ;;
    sustained)  # issue 16: the backlog stays bounded with 16 producers
      run sustained 100 --quick --only sustained_kafka --producers 16 --claim-connections 4 ;;
    claim_connections)  # issue 18: one relay with 1, 2 and 4 claim connections
      run claim_connections 200 --only sql_ceiling,kafka_drain,kafka_drain_cc2,kafka_drain_cc4,http_ceiling,webhook_drain,webhook_drain_cc2,webhook_drain_cc4 \
        --kafka-messages 200000 --webhook-messages 100000 --claim-connections-sweep 2,4 ;;
    statements)  # issue 18 / ADR 0003: the relay's statements alone against bucket leases, the
      # Kafka drain in both modes beside them (Postgres CPU by process: --statement-stats)
      run statements 220 --statement-stats --only sql_ceiling,sql_row_leases,sql_bucket_leases,kafka_drain,kafka_drain_bucket_leases \
        --kafka-messages 200000 ;;
    webhooks)  # issue 17: the default webhook drain beside one claim loop and bucket leases
      run webhooks 280 --only sql_ceiling,http_ceiling,http_ceiling_relay_client,webhook_drain,webhook_drain_cc1,webhook_drain_cc8,webhook_drain_bucket_leases,https_ceiling,webhook_drain_https \
        --webhook-messages 200000 --claim-connections-sweep 1,8 ;;
    *) echo "unknown group $group (drains, open_loop, sustained, claim_connections, statements, webhooks)"; exit 2 ;;
  esac
done
