#!/usr/bin/env bash
# The README's grpcurl session, run for real against the built binary on both backends:
# reflection `list` and `describe` with no proto files, then OK, OK, OK, OVER_LIMIT, each with
# the exact rate-limit response headers (examples/limits asks for the draft format).
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --locked --quiet
bin=target/debug/sluice
work=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

fail() { echo "FAIL: $*" >&2; exit 1; }

# Starts sluice on ephemeral ports and sets $addr to its gRPC address. Runs in this shell (not
# in a command substitution) so the child is tracked for cleanup and holds no pipe open.
start_sluice() {
  local log=$1; shift
  "$bin" serve --config examples/limits --grpc-addr 127.0.0.1:0 --admin-addr 127.0.0.1:0 "$@" \
    </dev/null >/dev/null 2>"$log" &
  pids+=($!)
  for _ in $(seq 1 200); do
    if grep -q 'listening' "$log"; then
      addr=$(grep -o 'grpc_addr=[^ ]*' "$log" | head -1 | cut -d= -f2)
      return 0
    fi
    sleep 0.05
  done
  cat "$log" >&2
  fail "sluice did not start"
}

walkthrough() {
  local name=$1 addr=$2
  echo "-- $name backend at $addr"
  grpcurl -plaintext "$addr" list | tee "$work/list"
  grep -qx 'envoy.service.ratelimit.v3.RateLimitService' "$work/list" || fail "$name: list lacks the RLS service"
  grep -qx 'grpc.health.v1.Health' "$work/list" || fail "$name: list lacks grpc.health.v1.Health"
  grpcurl -plaintext "$addr" describe envoy.service.ratelimit.v3.RateLimitService | tee "$work/describe"
  grep -q 'rpc ShouldRateLimit' "$work/describe" || fail "$name: describe lacks ShouldRateLimit"
  grpcurl -plaintext -d '{"service":"envoy.service.ratelimit.v3.RateLimitService"}' "$addr" grpc.health.v1.Health/Check \
    | grep -q '"SERVING"' || fail "$name: health is not SERVING"

  local req='{"domain":"edge","descriptors":[{"entries":[{"key":"generic_key","value":"demo"}]}]}'
  local policy='RateLimit-Policy="demo";q=3;w=60'
  local expected headers
  # Seconds until the first hit leaves the 60 s window, rounded up: 60 unless a grpcurl call
  # took a whole second on a loaded machine (tests/headers.rs pins the exact values).
  local t='(59|60)'
  for step in \
    "OK|$policy RateLimit=\"demo\";r=2;t=$t" \
    "OK|$policy RateLimit=\"demo\";r=1;t=$t" \
    "OK|$policy RateLimit=\"demo\";r=0;t=$t" \
    "OVER_LIMIT|$policy RateLimit=\"demo\";r=0;t=$t Retry-After=$t"; do
    expected=${step%%|*}
    headers=${step#*|}
    grpcurl -plaintext -d "$req" "$addr" envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit >"$work/out"
    cat "$work/out"
    grep -q "\"overallCode\": \"$expected\"" "$work/out" || fail "$name: expected $expected"
    got=$(python3 -c 'import json,sys; print(" ".join(h["key"]+"="+h["value"] for h in json.load(open(sys.argv[1])).get("responseHeadersToAdd", [])))' "$work/out")
    echo "$got" | grep -qxE "$headers" || fail "$name: headers: expected [$headers], got [$got]"
  done
}

start_sluice "$work/memory.log"
walkthrough memory "$addr"

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
mkdir "$work/redis"
redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$work/redis" \
  </dev/null >"$work/redis.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do redis-cli -p "$port" ping 2>/dev/null | grep -q PONG && break; sleep 0.05; done
start_sluice "$work/redis-sluice.log" --redis-url "redis://127.0.0.1:$port"
walkthrough redis "$addr"
keys=$(redis-cli -p "$port" --scan --pattern 'sluice:*' | wc -l)
[ "$keys" -ge 1 ] || fail "redis: no sluice key written"
echo "grpcurl walkthrough ok (memory and redis backends)"
