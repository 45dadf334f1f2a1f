//! `deploy/envoy/envoy.yaml` as shipped (only its addresses and ports rendered, see
//! `helpers/envoy_config.rs`), a real Envoy, in front of sluice serving `deploy/base/limits`:
//! real HTTP from clients on distinct loopback addresses, statuses and headers as the client
//! sees them, on the memory backend, on Redis and on a 3-node Redis Cluster. Also: the
//! descriptors Envoy really sends for every route each reach a limit of the limits file, and
//! three sluice replicas behind one Envoy cluster share one Redis exactly.
//!
//! The shipped filter's timeout (20 ms, checked) is raised for these live runs, the one change
//! besides addresses: `helpers/envoy_config.rs` (`with_test_filter_timeout`) says why;
//! `tests/it/envoy_faults.rs` tests the filter at 20 ms.

use crate::helpers;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use helpers::Upstream;
use helpers::envoy_config::{
    bootstrap, cluster, generic_key, grpc_cluster, http_listener, ratelimit_filter, render_shipped,
    repo_path, route, with_test_filter_timeout,
};
use helpers::{Envoy, RedisCluster, RedisServer, Req, TestServer, edge_limits, test_settings};
use serde_json::{Value, json};
use sluice::config::{Config, TraceEnd};
use sluice::descriptor::Entry;
use sluice::proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use sluice::proto::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use sluice::proto::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tonic::transport::Channel;

const SHIPPED: &str = "deploy/envoy/envoy.yaml";
const LIMITS: &str = "deploy/base/limits";

/// Envoy with the shipped config in front of the RLS at `rls` and `upstream`; its `ingress`
/// listener.
fn shipped_envoy(rls: SocketAddr, upstream: &Upstream) -> (Envoy, SocketAddr) {
    let mut config = render_shipped(SHIPPED, &[("app", upstream.addr), ("sluice", rls)]);
    with_test_filter_timeout(&mut config, "0.020s");
    let envoy = Envoy::start_json(&config);
    let ingress = envoy.listener("ingress");
    (envoy, ingress)
}

/// Every promise of `deploy/base/limits` through the shipped Envoy config at `ingress`, Envoy's
/// own X-RateLimit-* included (`enable_x_ratelimit_headers`; off on /public).
async fn shipped_config_keeps_the_limits_promises(ingress: SocketAddr) {
    edge_limits::login(ingress, "/login", Some("5, 300;w=60, 5;w=60")).await;
    let x_api = "120, 200;w=1, 120;w=60, 600;w=60";
    edge_limits::api(ingress, "/api/orders", Some(x_api), "127.0.0.1").await;
    edge_limits::public(ingress, "/public/index.html", "127.0.0.3").await;
    edge_limits::not_limited(ingress, "/").await;
}

fn limits() -> std::path::PathBuf {
    repo_path(LIMITS)
}

