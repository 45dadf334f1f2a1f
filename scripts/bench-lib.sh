# Shared by the benchmark scripts (sourced, not run): a work directory, processes stopped on exit,
# ephemeral loopback ports and Redis's own count of EVALSHA calls.
#
# After sourcing: WORK is a fresh temporary directory; every PID appended to PIDS is killed and
# awaited on exit (and WORK removed).

WORK="$(mktemp -d)"
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT INT TERM

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

wait_port() { # port
  for _ in $(seq 1 200); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.05
  done
  echo "nothing listens on 127.0.0.1:$1" >&2; return 1
}

evalsha_calls() { # port: EVALSHA calls that Redis has served so far (total_commands_processed
  # would also count the commands the script runs inside Redis, which are no round trips)
  local calls
  calls="$(redis-cli -p "$1" INFO commandstats | tr -d '\r' \
    | sed -n 's/^cmdstat_evalsha:calls=\([0-9]*\),.*/\1/p')"
  echo "${calls:-0}"
}
