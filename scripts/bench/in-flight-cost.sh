#!/usr/bin/env bash
# What an `in_flight` key costs Redis: Redis time per call (SLOWLOG, every call logged) to admit a
# request (take a lease), to release a lease by its token (the refund when the stream is done)
# and to refuse a request (every lease taken), and `MEMORY USAGE key SAMPLES 0` with the key
# full, by limit. Figures in docs/algorithms.md ("In flight"). No build: the script comes from
# scripts/bench/assemble-script.py (the working tree's).
#
#   scripts/bench/in-flight-cost.sh
#
# Each limit on a fresh database, one item per call on an explicit clock (lease 60 s, so
# none expires), tokens as the engine makes them (up to 16 digits): the key is filled to its
# limit, then 1,000 rounds each release the oldest request's lease, admit a new request, and
# try one more, which is refused.
# Every process listens on 127.0.0.1 only and is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/../.."

for tool in redis-server python3; do
  command -v "$tool" >/dev/null 2>&1 || { echo "in-flight-cost.sh needs $tool" >&2; exit 1; }
done
# shellcheck source=scripts/bench/bench-lib.sh
source scripts/bench/bench-lib.sh

start_redis
python3 - "$REDIS_PORT" <<'EOF'
import random, statistics, sys

port = int(sys.argv[1])
sys.path.insert(0, "scripts/bench")
from importlib import import_module
assemble = import_module("assemble-script").assemble
item_argv = import_module("assemble-script").item_argv
prepare = import_module("assemble-script").prepare
Redis = import_module("resp").Redis

r = Redis(port)
r.log_every_call()
T0, LEASE, ROUNDS = 1_700_000_040_000, 60_000, 1000
KEY = "sluice:{edge|client=c42|60000|if}"
script = assemble("")
prefix = prepare(r, script)

def call(now, limit, kind, token):
    """One item; returns (admitted, µs of this call in SLOWLOG)."""
    r("SLOWLOG", "RESET")
    item = item_argv(script, limit, LEASE, 1, kind=kind, algorithm="ALGORITHM_IN_FLIGHT",
                     param=token, over_limit="OVER_LIMIT_REFUSE")
    reply = r(*prefix, 1, KEY, now, *item)
    us = [e[2] for e in r("SLOWLOG", "GET", "-1") if e[3][0].upper() == prefix[0]]
    return reply[0], us[0]

print("| limit (leases held) | admit µs | release µs | refused µs | MEMORY USAGE bytes | bytes per lease |")
print("|---:|---:|---:|---:|---:|---:|")
for limit in (10, 100, 1000):
    r("FLUSHALL")
    now, held = T0, []
    for _ in range(limit):
        token = random.randrange(1, 1 << 52)
        assert call(now, limit, "KIND_CONSUME", token)[0] == 1
        held.append(token)
        now += 1
    size = r("MEMORY", "USAGE", KEY, "SAMPLES", "0")
    admit, release, refuse = [], [], []
    for _ in range(ROUNDS):
        release.append(call(now, limit, "KIND_REFUND", held.pop(0))[1])
        token = random.randrange(1, 1 << 52)
        admitted, us = call(now, limit, "KIND_CONSUME", token)
        assert admitted == 1
        admit.append(us)
        held.append(token)
        admitted, us = call(now, limit, "KIND_CONSUME", random.randrange(1, 1 << 52))
        assert admitted == 0
        refuse.append(us)
        now += 1
    assert r("ZCARD", KEY) == limit
    m = statistics.median
    print(f"| {limit} | {m(admit)} | {m(release)} | {m(refuse)} | {size} | {size / limit:.1f} |")
EOF
