#!/usr/bin/env bash
# Builds the container image (deploy/docker/Dockerfile) with podman or docker and checks it
# (issue 15): `version` runs in it, it runs as a non-root user, it has no compiler, its
# HEALTHCHECK targets /healthz, and `check-config` accepts the compose config inside it.
# Not part of scripts/test.sh: the image build compiles the relay again (minutes on 2 cores)
# and needs a container engine; docs/deploy.md has the measured time.
#
# Where no image registry is reachable, base images are made with debootstrap first:
#   scripts/image-test.sh --debootstrap
set -euo pipefail
cd "$(dirname "$0")/.."
ENGINE=${ENGINE:-$(command -v podman || command -v docker || true)}
[ -n "$ENGINE" ] || { echo "image-test: no podman or docker" >&2; exit 2; }
IMAGE=outbox-relay:image-test
fail() { echo "FAIL: $*" >&2; exit 1; }

if [ "${1:-}" = "--debootstrap" ]; then
  ROOTFS=$(mktemp -d)
  trap 'rm -rf "$ROOTFS"' EXIT
  echo "== debootstrap bookworm (minbase) as debian:12 and debian:12-slim"
  debootstrap --variant=minbase bookworm "$ROOTFS" http://deb.debian.org/debian >/dev/null
  tar -C "$ROOTFS" -c . | "$ENGINE" import - debian:12 >/dev/null
  "$ENGINE" tag debian:12 debian:12-slim
fi

echo "== building $IMAGE with $ENGINE"
start=$(date +%s)
"$ENGINE" build -f deploy/docker/Dockerfile --target runtime -t "$IMAGE" . >/tmp/image-test-build.log 2>&1 \
  || { tail -30 /tmp/image-test-build.log >&2; fail "the image did not build"; }
echo "built in $(( $(date +%s) - start )) s"

VERSION=$("$ENGINE" run --rm "$IMAGE" version)
grep -q '^outbox-relay [0-9]' <<<"$VERSION" || fail "version printed: $VERSION"
echo "$VERSION"
USER_ID=$("$ENGINE" run --rm --entrypoint /usr/bin/id "$IMAGE" -u)
[ "$USER_ID" != 0 ] || fail "the image runs as root"
if "$ENGINE" run --rm --entrypoint /bin/sh "$IMAGE" -c 'command -v g++ || command -v cc || command -v cmake'; then
  fail "a compiler or cmake in the runtime image"
fi
"$ENGINE" inspect --format '{{json .Config.Healthcheck}}' "$IMAGE" | grep -q '/healthz' \
  || fail "no HEALTHCHECK on /healthz"
"$ENGINE" run --rm -v "$PWD/deploy/compose/relay.yaml:/etc/outbox-relay/relay.yaml:ro" \
  -e OUTBOX_DATABASE_URL=postgresql://app:app@postgres:5432/app \
  -e HOOKS_SECRET=whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw \
  "$IMAGE" check-config --config /etc/outbox-relay/relay.yaml | grep -q 'ok, 2 destination' \
  || fail "check-config in the image"
echo "image size: $("$ENGINE" image inspect --format '{{.Size}}' "$IMAGE") bytes"
echo "PASS"
