#!/usr/bin/env python3
"""The Envoy Gateway part of check_deploy.py: deploy/envoy-gateway/ cross-checked against the
binary, docs/migration.md and Envoy Gateway's own naming. Schemas cannot see any of this:

- the EnvoyGateway config inside the ConfigMap `envoy-gateway-config` (its apiVersion and kind,
  the Kubernetes provider, the rate limiter's image being sluice's with a tag, a Redis backend);
- every variable it adds to the rate limiter's container is a `SLUICE_*` variable of
  `sluice serve --help` or an envoyproxy/ratelimit variable docs/migration.md maps;
- with `CONFIG_TYPE=FILE` (limits from a file instead of xDS): the config directory Envoy
  Gateway's RUNTIME_ROOT/RUNTIME_SUBDIRECTORY point at is a whole ConfigMap of the render,
  mounted through the pod's volumes, that `sluice check-config` accepts, and every descriptor
  Envoy Gateway derives from the render's BackendTrafficPolicies reaches a limit of it (as
  `sluice explain` answers: the binary's own matching);
- each BackendTrafficPolicy targets an HTTPRoute of the render, whose parents are Gateways of
  the render, with global rules whose units and costs Envoy Gateway accepts;
- deploy/envoy-gateway/values.yaml (Helm) swaps the same image and sets the same rate-limit
  backend as the xDS render.

The descriptor names are Envoy Gateway's (internal/xds/translator/ratelimit.go): the domain is
the listener `GATEWAY_NS/GATEWAY/LISTENER`; per route rule and match the route descriptor
`httproute/NS/ROUTE/rule/I/match/J/HOST` (dots of the hostname as `_`, `*` without one) as key
and value; then per BackendTrafficPolicy rule N one entry per header selector M,
`rule-N-match-M` (no value for a Distinct header: the request's value), or `rule-N-match--1`
for a rule without selectors.
"""

import os

import yaml

CONFIG_MAP = "envoy-gateway-config"
CONFIG_KEY = "envoy-gateway.yaml"
API_VERSION = "gateway.envoyproxy.io/v1alpha1"
UNITS = {"Second", "Minute", "Hour", "Day", "Week", "Month", "Year"}
COST_FROM = {"Number", "Metadata"}
# What Envoy Gateway sets when the policy does not say otherwise.
RUNTIME_DEFAULTS = {"RUNTIME_ROOT": "/data", "RUNTIME_SUBDIRECTORY": "ratelimit"}


def eg_config(docs):
    """The EnvoyGateway config of a render, or None."""
    for d in docs:
        if d["kind"] == "ConfigMap" and d["metadata"]["name"] == CONFIG_MAP:
            return yaml.safe_load(d["data"][CONFIG_KEY])
    return None


def rate_limit_deployment(config):
    return ((config.get("provider") or {}).get("kubernetes") or {}).get("rateLimitDeployment") or {}


def route_names(route):
    """Envoy Gateway's route descriptor of each (rule, match, hostname) of an HTTPRoute."""
    meta = route["metadata"]
    hosts = route["spec"].get("hostnames") or ["*"]
    names = []
    for i, rule in enumerate(route["spec"].get("rules") or []):
        for j, _ in enumerate(rule.get("matches") or [{}]):
            for host in hosts:
                names.append(
                    f"httproute/{meta['namespace']}/{meta['name']}/rule/{i}/match/{j}/"
                    + host.replace(".", "_")
                )
    return names


def domains_of(route, gateways):
    """The listeners (domains) a route is attached to."""
    out = []
    for ref in route["spec"].get("parentRefs") or []:
        ns = ref.get("namespace", route["metadata"]["namespace"])
        gw = gateways.get((ns, ref["name"]))
        if gw is None:
            continue
        for listener in gw["spec"]["listeners"]:
            if ref.get("sectionName") in (None, listener["name"]):
                out.append(f"{ns}/{ref['name']}/{listener['name']}")
    return out


