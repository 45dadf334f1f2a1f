#!/usr/bin/env bash
# Instructions that redis-server executes per request of sluice's Lua script, counted by
# valgrind's callgrind: unlike timings, the counts repeat to within ~0.5% however busy the
# machine is, so two versions of the script can be compared on a noisy machine. Figures in
# docs/performance.md ("Redis's side: instructions per request").
#
#   scripts/bench/script-cost.sh                  # the current Lua (from sluice-bench)
#   scripts/bench/script-cost.sh old.lua new.lua  # A/B of script or library files
#   SCENARIOS="log fixed" scripts/bench/script-cost.sh ...   # some scenarios only
#   WEIGHT=100000 SCENARIOS=log scripts/bench/script-cost.sh    # sliding-log items of 100000 hits
#
# Get a version's script with `scripts/bench/assemble-script.py [REV] > x.lua` (no build needed).
# Scenarios, each a fixed sequence of 2,000 calls (FCALL, or EVALSHA of a script) over 200 keys
# (TIME clock, limits never reached), replayed once to fill the keys and once under measurement:
#   log      one sliding-log item per call (of WEIGHT hits, default 1)
#   batch8   eight one-item requests per call (the batched layout), counted per request
#   two      two sliding-log items per call (two descriptors)
#   fixed    one fixed-window item per call
#   empty    `return 1` and `TIME` only, for the floor of any call
# Every run also measures scripts/bench/minimal-log.lua, a minimal hand-written weighted sliding
# log (TIME, evict and subtract what left, add the entry and the total, PEXPIRE), in the log
# scenario, and prints each log row's ratio to it (the target: at most 1.3x).
# Every process listens on 127.0.0.1 only and is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/../.."

for tool in valgrind callgrind_control redis-server redis-cli python3; do
  command -v "$tool" >/dev/null 2>&1 || { echo "script-cost.sh needs $tool" >&2; exit 1; }
done
# shellcheck source=scripts/bench/bench-lib.sh
source scripts/bench/bench-lib.sh

if [ "$#" -eq 0 ]; then
  cargo build --release --locked -p sluice-bench --bin sluice-bench -q
  target/release/sluice-bench --print-lua-script >"$WORK/current.lua"
  set -- "$WORK/current.lua"
fi
printf 'return 1' >"$WORK/return-1.lua"
printf "redis.call('TIME') return 1" >"$WORK/time-only.lua"

PORT="$(free_port)"
valgrind --tool=callgrind --callgrind-out-file="$WORK/callgrind.%p" redis-server --port "$PORT" \
  --bind 127.0.0.1 --save "" --appendonly no --dir "$WORK" --loglevel warning \
  >"$WORK/redis.log" 2>&1 &
VG_PID=$!; PIDS+=("$VG_PID")
for _ in $(seq 1 300); do redis-cli -p "$PORT" PING >/dev/null 2>&1 && break; sleep 0.1; done

CALLS=2000
# Writes the RESP-encoded call sequence of a scenario (same seed, same keys every time) for the
# script in `file`, each item in that script's own layout (assemble-script.py's item_argv).
commands() { # call scenario file: `call` is `EVALSHA sha` or `FCALL name`
  python3 - "$1" "$2" "$CALLS" "$3" "${WEIGHT:-1}" <<'EOF'
import random, sys
sys.path.insert(0, "scripts/bench")
from importlib import import_module
item_argv = import_module("assemble-script").item_argv
call, scenario, calls, weight = sys.argv[1].split(), sys.argv[2], int(sys.argv[3]), sys.argv[5]
with open(sys.argv[4]) as f:
    script = f.read()
rnd, out = random.Random(7), sys.stdout.buffer
def send(args):
    out.write(b"*%d\r\n" % len(args))
    for a in args:
        a = str(a).encode()
        out.write(b"$%d\r\n%s\r\n" % (len(a), a))
log = item_argv(script, "1000000000000", "3600000", weight)
fixed = item_argv(script, "1000000", "3600000", "1", algorithm="ALGORITHM_FIXED_WINDOW")
for _ in range(calls // 8 if scenario == "batch8" else calls):
    key = lambda prefix, n=200: "%s:%d" % (prefix, rnd.randrange(n))
    if scenario in ("log", "empty"):
        send(call + ["1", key("k"), ""] + log)
    elif scenario == "two":
        send(call + ["2", key("e"), key("k"), ""] + log + log)
    elif scenario == "fixed":
        send(call + ["1", key("f"), ""] + fixed)
    elif scenario == "batch8":
        keys = [key("k", 1600) for _ in range(8)]
        send(call + ["8"] + keys + ["b", "", "8"] + ["1"] * 8 + log * 8)
EOF
}

# Sends the call sequence; fails if any call got an error reply (a count of a failing script
# would be no count of the script).
replay() {
  local summary
  summary="$(redis-cli -p "$PORT" --pipe <"$WORK/calls.resp" 2>&1 | tail -1)"
  case "$summary" in
    *"errors: 0,"*) ;;
    *) echo "script-cost.sh: calls failed ($summary)" >&2; exit 1 ;;
  esac
}

# Instructions per request of `scenario` for the script in `file` (a script, or a function
# library: a file starting `#!lua name=`, loaded with FUNCTION LOAD and called with FCALL).
measure() { # file scenario
  local call
  if head -1 "$1" | grep -q '^#!lua name='; then
    redis-cli -p "$PORT" FUNCTION LOAD REPLACE "$(cat "$1")" >/dev/null
    # The function's name: sluice's DECIDE_FUNCTION line, else the first one registered.
    call="FCALL $({ sed -n "s/^local DECIDE_FUNCTION = '\([^']*\)'$/\1/p" "$1"
      grep -o "register_function *[({] *'[^']*'" "$1" | sed "s/.*'\([^']*\)'/\1/"; } | head -1)"
  else
    call="EVALSHA $(redis-cli -p "$PORT" SCRIPT LOAD "$(cat "$1")")"
  fi
  commands "$call" "$2" "$1" >"$WORK/calls.resp"
  redis-cli -p "$PORT" FLUSHALL >/dev/null
  replay
  callgrind_control --zero "$VG_PID" >/dev/null 2>&1
  replay
  callgrind_per "$VG_PID" "$CALLS"
}

echo "instructions in redis-server per request ($CALLS requests per scenario)"
REFERENCE=0
row() { # label file scenario: one line of the table (a failed measure stops the script), with
  # the ratio to the reference for the log scenario
  local n ratio=""
  n="$(measure "$2" "$3")"
  [ "$3" = log ] && [ "$REFERENCE" -gt 0 ] \
    && ratio="$(awk -v n="$n" -v r="$REFERENCE" 'BEGIN { printf "%.2fx minimal", n / r }')"
  printf '%-28s %10s %s\n' "$1" "$n" "$ratio"
}
row "floor: return 1" "$WORK/return-1.lua" empty
row "floor: TIME only" "$WORK/time-only.lua" empty
REFERENCE="$(measure scripts/bench/minimal-log.lua log)"
printf '%-28s %10s\n' "reference: minimal-log.lua" "$REFERENCE"
for file in "$@"; do
  for scenario in ${SCENARIOS:-log batch8 two fixed}; do
    row "$(basename "$file") $scenario" "$file" "$scenario"
  done
done
