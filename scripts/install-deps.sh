#!/usr/bin/env bash
# Installs every build, test and quickstart dependency from Debian 12 packages.
# Idempotent: safe to run again; it only installs what is missing.
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config git
  postgresql
  libpqxx-dev librdkafka-dev libcpp-httplib-dev libspdlog-dev libgtest-dev
  nlohmann-json3-dev libyaml-cpp-dev libssl-dev libcli11-dev
  kcat openssl procps prometheus
  systemd  # systemd-analyze, for the package test of the unit
  python3-psycopg  # the Python writer (sdk/python) and its tests
  golang-go golang-github-jackc-pgx-v4-dev golang-opentelemetry-otel-dev  # the Go writer (sdk/go)
  default-jdk-headless libpostgresql-jdbc-java  # the Java writer (sdk/java) and its tests
)

# The Node writer (sdk/node) and its tests: Debian's nodejs and npm, unless a node with npm is
# already installed (another distribution of Node, such as NodeSource's, ships npm inside it).
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  PACKAGES+=(nodejs npm)
fi

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "install-deps: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done"
