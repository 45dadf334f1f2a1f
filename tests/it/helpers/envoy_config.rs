//! Envoy configs for the tests, as JSON values (Envoy reads JSON as well as YAML).
//!
//! - [`render_addresses`] / [`render_shipped`]: a config `deploy/` ships, with ONLY its
//!   addresses and ports changed: the admin and every listener to `127.0.0.1:0`, each cluster's
//!   endpoints to the address the test gives for that cluster name. A socket address the
//!   rendering does not know is a failure, so nothing the test starts listens or connects
//!   beyond loopback. The shipped text itself is never copied into a test.
//!   [`with_test_filter_timeout`] is the one other change a live test makes, stated there.
//! - Builders for the configs the feature tests write themselves: [`bootstrap`],
//!   [`http_listener`], [`ratelimit_filter`], [`rlqs_filter`], [`with_access_log`],
//!   [`cluster`], [`grpc_cluster`], ...

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

/// A path of the repository.
pub fn repo_path(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(rel)
}

/// A YAML file of the repository as a JSON value.
pub fn yaml_file(path: &Path) -> Value {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("parse {}: {e}", path.display()))
}

/// Every YAML document of a file (an EnvoyFilter file may hold several).
pub fn yaml_documents(path: &Path) -> Vec<Value> {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    serde_saphyr::from_multiple(&text).unwrap_or_else(|e| panic!("parse {}: {e}", path.display()))
}

/// `{"socket_address": {...}}` for `addr`.
pub fn socket(addr: SocketAddr) -> Value {
    json!({"socket_address": {"address": addr.ip().to_string(), "port_value": addr.port()}})
}

/// `127.0.0.1:0`: a listener (or the admin) on a port the kernel picks.
pub fn any_port() -> Value {
    socket(SocketAddr::from(([127, 0, 0, 1], 0)))
}

/// `config` with its admin and listeners on `127.0.0.1:0` and each cluster's endpoints at the
/// address `clusters` gives for its name (see the module docs).
pub fn render_addresses(config: &mut Value, clusters: &[(&str, SocketAddr)]) {
    if let Some(admin) = config.pointer_mut("/admin/address") {
        *admin = any_port();
    }
    let resources = config
        .get_mut("static_resources")
        .expect("a bootstrap with static_resources");
    for listener in resources["listeners"].as_array_mut().into_iter().flatten() {
        listener["address"] = any_port();
    }
    for cluster in resources["clusters"].as_array_mut().into_iter().flatten() {
        let name = cluster["name"].as_str().expect("cluster name").to_owned();
        let addr = clusters
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, a)| *a)
            .unwrap_or_else(|| panic!("no test address for cluster {name:?}"));
        let endpoints = cluster
            .pointer_mut("/load_assignment/endpoints")
            .and_then(Value::as_array_mut)
            .unwrap_or_else(|| panic!("cluster {name:?} has no load_assignment endpoints"));
        for group in endpoints {
            for lb in group["lb_endpoints"].as_array_mut().into_iter().flatten() {
                lb["endpoint"]["address"] = socket(addr);
            }
        }
    }
    let mut stray = Vec::new();
    find_foreign_addresses(config, "", &mut stray);
    assert!(
        stray.is_empty(),
        "socket addresses the rendering does not know: {stray:?}"
    );
}

/// Socket addresses off loopback, by JSON path.
fn find_foreign_addresses(value: &Value, path: &str, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            if let Some(ip) = map.get("address").and_then(Value::as_str)
                && map.contains_key("port_value")
                && ip != "127.0.0.1"
            {
                out.push(format!("{path}: {ip}"));
            }
            for (k, v) in map {
                find_foreign_addresses(v, &format!("{path}/{k}"), out);
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                find_foreign_addresses(v, &format!("{path}/{i}"), out);
            }
        }
        _ => {}
    }
}

/// A bootstrap file of `deploy/`, rendered by [`render_addresses`].
pub fn render_shipped(rel: &str, clusters: &[(&str, SocketAddr)]) -> Value {
    let mut config = yaml_file(&repo_path(rel));
    render_addresses(&mut config, clusters);
    config
}

/// The rate-limit filter timeout of live runs of a shipped config (see
/// [`with_test_filter_timeout`]).
pub const TEST_FILTER_TIMEOUT: &str = "1s";