/// The shipped config in front of sluice on `redis_url` (memory without).
async fn shipped_on(redis_url: Option<String>) {
    let sluice = TestServer::start(test_settings(&limits(), redis_url.as_deref()));
    let upstream = Upstream::start();
    let (_envoy, ingress) = shipped_envoy(sluice.grpc_addr, &upstream);
    shipped_config_keeps_the_limits_promises(ingress).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shipped_envoy_config_on_memory() {
    shipped_on(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shipped_envoy_config_on_redis() {
    let redis = RedisServer::start();
    shipped_on(Some(redis.url())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shipped_envoy_config_on_redis_cluster() {
    let redis = RedisCluster::start();
    shipped_on(Some(redis.url())).await;
}

/// An RLS between Envoy and sluice that records every request and forwards it.
struct Recorder {
    sluice: RateLimitServiceClient<Channel>,
    seen: Arc<Mutex<Vec<RateLimitRequest>>>,
}

#[tonic::async_trait]
impl RateLimitService for Recorder {
    async fn should_rate_limit(
        &self,
        request: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        let request = request.into_inner();
        self.seen.lock().unwrap().push(request.clone());
        self.sluice.clone().should_rate_limit(request).await
    }
}

/// Serves `recorder` on an ephemeral loopback port (in the test's runtime).
async fn serve_recorder(recorder: Recorder) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(RateLimitServiceServer::new(recorder))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    addr
}

/// The descriptors Envoy really sends for each route of the shipped config (recorded between
/// Envoy and sluice) each reach a limit of `deploy/base/limits` by sluice's own matching: a
/// descriptor matching no rule would be silently admitted (envoyproxy/ratelimit's semantics),
/// so it fails here. Every route with `rate_limits` is visited; the others call nobody.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_descriptor_envoy_sends_reaches_a_limit() {
    let config = Config::load(&limits()).expect("deploy/base/limits loads");
    let sluice = TestServer::start(test_settings(&limits(), None));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let rls = serve_recorder(Recorder {
        sluice: sluice.client().await,
        seen: seen.clone(),
    })
    .await;
    let upstream = Upstream::start();
    let rendered = render_shipped(SHIPPED, &[("app", upstream.addr), ("sluice", rls)]);
    let (_envoy, ingress) = shipped_envoy(rls, &upstream);
    let routes = rendered
        .pointer("/static_resources/listeners/0/filter_chains/0/filters/0/typed_config/route_config/virtual_hosts/0/routes")
        .and_then(Value::as_array)
        .expect("the shipped config's routes")
        .clone();
    let mut limited_routes = 0;
    for r in &routes {
        let prefix = r["match"]["prefix"].as_str().expect("prefix routes");
        let expected = r["route"]["rate_limits"].as_array().map_or(0, Vec::len);
        seen.lock().unwrap().clear();
        let resp = Req::get(prefix)
            .header("x-api-key", "k1")
            .send(ingress)
            .await;
        assert_eq!(resp.status, 200, "{prefix}: {resp:?}");
        let calls = std::mem::take(&mut *seen.lock().unwrap());
        if expected == 0 {
            assert!(
                calls.is_empty(),
                "{prefix} has no rate_limits but called: {calls:?}"
            );
            continue;
        }
        limited_routes += 1;
        assert_eq!(calls.len(), 1, "{prefix}: one RLS call per request");
        let call = &calls[0];
        assert_eq!(
            call.descriptors.len(),
            expected,
            "{prefix}: one descriptor per rate_limits entry (x-api-key sent): {call:?}"
        );
        for d in &call.descriptors {
            let entries: Vec<Entry> = d
                .entries
                .iter()
                .map(|e| Entry::new(&e.key, &e.value))
                .collect();
            let trace = config.trace(&call.domain, &entries);
            let explained =
                sluice::explain::explain(&config, &call.domain, std::slice::from_ref(&entries));
            assert!(
                matches!(trace.end, TraceEnd::Matched { .. }),
                "{prefix}: {explained}"
            );
            let rule = trace.steps.last().expect("a matched rule").0;
            assert!(
                rule.limit.is_some(),
                "{prefix}: matched a rule without a limit:\n{explained}"
            );
        }
    }
    assert_eq!(
        limited_routes, 3,
        "/api, /login and /public are rate limited"
    );
}

/// Three sluice replicas behind one Envoy cluster (round robin over HTTP/2) share one Redis:
/// of 90 concurrent requests from 30 clients through Envoy, exactly the limit (25 per hour) is
/// admitted, and every replica decided some. The filter's timeout is 1 s here: the case is
/// exactness under concurrency, and 30 requests at once on 2 shared cores can take longer than
/// the shipped 20 ms (envoy_faults.rs tests the timeout).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_behind_one_envoy_cluster_admit_exactly_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("replicas.yaml"),
        "domain: replicas\ndescriptors:\n  - key: hammer\n    rate_limit: {unit: hour, requests_per_unit: 25}\n",
    )
    .unwrap();
    let redis = RedisServer::start();
    let replicas: Vec<TestServer> = (0..3)
        .map(|_| TestServer::start(test_settings(dir.path(), Some(&redis.url()))))
        .collect();
    let upstream = Upstream::start();
    let addrs: Vec<SocketAddr> = replicas.iter().map(|r| r.grpc_addr).collect();
    let config = bootstrap(
        vec![http_listener(
            "edge",
            vec![route(
                "/",
                "app",
                json!([{"actions": [generic_key("hammer", "k")]}]),
                json!({}),
            )],
            vec![ratelimit_filter(
                "replicas",
                "sluice",
                1000,
                true,
                json!({}),
            )],
        )],
        vec![
            cluster("app", &[upstream.addr]),
            grpc_cluster("sluice", &addrs),
        ],
    );
    let envoy = Envoy::start_json(&config);
    let edge = envoy.listener("edge");
    let mut clients = Vec::new();
    for c in 0..30u8 {
        clients.push(tokio::spawn(async move {
            let from = format!("127.0.1.{}", c + 1);
            let mut statuses = Vec::new();
            for _ in 0..3 {
                statuses.push(Req::get("/").from(&from).send(edge).await.status);
            }
            statuses
        }));
    }
    let mut statuses = Vec::new();
    for c in clients {
        statuses.extend(c.await.unwrap());
    }
    let admitted = statuses.iter().filter(|s| **s == 200).count();
    let refused = statuses.iter().filter(|s| **s == 429).count();
    assert_eq!((admitted, refused), (25, 65), "statuses: {statuses:?}");
    let per_host = envoy.host_requests("sluice");
    assert_eq!(per_host.len(), 3, "{per_host:?}");
    assert!(
        per_host.values().all(|n| *n > 0),
        "round robin reaches every replica: {per_host:?}"
    );
    assert_eq!(per_host.values().sum::<u64>(), 90, "{per_host:?}");
}
