//! The Istio EnvoyFilters of `deploy/istio/`, each applied (by `helpers/istio.rs`, a stand-in for
//! istiod's merge with Istio's matching) to an Envoy config shaped like the one istiod
//! generates for its context: the demo app's sidecar (SIDECAR_INBOUND, app port 8080) and the
//! ingress gateway (GATEWAY, port 8080 with the VirtualService routes `api`, `login`,
//! `public`). The result must pass `envoy --mode validate`, then serve live traffic through a
//! real Envoy in front of sluice with `deploy/base/limits`, limited as the file promises.
//!
//! Live runs change the rendered configs' addresses and ports (to loopback, ephemeral) and the
//! filter timeout (checked to be the shipped value first), as `helpers/envoy_config.rs`
//! explains (`with_test_filter_timeout`).

use crate::helpers;

use std::net::SocketAddr;
use std::time::Instant;

use helpers::envoy_config::{
    render_addresses, repo_path, with_test_filter_timeout, yaml_documents,
};
use helpers::istio::{Kind, Proxy, apply, gateway, sidecar_inbound};
use helpers::{Envoy, Req, TestServer, Upstream, edge_limits, free_port, test_settings};
use serde_json::Value;

const LIMITS: &str = "deploy/base/limits";
const APP_PORT: u16 = 8080;
const GATEWAY_APP: &str = "outbound|80||demo-app.sluice-demo.svc.cluster.local";
const GATEWAY_SLUICE: &str = "outbound|8081||sluice.sluice.svc.cluster.local";

fn envoy_filter(rel: &str) -> Value {
    let mut docs = yaml_documents(&repo_path(rel));
    assert_eq!(docs.len(), 1, "{rel}: one EnvoyFilter");
    docs.remove(0)
}

/// A demo-app pod of the `sidecar` overlay (namespace sluice-demo).
fn sidecar_proxy() -> Proxy {
    Proxy {
        kind: Kind::Sidecar,
        namespace: "sluice-demo",
        labels: vec![
            ("app.kubernetes.io/name", "demo-app"),
            ("sluice.io/sidecar", "true"),
        ],
    }
}

/// Istio's default ingress gateway.
fn gateway_proxy() -> Proxy {
    Proxy {
        kind: Kind::Gateway,
        namespace: "istio-system",
        labels: vec![("app", "istio-ingressgateway"), ("istio", "ingressgateway")],
    }
}

fn sidecar_rendered() -> Value {
    let mut config = sidecar_inbound(APP_PORT);
    let filter = envoy_filter("deploy/istio/sidecar/envoyfilter.yaml");
    let applied = apply(&mut config, &sidecar_proxy(), &filter);
    assert_eq!(applied.len(), 3, "{applied:#?}");
    config
}

fn gateway_rendered() -> Value {
    let mut config = gateway(
        APP_PORT,
        &[
            ("api", "/api"),
            ("login", "/login"),
            ("public", "/public"),
            ("default", "/"),
        ],
        GATEWAY_APP,
        &[(GATEWAY_APP, 80, false), (GATEWAY_SLUICE, 8081, true)],
    );
    let filter = envoy_filter("deploy/istio/gateway/envoyfilter.yaml");
    let applied = apply(&mut config, &gateway_proxy(), &filter);
    assert_eq!(applied.len(), 4, "{applied:#?}");
    config
}

