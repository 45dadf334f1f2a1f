#!/usr/bin/env bash
# Where a server's CPU goes per decision as the load changes: its CPU µs, context switches and
# syscalls per decision, counted by `perf stat` (kernel tracepoints: needs root or
# kernel.perf_event_paranoid <= -1). Run for sluice (Redis backend) and for the no-op RLS server
# at each load, admit-heavy shape. Figures in docs/performance.md ("Why half the
# rate is not half the load").
#
#   scripts/bench/wakeups.sh                                    # current build, default loads
#   LOADS="closed 2000 14000" scripts/bench/wakeups.sh 'w2=target/release/sluice' \
#     'w1=env TOKIO_WORKER_THREADS=1 target/release/sluice'
#
# LOADS: `closed` (64 callers, closed loop) and/or open-loop rates in requests per second.
# A variant is `label=command` (a sluice binary, or `env VAR=value binary`, then extra `serve`
# flags); the no-op server is measured once per load. Each run: 1 s of warm-up, then 4 s
# counted. Every process listens on 127.0.0.1 only and is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/../.."

# shellcheck source=scripts/bench/bench-lib.sh
source scripts/bench/bench-lib.sh
need wakeups.sh perf redis-server redis-cli python3
build_bins release
[ "$#" -ge 1 ] || set -- "sluice=target/release/sluice"
LOADS="${LOADS:-closed 1000 4000 8000}"

EVENTS=context-switches,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_futex
EVENTS+=,syscalls:sys_enter_recvfrom,syscalls:sys_enter_writev,syscalls:sys_enter_write
perf stat -e "$EVENTS" -- true >/dev/null 2>&1 \
  || { echo "perf cannot count syscall tracepoints here (root or perf_event_paranoid <= -1)" >&2; exit 1; }

start_redis
start_noop

# Drives `port` at `load` for 5 s and counts `pid`'s events over the last 4; prints one row.
measure() { # label load port pid
  local load_args=(--concurrency 64)
  [ "$2" != closed ] && load_args=(--concurrency 1024 --rate "$2")
  target/release/sluice-bench --target "127.0.0.1:$3" --no-ceiling --connections 4 \
    --keys 10000 --descriptor-keys user --duration-secs 5 --json "${load_args[@]}" \
    >"$WORK/run.json" &
  local bench=$!
  sleep 1
  local before after
  before="$(awk '{print $14 + $15}' "/proc/$4/stat")"
  perf stat -x, -e "$EVENTS" -p "$4" -o "$WORK/perf.csv" -- sleep 4
  after="$(awk '{print $14 + $15}' "/proc/$4/stat")"
  wait "$bench"
  python3 - "$WORK/run.json" "$WORK/perf.csv" "$1" "$2" "$((after - before))" \
    "$(getconf CLK_TCK)" <<'EOF'
import json, sys
report, perf_csv, label, load, ticks, hz = sys.argv[1:]
rate = json.load(open(report))["phases"][0]["decisions_per_sec"]
counted = rate * 4  # the 4 s under perf
events = {}
for line in open(perf_csv):
    parts = line.strip().split(",")
    if len(parts) > 2 and parts[0].replace(".", "").isdigit():
        events[parts[2].replace("syscalls:sys_enter_", "")] = float(parts[0]) / counted
cpu_us = int(ticks) / int(hz) * 1e6 / counted
cols = ["context-switches", "epoll_wait", "futex", "recvfrom", "writev", "write"]
print(f"| {label} | {load} | {rate:.0f} | {cpu_us:.1f} | " + " | ".join(f"{events.get(c, 0):.2f}" for c in cols) + " |")
EOF
}

echo "== machine: $(nproc) cores; load before: $(uptime | sed 's/.*load average: //')"
echo "| server | load | decisions/s | CPU µs per decision | context switches | epoll_wait | futex | recvfrom | writev | write |"
echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"
for load in $LOADS; do
  measure no-op "$load" "$NOOP_PORT" "$NOOP_PID"
  for variant in "$@"; do
    label="${variant%%=*}"
    redis-cli -p "$REDIS_PORT" FLUSHALL >/dev/null
    start_sluice "redis://127.0.0.1:$REDIS_PORT" "${variant#*=}"
    port=$SLUICE_PORT sluice_pid=$SLUICE_PID
    measure "$label" "$load" "$port" "$sluice_pid"
    kill "$sluice_pid"; wait "$sluice_pid" 2>/dev/null || true
  done
done
