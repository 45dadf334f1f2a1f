//! A small stand-in for istiod's EnvoyFilter merge, so the EnvoyFilters in `deploy/istio/` can be
//! applied to Envoy configs and run by a real Envoy.
//!
//! [`sidecar_inbound`] and [`gateway`] build bootstraps shaped like the ones istiod generates
//! for a pod's sidecar (the `virtualInbound` listener with the app port's filter chain and its
//! inline route configuration `inbound|PORT||`, the `inbound|PORT||` cluster) and for the
//! ingress gateway (listener `0.0.0.0_PORT` with route configuration `http.PORT`, the routes
//! named after the VirtualService's HTTP routes, `outbound|PORT||HOST` clusters), with the
//! vanilla Envoy filters istiod puts there (Istio's own, such as `istio.stats`, exist only in
//! istio-proxy). [`apply`] implements the patch operations the files use (ADD, INSERT_BEFORE,
//! MERGE) with Istio's matching: workload selector and namespace, `context` (SIDECAR_INBOUND,
//! SIDECAR_OUTBOUND, GATEWAY, ANY), `listener` (`portNumber`, `name`,
//! `filterChain.filter.name`, `filterChain.filter.subFilter.name`) and `routeConfiguration`
//! (`portNumber`, `name`, `vhost.name`, `vhost.route.name`); MERGE is proto merge (messages
//! merge, repeated fields append, scalars replace). A match field or an operation it does not
//! implement is a loud failure, and so is a patch that matches nothing, which istiod would
//! skip silently.
//!
//! What it cannot show (deploy/README.md says so too): istiod's own merge code, xDS delivery
//! (routes come by RDS in a mesh; they are inline here), iptables capture into port 15006.

use serde_json::{Map, Value, json};

use super::envoy_config::socket;

pub const HCM: &str = "envoy.filters.network.http_connection_manager";
const HCM_TYPE: &str = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager";
/// Istio's root namespace: an EnvoyFilter there applies to every namespace.
const ROOT_NAMESPACE: &str = "istio-system";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Sidecar,
    Gateway,
}

/// The proxy a config is generated for.
pub struct Proxy {
    pub kind: Kind,
    pub namespace: &'static str,
    pub labels: Vec<(&'static str, &'static str)>,
}

fn http_filter(name: &str, type_url: &str) -> Value {
    json!({"name": name, "typed_config": {"@type": type_url}})
}

/// The HTTP filters istiod configures that vanilla Envoy has (router last).
fn istio_http_filters() -> Vec<Value> {
    vec![
        http_filter(
            "envoy.filters.http.cors",
            "type.googleapis.com/envoy.extensions.filters.http.cors.v3.Cors",
        ),
        http_filter(
            "envoy.filters.http.fault",
            "type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault",
        ),
        http_filter(
            "envoy.filters.http.router",
            "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router",
        ),
    ]
}

fn hcm(stat_prefix: &str, use_remote_address: bool, route_config: Value) -> Value {
    json!({"name": HCM, "typed_config": {
        "@type": HCM_TYPE,
        "stat_prefix": stat_prefix,
        "use_remote_address": use_remote_address,
        "normalize_path": true,
        "route_config": route_config,
        "http_filters": istio_http_filters(),
    }})
}

fn static_cluster(name: &str, host: &str, port: u16, http2: bool) -> Value {
    let addr = format!("{host}:{port}").parse().expect("cluster address");
    let mut c = json!({
        "name": name,
        "type": "STATIC",
        "connect_timeout": "10s",
        "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [
            {"endpoint": {"address": socket(addr)}}
        ]}]},
    });
    if http2 {
        c["typed_extension_protocol_options"] = json!({
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": {"http2_protocol_options": {}},
            }
        });
    }
    c
}

fn admin() -> Value {
    json!({"address": {"socket_address": {"address": "127.0.0.1", "port_value": 15000}}})
}

