#!/usr/bin/env bash
# Validates deploy/ offline: renders every kustomization with `kubectl kustomize`, checks the
# native objects against the Kubernetes schemas with kubernetes-validate (PyPI, bundles the
# schemas), then scripts/ci/check_deploy.py cross-checks manifests, Envoy/Istio configs and the
# Dockerfile against each other and against the built binary (`sluice serve --help`,
# `sluice check-config` on every limits ConfigMap). Needs kubectl and kubernetes-validate:
# scripts/setup.sh installs them.
set -euo pipefail
cd "$(dirname "$0")/../.."

fail() { echo "FAIL: $*" >&2; exit 1; }
command -v kubectl >/dev/null 2>&1 || fail "kubectl is not installed (scripts/setup.sh installs it)"
command -v kubernetes-validate >/dev/null 2>&1 || fail "kubernetes-validate is not installed (scripts/setup.sh installs it)"

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
  # CRDs (ServiceMonitor, EnvoyFilter) have no bundled schema; check_deploy.py checks them.
  python3 - "$work/render/$name.yaml" "$work/native/$name.yaml" <<'PY'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
native = [d for d in docs if d["kind"] not in ("ServiceMonitor", "EnvoyFilter")]
yaml.safe_dump_all(native, open(sys.argv[2], "w"))
PY
  # --strict rejects unknown fields; a missing schema is a failure, not a warning.
  out=$(kubernetes-validate --strict --quiet "$work/native/$name.yaml" 2>&1) || { echo "$out" >&2; fail "kubernetes-validate $dir"; }
  if echo "$out" | grep -q .; then echo "$out" >&2; fail "kubernetes-validate $dir reported problems"; fi
  echo "  ok  $dir: kubectl kustomize + kubernetes-validate --strict ($(grep -c '^kind:' "$work/render/$name.yaml") objects)"
done

python3 scripts/ci/check_deploy.py "$bin" "$work/render"
