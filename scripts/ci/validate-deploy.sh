#!/usr/bin/env bash
# Validates deploy/ offline: renders every kustomization with `kubectl kustomize`, checks the
# native objects against the Kubernetes schemas with kubernetes-validate (PyPI, bundles the
# schemas), then scripts/ci/check_deploy.py cross-checks manifests, Envoy/Istio configs and the
# Dockerfile against each other and against the built binary (`sluice serve --help`,
# `sluice check-config` on every limits ConfigMap), and `envoy --mode validate` checks every Envoy
# bootstrap the repository ships (any YAML/JSON file outside target/ whose top level has
# static_resources). The Istio EnvoyFilters are not bootstraps: tests/it/istio.rs applies them to
# istiod-shaped configs and validates and runs the result. Needs kubectl, kubernetes-validate
# and envoy: scripts/setup.sh installs them.
set -euo pipefail
cd "$(dirname "$0")/../.."

fail() { echo "FAIL: $*" >&2; exit 1; }
command -v kubectl >/dev/null 2>&1 || fail "kubectl is not installed (scripts/setup.sh installs it)"
command -v kubernetes-validate >/dev/null 2>&1 || fail "kubernetes-validate is not installed (scripts/setup.sh installs it)"
command -v envoy >/dev/null 2>&1 || fail "envoy is not installed (scripts/setup.sh installs it)"

cargo build --locked --quiet
bin=target/debug/sluice
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/render" "$work/native"

# Every directory with a kustomization.yaml, so a new overlay cannot escape validation.
mapfile -t dirs < <(find deploy -name kustomization.yaml -printf '%h\n' | sort)
[ "${#dirs[@]}" -ge 5 ] || fail "expected at least 5 kustomizations under deploy/, found ${#dirs[@]}"
for dir in "${dirs[@]}"; do
  name=$(echo "${dir#deploy/}" | tr '/' '-')
  kubectl kustomize "$dir" >"$work/render/$name.yaml" || fail "kubectl kustomize $dir"
  # CRDs (ServiceMonitor, EnvoyFilter, Envoy Gateway's and the Gateway API's) have no bundled
  # schema; check_deploy.py checks them.
  python3 - "$work/render/$name.yaml" "$work/native/$name.yaml" <<'PY'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
crds = ("ServiceMonitor", "EnvoyFilter", "Gateway", "HTTPRoute", "BackendTrafficPolicy")
native = [d for d in docs if d["kind"] not in crds]
yaml.safe_dump_all(native, open(sys.argv[2], "w"))
PY
  # --strict rejects unknown fields; a missing schema is a failure, not a warning.
  out=$(kubernetes-validate --strict --quiet "$work/native/$name.yaml" 2>&1) || { echo "$out" >&2; fail "kubernetes-validate $dir"; }
  if echo "$out" | grep -q .; then echo "$out" >&2; fail "kubernetes-validate $dir reported problems"; fi
  echo "  ok  $dir: kubectl kustomize + kubernetes-validate --strict ($(grep -c '^kind:' "$work/render/$name.yaml") objects)"
done

python3 scripts/ci/check_deploy.py "$bin" "$work/render"

# Every Envoy bootstrap under version control's tree (not target/), validated by Envoy itself.
mapfile -t bootstraps < <(python3 - <<'PY'
import json, os, yaml
for root, dirs, files in os.walk("."):
    dirs[:] = sorted(d for d in dirs if d not in (".git", "target") and not d.startswith("."))
    for f in sorted(files):
        if not f.endswith((".yaml", ".yml", ".json")):
            continue
        path = os.path.join(root, f)[2:]
        try:
            with open(path, encoding="utf-8") as fh:
                docs = [json.load(fh)] if f.endswith(".json") else list(yaml.safe_load_all(fh))
        except Exception:
            continue
        if any(isinstance(d, dict) and "static_resources" in d for d in docs):
            print(path)
PY
)
[ "${#bootstraps[@]}" -ge 1 ] || fail "found no Envoy bootstrap to validate (deploy/envoy/envoy.yaml?)"
for config in "${bootstraps[@]}"; do
  out=$(envoy --mode validate --disable-hot-restart --log-level warning -c "$config" 2>&1) \
    || { echo "$out" >&2; fail "envoy --mode validate $config"; }
  echo "  ok  $config: envoy $(envoy --version | sed -n 's|.*version: [0-9a-f]*/\([0-9.]*\)/.*|\1|p') --mode validate"
done