/// The sidecar of a pod serving HTTP on `app_port` (inbound side only: what SIDECAR_INBOUND
/// patches see).
pub fn sidecar_inbound(app_port: u16) -> Value {
    let cluster = format!("inbound|{app_port}||");
    let route_config = json!({
        "name": cluster,
        "validate_clusters": false,
        "virtual_hosts": [{
            "name": format!("inbound|http|{app_port}"),
            "domains": ["*"],
            "routes": [{
                "name": "default",
                "match": {"prefix": "/"},
                "route": {"cluster": cluster, "timeout": "0s"},
            }],
        }],
    });
    json!({
        "admin": admin(),
        "static_resources": {
            "listeners": [{
                "name": "virtualInbound",
                "address": {"socket_address": {"address": "0.0.0.0", "port_value": 15006}},
                "traffic_direction": "INBOUND",
                "listener_filters": [{
                    "name": "envoy.filters.listener.tls_inspector",
                    "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.listener.tls_inspector.v3.TlsInspector"},
                }],
                "filter_chains": [{
                    "name": format!("0.0.0.0_{app_port}"),
                    "filter_chain_match": {"destination_port": app_port, "transport_protocol": "raw_buffer"},
                    "filters": [hcm(&format!("inbound_0.0.0.0_{app_port}"), false, route_config)],
                }],
            }],
            "clusters": [static_cluster(&cluster, "127.0.0.1", app_port, false)],
        },
    })
}

