#!/usr/bin/env python3
"""Checks deploy/, the Dockerfile and the Envoy/Istio configs against each other and against the
built binary. Called by scripts/ci/validate-deploy.sh after `kubectl kustomize` rendered every
kustomization into RENDER_DIR (one NAME.yaml per kustomization) and kubernetes-validate checked
the native objects against the Kubernetes schemas.

Why a script of its own: schemas only say a manifest is well-formed. What breaks a rollout is a
flag the binary does not know, a probe on the wrong port, a ServiceMonitor selecting nothing,
an Envoy descriptor no limit matches. Each such cross-reference is checked here, and every
problem is printed before the script exits non-zero.

Usage: check_deploy.py SLUICE_BINARY RENDER_DIR
"""

import os
import re
import subprocess
import sys
import tempfile
import tomllib
import types

import yaml

import check_envoy_gateway
import clihelp

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LIVENESS_SERVICE = "sluice.liveness"
RLS_SERVICE = "envoy.service.ratelimit.v3.RateLimitService"
RATELIMIT_FILTER = "envoy.filters.http.ratelimit"
RATELIMIT_TYPE = "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit"
HTTP_OPTIONS = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
CRD_KINDS = {"ServiceMonitor", "EnvoyFilter", "Gateway", "HTTPRoute", "BackendTrafficPolicy"}
# Envoy Gateway runs the rate limiter as this, with no arguments (src/main.rs).
RATELIMIT_PATH = "/bin/ratelimit"

errors = []
checked = []


def fail(where, message):
    errors.append(f"{where}: {message}")


def ok(what):
    checked.append(what)


def load_all(path):
    with open(path, encoding="utf-8") as f:
        return [d for d in yaml.safe_load_all(f) if d]


# --- the binary ------------------------------------------------------------------------------


def serve_help(binary):
    opts = clihelp.options(binary, "serve")
    flags = set(opts)
    envs = {o["env"] for o in opts.values() if o["env"]}
    defaults = {name: o["default"] for name, o in opts.items() if o["default"] is not None}
    if not envs:
        fail("sluice serve --help", "could not parse any env var")
    return flags, envs, defaults


def port_of(addr):
    return int(addr.rsplit(":", 1)[1])


def check_config_dir(binary, files, where):
    """Writes ConfigMap data the way the kubelet mounts it and runs `sluice check-config`."""
    with tempfile.TemporaryDirectory() as d:
        for name, text in files.items():
            with open(os.path.join(d, name), "w", encoding="utf-8") as f:
                f.write(text)
        r = subprocess.run([binary, "check-config", d], capture_output=True, text=True)
        if r.returncode != 0:
            fail(where, "sluice check-config rejects it:\n" + r.stderr.replace(d, where))
        else:
            ok(f"{where}: sluice check-config ok")


# --- limits (for Envoy descriptors): sluice itself answers which rule a descriptor reaches ------


# Stands for a value Envoy fills in at request time (a header, the client address): it matches
# key-only rules and catch-all wildcards, never an exact value the config spells.
RUNTIME_VALUE = "runtime-value"


class Limits:
    """A limits config (a directory or file) and what `sluice explain` says of descriptors in
    it, so the matching checked here is the binary's own (exact, wildcard, key-only, nested,
    `replaces`), not a copy of it."""

    def __init__(self, binary, path, texts):
        self.binary = binary
        self.path = path
        self.domains = {yaml.safe_load(t)["domain"] for t in texts}

    def explain(self, domain, descriptors, where):
        """For each descriptor (a list of (key, value-or-None)): None when it reaches no limit,
        else {"limit": the result line, "hides_remaining": bool}."""
        answers = [None] * len(descriptors)
        asked = [i for i, d in enumerate(descriptors) if d]
        if not asked:
            return answers
        args = [self.binary, "explain", "--config", self.path, "--domain", domain]
        args += [",".join(f"{k}={RUNTIME_VALUE if v is None else v}" for k, v in descriptors[i])
                 for i in asked]
        r = subprocess.run(args, capture_output=True, text=True)
        if r.returncode != 0:
            fail(where, f"sluice explain failed: {r.stderr.strip()}")
            return answers
        blocks = re.split(r"^descriptor \d+: .*$", r.stdout, flags=re.M)[1:]
        if len(blocks) != len(asked):
            fail(where, f"sluice explain answered {len(blocks)} of {len(asked)} descriptors:\n{r.stdout}")
            return answers
        for i, block in zip(asked, blocks):
            limit = re.search(r"^  result: (limit .*)$", block, flags=re.M)
            headers = re.search(r"^  response headers: (.*)$", block, flags=re.M)
            if limit:
                answers[i] = {
                    "limit": limit.group(1),
                    "hides_remaining": bool(headers) and "remaining count hidden" in headers.group(1),
                }
        return answers


