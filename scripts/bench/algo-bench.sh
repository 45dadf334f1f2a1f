#!/usr/bin/env bash
# Measures every limiting algorithm in Redis (bytes per key at full use, decisions per second of
# the script driven directly) and prints the Markdown tables of docs/algorithms.md. Starts its
# own redis-server on a free loopback port; needs redis-server on the PATH.
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo run --release --locked --quiet -p sluice-bench --bin sluice-algo-bench
