#!/usr/bin/env bash
# The cost of --redis-wait-replicas with scripts/bench/ab.sh: the admit-heavy scenario against a
# Redis with REPLICAS replicas (default 1, on loopback, in sync), one sluice without WAIT and one
# with WAIT 1, alternating round after round. Figures in docs/redis.md ("WAIT").
#
#   scripts/bench/wait-ab.sh                          # three rounds of 5 s each
#   ROUNDS=2 BENCH_SECS=10 scripts/bench/wait-ab.sh
#   RATE=8000 CONC=1024 scripts/bench/wait-ab.sh      # open loop: latency at a fixed rate
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --release --locked --bin sluice -q
export REPLICAS="${REPLICAS:-1}"
exec bash scripts/bench/ab.sh \
  "no-wait=target/release/sluice" \
  "wait-1=target/release/sluice --redis-wait-replicas 1"