def limits_of_configmaps(binary, texts, tmp):
    """The limits ConfigMap data written out the way the kubelet mounts it."""
    d = tempfile.mkdtemp(dir=tmp)
    for i, text in enumerate(texts):
        with open(os.path.join(d, f"limits-{i}.yaml"), "w", encoding="utf-8") as f:
            f.write(text)
    return Limits(binary, d, texts)


def descriptor_of(actions, where):
    """The (key, value-or-None) entries Envoy builds from one rate_limits entry's actions."""
    entries = []
    for action in actions:
        if "generic_key" in action:
            g = action["generic_key"]
            entries.append((g.get("descriptor_key", "generic_key"), g["descriptor_value"]))
        elif "remote_address" in action:
            entries.append(("remote_address", None))
        elif "request_headers" in action:
            h = action["request_headers"]
            if not h.get("header_name") or not h.get("descriptor_key"):
                fail(where, f"request_headers needs header_name and descriptor_key: {h}")
            entries.append((h.get("descriptor_key"), None))
        else:
            fail(where, f"unexpected action {sorted(action)}")
    return entries


def check_rate_limits(rate_limits, domain, limits, where, x_ratelimit_headers=False):
    """Every rate_limits entry's descriptor reaches a limit. With Envoy's X-RateLimit-* headers
    on, a descriptor whose rule hides the remaining count must turn them off
    (`x_ratelimit_option: OFF`): X-RateLimit-Remaining would show it."""
    if not rate_limits:
        fail(where, "no rate_limits")
        return
    descriptors = [descriptor_of(entry.get("actions") or [], f"{where}[{i}]")
                   for i, entry in enumerate(rate_limits)]
    answers = limits.explain(domain, descriptors, where)
    for i, (entry, entries, answer) in enumerate(zip(rate_limits, descriptors, answers)):
        shown = ", ".join(f"{k}={v if v is not None else '<runtime>'}" for k, v in entries)
        if answer is None:
            fail(where, f"descriptor [{shown}] matches no limit in domain `{domain}`")
            continue
        ok(f"{where}: [{shown}] -> {answer['limit']}")
        if x_ratelimit_headers and answer["hides_remaining"]:
            if entry.get("x_ratelimit_option") != "OFF":
                fail(where, f"rate_limits[{i}] reaches a rule with hide_remaining: it needs "
                     "x_ratelimit_option: OFF, or Envoy's X-RateLimit-Remaining shows the count")
            else:
                ok(f"{where}: rate_limits[{i}] hides the remaining count (x_ratelimit_option OFF)")


def check_filter(cfg, where, limits, max_timeout):
    if cfg.get("@type") != RATELIMIT_TYPE:
        fail(where, f"typed_config @type is {cfg.get('@type')}")
    domain = cfg.get("domain")
    if domain not in limits.domains:
        fail(where, f"domain `{domain}` is not in the limits ({sorted(limits.domains)})")
    timeout = str(cfg.get("timeout", ""))
    if not re.fullmatch(r"\d+(\.\d+)?s", timeout) or float(timeout[:-1]) > max_timeout:
        fail(where, f"timeout `{timeout}` must be set and at most {max_timeout}s")
    if cfg.get("failure_mode_deny") is not True:
        fail(where, "failure_mode_deny must be true (fail closed)")
    rls = cfg.get("rate_limit_service") or {}
    if rls.get("transport_api_version") != "V3":
        fail(where, "rate_limit_service.transport_api_version must be V3")
    cluster = ((rls.get("grpc_service") or {}).get("envoy_grpc") or {}).get("cluster_name")
    if not cluster:
        fail(where, "rate_limit_service.grpc_service.envoy_grpc.cluster_name missing")
    ok(f"{where}: ratelimit filter domain={domain} timeout={timeout} failure_mode_deny")
    return domain, cluster


def seconds(duration, where, field):
    """An Envoy duration (`1s`, `0.25s`) in seconds; a failure and 0 when it is not one."""
    text = str(duration or "")
    if not re.fullmatch(r"\d+(\.\d+)?s", text):
        fail(where, f"{field} `{text}` is not a duration in seconds")
        return 0.0
    return float(text[:-1])