/// The ingress gateway listening on `port` (its Gateway server's target port), routing the
/// VirtualService's named HTTP routes (`(name, path prefix)`) to `app_cluster`; `clusters` are
/// the outbound clusters istiod generates for the mesh's services: `(name, port, http2)`.
pub fn gateway(
    port: u16,
    routes: &[(&str, &str)],
    app_cluster: &str,
    clusters: &[(&str, u16, bool)],
) -> Value {
    let routes: Vec<Value> = routes
        .iter()
        .map(|(name, prefix)| {
            json!({
                "name": name,
                "match": {"prefix": prefix},
                "route": {"cluster": app_cluster, "timeout": "0s"},
            })
        })
        .collect();
    let route_config = json!({
        "name": format!("http.{port}"),
        "validate_clusters": false,
        "virtual_hosts": [{"name": "*:80", "domains": ["*"], "routes": routes}],
    });
    let listener_name = format!("0.0.0.0_{port}");
    json!({
        "admin": admin(),
        "static_resources": {
            "listeners": [{
                "name": listener_name,
                "address": {"socket_address": {"address": "0.0.0.0", "port_value": port}},
                "filter_chains": [{"filters": [hcm(&format!("outbound_{listener_name}"), true, route_config)]}],
            }],
            "clusters": clusters
                .iter()
                .map(|(name, port, http2)| static_cluster(name, "127.0.0.1", *port, *http2))
                .collect::<Vec<_>>(),
        },
    })
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Direction {
    Inbound,
    Outbound,
}

/// Whether a patch's `context` selects a part of `kind`'s config facing `direction`.
fn context_matches(context: &str, kind: Kind, direction: Direction) -> bool {
    match context {
        "ANY" => true,
        "GATEWAY" => kind == Kind::Gateway,
        "SIDECAR_INBOUND" => kind == Kind::Sidecar && direction == Direction::Inbound,
        "SIDECAR_OUTBOUND" => kind == Kind::Sidecar && direction == Direction::Outbound,
        other => panic!("unknown patch context {other}"),
    }
}

/// Panics on a key of `object` the renderer does not implement.
fn only_keys(object: &Value, allowed: &[&str], what: &str) {
    for key in object.as_object().into_iter().flat_map(Map::keys) {
        assert!(
            allowed.contains(&key.as_str()),
            "{what}.{key}: not implemented by the test renderer"
        );
    }
}

/// Proto merge of `value` into `target`: messages merge, repeated fields append, scalars (and
/// anything of another shape) replace.
pub fn proto_merge(target: &mut Value, value: &Value) {
    match (target, value) {
        (Value::Object(t), Value::Object(v)) => {
            for (k, v) in v {
                match t.get_mut(k) {
                    Some(existing) => proto_merge(existing, v),
                    None => {
                        t.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (Value::Array(t), Value::Array(v)) => t.extend(v.iter().cloned()),
        (t, v) => *t = v.clone(),
    }
}

fn port_of_listener(listener: &Value) -> Option<u64> {
    listener["address"]["socket_address"]["port_value"].as_u64()
}

/// The port a route configuration serves, from istiod's names: `inbound|PORT||`, `http.PORT`.
fn port_of_route_config(name: &str) -> Option<u64> {
    name.strip_prefix("inbound|")
        .and_then(|r| r.split('|').next())
        .or_else(|| name.strip_prefix("http."))
        .and_then(|p| p.parse().ok())
}

/// Applies the EnvoyFilter `filter` to `config`, generated for `proxy`. Returns one line per
/// applied patch (what matched). Panics if the filter does not select the proxy, or a patch
/// matches nothing.
pub fn apply(config: &mut Value, proxy: &Proxy, filter: &Value) -> Vec<String> {
    assert_eq!(filter["kind"], "EnvoyFilter");
    let name = filter["metadata"]["name"].as_str().unwrap_or("?");
    let namespace = filter["metadata"]["namespace"]
        .as_str()
        .unwrap_or("default");
    assert!(
        namespace == proxy.namespace || namespace == ROOT_NAMESPACE,
        "EnvoyFilter {name} in namespace {namespace} does not apply to a proxy in {}",
        proxy.namespace
    );
    let spec = &filter["spec"];
    only_keys(spec, &["workloadSelector", "configPatches"], "spec");
    let selector = spec["workloadSelector"]["labels"].as_object();
    for (k, v) in selector.into_iter().flatten() {
        assert!(
            proxy
                .labels
                .iter()
                .any(|(pk, pv)| pk == k && Some(*pv) == v.as_str()),
            "EnvoyFilter {name}: workloadSelector {k}={v} does not select the proxy"
        );
    }
    let mut applied = Vec::new();
    for (i, patch) in spec["configPatches"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        only_keys(patch, &["applyTo", "match", "patch"], "configPatches[]");
        only_keys(&patch["patch"], &["operation", "value"], "patch");
        let apply_to = patch["applyTo"].as_str().expect("applyTo");
        let op = patch["patch"]["operation"].as_str().expect("operation");
        let m = &patch["match"];
        only_keys(m, &["context", "listener", "routeConfiguration"], "match");
        let context = m["context"].as_str().unwrap_or("ANY");
        let value = &patch["patch"]["value"];
        let hits = match (apply_to, op) {
            ("CLUSTER", "ADD") => add_cluster(config, proxy.kind, context, value),
            ("HTTP_FILTER", "INSERT_BEFORE") => {
                insert_http_filter(config, proxy.kind, context, &m["listener"], value)
            }
            ("VIRTUAL_HOST" | "HTTP_ROUTE", "MERGE") => merge_routes(
                config,
                proxy.kind,
                context,
                apply_to,
                &m["routeConfiguration"],
                value,
            ),
            _ => panic!("{apply_to} {op}: not implemented by the test renderer"),
        };
        assert!(
            !hits.is_empty(),
            "EnvoyFilter {name}, patch {i} ({apply_to} {op}): matches nothing in the {:?} config",
            proxy.kind
        );
        applied.push(format!("{name}[{i}] {apply_to} {op}: {}", hits.join(", ")));
    }
    applied
}

fn add_cluster(config: &mut Value, kind: Kind, context: &str, value: &Value) -> Vec<String> {
    let fits = match kind {
        Kind::Gateway => context_matches(context, kind, Direction::Outbound),
        Kind::Sidecar => {
            context_matches(context, kind, Direction::Inbound)
                || context_matches(context, kind, Direction::Outbound)
        }
    };
    if !fits {
        return Vec::new();
    }
    let clusters = config["static_resources"]["clusters"]
        .as_array_mut()
        .expect("clusters");
    clusters.push(value.clone());
    vec![format!("cluster {}", value["name"])]
}

fn direction_of(listener: &Value) -> Direction {
    if listener["traffic_direction"] == "INBOUND" {
        Direction::Inbound
    } else {
        Direction::Outbound
    }
}

fn insert_http_filter(
    config: &mut Value,
    kind: Kind,
    context: &str,
    lmatch: &Value,
    value: &Value,
) -> Vec<String> {
    only_keys(lmatch, &["portNumber", "name", "filterChain"], "listener");
    let chain_match = &lmatch["filterChain"];
    only_keys(chain_match, &["filter"], "listener.filterChain");
    let fmatch = &chain_match["filter"];
    only_keys(
        fmatch,
        &["name", "subFilter"],
        "listener.filterChain.filter",
    );
    only_keys(&fmatch["subFilter"], &["name"], "filter.subFilter");
    let port = lmatch["portNumber"].as_u64();
    let sub = fmatch["subFilter"]["name"].as_str();
    let mut hits = Vec::new();
    let listeners = config["static_resources"]["listeners"]
        .as_array_mut()
        .expect("listeners");
    for listener in listeners {
        let lname = listener["name"].as_str().unwrap_or_default().to_owned();
        if !context_matches(context, kind, direction_of(listener))
            || lmatch["name"].as_str().is_some_and(|n| n != lname)
        {
            continue;
        }
        // istiod matches a port on virtualInbound by each filter chain's destination port.
        let virtual_inbound = lname == "virtualInbound";
        if port.is_some() && !virtual_inbound && port != port_of_listener(listener) {
            continue;
        }
        for chain in listener["filter_chains"]
            .as_array_mut()
            .into_iter()
            .flatten()
        {
            let dest = chain["filter_chain_match"]["destination_port"].as_u64();
            if virtual_inbound && port.is_some() && port != dest {
                continue;
            }
            for nf in chain["filters"].as_array_mut().into_iter().flatten() {
                if fmatch["name"].as_str().is_some_and(|n| nf["name"] != n) || nf["name"] != HCM {
                    continue;
                }
                let filters = nf["typed_config"]["http_filters"]
                    .as_array_mut()
                    .expect("http_filters");
                let at = match sub {
                    None => Some(0),
                    Some(sub) => filters.iter().position(|f| f["name"] == sub),
                };
                if let Some(at) = at {
                    filters.insert(at, value.clone());
                    hits.push(format!("listener {lname} before {}", sub.unwrap_or("all")));
                }
            }
        }
    }
    hits
}

fn merge_routes(
    config: &mut Value,
    kind: Kind,
    context: &str,
    apply_to: &str,
    rmatch: &Value,
    value: &Value,
) -> Vec<String> {
    only_keys(
        rmatch,
        &["portNumber", "name", "vhost"],
        "routeConfiguration",
    );
    only_keys(
        &rmatch["vhost"],
        &["name", "route"],
        "routeConfiguration.vhost",
    );
    only_keys(&rmatch["vhost"]["route"], &["name"], "vhost.route");
    let port = rmatch["portNumber"].as_u64();
    let vhost_name = rmatch["vhost"]["name"].as_str();
    let route_name = rmatch["vhost"]["route"]["name"].as_str();
    let mut hits = Vec::new();
    let listeners = config["static_resources"]["listeners"]
        .as_array_mut()
        .expect("listeners");
    for listener in listeners {
        if !context_matches(context, kind, direction_of(listener)) {
            continue;
        }
        for chain in listener["filter_chains"]
            .as_array_mut()
            .into_iter()
            .flatten()
        {
            for nf in chain["filters"].as_array_mut().into_iter().flatten() {
                let Some(rc) = nf.pointer_mut("/typed_config/route_config") else {
                    continue;
                };
                let rc_name = rc["name"].as_str().unwrap_or_default().to_owned();
                if rmatch["name"].as_str().is_some_and(|n| n != rc_name)
                    || (port.is_some() && port != port_of_route_config(&rc_name))
                {
                    continue;
                }
                for vh in rc["virtual_hosts"].as_array_mut().into_iter().flatten() {
                    let vh_name = vh["name"].as_str().unwrap_or_default().to_owned();
                    if vhost_name.is_some_and(|n| n != vh_name) {
                        continue;
                    }
                    if apply_to == "VIRTUAL_HOST" {
                        proto_merge(vh, value);
                        hits.push(format!("{rc_name} vhost {vh_name}"));
                        continue;
                    }
                    for route in vh["routes"].as_array_mut().into_iter().flatten() {
                        if route_name.is_some_and(|n| route["name"] != n) {
                            continue;
                        }
                        proto_merge(route, value);
                        hits.push(format!("{rc_name} route {}", route["name"]));
                    }
                }
            }
        }
    }
    hits
}
