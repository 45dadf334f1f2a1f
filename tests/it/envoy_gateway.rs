//! The Envoy Gateway environment, black box: the rate limiter run exactly as Envoy Gateway's
//! pod runs it ([`GatewayPod`]: the binary as `ratelimit`, its environment and nothing else, a
//! pod-like sandbox).
//!
//! It checks what Envoy Gateway relies on: the subscription over mutual TLS with node id
//! `envoy-ratelimit`, health before and after the first config (`/healthcheck` on `PORT`, the
//! path of its startup and readiness probes, and gRPC health) under each combination of
//! `FORCE_START_WITHOUT_INITIAL_CONFIG` and `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`, limits
//! pushed over xDS in its shapes served to a real Envoy over mutual TLS (its cluster, its
//! route-side check of 0 hits then the response's cost on stream done), the Prometheus scrape
//! on `PROMETHEUS_ADDR`, and a clean SIGTERM. What it saw is printed.

use crate::helpers;

use std::time::{Duration, Instant};

use helpers::envoy_config::{bootstrap, cluster};
use helpers::gateway;
use helpers::gateway_pod::{GatewayPod, READINESS_PROBE, STARTUP_PROBE};
use helpers::prometheus::{scrape, sum, value};
use helpers::{Envoy, Req, Upstream, http_get};
use sluice::proto::ratelimit::config::ratelimit::v3::RateLimitUnit;
use tonic_health::ServingStatus;

/// The rate-limit filter's timeout: Envoy Gateway's default is 20 ms; a debug build on a
/// loaded 2-core machine misses that now and then (tests/it/envoy_faults.rs tests the budget).
const FILTER_TIMEOUT_MS: u64 = 1000;