def rule_entries(n, rule, where, fail):
    """The entries Envoy Gateway appends after the route descriptor for policy rule `n`."""
    selectors = rule.get("clientSelectors") or []
    if not selectors:
        return [(f"rule-{n}-match--1", f"rule-{n}-match--1")]
    entries = []
    for selector in selectors:
        if set(selector) - {"headers"}:
            fail(where, f"rule {n}: only header selectors are modelled by this check: {sorted(selector)}")
        for m, header in enumerate(selector.get("headers") or []):
            key = f"rule-{n}-match-{m}"
            entries.append((key, None if header.get("type") == "Distinct" else key))
    return entries


def check_policy(name, btp, routes, gateways, fail, ok):
    """Checks one BackendTrafficPolicy; returns [(domain, entries)] Envoy Gateway derives."""
    where = f"{name}: BackendTrafficPolicy {btp['metadata']['name']}"
    ns = btp["metadata"]["namespace"]
    derived = []
    rl = btp["spec"].get("rateLimit") or {}
    if rl.get("type") != "Global":
        fail(where, "rateLimit.type must be Global (the rate-limit service; Local never calls it)")
    rules = (rl.get("global") or {}).get("rules") or []
    if not rules:
        fail(where, "no global rules")
    for n, rule in enumerate(rules):
        limit = rule.get("limit") or {}
        if not isinstance(limit.get("requests"), int) or limit.get("unit") not in UNITS:
            fail(where, f"rule {n}: limit needs requests and a unit of {sorted(UNITS)}: {limit}")
        for side, cost in (rule.get("cost") or {}).items():
            source = cost.get("from")
            if side not in ("request", "response") or source not in COST_FROM:
                fail(where, f"rule {n}: cost.{side}.from must be one of {sorted(COST_FROM)}")
            elif source == "Number" and not isinstance(cost.get("number"), int):
                fail(where, f"rule {n}: cost.{side} from Number needs a number")
            elif source == "Metadata" and not {"namespace", "key"} <= set(cost.get("metadata") or {}):
                fail(where, f"rule {n}: cost.{side} from Metadata needs metadata.namespace and .key")
    for ref in btp["spec"].get("targetRefs") or []:
        route = routes.get((ns, ref["name"])) if ref.get("kind") == "HTTPRoute" else None
        if route is None:
            fail(where, f"targetRef {ref} is not an HTTPRoute of this render")
            continue
        domains = domains_of(route, gateways)
        if not domains:
            fail(where, f"HTTPRoute {ref['name']} has no parent Gateway listener in this render")
        for domain in domains:
            for route_name in route_names(route):
                for n, rule in enumerate(rules):
                    entries = [(route_name, route_name)] + rule_entries(n, rule, where, fail)
                    derived.append((domain, entries))
    ok(f"{where}: {len(rules)} global rule(s), {len(derived)} descriptor(s) Envoy Gateway sends")
    return derived


def check_container(name, config, docs, ctx):
    """The rate limiter's container of the EnvoyGateway config."""
    where = f"{name}: EnvoyGateway rateLimitDeployment"
    deployment = rate_limit_deployment(config)
    container = deployment.get("container") or {}
    image = container.get("image") or ""
    repo, _, tag = image.rpartition(":")
    if repo.rsplit("/", 1)[-1] != "sluice" or not tag or "/" in tag:
        ctx.fail(where, f"container.image must be a sluice image with a tag: {image!r}")
    env = {e["name"]: e.get("value") for e in container.get("env") or []}
    for var in env:
        if var.startswith("SLUICE_"):
            if var not in ctx.envs:
                ctx.fail(where, f"env {var} is not in `sluice serve --help`")
        elif f"`{var}`" not in ctx.migration:
            ctx.fail(where, f"env {var} is neither a SLUICE_* variable nor mapped in docs/migration.md")
    ctx.ok(f"{where}: image {image}, env {sorted(env) or 'none'}")
    if (env.get("CONFIG_TYPE") or "GRPC_XDS_SOTW").upper() != "FILE":
        return None
    runtime = {k: env.get(k) or v for k, v in RUNTIME_DEFAULTS.items()}
    path = f"{runtime['RUNTIME_ROOT']}/{runtime['RUNTIME_SUBDIRECTORY']}/config"
    mounts = {m["mountPath"]: m["name"] for m in container.get("volumeMounts") or []}
    volumes = {v["name"]: v for v in (deployment.get("pod") or {}).get("volumes") or []}
    volume = volumes.get(mounts.get(path, ""), {})
    cm_name = (volume.get("configMap") or {}).get("name")
    cms = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == cm_name]
    if not cms:
        ctx.fail(where, f"CONFIG_TYPE=FILE reads {path}, which mounts no ConfigMap of this render")
        return None
    if volume["configMap"].get("items"):
        ctx.fail(where, "mount the whole ConfigMap (no items): item mounts never update")
    ctx.check_config_dir(ctx.binary, cms[0]["data"], f"{name}: ConfigMap {cm_name}")
    return ctx.limits_of(list(cms[0]["data"].values()))