/// The one change a live test makes to a shipped config besides addresses: each HTTP
/// rate-limit filter's `timeout`, checked to be `shipped` (so the shipped value is still what
/// the test reads), becomes [`TEST_FILTER_TIMEOUT`]. Why: the shipped 20 ms is a production
/// budget (a release build on a host that is not saturated); the tests run a debug build on 2
/// cores shared with the rest of the suite and other builds. Measured here through the shipped
/// config with one test running: p50 1.5 ms, p99 8.8 ms, max 17 ms per request end to end; with
/// the suite's tests in parallel, stalls past 20 ms turned a few of ~600 requests into 500s in 3
/// runs of 5. What a 500 would test (the filter's timeout and failure mode at 20 ms) is tested
/// at 20 ms by `tests/it/envoy_faults.rs`; `envoy --mode validate` and the README check run the
/// shipped files unchanged.
pub fn with_test_filter_timeout(config: &mut Value, shipped: &str) {
    let mut changed = 0;
    raise_timeouts(config, shipped, &mut changed);
    assert!(changed > 0, "no HTTP rate-limit filter in the config");
}

fn raise_timeouts(value: &mut Value, shipped: &str, changed: &mut usize) {
    match value {
        Value::Object(map) => {
            if map.get("@type").and_then(Value::as_str) == Some(RATELIMIT_TYPE) {
                assert_eq!(
                    map.get("timeout").and_then(Value::as_str),
                    Some(shipped),
                    "the shipped filter timeout"
                );
                map.insert("timeout".into(), json!(TEST_FILTER_TIMEOUT));
                *changed += 1;
            }
            for v in map.values_mut() {
                raise_timeouts(v, shipped, changed);
            }
        }
        Value::Array(items) => {
            for v in items {
                raise_timeouts(v, shipped, changed);
            }
        }
        _ => {}
    }
}

const RATELIMIT_TYPE: &str =
    "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit";

/// A bootstrap: admin on an ephemeral loopback port, static listeners and clusters.
pub fn bootstrap(listeners: Vec<Value>, clusters: Vec<Value>) -> Value {
    json!({
        "admin": {"address": any_port()},
        "static_resources": {"listeners": listeners, "clusters": clusters},
    })
}

fn endpoints(name: &str, addrs: &[SocketAddr]) -> Value {
    let lb: Vec<Value> = addrs
        .iter()
        .map(|a| json!({"endpoint": {"address": socket(*a)}}))
        .collect();
    json!({"cluster_name": name, "endpoints": [{"lb_endpoints": lb}]})
}

/// A static HTTP/1.1 cluster, round robin over `addrs`.
pub fn cluster(name: &str, addrs: &[SocketAddr]) -> Value {
    json!({
        "name": name,
        "type": "STATIC",
        "connect_timeout": "0.25s",
        "lb_policy": "ROUND_ROBIN",
        "load_assignment": endpoints(name, addrs),
    })
}

/// A static HTTP/2 cluster (gRPC), round robin over `addrs`.
pub fn grpc_cluster(name: &str, addrs: &[SocketAddr]) -> Value {
    let mut c = cluster(name, addrs);
    c["typed_extension_protocol_options"] = json!({
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "explicit_http_config": {"http2_protocol_options": {}},
        }
    });
    c
}

/// A listener on an ephemeral loopback port with one HTTP connection manager: one virtual host
/// (`*`) with `routes`, then `http_filters` (the router is appended).
pub fn http_listener(name: &str, routes: Vec<Value>, mut http_filters: Vec<Value>) -> Value {
    http_filters.push(json!({
        "name": "envoy.filters.http.router",
        "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"},
    }));
    json!({
        "name": name,
        "address": any_port(),
        "filter_chains": [{"filters": [{
            "name": "envoy.filters.network.http_connection_manager",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                "stat_prefix": name,
                "use_remote_address": true,
                "route_config": {"name": name, "virtual_hosts": [{
                    "name": name, "domains": ["*"], "routes": routes,
                }]},
                "http_filters": http_filters,
            },
        }]}],
    })
}

/// A route on path `prefix` to `cluster` with route-level `rate_limits`, plus any other fields
/// of the route object in `extra` (e.g. `typed_per_filter_config`).
pub fn route(prefix: &str, cluster: &str, rate_limits: Value, extra: Value) -> Value {
    let mut r = json!({
        "match": {"prefix": prefix},
        "route": {"cluster": cluster, "rate_limits": rate_limits},
    });
    merge(&mut r, extra);
    r
}

