#!/usr/bin/env bash
# Instructions that sluice executes per decision (Redis backend), counted by valgrind's
# callgrind: unlike CPU times on a shared VM, the counts repeat to within about 1 %, so two
# builds (or flag sets) can be compared on a noisy machine. Figures in docs/performance.md
# ("Inside sluice", "The rejection cache under a flood").
#
#   scripts/bench/sluice-cost.sh                                   # the current release build
#   scripts/bench/sluice-cost.sh 'old=/tmp/sluice-old' 'new=target/release/sluice'
#   FLOOD=1000000 scripts/bench/sluice-cost.sh 'off=target/release/sluice --local-cache-size 0' \
#     'on=target/release/sluice'
#
# A variant is `label=command`: a sluice binary and any extra `serve` flags (word-split), as in
# scripts/bench/ab.sh. Each variant runs under callgrind against its own flushed redis-server; 2,000
# warm-up decisions (connections, script load), then counters zeroed, then 4,000 measured
# decisions from sluice-bench (16 callers, 2 connections, 10,000 keys). Only user-space
# instructions count: the kernel's share (syscalls, wake-ups) is not in these figures.
#
# FLOOD=K measures a flood of K distinct keys over their limit instead (benches/scale, `flood`:
# 1 per hour): an uninstrumented sluice first sends each of the K keys once, then each variant
# gets WARMUP (default 20,000: more than the local cache's default 10,000 entries, so it is full)
# and then the measured decisions on keys drawn at random among the K (independent draws: the
# two runs take different seeds), all rejected.
# KEEP=DIR keeps each variant's callgrind dump as DIR/LABEL.callgrind (for callgrind_annotate).
# Every process listens on 127.0.0.1 only and is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/../.."

for tool in valgrind callgrind_control redis-server redis-cli python3; do
  command -v "$tool" >/dev/null 2>&1 || { echo "sluice-cost.sh needs $tool" >&2; exit 1; }
done
cargo build --release --locked -p sluice -p sluice-bench --bins -q
[ "$#" -ge 1 ] || set -- "current=target/release/sluice"
# shellcheck source=scripts/bench/bench-lib.sh
source scripts/bench/bench-lib.sh

start_redis

MEASURED=4000
WARMUP=2000
WARMUP_SEED=0 MEASURED_SEED=0
CONFIG=benches/limits
LOAD=(--keys 10000 --descriptor-keys user)
WHAT="admit-heavy decision"
if [ -n "${FLOOD:-}" ]; then
  WARMUP="${WARMUP_DECISIONS:-20000}" WARMUP_SEED=1 MEASURED_SEED=2
  CONFIG=benches/scale
  LOAD=(--domain scale --keys "$FLOOD" --descriptor-keys flood --value-prefix f)
  WHAT="decision in a flood of $FLOOD over-limit keys"
fi
load() { # port requests [sluice-bench flags]
  local port="$1" requests="$2"
  shift 2
  target/release/sluice-bench --target "127.0.0.1:$port" --no-ceiling --concurrency 16 \
    --connections 2 "${LOAD[@]}" --max-requests "$requests" --duration-secs 1200 "$@" \
    >"$WORK/bench.out" 2>&1
  grep -q "errors 0" "$WORK/bench.out" || { cat "$WORK/bench.out" >&2; exit 1; }
}

if [ -n "${FLOOD:-}" ]; then
  echo "sending each of $FLOOD keys once" >&2
  SLUICE_CONFIG="$CONFIG" BIN=target/release start_sluice "redis://127.0.0.1:$REDIS_PORT" \
    "target/release/sluice --local-cache-size 0 --backend-timeout-ms 5000"
  load "$SLUICE_PORT" "$FLOOD" --sequential
  kill "$SLUICE_PID"; wait "$SLUICE_PID" 2>/dev/null || true
fi

echo "instructions in sluice per $WHAT ($MEASURED decisions per variant)"
for variant in "$@"; do
  label="${variant%%=*}"
  read -ra command <<<"${variant#*=}"
  [ -z "${FLOOD:-}" ] && redis-cli -p "$REDIS_PORT" FLUSHALL >/dev/null
  port="$(free_port)"; admin="$(free_port)"
  # A generous backend deadline: under callgrind sluice runs some 50 times slower.
  RUST_LOG=warn valgrind --tool=callgrind --callgrind-out-file="$WORK/callgrind.%p" \
    "${command[@]:0:1}" serve --config "$CONFIG" --grpc-addr "127.0.0.1:$port" \
    --admin-addr "127.0.0.1:$admin" --redis-url "redis://127.0.0.1:$REDIS_PORT" \
    --backend-timeout-ms 5000 "${command[@]:1}" >"$WORK/sluice.log" 2>&1 &
  vg_pid=$!; PIDS+=("$vg_pid")
  for _ in $(seq 1 600); do
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
    sleep 0.1
  done
  load "$port" "$WARMUP" --seed "$WARMUP_SEED"
  callgrind_control --zero "$vg_pid" >/dev/null 2>&1
  load "$port" "$MEASURED" --seed "$MEASURED_SEED"
  printf '%-28s %10s\n' "$label" "$(callgrind_per "$vg_pid" "$MEASURED")"
  [ -n "${KEEP:-}" ] && mkdir -p "$KEEP" && cp "$WORK"/callgrind."$vg_pid".* "$KEEP/$label.callgrind"
  kill "$vg_pid" 2>/dev/null || true; wait "$vg_pid" 2>/dev/null || true
done