/// `field` of /proc/PID/status.
fn proc_status(pid: u32, field: &str) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .map(|v| v.split_whitespace().collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// GET `path` on `addr` without blocking the runtime.
async fn get(addr: std::net::SocketAddr, path: &'static str) -> (u16, String) {
    tokio::task::spawn_blocking(move || http_get(addr, path))
        .await
        .expect("HTTP GET")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_envoy_gateway_environment_serves_xds_limits_to_envoy_over_mutual_tls() {
    let mut pod = GatewayPod::start(|env| env).await;
    let (grpc, http, prometheus) = (pod.grpc, pod.http, pod.prometheus);
    let ratelimit = &mut pod.ratelimit;
    let (pki, xds) = (&pod.pki, &pod.xds);
    assert_eq!(ratelimit.grpc_addr.port(), grpc.port());
    assert_eq!(ratelimit.admin_addr.port(), http.port());
    assert!(
        ratelimit.grpc_addr.ip().is_unspecified() && ratelimit.admin_addr.ip().is_unspecified()
    );
    let pid = ratelimit.pid();
    let (uid, caps) = (proc_status(pid, "Uid:"), proc_status(pid, "CapEff:"));
    println!("ratelimit runs as uid {uid}, effective capabilities {caps}");
    assert_eq!(uid, "65534 65534 65534 65534");
    assert_eq!(caps, "0000000000000000");

    // The subscription: mutual TLS, Envoy Gateway's node id.
    let subscribe = xds.next_request().await;
    assert!(
        subscribe.client_cert,
        "the xDS client presented no certificate"
    );
    assert_eq!(
        subscribe.request.node.map(|n| n.id).as_deref(),
        Some("envoy-ratelimit")
    );

    // Forced start: serving and healthy (Envoy Gateway sets no
    // HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED, so envoyproxy/ratelimit answers 200 here too),
    // answering UNAVAILABLE until a config arrives.
    let before = get(http, "/healthcheck").await;
    let refused = gateway::check(grpc, pki).await.expect_err("no config yet");
    println!(
        "before the first config: /healthcheck {} {:?}; RLS {:?}",
        before.0,
        before.1.trim(),
        refused.code()
    );
    assert_eq!(before, (200, "OK".to_owned()));
    assert_eq!(refused.code(), tonic::Code::Unavailable);

    // Envoy Gateway pushes its limits: 8 tokens per minute on the route's rule.
    xds.push("1", &[gateway::limits_config(8, RateLimitUnit::Minute)])
        .await;
    let ack = xds.next_request().await.request;
    assert_eq!(ack.version_info, "1");
    assert!(ack.error_detail.is_none(), "NACK: {ack:?}");
    let deadline = Instant::now() + Duration::from_secs(10);
    let left = loop {
        match gateway::check(grpc, pki).await {
            Ok(left) => break left,
            Err(status) if Instant::now() > deadline => panic!("no config applied: {status}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    };
    assert_eq!(left, 8, "the pushed budget");
    assert_eq!(get(http, "/healthcheck").await, (200, "OK".to_owned()));

    // A real Envoy, configured as Envoy Gateway configures it, over mutual TLS.
    let upstream = Upstream::start();
    let clusters = vec![
        cluster("app", &[upstream.addr]),
        gateway::ratelimit_cluster(grpc, &pki.envoy, &pki.ca),
    ];
    let listeners = vec![gateway::listener("app", FILTER_TIMEOUT_MS)];
    let envoy = Envoy::start_json(&bootstrap(listeners, clusters));
    let edge = envoy.listener("gateway");
    let mut statuses = Vec::new();
    for left_after in [4, 0] {
        let resp = Req::get("/v1/chat")
            .header("x-reply-x-tokens", "4")
            .send(edge)
            .await;
        statuses.push(resp.status);
        if resp.status != 200 {
            panic!(
                "{resp:?}\nEnvoy's rate-limit cluster: {}\nratelimit's log:\n{}",
                envoy.admin_get("/stats?filter=ratelimit_cluster.(upstream_cx|ssl)"),
                ratelimit.log_text()
            );
        }
        gateway::until_tokens_left(grpc, pki, left_after).await;
    }
    let spent = Req::get("/v1/chat")
        .header("x-reply-x-tokens", "4")
        .send(edge)
        .await;
    statuses.push(spent.status);
    println!(
        "through Envoy (8 tokens a minute, 4 per response): {statuses:?}; the 429's \
         x-ratelimit-limit {:?}",
        spent.header("x-ratelimit-limit")
    );
    assert_eq!(statuses, [200, 200, 429]);

    // Prometheus on PROMETHEUS_ADDR; the probes on PORT.
    let text = tokio::task::spawn_blocking(move || scrape(prometheus))
        .await
        .expect("scrape");
    for series in [
        "sluice_xds_connected",
        r#"sluice_xds_config_version_info{version="1"}"#,
        "sluice_backend_up",
    ] {
        assert_eq!(value(&text, series), 1.0, "{series}");
    }
    // Envoy's calls and the test's own checks (a check of 0 hits on a full window is
    // OVER_LIMIT too), so at least these.
    let answered = |code: &str| {
        let labels = [("domain", gateway::DOMAIN), ("code", code)];
        sum(&text, "sluice_requests_total", &labels)
    };
    assert!(
        answered("ok") >= 4.0 && answered("over_limit") >= 2.0,
        "{text}"
    );
    // envoyproxy/ratelimit's series, through Envoy Gateway's mapping: what its dashboards and
    // e2e tests query.
    let requests_of = |method: &str| {
        sum(
            &text,
            "ratelimit_service_total_requests",
            &[("grpc_method", method)],
        )
    };
    assert!(requests_of("ShouldRateLimit") >= 6.0, "{text}");
    // Hits, not calls: the route-side checks carry 0 (a full window refuses them without a
    // hit over the limit), the costs on stream done 4 each.
    let limited = |name: &str| sum(&text, name, &[("domain", gateway::DOMAIN)]);
    assert!(
        limited("ratelimit_service_rate_limit_total_hits") >= 8.0
            && limited("ratelimit_service_rate_limit_within_limit") >= 8.0,
        "{text}"
    );
    let requests: Vec<&str> = text
        .lines()
        .filter(|l| {
            l.starts_with("sluice_requests_total")
                || l.starts_with("sluice_xds_")
                || l.starts_with("ratelimit_service_rate_limit_")
                || l.starts_with("ratelimit_service_total_requests")
        })
        .collect();
    println!(
        "scraped {prometheus} /metrics:\n  {}",
        requests.join("\n  ")
    );
    let (code, _) = get(http, "/readyz").await;
    assert_eq!(code, 200, "/readyz on PORT");

    let log = ratelimit.log_text();
    let notes: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("envoyproxy/ratelimit variable:"))
        .collect();
    println!("start-up notes:\n  {}", notes.join("\n  "));
    assert!(!log.contains("ERROR"), "{log}");
    let status = ratelimit.terminate();
    assert!(
        status.success(),
        "SIGTERM: {status:?}\n{}",
        ratelimit.log_text()
    );
}

/// What a variable of the pod is set to in a health test; `None`: left unset.
type Var = Option<&'static str>;

/// `/healthcheck` as the pod's probes see it, gRPC health of envoyproxy/ratelimit's service name
/// (`ratelimit`) and of the server (`""`, sluice's readiness), and the RLS's answer.
#[derive(Debug, PartialEq)]
struct Seen {
    healthcheck: u16,
    ratelimit: Option<ServingStatus>,
    server: Option<ServingStatus>,
    rls: Result<u32, tonic::Code>,
}

async fn seen(pod: &GatewayPod) -> Seen {
    let (_, healthcheck, _) = STARTUP_PROBE.attempt(pod.http).await;
    let rls = tokio::time::timeout(Duration::from_secs(1), gateway::check(pod.grpc, &pod.pki))
        .await
        .map_or(Err(tonic::Code::DeadlineExceeded), |r| {
            r.map_err(|s| s.code())
        });
    Seen {
        healthcheck,
        ratelimit: pod.grpc_health("ratelimit").await,
        server: pod.grpc_health("").await,
        rls,
    }
}

/// Waits (10 s at most) until `what` is seen.
async fn until_seen(pod: &GatewayPod, what: &Seen) -> Seen {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = seen(pod).await;
        if now == *what || Instant::now() > deadline {
            return now;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The pod with `FORCE_START_WITHOUT_INITIAL_CONFIG` and
/// `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED` as given, checked before the first config
/// (`before`), after it (healthy, ready, 8 tokens), and, when a config is required, after a
/// push that names no domain and after one that does again.
async fn health_per_combination(force: Var, healthy_with: Var, before: Seen) {
    let pod = GatewayPod::start(|env| {
        let env = match force {
            Some(v) => env.set("FORCE_START_WITHOUT_INITIAL_CONFIG", v),
            None => env.unset("FORCE_START_WITHOUT_INITIAL_CONFIG"),
        };
        match healthy_with {
            Some(v) => env.set("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", v),
            None => env.unset("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED"),
        }
    })
    .await;
    let label = format!(
        "FORCE_START_WITHOUT_INITIAL_CONFIG={force:?} HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED={healthy_with:?}"
    );
    let first = pod.xds.next_request().await;
    assert!(first.client_cert, "{label}: no client certificate");

    // Before the first config: what the kubelet's probes conclude, and gRPC health.
    let now = until_seen(&pod, &before).await;
    let startup = STARTUP_PROBE.attempt(pod.http).await;
    let readiness = READINESS_PROBE.attempt(pod.http).await;
    println!(
        "{label}\n  before the first config: {now:?}; startup probe {} (a pod never configured \
         is restarted after {:?} of failures), readiness probe {}",
        if startup.0 { "passes" } else { "fails" },
        STARTUP_PROBE.gives_up_after(),
        if readiness.0 { "passes" } else { "fails" },
    );
    assert_eq!(now, before, "{label}: before the first config");
    assert_eq!(startup.0, before.healthcheck == 200, "{label}");
    assert_eq!(readiness.0, before.healthcheck == 200, "{label}");

    // The first config: healthy and ready whatever the variables say.
    pod.xds
        .push("1", &[gateway::limits_config(8, RateLimitUnit::Minute)])
        .await;
    let configured = Seen {
        healthcheck: 200,
        ratelimit: Some(ServingStatus::Serving),
        server: Some(ServingStatus::Serving),
        rls: Ok(8),
    };
    let now = until_seen(&pod, &configured).await;
    println!("  after the first config: {now:?}");
    assert_eq!(now, configured, "{label}: after the first config");
    assert!(STARTUP_PROBE.attempt(pod.http).await.0, "{label}");
    assert!(READINESS_PROBE.attempt(pod.http).await.0, "{label}");

    // A push that names no domain: envoyproxy/ratelimit's health fails again with
    // HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED=true only; requests find no limit.
    pod.xds.push("2", &[]).await;
    let required = healthy_with == Some("true");
    let empty = Seen {
        healthcheck: if required { 500 } else { 200 },
        ratelimit: Some(if required {
            ServingStatus::NotServing
        } else {
            ServingStatus::Serving
        }),
        server: Some(ServingStatus::Serving),
        rls: Ok(0),
    };
    let now = until_seen(&pod, &empty).await;
    println!("  after a config naming no domain: {now:?}");
    assert_eq!(now, empty, "{label}: after an empty push");
    pod.xds
        .push("3", &[gateway::limits_config(8, RateLimitUnit::Minute)])
        .await;
    assert_eq!(until_seen(&pod, &configured).await, configured, "{label}");
    let log = pod.ratelimit.log_text();
    assert!(
        !log.contains("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED is not supported"),
        "{log}"
    );
}

/// Envoy Gateway's own environment (forced start, no HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED):
/// healthy before the first config, as envoyproxy/ratelimit, so a gateway without a rate-limit
/// policy keeps its rate limiter (its startup probe passes); requests are UNAVAILABLE until
/// then, and sluice's own readiness (`""`) waits for the config.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forced_start_is_healthy_before_the_first_config() {
    let before = Seen {
        healthcheck: 200,
        ratelimit: Some(ServingStatus::Serving),
        server: Some(ServingStatus::NotServing),
        rls: Err(tonic::Code::Unavailable),
    };
    health_per_combination(Some("true"), None, before).await;
}

/// Forced start with HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED=true: unhealthy until a config
/// naming a domain arrives (the startup probe fails meanwhile), and again when a push names
/// none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forced_start_requiring_a_config_is_unhealthy_until_one_arrives() {
    let before = Seen {
        healthcheck: 500,
        ratelimit: Some(ServingStatus::NotServing),
        server: Some(ServingStatus::NotServing),
        rls: Err(tonic::Code::Unavailable),
    };
    health_per_combination(Some("true"), Some("true"), before).await;
}

/// Not forced (HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED unset): envoyproxy/ratelimit listens on
/// nothing before the first config, so its probes fail; sluice's gRPC port does not serve yet
/// either (nothing answers) and `/healthcheck` answers 500. Once a config came, one naming no
/// domain does not fail health.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_for_the_first_config_fails_the_probes_until_it_arrives() {
    let before = Seen {
        healthcheck: 500,
        ratelimit: None,
        server: None,
        rls: Err(tonic::Code::DeadlineExceeded),
    };
    health_per_combination(None, None, before).await;
}

/// Not forced, HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED=true: as without it before the first
/// config; a push naming no domain fails health again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_and_requiring_a_config_fails_the_probes_until_it_arrives() {
    let before = Seen {
        healthcheck: 500,
        ratelimit: None,
        server: None,
        rls: Err(tonic::Code::DeadlineExceeded),
    };
    health_per_combination(Some("false"), Some("true"), before).await;
}