/// The HTTP rate-limit filter calling the gRPC cluster `rls_cluster` for `domain`, with the
/// given timeout and failure mode; `extra` adds or replaces fields of its config.
pub fn ratelimit_filter(
    domain: &str,
    rls_cluster: &str,
    timeout_ms: u64,
    failure_mode_deny: bool,
    extra: Value,
) -> Value {
    let mut config = json!({
        "@type": RATELIMIT_TYPE,
        "domain": domain,
        "timeout": format!("{}s", timeout_ms as f64 / 1000.0),
        "failure_mode_deny": failure_mode_deny,
        "rate_limit_service": {
            "transport_api_version": "V3",
            "grpc_service": {"envoy_grpc": {"cluster_name": rls_cluster}},
        },
    });
    merge(&mut config, extra);
    json!({"name": "envoy.filters.http.ratelimit", "typed_config": config})
}

/// A `generic_key` action.
pub fn generic_key(key: &str, value: &str) -> Value {
    json!({"generic_key": {"descriptor_key": key, "descriptor_value": value}})
}

/// Adds `extra`'s fields to `target` (objects merge recursively; anything else replaces).
pub fn merge(target: &mut Value, extra: Value) {
    match (target, extra) {
        (Value::Object(t), Value::Object(e)) => {
            for (k, v) in e {
                merge(t.entry(k).or_insert(Value::Null), v);
            }
        }
        (t, Value::Null) if !t.is_null() => {}
        (t, e) => *t = e,
    }
}

/// The Rate Limit Quota Service filter of domain `domain` on the gRPC cluster `rlqs_cluster`:
/// every request with a `bucket_header` header goes to the bucket `{client: <its value>}`
/// (requests without it are not limited, as Envoy leaves unmatched requests), reported every
/// 5 s (Envoy 1.40 reports every 5 s whatever this says). Before a bucket's first assignment,
/// and once an assignment has expired, DENY_ALL (for 10 s, then the no-assignment DENY_ALL):
/// the blanket rules only, as a token bucket there crashes Envoy 1.40.
pub fn rlqs_filter(domain: &str, rlqs_cluster: &str, bucket_header: &str) -> Value {
    let header_input = json!({
        "@type": "type.googleapis.com/envoy.type.matcher.v3.HttpRequestHeaderMatchInput",
        "header_name": bucket_header,
    });
    json!({
        "name": "envoy.filters.http.rate_limit_quota",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaFilterConfig",
            "rlqs_server": {"envoy_grpc": {"cluster_name": rlqs_cluster}},
            "domain": domain,
            "bucket_matchers": {"matcher_list": {"matchers": [{
                "predicate": {"single_predicate": {
                    "input": {"name": "bucket_header", "typed_config": header_input},
                    "value_match": {"safe_regex": {"google_re2": {}, "regex": ".+"}},
                }},
                "on_match": {"action": {
                    "name": "bucket",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaBucketSettings",
                        "bucket_id_builder": {"bucket_id_builder": {
                            "client": {"custom_value": {"name": "client", "typed_config": header_input}},
                        }},
                        "reporting_interval": "5s",
                        "no_assignment_behavior": {"fallback_rate_limit": {"blanket_rule": "DENY_ALL"}},
                        "expired_assignment_behavior": {
                            "expired_assignment_behavior_timeout": "10s",
                            "fallback_rate_limit": {"blanket_rule": "DENY_ALL"},
                        },
                    },
                }},
            }]}},
        },
    })
}

/// Adds to `listener`'s HTTP connection manager an access log to `path`: one line per request,
/// `START_SECONDS.MILLIS STATUS CLIENT FLAGS` (the `x-client-id` header, `-` without; Envoy's
/// response flags, `RL` for a request its rate-limit filter refused).
pub fn with_access_log(listener: &mut Value, path: &Path) {
    let hcm = listener
        .pointer_mut("/filter_chains/0/filters/0/typed_config")
        .expect("an HTTP connection manager");
    hcm["access_log"] = json!([{
        "name": "envoy.access_loggers.file",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
            "path": path.display().to_string(),
            "log_format": {"text_format": "%START_TIME(%s.%3f)% %RESPONSE_CODE% %REQ(x-client-id)% %RESPONSE_FLAGS%\n"},
        },
    }]);
}