def check_health_checks(cluster, where, drain_delay):
    """The sluice cluster health-checks the rate-limit service over gRPC health, and takes a
    replica out within sluice's drain delay even when every check times out: a replica that
    got SIGTERM still answers while Envoy notices, so a rollout fails no request
    (tests/it/drain.rs runs these settings)."""
    checks = cluster.get("health_checks") or []
    if len(checks) != 1:
        fail(where, f"cluster {cluster.get('name')} needs one health check (gRPC health): {checks}")
        return
    hc = checks[0]
    service = (hc.get("grpc_health_check") or {}).get("service_name")
    if service != RLS_SERVICE:
        fail(where, f"the health check must be grpc_health_check of {RLS_SERVICE}: {service}")
    interval = seconds(hc.get("interval"), where, "health check interval")
    timeout = seconds(hc.get("timeout"), where, "health check timeout")
    no_traffic = seconds(hc.get("no_traffic_interval"), where, "health check no_traffic_interval")
    threshold = int(hc.get("unhealthy_threshold") or 0)
    if threshold < 1:
        fail(where, "the health check needs unhealthy_threshold")
    # Each failed check comes at most an interval (no_traffic_interval while Envoy has sent no
    # call yet) after the one before, and takes at most its timeout.
    worst = threshold * (max(interval, no_traffic) + timeout)
    if worst >= drain_delay:
        fail(where, f"the health check takes a replica out after up to {worst:g} s, not within "
                    f"sluice's drain delay ({drain_delay:g} s, --drain-delay-secs)")
    else:
        ok(f"{where}: gRPC health check takes a draining replica out within {worst:g} s "
           f"< drain delay {drain_delay:g} s")


def check_sluice_cluster(cluster, where, grpc_port):
    opts = (cluster.get("typed_extension_protocol_options") or {}).get(HTTP_OPTIONS) or {}
    if "http2_protocol_options" not in (opts.get("explicit_http_config") or {}):
        fail(where, f"cluster {cluster.get('name')} must speak HTTP/2 (explicit_http_config)")
    addrs = [
        ep["endpoint"]["address"]["socket_address"]
        for group in cluster["load_assignment"]["endpoints"]
        for ep in group["lb_endpoints"]
    ]
    if [(a["address"], a["port_value"]) for a in addrs] != [("127.0.0.1", grpc_port)]:
        fail(where, f"cluster {cluster.get('name')} must point at 127.0.0.1:{grpc_port}: {addrs}")
    ok(f"{where}: cluster {cluster.get('name')} HTTP/2 to 127.0.0.1:{grpc_port}")


# --- Kubernetes manifests ---------------------------------------------------------------------


def matches(selector, labels):
    return all(labels.get(k) == v for k, v in (selector or {}).items())


def check_security(c, where):
    sc = c.get("securityContext") or {}
    if sc.get("runAsNonRoot") is not True:
        fail(where, "securityContext.runAsNonRoot must be true")
    if sc.get("readOnlyRootFilesystem") is not True:
        fail(where, "securityContext.readOnlyRootFilesystem must be true")
    if sc.get("allowPrivilegeEscalation") is not False:
        fail(where, "securityContext.allowPrivilegeEscalation must be false")
    if (sc.get("capabilities") or {}).get("drop") != ["ALL"]:
        fail(where, "securityContext.capabilities.drop must be [ALL]")
    res = c.get("resources") or {}
    for kind in ("requests", "limits"):
        for r in ("cpu", "memory"):
            if r not in (res.get(kind) or {}):
                fail(where, f"resources.{kind}.{r} missing")


