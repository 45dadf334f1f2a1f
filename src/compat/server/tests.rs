use std::collections::HashMap;

use super::super::tests::run;
use super::super::xds::tests::ENVOY_GATEWAY;
use super::super::{Translation, translate};
use super::with_ratelimit_defaults;

/// What Envoy Gateway sets on its rate-limit Deployment besides its xDS and file part
/// (`super::super::xds::tests::ENVOY_GATEWAY`): Redis and Prometheus on.
const ENVOY_GATEWAY_SERVER: &[(&str, &str)] = &[
    ("LOG_LEVEL", "info"),
    ("USE_STATSD", "false"),
    ("GRPC_SERVER_USE_TLS", "true"),
    ("GRPC_SERVER_TLS_CERT", "/certs/tls.crt"),
    ("GRPC_SERVER_TLS_KEY", "/certs/tls.key"),
    ("GRPC_SERVER_TLS_CA_CERT", "/certs/ca.crt"),
    ("REDIS_SOCKET_TYPE", "tcp"),
    ("REDIS_URL", "redis.redis.svc:6379"),
    ("USE_PROMETHEUS", "true"),
    ("PROMETHEUS_ADDR", ":19001"),
    ("PROMETHEUS_MAPPER_YAML", "/etc/statsd-exporter/conf.yaml"),
];

/// As `/bin/ratelimit` reads them: `vars`, with envoyproxy/ratelimit's defaults.
fn as_ratelimit(vars: &[(&str, &str)]) -> Translation {
    let env: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    let get = |name: &str| env.get(name).cloned();
    let with_defaults = with_ratelimit_defaults(&get);
    translate(&with_defaults)
}

