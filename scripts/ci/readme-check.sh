#!/usr/bin/env bash
# Builds sluice and checks README.md and docs/cli.md, docs/config.md, docs/architecture.md
# against it (scripts/ci/check_readme.py): the grpcurl session run for real on the memory and
# Redis backends, the curl session through a real Envoy, every metric name those pages quote in
# /metrics, docs/cli.md's flag table and synopsis against `--help`. Then every relative link and
# anchor of the repository's Markdown (scripts/ci/check_links.py).
# Needs grpcurl 1.8.6, redis-server, redis-cli, envoy and curl: scripts/setup.sh installs them.
set -euo pipefail
cd "$(dirname "$0")/../.."
for tool in grpcurl redis-server redis-cli envoy curl; do
  command -v "$tool" >/dev/null 2>&1 || { echo "readme-check.sh needs $tool (scripts/setup.sh installs it)" >&2; exit 1; }
done
cargo build --locked --quiet --bin sluice
python3 scripts/ci/check_readme.py target/debug/sluice README.md
python3 scripts/ci/check_links.py
