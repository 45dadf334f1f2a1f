#!/usr/bin/env bash
# The scale benchmark of docs/performance.md ("Cost at scale"): decision cost along the two axes a
# rate limiter meets, on the memory and the Redis backend, in one run.
#   - one key holding N entries in its window (N = 10, 1k, 100k, 1M): the key `winN` (limit N
#     per hour) is filled with N requests, then measured with requests that find it full
#     (rejected, recording nothing: the key holds exactly N entries while measured; on Redis
#     with the local cache off, else the cache would answer them);
#   - floods of K distinct over-limit keys (K = 1k, 10k, 100k, 1M): K values of `flood` (limit 1
#     per hour) are each sent once, then requests on K random values of them are measured, on
#     Redis with the local cache off and on (`--local-cache-size` default), and on memory (which
#     has no cache in front of it: it is its own store).
# Before its rounds, each instance serves 1 s (SCALE_WARM_SECS) of the phase's load unmeasured.
# Per phase: decisions/s, CPU µs per decision of sluice and redis-server (from /proc), p99,
# errors (missed backend deadlines answer UNAVAILABLE); memory per entry and per key from
# sluice's RSS (memory backend) and Redis's used_memory around the fills. 64 callers on 4
# connections, closed loop, loopback (sluice-bench, release builds). The load generator runs at
# nice 10 (SCALE_CLIENT_NICE): on a machine of few cores, a closed-loop client at sluice's
# priority keeps Redis waiting for a core, and the missed deadlines then measure the scheduler,
# both settings alike, not what a phase costs.
#
# With --before REV, a build of that revision (e.g. main) runs beside the current tree's and every
# measurement alternates between the two, phase by phase (same fills, same Redis, same moments).
# The current tree's sluice and sluice-bench drive both. A before build's memory backend that
# cannot fill a key within SCALE_FILL_SECS is measured at the entries it reached.
#
#   scripts/bench/scale.sh                      # the current tree: about 12 minutes after the build
#   scripts/bench/scale.sh --before main        # and main's build beside it: about 20 minutes
#   scripts/bench/scale.sh --quick              # a smoke run: debug build, small sizes, < 1 minute
#   scripts/bench/scale.sh --before main --chart docs/performance-scale.png
#   SCALE_SECS=10 SCALE_ROUNDS=3 scripts/bench/scale.sh   # longer phases, more rounds (median)
#   SCALE_BEFORE_BIN=/path/to/sluice scripts/bench/scale.sh   # a before build made elsewhere
#
# Writes table.md, the chart (scale.png) and the raw JSON to target/bench/scale-<date>/; --chart
# also copies the chart to the path given. Every process listens on 127.0.0.1 only; all of them
# are stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT="$PWD"

QUICK=0
BEFORE_REV=""
CHART=""
while [ "$#" -gt 0 ]; do
  case "$1" in
    --quick) QUICK=1 ;;
    --before) BEFORE_REV="$2"; shift ;;
    --chart) CHART="$2"; shift ;;
    *) echo "usage: scale.sh [--quick] [--before REV] [--chart PATH]" >&2; exit 2 ;;
  esac
  shift
done
if [ "$QUICK" = 1 ]; then
  SIZES="10 1000"; FLOODS="100 1000"; SECS="${SCALE_SECS:-0.3}"; PROFILE=debug
  WARM_SECS="${SCALE_WARM_SECS:-0.1}"
  FILL_SECS="${SCALE_FILL_SECS:-60}"
else
  SIZES="10 1000 100000 1000000"; FLOODS="1000 10000 100000 1000000"; SECS="${SCALE_SECS:-5}"
  PROFILE=release; FILL_SECS="${SCALE_FILL_SECS:-60}"; WARM_SECS="${SCALE_WARM_SECS:-1}"
fi
ROUNDS="${SCALE_ROUNDS:-1}"
CLIENT_NICE="${SCALE_CLIENT_NICE:-10}"
CONC=64
CONNS=4

# shellcheck source=scripts/bench/bench-lib.sh
source scripts/bench/bench-lib.sh
need scale.sh redis-server redis-cli python3 gnuplot git
export SLUICE_CONFIG=benches/scale

