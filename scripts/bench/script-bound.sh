#!/usr/bin/env bash
# The most admit-heavy could reach with one script call per decision on this machine: sluice
# built with a Lua script that decides nothing (it returns a well-formed "admitted" reply for
# every request of a call, touching no key), A/B against the real build with scripts/bench/ab.sh.
# Everything else is the same: gRPC, batching, FCALL round trips, reply decoding, the
# generator and the no-op ceiling. The gap between the two is what the sliding log's work inside
# Redis costs; the ratio of the no-op-script build is a ceiling for any script. Figures in
# docs/performance.md ("The ceiling of any script").
#
#   scripts/bench/script-bound.sh                 # 3 alternating rounds, 64 callers
#   ROUNDS=5 scripts/bench/script-bound.sh        # any scripts/bench/ab.sh setting passes through
#
# The no-op-script build is the committed tree (git archive HEAD) with
# scripts/bench/script-bound-noop.lua in place of src/limiter/redis/lua/decide.lua, built in its
# own target directory, target/script-bound/ (the first run compiles every dependency once more:
# about 3 minutes on these 2 cores). It is for this measurement only: it admits everything. The
# library's other parts (the generated header, shared.lua, models.lua) run once, when Redis loads
# the library, as they do for the real decide.lua: per call the no-op pays only FCALL itself and
# its reply, so its ratio is the ceiling of any decision made in one function call.
# Every process listens on 127.0.0.1 only and is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/../.."

for tool in git redis-server; do
  command -v "$tool" >/dev/null 2>&1 || { echo "script-bound.sh needs $tool" >&2; exit 1; }
done
ROOT="$(pwd)"
TREE="$(mktemp -d)"
trap 'rm -rf "$TREE"' EXIT

git archive HEAD | tar -x -C "$TREE"
# The Lua lives in files that src/limiter/redis/script.rs includes at build time: swapping one
# is the whole change.
cp "$TREE/scripts/bench/script-bound-noop.lua" "$TREE/src/limiter/redis/lua/decide.lua"
echo "== building the no-op-script sluice (target/script-bound/)"
(cd "$TREE" && CARGO_TARGET_DIR="$ROOT/target/script-bound" cargo build --release --locked --bin sluice -q)
echo "== building the real sluice (target/release/)"
cargo build --release --locked --bin sluice -q

bash scripts/bench/ab.sh 'real=target/release/sluice' 'noop-script=target/script-bound/release/sluice'
