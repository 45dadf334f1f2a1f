#!/usr/bin/env bash
# Shared by the benchmark scripts (sourced, not run): a work directory, processes stopped on exit,
# the tools a script needs, the build of sluice and the benchmark tools, ephemeral loopback
# ports, a redis-server, the no-op RLS server and sluice instances of their own, callgrind totals and Redis's own
# count of script calls (FCALL, EVALSHA).
#
# After sourcing: WORK is a fresh temporary directory; every PID appended to PIDS is killed and
# awaited on exit (and WORK removed).

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  echo "bench-lib.sh is sourced by the other scripts in scripts/bench/, not run" >&2
  exit 2
fi

WORK="$(mktemp -d)"
PIDS=()
# Every sluice a benchmark starts stops at once on SIGTERM: nothing routes calls to it but the
# benchmark, so the drain delay (10 s by default) would only stretch each stop.
export SLUICE_DRAIN_DELAY_SECS=0
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT INT TERM

need() { # script tool...: fails unless every tool is on the PATH
  local script="$1" tool
  shift
  for tool in "$@"; do
    command -v "$tool" >/dev/null 2>&1 \
      || { echo "$script needs $tool (scripts/setup.sh installs it)" >&2; exit 1; }
  done
}

build_bins() { # release|debug -> sets BIN: sluice and the benchmark tools, built in that profile
  if [ "$1" = release ]; then
    cargo build --release --locked -p sluice -p sluice-bench --bins -q
  else
    cargo build --locked -p sluice -p sluice-bench --bins -q
  fi
  BIN="target/$1"
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

wait_port() { # port: up to a minute, so a loaded machine only slows a start-up down
  for _ in $(seq 1 1200); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.05
  done
  echo "nothing listens on 127.0.0.1:$1" >&2; return 1
}

start_redis() { # -> sets REDIS_PORT REDIS_PID; no persistence, loopback only. With
  # REPLICAS=N (default 0), N replicas of it too (REPLICA_PIDS), in sync before it returns.
  REDIS_PORT="$(free_port)"
  redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no \
    --dir "$WORK" --loglevel warning >"$WORK/redis-$REDIS_PORT.log" 2>&1 &
  REDIS_PID=$!
  PIDS+=("$REDIS_PID")
  wait_port "$REDIS_PORT"
  REPLICA_PIDS=()
  local i port
  for i in $(seq 1 "${REPLICAS:-0}"); do
    port="$(free_port)"
    mkdir -p "$WORK/replica-$i"
    redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
      --dir "$WORK/replica-$i" --loglevel warning --replicaof 127.0.0.1 "$REDIS_PORT" \
      >"$WORK/redis-$port.log" 2>&1 &
    REPLICA_PIDS+=($!)
    PIDS+=($!)
    wait_port "$port"
  done
  for _ in $(seq 1 1200); do
    [ "$(redis-cli -p "$REDIS_PORT" INFO replication | grep -c 'state=online')" -ge "${REPLICAS:-0}" ] && return 0
    sleep 0.05
  done
  echo "the replicas of 127.0.0.1:$REDIS_PORT did not get in sync" >&2; return 1
}

start_noop() { # -> sets NOOP_PORT NOOP_PID: the no-op RLS server (`sluice-bench --serve-noop`), a
  # process of its own as sluice is (same tonic server, same runtime shape), so a ratio to it
  # compares like with like
  NOOP_PORT="$(free_port)"
  "$BIN/sluice-bench" --serve-noop "127.0.0.1:$NOOP_PORT" 2>"$WORK/noop.log" &
  NOOP_PID=$!
  PIDS+=("$NOOP_PID")
  wait_port "$NOOP_PORT"
}

start_sluice() { # redis-url-or-empty [command] -> sets SLUICE_PORT SLUICE_PID: `sluice serve` with
  # benches/limits (or $SLUICE_CONFIG) on ephemeral loopback ports, the memory backend when the
  # URL is empty. The command (default: $BIN/sluice) may be `env VAR=value... binary [serve
  # flags]`; `env` execs the binary, so SLUICE_PID is sluice's own.
  SLUICE_PORT="$(free_port)"
  local admin backend=() command=("$BIN/sluice") binary_at=0
  admin="$(free_port)"
  [ -n "$1" ] && backend=(--redis-url "$1")
  [ -n "${2:-}" ] && read -ra command <<<"$2"
  if [ "${command[0]}" = env ]; then
    binary_at=1
    while [[ "${command[$binary_at]}" == *=* ]]; do binary_at=$((binary_at + 1)); done
  fi
  RUST_LOG=warn "${command[@]:0:$((binary_at + 1))}" serve --config "${SLUICE_CONFIG:-benches/limits}" \
    --grpc-addr "127.0.0.1:$SLUICE_PORT" --admin-addr "127.0.0.1:$admin" "${backend[@]}" \
    "${command[@]:$((binary_at + 1))}" >"$WORK/sluice-$SLUICE_PORT.log" 2>&1 &
  SLUICE_PID=$!
  PIDS+=("$SLUICE_PID")
  wait_port "$SLUICE_PORT"
}

callgrind_per() { # pid divisor: dumps the process's callgrind counters (callgrind started with
  # --callgrind-out-file="$WORK/callgrind.%p", counters zeroed before the measured work) and
  # prints its instructions divided by divisor
  rm -f "$WORK"/callgrind."$1".*
  callgrind_control --dump "$1" >/dev/null 2>&1
  local dump=""
  for _ in $(seq 1 100); do
    dump="$(ls "$WORK"/callgrind."$1".* 2>/dev/null | head -1)"
    [ -n "$dump" ] && grep -q '^totals:\|^summary:' "$dump" && break
    sleep 0.1
  done
  awk '/^(totals|summary):/ { print int($2 / '"$2"'); exit }' "$dump"
}

evalsha_calls() { # port: script calls (FCALL of sluice's function, or EVALSHA of a script)
  # that Redis has served so far (total_commands_processed would also count the commands the
  # Lua runs inside Redis, which are no round trips)
  redis-cli -p "$1" INFO commandstats | tr -d '\r' \
    | sed -n 's/^cmdstat_\(evalsha\|fcall\):calls=\([0-9]*\),.*/\2/p' | awk '{ n += $1 } END { print n + 0 }'
}
