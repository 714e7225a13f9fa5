# Throwaway PostgreSQL 15 cluster helpers, sourced by scripts. Sets PG_URL.
# pg_throwaway_start DIR   pg_throwaway_stop DIR
PG_BIN="${OUTBOX_PG_BIN:-/usr/lib/postgresql/15/bin}"

free_port() {
  local p
  for _ in $(seq 1 100); do
    p=$(( 20000 + RANDOM % 20000 ))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then echo "$p"; return 0; fi
  done
  echo "no free port found" >&2; return 1
}

as_pg() {
  if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

pg_throwaway_start() {
  local dir="$1"
  mkdir -p "$dir/sock"
  if [ "$(id -u)" -eq 0 ]; then chown -R postgres:postgres "$dir"; fi
  as_pg "$PG_BIN/initdb" -D "$dir/data" -A trust -U postgres -E UTF8 --no-sync >"$dir/initdb.log" 2>&1 \
    || { cat "$dir/initdb.log" >&2; return 1; }
  PG_PORT=$(free_port)
  as_pg "$PG_BIN/pg_ctl" -D "$dir/data" -l "$dir/postgres.log" -w -t 60 \
    -o "-c listen_addresses=127.0.0.1 -p $PG_PORT -c unix_socket_directories=$dir/sock -c max_connections=200" \
    start >/dev/null || { cat "$dir/postgres.log" >&2; return 1; }
  PG_URL="postgresql://postgres@127.0.0.1:$PG_PORT/postgres"
  export PG_URL PG_PORT
}

pg_throwaway_stop() {
  local dir="$1"
  [ -d "$dir/data" ] && as_pg "$PG_BIN/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null 2>&1 || true
}