BUILDS=(after)
if [ -n "${SCALE_BEFORE_BIN:-}" ]; then
  cp "$SCALE_BEFORE_BIN" "$WORK/sluice-before"
  BUILDS=(before after)
elif [ -n "$BEFORE_REV" ]; then
  # Built first, in a worktree of its own against this tree's target directory (the
  # dependencies are shared; only sluice itself compiles), then copied out of the way of the
  # current tree's build.
  echo "== building $BEFORE_REV ($PROFILE)" >&2
  git worktree add --detach -q "$WORK/before-src" "$BEFORE_REV"
  flags=(--locked -p sluice --bin sluice -q)
  [ "$PROFILE" = release ] && flags+=(--release)
  (cd "$WORK/before-src" && CARGO_TARGET_DIR="$ROOT/target" cargo build "${flags[@]}")
  cp "target/$PROFILE/sluice" "$WORK/sluice-before"
  git worktree remove --force "$WORK/before-src"
  BUILDS=(before after)
fi
echo "== building the current tree ($PROFILE)" >&2
build_bins "$PROFILE"
OUT="target/bench/scale-$(date +%Y%m%d-%H%M%S)"
[ "$QUICK" = 1 ] && OUT="$OUT-quick"
mkdir -p "$OUT"
uptime >"$OUT/uptime-before.txt"
echo "== machine: $(nproc) cores; load: $(uptime | sed 's/.*load average: //')" >&2
started=$SECONDS

binary() { [ "$1" = before ] && echo "$WORK/sluice-before" || echo "$BIN/sluice"; }
rss_kb() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status"; }
used_memory() {
  redis-cli -p "$REDIS_PORT" INFO memory | tr -d '\r' | sed -n 's/^used_memory:\([0-9]*\)$/\1/p'
}

start_redis
REDIS_URL="redis://127.0.0.1:$REDIS_PORT"
declare -A PORT PID
for b in "${BUILDS[@]}"; do
  start_sluice "" "$(binary "$b")"
  PORT[memory-$b]=$SLUICE_PORT PID[memory-$b]=$SLUICE_PID
  start_sluice "$REDIS_URL" "$(binary "$b") --local-cache-size 0"
  PORT[redis-off-$b]=$SLUICE_PORT PID[redis-off-$b]=$SLUICE_PID
  start_sluice "$REDIS_URL" "$(binary "$b")"
  PORT[redis-on-$b]=$SLUICE_PORT PID[redis-on-$b]=$SLUICE_PID
done
# Redis keys are filled through an instance of their own whose deadline no loaded moment misses
# (a missed deadline would leave the fill's count of entries uncertain).
start_sluice "$REDIS_URL" "$BIN/sluice --local-cache-size 0 --backend-timeout-ms 5000"
PORT[redis-fill]=$SLUICE_PORT PID[redis-fill]=$SLUICE_PID

load() { # out instance descriptor keys prefix, then sluice-bench arguments
  local out="$1" instance="$2" descriptor="$3" keys="$4" prefix="$5" pids
  shift 5
  pids=(--pid "sluice=${PID[$instance]}")
  [[ "$instance" == redis-* ]] && pids+=(--pid "redis-server=$REDIS_PID")
  nice -n "$CLIENT_NICE" "$BIN/sluice-bench" --no-ceiling --json --domain scale --target "127.0.0.1:${PORT[$instance]}" \
    --concurrency "$CONC" --connections "$CONNS" --descriptor-keys "$descriptor" --keys "$keys" \
    --value-prefix "$prefix" "${pids[@]}" "$@" >"$OUT/$out.json"
}
fill() { # out instance descriptor keys prefix requests: each value once (sequential); a
  # before build's memory backend stops after SCALE_FILL_SECS, any other after 20 minutes
  local secs=1200
  [[ "$2" == memory-before ]] && secs="$FILL_SECS"
  load "$1" "$2" "$3" "$4" "$5" --sequential --max-requests "$6" --duration-secs "$secs"
}
SEED=0
warm() { # instance descriptor keys prefix: the phase's load, not measured, so that what a first
  # contact costs (an instance's first phase, a cache's switch to a new key set) is not counted
  # in its first round
  SEED=$((SEED + 1))
  load "warm-$1-$2-$3" "$@" --duration-secs "$WARM_SECS" --seed "$SEED"
}
measure() { # out instance descriptor keys prefix: each phase draws its keys with a seed of its
  # own, so no phase replays the values (and the cache entries) of an earlier one
  echo "   $1" >&2
  SEED=$((SEED + 1))
  load "$@" --duration-secs "$SECS" --seed "$SEED"
}

