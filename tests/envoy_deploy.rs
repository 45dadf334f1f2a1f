//! `deploy/envoy/envoy.yaml` as shipped (only its addresses and ports rendered, see
//! `helpers/envoy_config.rs`), a real Envoy, in front of sluice serving `deploy/base/limits`:
//! real HTTP from clients on distinct loopback addresses, statuses and headers as the client
//! sees them, on the memory backend, on Redis and on a 3-node Redis Cluster. Also: the
//! descriptors Envoy really sends for every route each reach a limit of the limits file, and
//! three sluice replicas behind one Envoy cluster share one Redis exactly.
//!
//! The shipped filter's timeout (20 ms, checked) is raised for these live runs, the one change
//! besides addresses: `helpers/envoy_config.rs` (`with_test_filter_timeout`) says why;
//! `tests/envoy_faults.rs` tests the filter at 20 ms.

mod helpers;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use helpers::envoy_config::{
    bootstrap, cluster, generic_key, grpc_cluster, http_listener, ratelimit_filter, render_shipped,
    repo_path, route, with_test_filter_timeout,
};
use helpers::Upstream;
use helpers::{test_settings, Envoy, HttpResponse, RedisCluster, RedisServer, Req, TestServer};
use serde_json::{json, Value};
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

/// `t` of a `RateLimit` header or a `Retry-After`: whole seconds until the first hit of a
/// `window`-second limit leaves it, `window` right after that hit. `since_first` started just
/// before it was sent.
fn assert_countdown(what: &str, got: u64, window: u64, since_first: Instant) {
    let low = window
        .saturating_sub(since_first.elapsed().as_secs() + 1)
        .max(1);
    assert!(
        (low..=window).contains(&got),
        "{what}: {got} s, expected {low}..={window}"
    );
}

/// `"default";r=R;t=T` -> (R, T).
fn draft_field(value: &str) -> (u64, u64) {
    let rest = value
        .strip_prefix("\"default\";r=")
        .unwrap_or_else(|| panic!("RateLimit: {value}"));
    let (r, t) = rest.split_once(";t=").expect("RateLimit has t");
    (r.parse().expect("r"), t.parse().expect("t"))
}

/// What README promises for an endpoint whose tightest limit is `q` per minute and shows its
/// remaining count, on the `nth` request (1-based) of one client since `since_first`: 200 with
/// sluice's draft headers and Envoy's X-RateLimit-* (one each, agreeing) up to `q`, then 429
/// with `Retry-After` and `x-envoy-ratelimited`. `envoy_limit` is Envoy's X-RateLimit-Limit
/// (the tightest limit, then every limit of the request with its window).
fn assert_visible(resp: &HttpResponse, nth: u64, q: u64, envoy_limit: &str, since: Instant) {
    let ctx = format!("request {nth} of a limit of {q}: {resp:?}");
    assert_eq!(
        resp.header("ratelimit-policy"),
        Some(format!("\"default\";q={q};w=60").as_str()),
        "{ctx}"
    );
    let (r, t) = draft_field(resp.header("ratelimit").expect("RateLimit"));
    assert_countdown("RateLimit t", t, 60, since);
    assert_eq!(resp.header("x-ratelimit-limit"), Some(envoy_limit), "{ctx}");
    assert_eq!(
        resp.header("x-ratelimit-reset"),
        Some(t.to_string().as_str()),
        "{ctx}"
    );
    assert_eq!(
        resp.header("x-ratelimit-remaining"),
        Some(r.to_string().as_str()),
        "{ctx}"
    );
    if nth <= q {
        assert_eq!(resp.status, 200, "{ctx}");
        assert_eq!(r, q - nth, "{ctx}");
        assert_eq!(resp.header("retry-after"), None, "{ctx}");
        assert_eq!(resp.header("x-envoy-ratelimited"), None, "{ctx}");
    } else {
        assert_eq!(resp.status, 429, "{ctx}");
        assert_eq!(r, 0, "{ctx}");
        assert_eq!(
            resp.header("retry-after"),
            Some(t.to_string().as_str()),
            "{ctx}"
        );
        assert_eq!(resp.header("x-envoy-ratelimited"), Some("true"), "{ctx}");
    }
}

