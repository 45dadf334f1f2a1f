#!/usr/bin/env bash
# The test command (README's, and CI's through .ci/run), from a fresh clone on a fresh machine:
# installs what the tests use (scripts/setup.sh), then runs lint (rustfmt, clippy on the whole
# workspace, luacheck), the deploy/ validation, the README checks (the grpcurl session, the
# curl session through Envoy, the metric names and the flag table against the built binary),
# smoke runs of the benchmark harnesses (bench.sh, scale.sh: they check that the harness runs,
# never a figure, a status or a deadline, so a loaded machine cannot fail them), a parse check of
# the other benchmark scripts and every test of the workspace (last, so its summary closes the
# output): the library's unit tests, the one integration-test crate tests/it, the benchmark
# tools' tests. Tests start their own redis-server and envoy processes on ephemeral ports. The
# tests run under cargo-nextest (.config/nextest.toml): each in a process of its own, killed and
# failed past 3 minutes, so a hung test fails the run instead of stalling it; the tests whose
# assertions depend on a deadline run alone (docs/testing.md).
# SLUICE_TEST_THREADS sets how many run at once (default 4).
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh

echo "== every script under scripts/ is executable"
not_executable=$(find scripts -type f ! -name '*.md' ! -name '*.lua' ! -perm -u+x)
[ -z "$not_executable" ] || { echo "not executable: $not_executable" >&2; exit 1; }
echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy (workspace)"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== architecture: no import cycle between modules (long functions: clippy above)"
python3 scripts/ci/check-architecture.py src
echo "== Lua lint"
bash scripts/ci/lua-lint.sh
echo "== deploy/ validation (kustomize, schemas, Envoy/Istio, envoy --mode validate, Dockerfile vs binary)"
bash scripts/ci/validate-deploy.sh
echo "== README vs the binary (grpcurl session, curl session through Envoy, metric names, flags)"
bash scripts/ci/readme-check.sh
echo "== benchmark harness smoke run (scripts/bench/bench.sh --smoke: the harness runs; no figure, status or deadline checked)"
bash scripts/bench/bench.sh --smoke >/dev/null
echo "== scale benchmark smoke run (scripts/bench/scale.sh --quick: its table and chart, no figures checked)"
bash scripts/bench/scale.sh --quick >/dev/null
echo "== the other benchmark scripts parse (bash -n)"
for script in scripts/bench/*.sh; do bash -n "$script"; done
echo "== doc tests (nextest does not run them)"
cargo test --workspace --locked --doc
echo "== cargo nextest (workspace; a test past its timeout fails, see .config/nextest.toml)"
cargo nextest run --workspace --locked --profile ci --test-threads "${SLUICE_TEST_THREADS:-4}"
