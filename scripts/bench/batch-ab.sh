#!/usr/bin/env bash
# A/B of Redis batching (`--redis-batch-max`) with scripts/bench/ab.sh: the admit-heavy scenario
# against one sluice per setting, settings alternating. Figures in docs/performance.md
# ("Batching").
#
#   scripts/bench/batch-ab.sh                # batch 1 vs 16, three rounds of 5 s each
#   BATCHES="1 4 16" ROUNDS=2 BENCH_SECS=10 scripts/bench/batch-ab.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --release --locked --bin sluice -q
variants=()
for batch in ${BATCHES:-1 16}; do
  variants+=("batch-$batch=target/release/sluice --redis-batch-max $batch")
done
exec bash scripts/bench/ab.sh "${variants[@]}"
