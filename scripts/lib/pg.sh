# Throwaway PostgreSQL 15 cluster helpers, sourced by scripts. Sets PG_URL.
# pg_throwaway_start DIR   pg_throwaway_stop DIR
PG_BIN="${OUTBOX_PG_BIN:-/usr/lib/postgresql/15/bin}"

# A port nothing listens on now, from 20000-32767: below Linux's ephemeral range (32768 and
# up), so no client connection is given it as its local port meanwhile. Another process may
# still bind it first: pg_throwaway_start then tries another.
free_port() {
  local p
  for _ in $(seq 1 100); do
    p=$(( 20000 + RANDOM % 12768 ))
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
  local attempt logged
  for attempt in 1 2 3 4 5; do
    PG_PORT=$(free_port)
    logged=$(stat -c %s "$dir/postgres.log" 2>/dev/null || echo 0)
    if as_pg "$PG_BIN/pg_ctl" -D "$dir/data" -l "$dir/postgres.log" -w -t 60 \
         -o "-c listen_addresses=127.0.0.1 -p $PG_PORT -c unix_socket_directories=$dir/sock -c max_connections=200" \
         start >/dev/null; then
      break
    fi
    # Taken between free_port's check and the server's bind: another port. Anything else fails.
    if [ "$attempt" -lt 5 ] &&
       tail -c +"$((logged + 1))" "$dir/postgres.log" | grep -q "Address already in use"; then
      echo "pg_throwaway_start: port $PG_PORT was taken, trying another" >&2
      continue
    fi
    cat "$dir/postgres.log" >&2
    return 1
  done
  PG_URL="postgresql://postgres@127.0.0.1:$PG_PORT/postgres"
  export PG_URL PG_PORT
}

pg_throwaway_stop() {
  local dir="$1"
  [ -d "$dir/data" ] && as_pg "$PG_BIN/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null 2>&1 || true
}