#[test]
fn the_envoy_gateway_environment_is_honoured_or_accepted_with_a_reason() {
    let t = as_ratelimit(&[ENVOY_GATEWAY, ENVOY_GATEWAY_SERVER].concat());
    let expect = [
        ("SLUICE_CONFIG_XDS", "https://envoy-gateway:18001"),
        ("SLUICE_CONFIG_XDS_NODE_ID", "envoy-ratelimit"),
        ("SLUICE_CONFIG_XDS_CLIENT_CERT", "/certs/tls.crt"),
        ("SLUICE_CONFIG_XDS_CLIENT_KEY", "/certs/tls.key"),
        ("SLUICE_CONFIG_XDS_CA_FILE", "/certs/ca.crt"),
        ("SLUICE_FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
        // /healthcheck answers OK before the first config, as envoyproxy/ratelimit does there.
        ("SLUICE_HEALTH_REQUIRES_CONFIG", "never"),
        ("SLUICE_GRPC_TLS_CERT", "/certs/tls.crt"),
        ("SLUICE_GRPC_TLS_KEY", "/certs/tls.key"),
        ("SLUICE_GRPC_CLIENT_CA", "/certs/ca.crt"),
        ("SLUICE_REDIS_URL", "redis://redis.redis.svc:6379"),
        ("SLUICE_METRICS_ADDR", "0.0.0.0:19001"),
        ("SLUICE_METRICS_RATELIMIT_NAMES", "true"),
        ("SLUICE_METRICS_MAPPER", "/etc/statsd-exporter/conf.yaml"),
        ("SLUICE_LOG", "info"),
        // envoyproxy/ratelimit's defaults: Envoy Gateway sets neither port.
        ("SLUICE_GRPC_ADDR", "0.0.0.0:8081"),
        ("SLUICE_ADMIN_ADDR", "0.0.0.0:8080"),
    ];
    for (k, v) in expect {
        assert_eq!(t.set.get(k).map(String::as_str), Some(v), "{k}: {t:#?}");
    }
    assert_eq!(t.set.len(), expect.len(), "{t:#?}");
    assert!(t.errors.is_empty(), "{t:#?}");
    // Each variable not applied as is says why, once.
    let noted = [
        "RUNTIME_ROOT ignored: CONFIG_TYPE=GRPC_XDS_SOTW",
        "RUNTIME_WATCH_ROOT ignored: CONFIG_TYPE=GRPC_XDS_SOTW",
        "GRPC_SERVER_TLS_CA_CERT: client certificates are verified against it",
    ];
    for start in noted {
        assert!(
            t.notes.iter().any(|n| n.starts_with(start)),
            "{start}: {t:#?}"
        );
    }
    assert_eq!(t.notes.len(), noted.len(), "{t:#?}");
}

#[test]
fn envoyproxy_ratelimit_defaults_apply_under_its_name_only() {
    // Nothing set: the ports and the runtime directory upstream would use.
    let t = as_ratelimit(&[]);
    assert_eq!(t.set["SLUICE_GRPC_ADDR"], "0.0.0.0:8081");
    assert_eq!(t.set["SLUICE_ADMIN_ADDR"], "0.0.0.0:8080");
    assert_eq!(t.set["SLUICE_CONFIG"], "/srv/runtime_data/current/config");
    assert!(t.notes.is_empty(), "{t:#?}");
    // A SLUICE_* variable that is set is not contradicted by a default.
    let t = as_ratelimit(&[
        ("SLUICE_ADMIN_ADDR", "127.0.0.1:9102"),
        ("GRPC_PORT", "9000"),
    ]);
    assert!(!t.set.contains_key("SLUICE_ADMIN_ADDR"), "{t:#?}");
    assert_eq!(t.set["SLUICE_GRPC_ADDR"], "0.0.0.0:9000");
    assert!(t.notes.is_empty(), "{t:#?}");
    // Under the name sluice, nothing is invented.
    assert!(run(&[]).set.is_empty());
}

#[test]
fn grpc_tls_variables() {
    // Both CA variables: clients of either CA are accepted; the SAN is checked.
    let t = run(&[
        ("GRPC_SERVER_USE_TLS", "true"),
        ("GRPC_SERVER_TLS_CERT", "/c/tls.crt"),
        ("GRPC_SERVER_TLS_KEY", "/c/tls.key"),
        ("GRPC_CLIENT_TLS_CACERT", "/c/clients.crt"),
        ("GRPC_SERVER_TLS_CA_CERT", "/c/ca.crt"),
        ("GRPC_CLIENT_TLS_SAN", "envoy.test"),
    ]);
    assert_eq!(t.set["SLUICE_GRPC_CLIENT_CA"], "/c/clients.crt,/c/ca.crt");
    assert_eq!(t.set["SLUICE_GRPC_CLIENT_SAN"], "envoy.test");
    assert!(t.notes.is_empty() && t.errors.is_empty(), "{t:#?}");
    // envoyproxy/ratelimit's own variable alone: the same as upstream, nothing to say.
    let t = run(&[
        ("GRPC_SERVER_USE_TLS", "true"),
        ("GRPC_SERVER_TLS_CERT", "/c/tls.crt"),
        ("GRPC_SERVER_TLS_KEY", "/c/tls.key"),
        ("GRPC_CLIENT_TLS_CACERT", "/c/ca.crt"),
    ]);
    assert_eq!(t.set["SLUICE_GRPC_CLIENT_CA"], "/c/ca.crt");
    assert!(t.notes.is_empty(), "{t:#?}");
    // TLS without a CA: server TLS only; a SAN then has nothing to check.
    let t = run(&[
        ("GRPC_SERVER_USE_TLS", "true"),
        ("GRPC_SERVER_TLS_CERT", "/c/tls.crt"),
        ("GRPC_SERVER_TLS_KEY", "/c/tls.key"),
        ("GRPC_CLIENT_TLS_SAN", "envoy.test"),
    ]);
    assert!(!t.set.contains_key("SLUICE_GRPC_CLIENT_CA"));
    assert!(
        t.notes[0].starts_with("GRPC_CLIENT_TLS_SAN ignored: no client CA"),
        "{t:#?}"
    );
    // TLS asked for without its files: no start (never plaintext instead).
    let t = run(&[
        ("GRPC_SERVER_USE_TLS", "true"),
        ("GRPC_SERVER_TLS_CERT", "/c"),
    ]);
    assert_eq!(
        t.errors,
        ["GRPC_SERVER_USE_TLS=true needs GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY"]
    );
    // TLS off: its files are reported, not applied.
    let t = run(&[
        ("GRPC_SERVER_USE_TLS", "false"),
        ("GRPC_SERVER_TLS_CERT", "/c"),
    ]);
    assert!(t.set.is_empty(), "{t:#?}");
    assert_eq!(
        t.notes,
        ["GRPC_SERVER_TLS_CERT ignored: GRPC_SERVER_USE_TLS is not true"]
    );
}

#[test]
fn runtime_ignoredotfiles_false_is_reported() {
    let t = run(&[("RUNTIME_IGNOREDOTFILES", "false")]);
    assert_eq!(t.notes.len(), 1, "{t:#?}");
    assert!(t.notes[0].starts_with("RUNTIME_IGNOREDOTFILES=false ignored"));
}