/// The HTTP filter names of the first HTTP connection manager.
fn http_filter_names(config: &Value) -> Vec<String> {
    config
        .pointer(
            "/static_resources/listeners/0/filter_chains/0/filters/0/typed_config/http_filters",
        )
        .and_then(Value::as_array)
        .expect("http_filters")
        .iter()
        .map(|f| f["name"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn rendered_configs_pass_envoy_validate() {
    for (name, config) in [
        ("sidecar", sidecar_rendered()),
        ("gateway", gateway_rendered()),
    ] {
        assert_eq!(
            http_filter_names(&config),
            [
                "envoy.filters.http.cors",
                "envoy.filters.http.fault",
                "envoy.filters.http.ratelimit",
                "envoy.filters.http.router"
            ],
            "{name}: the rate-limit filter goes right before the router"
        );
        let text = serde_json::to_string_pretty(&config).unwrap();
        if let Err(e) = helpers::envoy::validate(&text) {
            panic!("{name}: envoy --mode validate:\n{e}\nconfig:\n{text}");
        }
    }
}

/// The renderer's matching is not vacuous: an EnvoyFilter selecting other workloads, or a patch
/// for a port the proxy does not serve, is refused (istiod would skip it silently).
#[test]
fn renderer_refuses_what_istio_would_not_apply() {
    let gateway_filter = envoy_filter("deploy/istio/gateway/envoyfilter.yaml");
    let sidecar_filter = envoy_filter("deploy/istio/sidecar/envoyfilter.yaml");
    let message = |f: Box<dyn FnOnce() + std::panic::UnwindSafe>| -> String {
        let err = std::panic::catch_unwind(f).expect_err("the renderer must refuse");
        err.downcast_ref::<String>().cloned().unwrap_or_default()
    };
    let m = message(Box::new(move || {
        let mut config = sidecar_inbound(APP_PORT);
        let proxy = Proxy {
            namespace: "istio-system",
            ..sidecar_proxy()
        };
        apply(&mut config, &proxy, &gateway_filter);
    }));
    assert!(m.contains("workloadSelector istio"), "{m}");
    let m = message(Box::new(move || {
        let mut config = sidecar_inbound(9090);
        apply(&mut config, &sidecar_proxy(), &sidecar_filter);
    }));
    assert!(m.contains("matches nothing"), "{m}");
}

/// Starts Envoy on the sidecar config with the inbound listener on a free port and its filter
/// chain matching that port (as 8080 after iptables capture); retried if the port is taken
/// meanwhile. Returns Envoy and the port.
fn start_sidecar(mut config: Value) -> (Envoy, SocketAddr) {
    let mut last = String::new();
    for _ in 0..3 {
        let port = free_port();
        let listener = &mut config["static_resources"]["listeners"][0];
        listener["address"]["socket_address"]["port_value"] = port.into();
        listener["filter_chains"][0]["filter_chain_match"]["destination_port"] = port.into();
        match Envoy::try_start(&serde_json::to_string(&config).unwrap()) {
            Ok(envoy) => return (envoy, SocketAddr::from(([127, 0, 0, 1], port))),
            Err(e) => last = e,
        }
    }
    panic!("Envoy did not start on 3 free ports: {last}");
}

/// The sidecar filter's promise: every request to the workload sends [endpoint=api],
/// [endpoint=api, remote_address] (and [endpoint=api, api_key] with x-api-key), so each client
/// gets 120 per minute, with sluice's headers only (no enable_x_ratelimit_headers there).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sidecar_envoyfilter_limits_live_traffic() {
    let sluice = TestServer::start(test_settings(&repo_path(LIMITS), None));
    let upstream = Upstream::start();
    let mut config = sidecar_rendered();
    let inbound_cluster = format!("inbound|{APP_PORT}||");
    render_addresses(
        &mut config,
        &[
            (inbound_cluster.as_str(), upstream.addr),
            ("sluice_local", sluice.grpc_addr),
        ],
    );
    with_test_filter_timeout(&mut config, "0.020s");
    let (_envoy, inbound) = start_sidecar(config);
    let since = Instant::now();
    let other = Req::get("/").from("127.0.0.2").send(inbound).await;
    edge_limits::assert_visible(&other, 1, 120, None, since);
    edge_limits::api(inbound, "/orders/17", None, "127.0.0.1").await;
    // The other client is still admitted (its tightest limit may now be the workload's 200 per
    // second, which the first client's burst used).
    let other = Req::get("/").from("127.0.0.2").send(inbound).await;
    assert_eq!(other.status, 200, "{other:?}");
}

/// The gateway filter's promise, route by route: /login 5 and /api 120 per minute per client,
/// /public 60 with the remaining count hidden, any other route not limited; sluice's headers
/// only (the filter leaves Envoy's X-RateLimit-* off).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_envoyfilter_limits_live_traffic() {
    let sluice = TestServer::start(test_settings(&repo_path(LIMITS), None));
    let upstream = Upstream::start();
    let mut config = gateway_rendered();
    render_addresses(
        &mut config,
        &[
            (GATEWAY_APP, upstream.addr),
            (GATEWAY_SLUICE, sluice.grpc_addr),
        ],
    );
    with_test_filter_timeout(&mut config, "0.050s");
    let envoy = Envoy::start_json(&config);
    let addr = envoy.listener(&format!("0.0.0.0_{APP_PORT}"));
    edge_limits::login(addr, "/login", None).await;
    edge_limits::api(addr, "/api/orders", None, "127.0.0.1").await;
    edge_limits::public(addr, "/public/index.html", "127.0.0.3").await;
    edge_limits::not_limited(addr, "/").await;
}