def check_sluice_container(c, pod, docs, where, flags, envs, defaults, binary, mount_seen):
    args = c.get("args") or []
    if args[:1] != ["serve"]:
        fail(where, f"args must start with `serve`: {args}")
    opts = {}
    i = 1
    while i < len(args):
        a = args[i]
        if not a.startswith("--"):
            fail(where, f"unexpected argument `{a}`")
            i += 1
            continue
        name = a[2:].split("=", 1)[0]
        if name not in flags:
            fail(where, f"flag --{name} is not in `sluice serve --help`")
        if "=" in a:
            opts[name] = a.split("=", 1)[1]
            i += 1
        else:
            opts[name] = args[i + 1] if i + 1 < len(args) else ""
            i += 2
    env = {e["name"]: e for e in c.get("env") or []}
    for name in env:
        if name.startswith("SLUICE_") and name not in envs:
            fail(where, f"env var {name} is not in `sluice serve --help`")

    def setting(flag, var):
        if flag in opts:
            return opts[flag]
        if var in env:
            return env[var].get("value")
        return defaults.get(flag)

    grpc_addr = setting("grpc-addr", "SLUICE_GRPC_ADDR")
    admin_addr = setting("admin-addr", "SLUICE_ADMIN_ADDR")
    config = setting("config", "SLUICE_CONFIG")
    if not grpc_addr or not grpc_addr.startswith("0.0.0.0:"):
        fail(where, f"--grpc-addr must listen on 0.0.0.0 (kubelet probes dial the pod IP): {grpc_addr}")
    if not admin_addr or not admin_addr.startswith("0.0.0.0:"):
        fail(where, f"--admin-addr must listen on 0.0.0.0 for Prometheus: {admin_addr}")
    grpc_port, admin_port = port_of(grpc_addr), port_of(admin_addr)
    if grpc_port != port_of(defaults["grpc-addr"]) or admin_port != port_of(defaults["admin-addr"]):
        fail(where, "ports differ from the binary's defaults (Envoy/Istio configs assume them)")
    ports = {p.get("name"): p["containerPort"] for p in c.get("ports") or []}
    if ports.get("grpc") != grpc_port or ports.get("metrics") != admin_port:
        fail(where, f"containerPorts grpc/metrics {ports} differ from the flags {grpc_port}/{admin_port}")

    ready = (c.get("readinessProbe") or {}).get("grpc") or {}
    live = (c.get("livenessProbe") or {}).get("grpc") or {}
    if ready.get("port") != grpc_port or ready.get("service") != RLS_SERVICE:
        fail(where, f"readinessProbe must be grpc on {grpc_port} with service {RLS_SERVICE}: {ready}")
    if live.get("port") != grpc_port or live.get("service") != LIVENESS_SERVICE:
        fail(where, f"livenessProbe must be grpc on {grpc_port} with service {LIVENESS_SERVICE} "
                    f"(a Redis outage must not restart the pod): {live}")

    # SIGTERM to exit: the drain delay, then the calls in flight, each within the request
    # timeout. The kubelet kills the container at the grace period (30 s when unset).
    drain = float(setting("drain-delay-secs", "SLUICE_DRAIN_DELAY_SECS") or 0)
    calls = float(setting("request-timeout-ms", "SLUICE_REQUEST_TIMEOUT_MS") or 0) / 1000
    grace = pod["spec"].get("terminationGracePeriodSeconds", 30)
    if drain + calls >= grace:
        fail(where, f"terminationGracePeriodSeconds {grace} leaves no room for the drain delay "
                    f"({drain:g} s) and the calls in flight (request timeout {calls:g} s)")
    elif drain <= 0:
        fail(where, "--drain-delay-secs 0: the port would close before Services and proxies "
                    "stop sending to the pod")
    else:
        ok(f"{where}: drain delay {drain:g} s + request timeout {calls:g} s within the grace "
           f"period {grace} s")

    ann = pod["metadata"].get("annotations") or {}
    if ann.get("prometheus.io/scrape") != "true" or ann.get("prometheus.io/port") != str(admin_port) \
            or ann.get("prometheus.io/path") != "/metrics":
        fail(where, f"pod needs prometheus.io/scrape, port {admin_port} and path /metrics annotations")

    # The config path is a mounted ConfigMap, which exists in the render and passes check-config.
    mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts") or []}
    volumes = {v["name"]: v for v in pod["spec"].get("volumes") or []}
    vol = volumes.get(mounts.get(config, ""), {})
    cm_name = (vol.get("configMap") or {}).get("name")
    cms = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == cm_name]
    if not cm_name or not cms:
        fail(where, f"--config {config} is not a mounted ConfigMap of this render")
    elif vol["configMap"].get("items"):
        fail(where, "mount the whole ConfigMap (no items): subPath/items mounts never update")
    else:
        mount_seen.add(config)
        key = (where.split(":")[0], cm_name)
        if key not in checked_configmaps:
            checked_configmaps.add(key)
            check_config_dir(binary, cms[0]["data"], f"{key[0]}: ConfigMap {cm_name}")

    for name, e in env.items():
        ref = (e.get("valueFrom") or {}).get("secretKeyRef")
        if ref:
            secrets = [d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"] == ref["name"]]
            if not secrets:
                fail(where, f"{name} reads Secret {ref['name']}, which this render lacks")
            elif ref["key"] not in (secrets[0].get("data") or {}) and ref["key"] not in (
                secrets[0].get("stringData") or {}
            ):
                fail(where, f"{name} reads key {ref['key']} absent from Secret {ref['name']}")
    ok(f"{where}: flags, env, ports {grpc_port}/{admin_port}, probes, annotations, config mount")
    return grpc_port, admin_port


checked_configmaps = set()


def check_render(name, docs, binary, flags, envs, defaults, mount_seen):
    services = [d for d in docs if d["kind"] == "Service"]
    deployments = [d for d in docs if d["kind"] == "Deployment"]
    found_sluice = False
    for dep in deployments:
        pod = dep["spec"]["template"]
        labels = pod["metadata"].get("labels") or {}
        if not matches(dep["spec"]["selector"]["matchLabels"], labels):
            fail(f"{name}: Deployment {dep['metadata']['name']}", "selector does not match its pod labels")
        for c in pod["spec"]["containers"]:
            where = f"{name}: {dep['metadata']['name']}/{c['name']}"
            check_security(c, where)
            if c["name"] == "sluice":
                found_sluice = True
                check_sluice_container(c, pod, docs, where, flags, envs, defaults, binary, mount_seen)
        ok(f"{name}: Deployment {dep['metadata']['name']} security contexts and resources")
    for svc in services:
        pods = [d for d in deployments if matches(svc["spec"]["selector"], d["spec"]["template"]["metadata"]["labels"])]
        if not pods:
            fail(f"{name}: Service {svc['metadata']['name']}", "selects no Deployment's pods")
            continue
        names = {p.get("name") for c in pods[0]["spec"]["template"]["spec"]["containers"] for p in c.get("ports") or []}
        for p in svc["spec"]["ports"]:
            if isinstance(p["targetPort"], str) and p["targetPort"] not in names:
                fail(f"{name}: Service {svc['metadata']['name']}", f"targetPort {p['targetPort']} is no container port")
    for d in docs:
        kind, n = d["kind"], d["metadata"]["name"]
        where = f"{name}: {kind} {n}"
        if kind in ("PodDisruptionBudget", "NetworkPolicy"):
            sel = (d["spec"].get("selector") or d["spec"].get("podSelector") or {}).get("matchLabels")
            if not any(matches(sel, x["spec"]["template"]["metadata"]["labels"]) for x in deployments):
                fail(where, "selects no pod of this render")
            else:
                ok(f"{where} selects the pods")
        if kind == "HorizontalPodAutoscaler":
            ref = d["spec"]["scaleTargetRef"]
            if not any(x["metadata"]["name"] == ref["name"] for x in deployments):
                fail(where, f"scaleTargetRef {ref['name']} is not in this render")
        if kind == "ServiceMonitor":
            sel = d["spec"]["selector"]["matchLabels"]
            svcs = [s for s in services if matches(sel, s["metadata"].get("labels") or {})]
            ports = {p.get("name") for s in svcs for p in s["spec"]["ports"]}
            for ep in d["spec"]["endpoints"]:
                if ep.get("port") not in ports:
                    fail(where, f"endpoint port {ep.get('port')} is on no selected Service")
                elif ep.get("path") != "/metrics":
                    fail(where, "endpoint path must be /metrics")
                else:
                    ok(f"{where} scrapes {ep['port']}")
    return found_sluice


def check_envoyfilter(name, ef, docs, limits, grpc_port):
    where = f"{name}: EnvoyFilter {ef['metadata']['name']}"
    if ef.get("apiVersion") != "networking.istio.io/v1alpha3":
        fail(where, f"apiVersion {ef.get('apiVersion')}")
    patches = ef["spec"]["configPatches"]
    contexts = {p["match"]["context"] for p in patches}
    if len(contexts) != 1 or not contexts <= {"GATEWAY", "SIDECAR_INBOUND"}:
        fail(where, f"expected one context, GATEWAY or SIDECAR_INBOUND: {contexts}")
    context = next(iter(contexts))
    sel = ef["spec"]["workloadSelector"]["labels"]
    filters = [p for p in patches if p["applyTo"] == "HTTP_FILTER"]
    if len(filters) != 1 or filters[0]["patch"]["value"]["name"] != RATELIMIT_FILTER:
        fail(where, "needs exactly one HTTP_FILTER patch inserting envoy.filters.http.ratelimit")
        return
    f = filters[0]
    sub = f["match"]["listener"]["filterChain"]["filter"].get("subFilter", {}).get("name")
    if f["patch"]["operation"] != "INSERT_BEFORE" or sub != "envoy.filters.http.router":
        fail(where, "the ratelimit filter must go INSERT_BEFORE envoy.filters.http.router")
    max_timeout = 0.05 if context == "GATEWAY" else 0.02
    domain, cluster = check_filter(f["patch"]["value"]["typed_config"], where, limits, max_timeout)
    if context == "GATEWAY":
        if sel != {"istio": "ingressgateway"}:
            fail(where, f"workloadSelector must select the ingress gateway: {sel}")
        svc = [d for d in docs if d["kind"] == "Service" and any(p["port"] == grpc_port for p in d["spec"]["ports"])]
        want = [f"outbound|{grpc_port}||{s['metadata']['name']}.{s['metadata']['namespace']}.svc.cluster.local" for s in svc]
        if cluster not in want:
            fail(where, f"cluster {cluster} is not the sluice Service of this render ({want})")
        else:
            ok(f"{where}: cluster {cluster} is the rendered Service")
    else:
        pods = [d for d in docs if d["kind"] == "Deployment" and matches(sel, d["spec"]["template"]["metadata"]["labels"])]
        if not pods or ef["metadata"].get("namespace") != pods[0]["metadata"].get("namespace"):
            fail(where, "workloadSelector/namespace select no sidecar Deployment of this render")
        added = [p["patch"]["value"] for p in patches if p["applyTo"] == "CLUSTER" and p["patch"]["operation"] == "ADD"]
        target = [c for c in added if c["name"] == cluster]
        if not target:
            fail(where, f"cluster {cluster} is not added by a CLUSTER patch")
        else:
            check_sluice_cluster(target[0], where, grpc_port)
    routes = [p for p in patches if p["applyTo"] in ("HTTP_ROUTE", "VIRTUAL_HOST")]
    if not routes:
        fail(where, "no HTTP_ROUTE/VIRTUAL_HOST patch adds rate_limits")
    for p in routes:
        value = p["patch"]["value"]
        rl = value.get("rate_limits") if p["applyTo"] == "VIRTUAL_HOST" else (value.get("route") or {}).get("rate_limits")
        check_rate_limits(rl, domain, limits, f"{where} {p['applyTo']}")


RLQS_FILTER = "envoy.filters.http.rate_limit_quota"


def rlqs_buckets(matcher):
    """Every bucket a Rate Limit Quota filter's matcher tree builds: its entries, a dynamic value
    (custom_value) as None, and the bucket settings."""
    out = []

    def walk(node):
        if isinstance(node, list):
            for item in node:
                walk(item)
            return
        if not isinstance(node, dict):
            return
        builder = node.get("bucket_id_builder")
        if isinstance(builder, dict) and "bucket_id_builder" in builder:
            entries = [(k, v.get("string_value")) for k, v in builder["bucket_id_builder"].items()]
            out.append((entries, node))
            return
        for value in node.values():
            walk(value)

    walk(matcher)
    return out


def check_rlqs_bootstrap(path, binary, limits_path, grpc_port):
    """An Envoy bootstrap with the Rate Limit Quota filter: on a defined HTTP/2 cluster at
    sluice's gRPC port, before the router; every bucket it builds gets allotments from a rule
    of the limits (`sluice explain --bucket`, a dynamic value as RUNTIME_VALUE), and falls back
    to blanket rules that fail closed, with an explicit expiry timeout (docs/rlqs.md)."""
    where = os.path.relpath(path, ROOT)
    boot = load_all(path)[0]
    clusters = {c["name"]: c for c in boot["static_resources"]["clusters"]}
    found = 0
    for listener in boot["static_resources"]["listeners"]:
        for chain in listener["filter_chains"]:
            for nf in chain["filters"]:
                http_filters = (nf.get("typed_config") or {}).get("http_filters") or []
                names = [h["name"] for h in http_filters]
                if RLQS_FILTER not in names:
                    continue
                found += 1
                if names[-1] != "envoy.filters.http.router" or names.index(RLQS_FILTER) > names.index("envoy.filters.http.router"):
                    fail(where, "the quota filter must come before the router, which must be last")
                cfg = http_filters[names.index(RLQS_FILTER)]["typed_config"]
                cluster = cfg["rlqs_server"]["envoy_grpc"]["cluster_name"]
                if cluster not in clusters:
                    fail(where, f"cluster {cluster} is not defined")
                else:
                    check_sluice_cluster(clusters[cluster], where, grpc_port)
                buckets = rlqs_buckets(cfg["bucket_matchers"])
                if not buckets:
                    fail(where, "the quota filter builds no bucket")
                for entries, settings in buckets:
                    text = ",".join(f"{k}={RUNTIME_VALUE if v is None else v}" for k, v in entries)
                    r = subprocess.run([binary, "explain", "--config", limits_path, "--domain",
                                        cfg["domain"], "--bucket", text], capture_output=True, text=True)
                    if r.returncode != 0 or "quota service: allotments from rule" not in r.stdout:
                        fail(where, f"bucket {text} gets no allotments:\n{r.stdout}{r.stderr}")
                    na = settings.get("no_assignment_behavior", {}).get("fallback_rate_limit", {})
                    if na != {"blanket_rule": "DENY_ALL"}:
                        fail(where, f"bucket {text}: no_assignment_behavior must be the DENY_ALL blanket rule, not {na}")
                    ex = settings.get("expired_assignment_behavior", {})
                    if "expired_assignment_behavior_timeout" not in ex or ex.get("fallback_rate_limit") != {"blanket_rule": "DENY_ALL"}:
                        fail(where, f"bucket {text}: expired_assignment_behavior needs a timeout and the DENY_ALL blanket rule")
    if found != 1:
        fail(where, f"expected one quota filter, found {found}")
    else:
        ok(f"{where}: quota filter, its buckets' rules and fallbacks")


def check_envoy_bootstrap(path, limits, grpc_port, drain_delay):
    where = os.path.relpath(path, ROOT)
    boot = load_all(path)[0]
    clusters = {c["name"]: c for c in boot["static_resources"]["clusters"]}
    found = 0
    for listener in boot["static_resources"]["listeners"]:
        for chain in listener["filter_chains"]:
            for nf in chain["filters"]:
                hcm = nf.get("typed_config") or {}
                http_filters = hcm.get("http_filters") or []
                names = [h["name"] for h in http_filters]
                if RATELIMIT_FILTER not in names:
                    continue
                found += 1
                if names[-1] != "envoy.filters.http.router" or names.index(RATELIMIT_FILTER) > names.index("envoy.filters.http.router"):
                    fail(where, "the ratelimit filter must come before the router, which must be last")
                cfg = http_filters[names.index(RATELIMIT_FILTER)]["typed_config"]
                domain, cluster = check_filter(cfg, where, limits, 0.02)
                if cfg.get("enable_x_ratelimit_headers") != "DRAFT_VERSION_03":
                    fail(where, "enable_x_ratelimit_headers must be DRAFT_VERSION_03")
                if cluster not in clusters:
                    fail(where, f"cluster {cluster} is not defined")
                else:
                    check_sluice_cluster(clusters[cluster], where, grpc_port)
                    check_health_checks(clusters[cluster], where, drain_delay)
                for vh in hcm["route_config"]["virtual_hosts"]:
                    for route in vh["routes"]:
                        rl = (route.get("route") or {}).get("rate_limits")
                        if rl:
                            check_rate_limits(rl, domain, limits, f"{where} route {route['match']}",
                                              x_ratelimit_headers=True)
                        dest = (route.get("route") or {}).get("cluster")
                        if dest and dest not in clusters:
                            fail(where, f"route to undefined cluster {dest}")
    if found != 1:
        fail(where, f"expected one HTTP connection manager with the ratelimit filter, found {found}")


def check_dockerfile(defaults, mount_paths):
    where = "Dockerfile"
    with open(os.path.join(ROOT, "Dockerfile"), encoding="utf-8") as f:
        text = f.read()
    lines = [l.strip() for l in text.splitlines() if l.strip() and not l.strip().startswith("#")]
    froms = [l for l in lines if l.startswith("FROM ")]
    if len(froms) < 2 or " AS " not in froms[0]:
        fail(where, "must be multi-stage (a named build stage, then the final image)")
    builder = froms[0].split()[-1]
    runs = [l for l in lines if l.startswith("RUN ")]
    build = [r for r in runs if "cargo build" in r]
    if not build or "--locked" not in build[0] or "--release" not in build[0]:
        fail(where, "the build stage must run `cargo build --release --locked` (CI builds with --locked)")
    # Every COPY from the build context names a path that exists.
    for l in lines:
        if l.startswith("COPY ") and "--from=" not in l:
            for src in l.split()[1:-1]:
                if not os.path.exists(os.path.join(ROOT, src)):
                    fail(where, f"COPY source {src} does not exist")
    # Cargo reads every workspace member's manifest, even to build one package: each member
    # must be in the build context the Dockerfile copies.
    with open(os.path.join(ROOT, "Cargo.toml"), "rb") as f:
        members = tomllib.load(f).get("workspace", {}).get("members", [])
    copied = [os.path.normpath(src) for l in lines if l.startswith("COPY ") and "--from=" not in l
              for src in l.split()[1:-1]]
    for member in members:
        member = os.path.normpath(member)
        if member != "." and not any(member == c or member.startswith(c + "/") for c in copied):
            fail(where, f"workspace member {member} is not copied into the build stage (cargo needs its manifest)")
    # The binary copied out of the builder is the one cargo writes.
    copies = [l for l in lines if l.startswith(f"COPY --from={builder} ")]
    binary_dst = None
    if not copies:
        fail(where, f"the final stage copies nothing from {builder}")
    else:
        src, dst = copies[0].split()[2:4]
        workdir = [l.split()[1] for l in lines if l.startswith("WORKDIR ")][0]
        if src != f"{workdir}/target/release/sluice":
            fail(where, f"copies {src}, but cargo writes {workdir}/target/release/sluice")
        binary_dst = dst
        # Envoy Gateway's command: the same binary under envoyproxy/ratelimit's path.
        if not any(c.split()[2:4] == [src, RATELIMIT_PATH] for c in copies):
            fail(where, f"the final stage must also copy {src} to {RATELIMIT_PATH} (Envoy Gateway runs it)")
    user = [l.split()[1] for l in lines if l.startswith("USER ")]
    if not user or not re.fullmatch(r"[1-9]\d*(:\d+)?", user[-1]):
        fail(where, "the final stage needs a numeric non-root USER (runAsNonRoot checks it)")
    expose = sorted(int(p) for l in lines if l.startswith("EXPOSE ") for p in l.split()[1:])
    want = sorted([port_of(defaults["grpc-addr"]), port_of(defaults["admin-addr"])])
    if expose != want:
        fail(where, f"EXPOSE {expose} differs from the flags' default ports {want}")
    entry = [l for l in lines if l.startswith("ENTRYPOINT ")]
    cmd = [l for l in lines if l.startswith("CMD ")]
    if not entry or binary_dst not in entry[0]:
        fail(where, f"ENTRYPOINT must run {binary_dst}")
    if cmd:
        args = yaml.safe_load(cmd[0][4:])
        if "--config" not in args or args[args.index("--config") + 1] not in mount_paths:
            fail(where, f"CMD --config must be the manifests' mount path {sorted(mount_paths)}")
    ok(f"{where}: multi-stage, cargo build --release --locked, {binary_dst}, USER {user[-1] if user else '?'}, EXPOSE {expose}")


def main():
    binary, render_dir = sys.argv[1], sys.argv[2]
    with tempfile.TemporaryDirectory() as tmp:
        return check_all(binary, render_dir, tmp)


def check_all(binary, render_dir, tmp):
    flags, envs, defaults = serve_help(binary)
    for need in ("grpc-addr", "admin-addr", "drain-delay-secs", "request-timeout-ms"):
        if need not in defaults:
            fail("sluice serve --help", f"no default shown for --{need}")
    if errors:
        return report()
    grpc_port = port_of(defaults["grpc-addr"])
    mount_paths = set()
    renders = {}
    for f in sorted(os.listdir(render_dir)):
        if f.endswith(".yaml"):
            renders[f[:-5]] = load_all(os.path.join(render_dir, f))
    sidecar_or_service = 0
    for name, docs in renders.items():
        if check_render(name, docs, binary, flags, envs, defaults, mount_paths):
            sidecar_or_service += 1
        texts = [t for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "sluice-limits" for t in d["data"].values()]
        for ef in (d for d in docs if d["kind"] == "EnvoyFilter"):
            check_envoyfilter(name, ef, docs, limits_of_configmaps(binary, texts, tmp), grpc_port)
    if sidecar_or_service < 2:
        fail(render_dir, "expected sluice containers in at least the sidecar and service renders")
    base_limits = os.path.join(ROOT, "deploy/base/limits")
    texts = []
    for f in sorted(os.listdir(base_limits)):
        with open(os.path.join(base_limits, f), encoding="utf-8") as fh:
            texts.append(fh.read())
    check_envoy_bootstrap(os.path.join(ROOT, "deploy/envoy/envoy.yaml"),
                          Limits(binary, base_limits, texts), grpc_port,
                          float(defaults["drain-delay-secs"]))
    check_rlqs_bootstrap(os.path.join(ROOT, "deploy/envoy/rlqs.yaml"), binary, base_limits, grpc_port)
    check_dockerfile(defaults, mount_paths)
    check_envoy_gateway_renders(renders, binary, envs, tmp)
    return report()


def check_envoy_gateway_renders(renders, binary, envs, tmp):
    """deploy/envoy-gateway: every render with an EnvoyGateway config, then the Helm values
    against the xDS render's config (scripts/ci/check_envoy_gateway.py says what is checked)."""
    with open(os.path.join(ROOT, "docs/migration.md"), encoding="utf-8") as f:
        migration = f.read()
    ctx = types.SimpleNamespace(
        fail=fail, ok=ok, envs=envs, binary=binary, migration=migration,
        check_config_dir=check_config_dir,
        limits_of=lambda texts: limits_of_configmaps(binary, texts, tmp),
    )
    configs = {}
    for name, docs in renders.items():
        config = check_envoy_gateway.check_render(name, docs, ctx)
        if config is not None:
            configs[name] = config
    for need in ("envoy-gateway-xds", "envoy-gateway-custom-window"):
        if need not in configs:
            fail(need, "no EnvoyGateway config rendered (deploy/envoy-gateway/...)")
    if "envoy-gateway-xds" in configs:
        values = os.path.join(ROOT, "deploy/envoy-gateway/values.yaml")
        check_envoy_gateway.check_helm_values(values, configs["envoy-gateway-xds"], fail, ok)


def report():
    for c in checked:
        print(f"  ok  {c}")
    for e in errors:
        print(f"FAIL  {e}", file=sys.stderr)
    print(f"deploy checks: {len(checked)} ok, {len(errors)} failed")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