/// `/public` (`hide_remaining`): the limit and, on 429, when to retry; never the remaining
/// count, from sluice or from Envoy.
fn assert_hidden(resp: &HttpResponse, nth: u64, since: Instant) {
    let ctx = format!("/public request {nth}: {resp:?}");
    assert_eq!(
        resp.header("ratelimit-policy"),
        Some("\"default\";q=60;w=60"),
        "{ctx}"
    );
    for hidden in [
        "ratelimit",
        "x-ratelimit-remaining",
        "x-ratelimit-limit",
        "x-ratelimit-reset",
    ] {
        assert_eq!(resp.header(hidden), None, "{hidden} on {ctx}");
    }
    if nth <= 60 {
        assert_eq!(resp.status, 200, "{ctx}");
        assert_eq!(resp.header("retry-after"), None, "{ctx}");
    } else {
        assert_eq!(resp.status, 429, "{ctx}");
        let retry: u64 = resp
            .header("retry-after")
            .expect("Retry-After")
            .parse()
            .unwrap();
        assert_countdown("Retry-After", retry, 60, since);
        assert_eq!(resp.header("x-envoy-ratelimited"), Some("true"), "{ctx}");
    }
}

/// Every promise of `deploy/base/limits` through the shipped Envoy config at `ingress`.
async fn shipped_config_keeps_the_limits_promises(ingress: SocketAddr) {
    // /login: 5 per minute per client (300 for the endpoint): the 6th request of a client is
    // refused, another client is still admitted.
    let since = Instant::now();
    for nth in 1..=6 {
        let resp = Req::get("/login").from("127.0.0.1").send(ingress).await;
        assert_visible(&resp, nth, 5, "5, 300;w=60, 5;w=60", since);
    }
    let other = Instant::now();
    let resp = Req::get("/login").from("127.0.0.2").send(ingress).await;
    assert_visible(&resp, 1, 5, "5, 300;w=60, 5;w=60", other);

    // /api: 120 per minute per client (200 per second for the endpoint, 600 per minute per
    // API key): the limited /login of the first client does not touch its /api.
    let since = Instant::now();
    for nth in 1..=121 {
        let key = format!("key-{}", nth % 7);
        let resp = Req::get("/api/orders")
            .header("x-api-key", &key)
            .from("127.0.0.1")
            .send(ingress)
            .await;
        assert_visible(&resp, nth, 120, "120, 200;w=1, 120;w=60, 600;w=60", since);
    }

    // /public: 60 per minute per client, its remaining count hidden.
    let since = Instant::now();
    for nth in 1..=61 {
        let resp = Req::get("/public/index.html")
            .from("127.0.0.3")
            .send(ingress)
            .await;
        assert_hidden(&resp, nth, since);
    }

    // Any other path is not rate limited: no RLS call, no rate-limit header.
    let resp = Req::get("/").from("127.0.0.1").send(ingress).await;
    assert_eq!(resp.status, 200);
    assert_eq!(resp.body, "ok\n");
    for name in resp.names() {
        assert!(
            !name.contains("ratelimit") && name != "retry-after",
            "{resp:?}"
        );
    }
}

fn limits() -> std::path::PathBuf {
    repo_path(LIMITS)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shipped_envoy_config_on_memory() {
    let sluice = TestServer::start(test_settings(&limits(), None));
    let upstream = Upstream::start();
    let (_envoy, ingress) = shipped_envoy(sluice.grpc_addr, &upstream);
    shipped_config_keeps_the_limits_promises(ingress).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shipped_envoy_config_on_redis() {
    let redis = RedisServer::start();
    let sluice = TestServer::start(test_settings(&limits(), Some(&redis.url())));
    let upstream = Upstream::start();
    let (_envoy, ingress) = shipped_envoy(sluice.grpc_addr, &upstream);
    shipped_config_keeps_the_limits_promises(ingress).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shipped_envoy_config_on_redis_cluster() {
    let redis = RedisCluster::start();
    let sluice = TestServer::start(test_settings(&limits(), Some(&redis.url())));
    let upstream = Upstream::start();
    let (_envoy, ingress) = shipped_envoy(sluice.grpc_addr, &upstream);
    shipped_config_keeps_the_limits_promises(ingress).await;
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
            assert_eq!(trace.end, TraceEnd::Matched, "{prefix}: {explained}");
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
