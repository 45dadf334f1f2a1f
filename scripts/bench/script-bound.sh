#!/usr/bin/env bash
# The most admit-heavy could reach with one script call per decision on this machine: sluice
# built with a Lua script that decides nothing (it returns a well-formed "admitted" reply for
# every request of a call, touching no key), A/B against the real build with scripts/bench/ab.sh.
# Everything else is the same: gRPC, batching, EVALSHA round trips, reply decoding, the
# generator and the no-op ceiling. The gap between the two is what the sliding log's work inside
# Redis costs; the ratio of the no-op-script build is a ceiling for any script. Figures in
# docs/performance.md ("The ceiling of any script").
#
#   scripts/bench/script-bound.sh                 # 3 alternating rounds, 64 callers
#   ROUNDS=5 scripts/bench/script-bound.sh        # any scripts/bench/ab.sh setting passes through
#
# The no-op-script build is made from the committed tree (git archive HEAD) with its own target
# directory, target/script-bound/ (the first run compiles every dependency once more: about 3
# minutes on these 2 cores). It is for this measurement only: it admits everything.
# Every process listens on 127.0.0.1 only and is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/../.."

for tool in git python3 redis-server; do
  command -v "$tool" >/dev/null 2>&1 || { echo "script-bound.sh needs $tool" >&2; exit 1; }
done
ROOT="$(pwd)"
TREE="$(mktemp -d)"
trap 'rm -rf "$TREE"' EXIT

git archive HEAD | tar -x -C "$TREE"
python3 - "$TREE/src/limiter/redis/script.rs" <<'EOF'
import sys
path = sys.argv[1]
src = open(path).read()
start = src.index("pub const SCRIPT: &str = concat!(")
end = src.index("\n);\n", start) + len("\n);\n")
# Same reply shapes as the real script (see its doc): unbatched {1, 1, 0, 1000 per item...,
# 0 per item...}; batched (ARGV[1] == 'b') one such reply per request.
noop = '''pub const SCRIPT: &str = r#"
local function admitted(n)
  local r = {1}
  for i = 1, n do
    r[3 * i - 1], r[3 * i], r[3 * i + 1] = 1, 0, 1000
  end
  for i = 1, n do
    r[1 + 3 * n + i] = 0
  end
  return r
end
if ARGV[1] ~= 'b' then
  return admitted(#KEYS)
end
local out = {}
for g = 1, tonumber(ARGV[3]) do
  out[g] = admitted(tonumber(ARGV[3 + g]))
end
return out
"#;
'''
open(path, "w").write(src[:start] + noop + src[end:])
EOF
echo "== building the no-op-script sluice (target/script-bound/)"
(cd "$TREE" && CARGO_TARGET_DIR="$ROOT/target/script-bound" cargo build --release --locked --bin sluice -q)
echo "== building the real sluice (target/release/)"
cargo build --release --locked --bin sluice -q

bash scripts/bench/ab.sh 'real=target/release/sluice' 'noop-script=target/script-bound/release/sluice'