# Axis 1: one key, N entries. Redis is filled once (through the fill instance) and
# shared by both builds; each build's memory backend is filled on its own.
echo "used_memory $(used_memory)" >"$OUT/memory-redis-start.txt"
for b in "${BUILDS[@]}"; do echo "rss_kb $(rss_kb "${PID[memory-$b]}")" >"$OUT/memory-memory-$b-start.txt"; done
for n in $SIZES; do
  echo "== one key, $n entries" >&2
  fill "fill-window-redis-$n" redis-fill "win$n" 1 w "$n"
  echo "used_memory $(used_memory)" >"$OUT/memory-redis-window-$n.txt"
  for b in "${BUILDS[@]}"; do
    fill "fill-window-memory-$b-$n" "memory-$b" "win$n" 1 w "$n"
    echo "rss_kb $(rss_kb "${PID[memory-$b]}")" >"$OUT/memory-memory-$b-window-$n.txt"
  done
  for b in "${BUILDS[@]}"; do
    warm "memory-$b" "win$n" 1 w
    warm "redis-off-$b" "win$n" 1 w
  done
  for r in $(seq 1 "$ROUNDS"); do
    for b in "${BUILDS[@]}"; do
      measure "window-memory-none-$b-$n-r$r" "memory-$b" "win$n" 1 w
      measure "window-redis-off-$b-$n-r$r" "redis-off-$b" "win$n" 1 w
    done
  done
done

# Axis 2: K distinct over-limit keys: the largest flood's values are each sent once, so every
# smaller flood (the values below K) is over its limit too.
max_flood="${FLOODS##* }"
echo "== $max_flood keys over their limit" >&2
echo "used_memory $(used_memory)" >"$OUT/memory-redis-flood-start.txt"
fill "fill-flood-redis" redis-fill flood "$max_flood" f "$max_flood"
echo "used_memory $(used_memory)" >"$OUT/memory-redis-flood-end.txt"
for b in "${BUILDS[@]}"; do
  echo "rss_kb $(rss_kb "${PID[memory-$b]}")" >"$OUT/memory-memory-$b-flood-start.txt"
  fill "fill-flood-memory-$b" "memory-$b" flood "$max_flood" f "$max_flood"
  echo "rss_kb $(rss_kb "${PID[memory-$b]}")" >"$OUT/memory-memory-$b-flood-end.txt"
done
for k in $FLOODS; do
  echo "== flood of $k over-limit keys" >&2
  for b in "${BUILDS[@]}"; do
    for instance in "redis-off-$b" "redis-on-$b" "memory-$b"; do warm "$instance" flood "$k" f; done
  done
  for r in $(seq 1 "$ROUNDS"); do
    for b in "${BUILDS[@]}"; do
      measure "flood-redis-off-$b-$k-r$r" "redis-off-$b" flood "$k" f
      measure "flood-redis-on-$b-$k-r$r" "redis-on-$b" flood "$k" f
      measure "flood-memory-none-$b-$k-r$r" "memory-$b" flood "$k" f
    done
  done
done
uptime >"$OUT/uptime-after.txt"
echo "$((SECONDS - started))" >"$OUT/elapsed-secs.txt"

python3 scripts/bench/scale-report.py "$OUT" "$SIZES" "$FLOODS" "${BUILDS[*]}" "$QUICK" | tee "$OUT/table.md"
(cd "$OUT" && gnuplot scale.gp)
[ -n "$CHART" ] && cp "$OUT/scale.png" "$CHART"
echo "table: $OUT/table.md; chart: $OUT/scale.png${CHART:+ (copied to $CHART)}" >&2
