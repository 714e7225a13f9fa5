#!/usr/bin/env bash
# The Debian package, built and inspected as a user would get it (issue 15):
#   cpack builds it from the build tree; dpkg-deb shows its files, modes, conffiles and
#   dependencies; it is unpacked into a scratch root, whose outbox-relay must run (`version`,
#   and `check-config` on the shipped example) with only runtime libraries; the shipped
#   systemd unit must pass `systemd-analyze verify` and its offline security check.
# Usage: deb_test.sh BUILD_DIR
set -euo pipefail
BUILD=$1
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

cpack --config "$BUILD/CPackConfig.cmake" -B "$WORK/out" >"$WORK/cpack.log" 2>&1 \
  || { cat "$WORK/cpack.log" >&2; fail "cpack did not build the package"; }
DEB=$(ls "$WORK"/out/outbox-relay_*_*.deb)
echo "built $(basename "$DEB") ($(stat -c %s "$DEB") bytes)"

# Files and modes.
LISTING=$(dpkg-deb -c "$DEB")
for f in ./usr/bin/outbox-relay ./usr/lib/systemd/system/outbox-relay.service \
         ./etc/outbox-relay/relay.yaml ./etc/outbox-relay/outbox-relay.env \
         ./usr/share/doc/outbox-relay/README.md ./usr/share/doc/outbox-relay/docs/operations.md; do
  grep -q " $f\$" <<<"$LISTING" || fail "the package has no $f"
done
grep -q '^-rw------- .* ./etc/outbox-relay/outbox-relay.env$' <<<"$LISTING" \
  || fail "outbox-relay.env (secrets) must be readable by root only"
if grep -E ' ./usr/(bin|lib)/.*(outbox-bench|outbox-dev-broker|outbox-sample-receiver|\.a)$' <<<"$LISTING"; then
  fail "development tools or static libraries in the package"
fi

# The administrator's files survive upgrades.
dpkg-deb -e "$DEB" "$WORK/control"
grep -qx /etc/outbox-relay/relay.yaml "$WORK/control/conffiles" || fail "relay.yaml is not a conffile"
grep -qx /etc/outbox-relay/outbox-relay.env "$WORK/control/conffiles" || fail "outbox-relay.env is not a conffile"

# Runtime dependencies: the shared libraries, never the -dev packages.
DEPENDS=$(dpkg-deb -f "$DEB" Depends)
echo "Depends: $DEPENDS"
for lib in libpqxx-6.4 librdkafka1 libcpp-httplib0.11 libyaml-cpp0.7 libssl3; do
  grep -q "$lib" <<<"$DEPENDS" || fail "Depends lacks $lib"
done
if grep -q -- '-dev' <<<"$DEPENDS"; then fail "Depends names a -dev package"; fi

# Unpacked: the binary runs and reads the shipped example.
ROOT="$WORK/root"
dpkg -x "$DEB" "$ROOT"
if ldd "$ROOT/usr/bin/outbox-relay" | grep -q 'not found'; then fail "unresolved libraries"; fi
VERSION=$("$ROOT/usr/bin/outbox-relay" version)
grep -q '^outbox-relay [0-9]' <<<"$VERSION" || fail "version printed: $VERSION"
CHECK=$(KAFKA_PASSWORD=x BILLING_WEBHOOK_SECRET=whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw \
  "$ROOT/usr/bin/outbox-relay" check-config --config "$ROOT/etc/outbox-relay/relay.yaml" 2>&1) \
  || fail "check-config refused the shipped example: $CHECK"
grep -q 'ok, 3 destination(s)' <<<"$CHECK" || fail "check-config printed: $CHECK"

# The unit: systemd's own checks (verify needs the executables it names to exist, so a copy
# points at the unpacked binary), and the hardening it promises.
UNIT="$ROOT/usr/lib/systemd/system/outbox-relay.service"
mkdir -p "$WORK/unit"
sed "s|/usr/bin/outbox-relay|$ROOT/usr/bin/outbox-relay|g" "$UNIT" >"$WORK/unit/outbox-relay.service"
VERIFY=$(systemd-analyze verify "$WORK/unit/outbox-relay.service" 2>&1) || fail "systemd-analyze verify: $VERIFY"
[ -z "$VERIFY" ] || fail "systemd-analyze verify complained: $VERIFY"
for directive in DynamicUser=yes NoNewPrivileges=yes ProtectSystem=strict ProtectHome=yes \
                 PrivateTmp=yes 'RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX' \
                 Restart=on-failure KillSignal=SIGTERM TimeoutStopSec=30s \
                 EnvironmentFile=-/etc/outbox-relay/outbox-relay.env; do
  grep -qx "$directive" "$UNIT" || fail "the unit lacks $directive"
done
EXPOSURE=$(systemd-analyze security --offline=yes "$WORK/unit/outbox-relay.service" 2>&1 \
  | sed -n 's/.*Overall exposure level for outbox-relay.service: \([0-9.]*\).*/\1/p')
[ -n "$EXPOSURE" ] || fail "systemd-analyze security printed no exposure level"
echo "systemd-analyze security: exposure $EXPOSURE"
awk -v e="$EXPOSURE" 'BEGIN { exit !(e <= 2.0) }' || fail "exposure $EXPOSURE above 2.0"
echo "PASS"
