#!/usr/bin/env bash
# A/B of sluice builds or flags under the admit-heavy scenario of scripts/bench/bench.sh: one sluice
# per variant, variants alternating round after round, each against a fresh sluice on the same
# redis-server (flushed between runs) and measured together with the no-op server in the same
# run. Prints per run: decisions/s, the ratio to the no-op server, EVALSHA calls per decision
# (Redis's own command stats), the CPU of sluice and redis-server per decision, p99, and the
# calls that failed (missed the backend deadline or were refused: UNAVAILABLE).
#
#   scripts/bench/ab.sh 'old=/tmp/sluice-old' 'new=target/release/sluice'
#   scripts/bench/ab.sh 'pool-8=target/release/sluice --redis-pool-size 8' \
#                 'pool-2=target/release/sluice --redis-pool-size 2'
#   ROUNDS=2 BENCH_SECS=10 RATE=9000 CONC=1024 scripts/bench/ab.sh ...   # open loop at 9,000/s
#   REPLICAS=1 scripts/bench/ab.sh ...     # the Redis has a replica (scripts/bench/wait-ab.sh)
#
# A variant is `label=command`: a sluice binary and any extra `serve` flags (word-split). Keep a
# build for later comparison with `cp target/release/sluice /tmp/sluice-old`.
# Every process listens on 127.0.0.1 only; all of them are stopped on exit (trap).
set -euo pipefail
cd "$(dirname "$0")/../.."

[ "$#" -ge 1 ] || { sed -n '2,16p' "$0"; exit 2; }
SECS="${BENCH_SECS:-5}"
ROUNDS="${ROUNDS:-3}"
for tool in redis-server redis-cli python3; do
  command -v "$tool" >/dev/null 2>&1 || { echo "ab.sh needs $tool (scripts/setup.sh installs it)" >&2; exit 1; }
done
cargo build --release --locked -p sluice-bench --bin sluice-bench -q
BIN=target/release
# shellcheck source=scripts/bench/bench-lib.sh
source scripts/bench/bench-lib.sh

start_redis
NOOP_PORT="$(free_port)"
"$BIN/sluice-bench" --serve-noop "127.0.0.1:$NOOP_PORT" 2>"$WORK/noop.log" &
NOOP_PID=$!; PIDS+=("$NOOP_PID")
wait_port "$NOOP_PORT"

load="${CONC:-64} callers"
[ -n "${RATE:-}" ] && load="open loop at ${RATE}/s, up to ${CONC:-64} in flight"
echo "== machine: $(nproc) cores; load before: $(uptime | sed 's/.*load average: //'); $load, ${SECS} s per run"
echo "| round | variant | decisions/s | vs no-op | EVALSHA per decision | sluice µs per decision | redis-server µs per decision | p99 ms | errors |"
echo "|---|---|---:|---:|---:|---:|---:|---:|---:|"
for round in $(seq 1 "$ROUNDS"); do
  for variant in "$@"; do
    label="${variant%%=*}"
    read -ra command <<<"${variant#*=}"
    redis-cli -p "$REDIS_PORT" FLUSHALL >/dev/null
    port="$(free_port)"; admin="$(free_port)"
    RUST_LOG=warn "${command[@]:0:1}" serve --config benches/limits --grpc-addr "127.0.0.1:$port" \
      --admin-addr "127.0.0.1:$admin" --redis-url "redis://127.0.0.1:$REDIS_PORT" \
      "${command[@]:1}" >"$WORK/sluice-$port.log" 2>&1 &
    sluice_pid=$!; PIDS+=("$sluice_pid")
    wait_port "$port"
    before="$(evalsha_calls "$REDIS_PORT")"
    rate_args=()
    [ -n "${RATE:-}" ] && rate_args=(--rate "$RATE")
    "$BIN/sluice-bench" --target "127.0.0.1:$port" --duration-secs "$SECS" \
      --concurrency "${CONC:-64}" "${rate_args[@]}" --connections 4 --keys 10000 \
      --descriptor-keys user --ceiling "127.0.0.1:$NOOP_PORT" \
      --pid "noop=$NOOP_PID" --pid "sluice=$sluice_pid" --pid "redis-server=$REDIS_PID" \
      --json >"$WORK/run.json"
    calls=$(( $(evalsha_calls "$REDIS_PORT") - before ))
    kill "$sluice_pid"; wait "$sluice_pid" 2>/dev/null || true
    python3 - "$WORK/run.json" "$round" "$label" "$calls" <<'EOF'
import json, sys
report, round_, label, calls = json.load(open(sys.argv[1])), sys.argv[2], sys.argv[3], int(sys.argv[4])
noop, target = report["phases"][0], report["phases"][1]
n = max(target["requests"], 1)
cpu = lambda name: target["cpu_secs"].get(name, 0.0) * 1e6 / n
print(f"| {round_} | {label} | {target['decisions_per_sec']:.0f} | "
      f"{target['decisions_per_sec'] / noop['decisions_per_sec']:.2f} | {calls / n:.2f} | "
      f"{cpu('sluice'):.1f} | {cpu('redis-server'):.1f} | {target['p99_ms']:.2f} | "
      f"{target['errors']} |")
EOF
  done
done