def check_render(name, docs, ctx):
    """Checks a render holding an EnvoyGateway config; returns it (None for other renders)."""
    config = eg_config(docs)
    if config is None:
        return None
    where = f"{name}: ConfigMap {CONFIG_MAP}"
    if config.get("apiVersion") != API_VERSION or config.get("kind") != "EnvoyGateway":
        ctx.fail(where, f"{CONFIG_KEY} must be an EnvoyGateway of {API_VERSION}")
    if (config.get("provider") or {}).get("type") != "Kubernetes":
        ctx.fail(where, "provider.type must be Kubernetes (rateLimitDeployment is its setting)")
    backend = (config.get("rateLimit") or {}).get("backend") or {}
    if backend.get("type") != "Redis" or ":" not in str((backend.get("redis") or {}).get("url", "")):
        ctx.fail(where, "rateLimit.backend must be Redis with a host:port url (global limits need it)")
    limits = check_container(name, config, docs, ctx)
    by_key = lambda kind: {(d["metadata"]["namespace"], d["metadata"]["name"]): d for d in docs if d["kind"] == kind}
    routes, gateways = by_key("HTTPRoute"), by_key("Gateway")
    for btp in (d for d in docs if d["kind"] == "BackendTrafficPolicy"):
        for domain, entries in check_policy(name, btp, routes, gateways, ctx.fail, ctx.ok):
            if limits is None:
                continue
            shown = ", ".join(f"{k}={v if v is not None else '<runtime>'}" for k, v in entries)
            if domain not in limits.domains:
                ctx.fail(name, f"domain `{domain}` is not in the file ({sorted(limits.domains)})")
                continue
            answer = limits.explain(domain, [entries], name)[0]
            if answer is None:
                ctx.fail(name, f"domain `{domain}`: [{shown}] reaches no limit of the file")
            else:
                ctx.ok(f"{name}: `{domain}` [{shown}] -> {answer['limit']}")
    return config


def check_helm_values(path, config, fail, ok):
    """The Helm values swap the same image and set the same rate-limit backend as `config`."""
    where = os.path.relpath(path, os.path.dirname(os.path.dirname(os.path.dirname(path))))
    with open(path, encoding="utf-8") as f:
        values = yaml.safe_load(f)
    image = (((values.get("global") or {}).get("images") or {}).get("ratelimit") or {}).get("image")
    want = (rate_limit_deployment(config).get("container") or {}).get("image")
    if image != want:
        fail(where, f"global.images.ratelimit.image {image!r} differs from the config's {want!r}")
    eg = (values.get("config") or {}).get("envoyGateway") or {}
    if eg.get("rateLimit") != config.get("rateLimit"):
        fail(where, "config.envoyGateway.rateLimit differs from the EnvoyGateway config's")
    if eg.get("gateway") != config.get("gateway"):
        fail(where, "config.envoyGateway.gateway differs from the EnvoyGateway config's")
    ok(f"{where}: image {image} and rate-limit backend as in the EnvoyGateway config")
