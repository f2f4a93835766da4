# shellcheck shell=bash
# Helpers shared by Weir's scripts. Source it; it sets REPO, PY and WEIR.

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="$REPO/.venv/bin/python"
WEIR="${WEIR_BIN:-$REPO/target/release/weir}"

# free_port: prints a TCP port that is free on 127.0.0.1 right now.
free_port() {
  "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

# wait_for_port PORT PID LOG [SECONDS]: waits until 127.0.0.1:PORT accepts a
# TCP connection. Fails early (printing the end of LOG) if PID exits first.
wait_for_port() {
  local port="$1" pid="$2" log="$3" limit="${4:-60}" waited=0
  until (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "weir exited before listening on port $port; end of $log:" >&2
      tail -n 40 "$log" >&2 || true
      return 1
    fi
    if [ "$waited" -ge $((limit * 10)) ]; then
      echo "weir did not listen on port $port within ${limit}s; end of $log:" >&2
      tail -n 40 "$log" >&2 || true
      return 1
    fi
    sleep 0.1
    waited=$((waited + 1))
  done
}

# stop_pid PID: SIGTERM, then SIGKILL after 10 s if it is still there.
stop_pid() {
  local pid="$1" i
  kill -0 "$pid" 2>/dev/null || return 0
  kill "$pid" 2>/dev/null || true
  for i in $(seq 1 100); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$pid" 2>/dev/null; then
    echo "weir (pid $pid) ignored SIGTERM for 10 s (tries: $i); killing it" >&2
    kill -9 "$pid" 2>/dev/null || true
  fi
  wait "$pid" 2>/dev/null || true
}

# require_weir: fails clearly when the release binary is missing.
require_weir() {
  if [ ! -x "$WEIR" ]; then
    echo "missing $WEIR; run scripts/setup.sh (cargo build --release) first" >&2
    return 1
  fi
}
