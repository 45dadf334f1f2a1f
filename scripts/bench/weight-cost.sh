#!/usr/bin/env bash
# What a sliding-log request costs Redis by its weight (its hits): bytes (`MEMORY USAGE key
# SAMPLES 0`), members written, and Redis time per call (SLOWLOG, every call logged). Figures in
# docs/algorithms.md ("Weights: what a request costs"). No build: the scripts come from
# scripts/bench/assemble-script.py (the working tree's, a revision's).
#
#   scripts/bench/weight-cost.sh          # the current tree's script
#   scripts/bench/weight-cost.sh REV      # and, side by side, the script of git revision REV
#
# Scenarios, each on a fresh database, one sliding-log item per call on an explicit clock
# (limits never reached, window 60 s):
#   one      a single request of weight w (1, 100, 100000) on a new key, 200 keys
#   window   1,000 requests of weight w on one key, 60 ms apart (all in the window at the end)
#   budget   a token budget: 1,000,000 tokens per minute, 1,000 requests of 2,000 tokens,
#            120 ms apart (so every request fits and the window holds 500 of them at the end)
# A revision that writes a member per hit gets 3 keys instead of 200 at weight 100000, and its
# `window` run of weight 100000 (100 million members) is left out.
# Every process listens on 127.0.0.1 only and is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/../.."

for tool in redis-server python3 git; do
  command -v "$tool" >/dev/null 2>&1 || { echo "weight-cost.sh needs $tool" >&2; exit 1; }
done
# shellcheck source=scripts/bench/bench-lib.sh
source scripts/bench/bench-lib.sh

start_redis
python3 - "$REDIS_PORT" "${1:-}" <<'EOF'
import statistics, sys

port, rev = int(sys.argv[1]), sys.argv[2]
sys.path.insert(0, "scripts/bench")
from importlib import import_module
assemble = import_module("assemble-script").assemble
item_argv = import_module("assemble-script").item_argv
prepare = import_module("assemble-script").prepare
Redis = import_module("resp").Redis

r = Redis(port)
r.log_every_call()
T0, WINDOW = 1_700_000_040_000, 60_000

def run(script, weight, calls, spacing, limit):
    """`calls` requests of `weight` on one key: (median µs, total µs, members, bytes, admitted)."""
    r("FLUSHALL")
    call = prepare(r, script)
    item = item_argv(script, limit, WINDOW, weight)
    r("SLOWLOG", "RESET")
    admitted = 0
    for i in range(calls):
        reply = r(*call, 1, "k", T0 + i * spacing, *item)
        admitted += reply[0]
    durations = [e[2] for e in r("SLOWLOG", "GET", "-1") if e[3][0].upper() == call[0]]
    assert len(durations) == calls, (len(durations), calls)
    members = r("ZCARD", "k") - (1 if r("ZSCORE", "k", "t") is not None else 0)
    bytes_ = r("MEMORY", "USAGE", "k", "SAMPLES", "0")
    return statistics.median(durations), sum(durations), members, bytes_, admitted

def fresh_keys(script, weight, keys):
    """One request of `weight` on each of `keys` new keys: (median µs, members of a key, bytes of a
    key)."""
    r("FLUSHALL")
    call = prepare(r, script)
    item = item_argv(script, 10**12, WINDOW, weight)
    r("SLOWLOG", "RESET")
    for i in range(keys):
        r(*call, 1, f"k{i}", T0, *item)
    durations = [e[2] for e in r("SLOWLOG", "GET", "-1") if e[3][0].upper() == call[0]]
    assert len(durations) == keys, (len(durations), keys)
    members = r("ZCARD", "k0") - (1 if r("ZSCORE", "k0", "t") is not None else 0)
    return statistics.median(durations), members, r("MEMORY", "USAGE", "k0", "SAMPLES", "0")

scripts = [("current", assemble(""))]
if rev:
    scripts.insert(0, (rev, assemble(rev)))

print("## One request of weight w on a new key (the median of 200 keys; of 3 where a revision's")
print("## would hold over 10 million members)\n")
print("| script | weight | Redis µs per request (SLOWLOG) | members written | MEMORY USAGE bytes of the key |")
print("|---|---:|---:|---:|---:|")
for name, script in scripts:
    for w in (1, 100, 100_000):
        keys = 3 if name != "current" and w * 200 > 10_000_000 else 200
        us, members, b = fresh_keys(script, w, keys)
        print(f"| {name} | {w} | {us} | {members} | {b} |")

print("\n## 1,000 requests of weight w on one key (all in the window)\n")
print("| script | weight | Redis µs per request (median) | members | MEMORY USAGE bytes | bytes per request |")
print("|---|---:|---:|---:|---:|---:|")
for name, script in scripts:
    for w in (1, 100, 100_000):
        if name != "current" and w * 1000 > 10_000_000:
            print(f"| {name} | {w} | not run ({w * 1000:,} members) | | | |")
            continue
        us, _, members, b, _ = run(script, w, 1000, 60, 10**12)
        print(f"| {name} | {w} | {us} | {members} | {b} | {b / 1000:.1f} |")

print("\n## Token budget: 1,000,000 tokens per minute, 1,000 requests of 2,000 tokens\n")
print("| script | admitted | Redis µs in all (SLOWLOG) | members at the end | MEMORY USAGE bytes at the end |")
print("|---|---:|---:|---:|---:|")
for name, script in scripts:
    _, total, members, b, admitted = run(script, 2000, 1000, 120, 1_000_000)
    print(f"| {name} | {admitted} | {total:,} | {members:,} | {b:,} |")
EOF
