//! The xDS config source against a test double of the management server
//! (`helpers::xds_server`): pushes served as live decisions over gRPC, replaced by later pushes,
//! a bad push NACKed with the old config still served, a dropped stream resubscribed, mutual
//! TLS 1.3 with certificates made here, a server of another CA refused, and what is served
//! before the first config (with and without `--force-start-without-initial-config`). The last
//! test runs the binary with Envoy Gateway's environment.

use crate::helpers;

use std::time::{Duration, Instant};

use helpers::certs::{Issued, TestCa, Usage};
use helpers::in_process::test_settings_from;
use helpers::prometheus::{samples, scrape, value};
use helpers::xds_server::{Handshake, ServerTls, XdsServer};
use helpers::{Sluice, TestServer, descriptor, http_get, request};
use sluice::proto::envoy::service::ratelimit::v3::rate_limit_response::Code;
use sluice::proto::ratelimit::config::ratelimit::v3::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
};
use sluice::server::ConfigSource;
use sluice::xds::{RATE_LIMIT_CONFIG_TYPE, XdsSettings};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

const LISTENER: &str = "envoy-gateway/gateway-1/http";
const ROUTE: &str = "httproute/default/backend/rule/0/match/0/*";

/// Envoy Gateway's shape: the route descriptor (key and value the route name) over a
/// key-only `remote_address` carrying the limit: `per_minute` per client address.
fn gateway_limits(per_minute: u32) -> RateLimitConfig {
    let per_ip = RateLimitDescriptor {
        key: "remote_address".into(),
        rate_limit: Some(RateLimitPolicy {
            unit: RateLimitUnit::Minute as i32,
            requests_per_unit: per_minute,
            ..RateLimitPolicy::default()
        }),
        ..RateLimitDescriptor::default()
    };
    RateLimitConfig {
        name: LISTENER.into(),
        domain: LISTENER.into(),
        descriptors: vec![RateLimitDescriptor {
            key: ROUTE.into(),
            value: ROUTE.into(),
            descriptors: vec![per_ip],
            ..RateLimitDescriptor::default()
        }],
    }
}

/// The same, with no unit on the limit: a config rule broken.
fn broken_limits() -> RateLimitConfig {
    let mut config = gateway_limits(1);
    config.descriptors[0].descriptors[0]
        .rate_limit
        .as_mut()
        .expect("a limit")
        .unit = RateLimitUnit::Unknown as i32;
    config
}

fn xds_settings(url: String) -> XdsSettings {
    XdsSettings {
        min_backoff: Duration::from_millis(50),
        max_backoff: Duration::from_millis(200),
        ..XdsSettings::new(url, "envoy-ratelimit")
    }
}

fn serve(xds: XdsSettings) -> TestServer {
    TestServer::start(test_settings_from(ConfigSource::Xds(xds)))
}

/// A plaintext double and a sluice subscribed to it, serving `gateway_limits(per_minute)` at
/// `version` (pushed and ACKed).
async fn subscribed(version: &str, per_minute: u32) -> (XdsServer, TestServer) {
    let xds = XdsServer::start().await;
    let sluice = serve(xds_settings(xds.url(false)));
    xds.next_request().await;
    xds.push(version, &[gateway_limits(per_minute)]).await;
    let ack = xds.next_request().await.request;
    assert_eq!(ack.version_info, version);
    assert!(ack.error_detail.is_none(), "{ack:?}");
    (xds, sluice)
}

/// The overall code of one request from `address` to the route.
async fn decide(sluice: &TestServer, address: &str) -> Result<Code, tonic::Status> {
    let mut client = sluice.client().await;
    let req = request(
        LISTENER,
        vec![descriptor(&[(ROUTE, ROUTE), ("remote_address", address)])],
    );
    let response = client.should_rate_limit(req).await?.into_inner();
    Ok(Code::try_from(response.overall_code).expect("a known code"))
}

/// Codes of `n` requests from `address`.
async fn decide_n(sluice: &TestServer, address: &str, n: usize) -> Vec<Code> {
    let mut codes = Vec::new();
    for _ in 0..n {
        codes.push(decide(sluice, address).await.expect("a decision"));
    }
    codes
}

/// `/readyz` of `sluice`, without blocking the test's runtime.
async fn readyz(addr: std::net::SocketAddr) -> (u16, String) {
    tokio::task::spawn_blocking(move || http_get(addr, "/readyz"))
        .await
        .expect("readyz")
}

/// Polls `/readyz` until it answers `status` (5 s at most); returns its body.
async fn readyz_until(addr: std::net::SocketAddr, status: u16) -> String {
    readyz_when(addr, |code, _| code == status).await
}

/// Polls `/readyz` until `done(status, body)` (5 s at most); returns the body.
async fn readyz_when(addr: std::net::SocketAddr, done: impl Fn(u16, &str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (code, body) = readyz(addr).await;
        if done(code, &body) {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "/readyz still answers {code} {body:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pushes_become_live_limits_and_are_replaced_by_the_next() {
    let xds = XdsServer::start().await;
    let sluice = serve(xds_settings(xds.url(false)));

    let subscribe = xds.next_request().await.request;
    assert_eq!(
        subscribe.node.as_ref().map(|n| n.id.as_str()),
        Some("envoy-ratelimit")
    );
    assert_eq!(subscribe.type_url, RATE_LIMIT_CONFIG_TYPE);
    assert!(
        subscribe.resource_names.is_empty(),
        "a wildcard subscription"
    );
    assert_eq!(
        (
            subscribe.version_info.as_str(),
            subscribe.response_nonce.as_str()
        ),
        ("", "")
    );

    let nonce = xds.push("1", &[gateway_limits(2)]).await;
    let ack = xds.next_request().await.request;
    assert_eq!(
        (ack.version_info.as_str(), ack.response_nonce.as_str()),
        ("1", nonce.as_str())
    );
    assert!(ack.error_detail.is_none(), "{ack:?}");
    // One counter per client address (the key-only descriptor), the limit on the last entry.
    assert_eq!(
        decide_n(&sluice, "10.0.0.1", 3).await,
        [Code::Ok, Code::Ok, Code::OverLimit]
    );
    assert_eq!(decide_n(&sluice, "10.0.0.2", 1).await, [Code::Ok]);

    // The next push replaces every domain: the listener's limits go, another domain comes.
    let mut other = gateway_limits(1);
    other.name = "envoy-gateway/gateway-2/http".into();
    other.domain = other.name.clone();
    let nonce = xds.push("2", &[other]).await;
    let ack = xds.next_request().await.request;
    assert_eq!(
        (ack.version_info.as_str(), ack.response_nonce),
        ("2", nonce)
    );
    assert_eq!(
        decide_n(&sluice, "10.0.0.1", 2).await,
        [Code::Ok, Code::Ok],
        "the listener's domain is gone: not limited"
    );
    let rlconfig = tokio::task::spawn_blocking({
        let addr = sluice.admin_addr;
        move || http_get(addr, "/rlconfig")
    })
    .await
    .unwrap()
    .1;
    assert!(
        rlconfig.starts_with("envoy-gateway/gateway-2/http.httproute"),
        "{rlconfig}"
    );
    sluice.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_push_is_nacked_and_the_previous_limits_keep_serving() {
    let (xds, sluice) = subscribed("1", 1).await;

    let nonce = xds.push("2", &[broken_limits()]).await;
    let nack = xds.next_request().await.request;
    assert_eq!(
        (nack.version_info.as_str(), nack.response_nonce.as_str()),
        ("1", nonce.as_str()),
        "a NACK carries the version still served and the rejected response's nonce"
    );
    let detail = nack.error_detail.expect("a NACK has an error_detail");
    assert_eq!(detail.code, tonic::Code::InvalidArgument as i32);
    assert_eq!(
        detail.message,
        format!(
            "xds:{LISTENER}: {ROUTE}_{ROUTE}.remote_address: `rate_limit` has no `unit` and is \
             not `unlimited: true`; valid units: second, minute, hour, day, week, month, year; \
             or a custom `window` (e.g. 30s)"
        )
    );
    // Version 1 still decides: 1 per minute.
    assert_eq!(
        decide_n(&sluice, "10.0.0.9", 2).await,
        [Code::Ok, Code::OverLimit]
    );

    // A resource of another type is refused as a whole response too.
    let foreign = prost_types::Any {
        type_url: "type.googleapis.com/envoy.config.cluster.v3.Cluster".into(),
        value: Vec::new(),
    };
    xds.push_raw("3", vec![foreign]).await;
    let nack = xds.next_request().await.request;
    assert_eq!(nack.version_info, "1");
    assert!(nack.error_detail.expect("NACK").message.starts_with(
        "resources[0]: type type.googleapis.com/envoy.config.cluster.v3.Cluster, expected"
    ));

    // A good push after them applies.
    let nonce = xds.push("4", &[gateway_limits(3)]).await;
    let ack = xds.next_request().await.request;
    assert_eq!(
        (ack.version_info.as_str(), ack.response_nonce),
        ("4", nonce)
    );
    assert!(ack.error_detail.is_none());
    assert_eq!(
        decide_n(&sluice, "10.0.0.10", 4).await,
        [Code::Ok, Code::Ok, Code::Ok, Code::OverLimit]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_stream_is_resubscribed_with_the_version_served() {
    let (xds, sluice) = subscribed("7", 1).await;

    xds.drop_streams();
    let again = xds.next_request().await;
    assert_eq!(again.stream, 1, "a second stream");
    assert_eq!(xds.streams_opened(), 2);
    assert_eq!(
        (
            again.request.version_info.as_str(),
            again.request.response_nonce.as_str()
        ),
        ("7", ""),
        "the new stream subscribes with the version served and no nonce"
    );
    // The limits survive the lost stream.
    assert_eq!(
        decide_n(&sluice, "10.1.0.1", 2).await,
        [Code::Ok, Code::OverLimit]
    );

    let nonce = xds.push("8", &[gateway_limits(2)]).await;
    let ack = xds.next_request().await;
    assert_eq!((ack.stream, ack.request.response_nonce), (1, nonce));
    assert_eq!(
        decide_n(&sluice, "10.1.0.2", 3).await,
        [Code::Ok, Code::Ok, Code::OverLimit]
    );
}

/// A TLS double whose certificate, from `server_ca`, names `names`; it trusts clients of
/// `client_ca`.
async fn tls_double(server_ca: &TestCa, client_ca: &TestCa, names: &[&str]) -> XdsServer {
    let server = server_ca.issue(&format!("server-{}", names[0]), names, Usage::Server);
    XdsServer::start_tls(ServerTls {
        server: &server,
        client_ca_pem: &client_ca.cert_pem,
    })
    .await
}

/// sluice's client certificate from `ca`, as Envoy Gateway's Secret holds it.
fn client_cert(ca: &TestCa) -> Issued {
    ca.issue("ratelimit", &["envoy-ratelimit"], Usage::Client)
}

/// Settings for `xds` over TLS: servers of `ca` trusted, `client` presented, the server's
/// certificate checked for Envoy Gateway's service name (not the address dialled).
fn mutual_tls(xds: &XdsServer, ca: &TestCa, client: &Issued) -> XdsSettings {
    let mut settings = xds_settings(xds.url(true));
    settings.tls.ca_file = Some(ca.cert.clone());
    settings.tls.client_cert = Some(client.cert.clone());
    settings.tls.client_key = Some(client.key.clone());
    settings.tls.server_name = Some("envoy-gateway".into());
    settings
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_1_3_with_the_server_name_checked() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new(dir.path(), "gateway");
    // Envoy Gateway's server certificate names the service, not the address dialled.
    let xds = tls_double(&ca, &ca, &["envoy-gateway"]).await;
    let client = client_cert(&ca);
    let sluice = serve(mutual_tls(&xds, &ca, &client));

    let subscribe = xds.next_request().await;
    assert!(subscribe.client_cert, "sluice presented its certificate");
    assert_eq!(
        xds.handshakes(),
        [Handshake::Done {
            version: "TLSv1_3".into(),
            alpn: Some("h2".into())
        }]
    );
    xds.push("1", &[gateway_limits(1)]).await;
    assert!(xds.next_request().await.request.error_detail.is_none());
    assert_eq!(
        decide_n(&sluice, "10.2.0.1", 2).await,
        [Code::Ok, Code::OverLimit]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_of_another_ca_or_a_client_without_certificate_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let trusted = TestCa::new(dir.path(), "trusted");
    let rogue = TestCa::new(dir.path(), "rogue");
    let xds = tls_double(&rogue, &trusted, &["envoy-gateway"]).await;
    let client = client_cert(&trusted);
    let mut settings = mutual_tls(&xds, &trusted, &client);
    settings.force_start = true;
    let sluice = serve(settings.clone());

    // sluice says why it has no config: the server's certificate is not from its CA.
    let why = format!(
        "no config yet: xDS server {}: connecting failed:",
        xds.url(true)
    );
    let body = readyz_when(sluice.admin_addr, |code, body| {
        code == 503 && body.starts_with(&why)
    })
    .await;
    assert!(
        body.contains("invalid peer certificate: UnknownIssuer"),
        "{body}"
    );
    // It keeps trying (backoff), and never subscribes to that server.
    assert_refused(&xds, "UnknownCA").await;
    assert!(xds.handshakes().len() >= 2, "{:?}", xds.handshakes());
    let refused = decide(&sluice, "10.3.0.1").await.expect_err("no config");
    assert_eq!(refused.code(), tonic::Code::Unavailable);
    sluice.stop().await.expect("clean stop");

    // A client that offers no certificate is refused by the server: nothing subscribed.
    let xds = tls_double(&trusted, &trusted, &["envoy-gateway"]).await;
    settings.url = xds.url(true);
    settings.tls.client_cert = None;
    settings.tls.client_key = None;
    let sluice = serve(settings);
    let why = format!("no config yet: xDS server {}: ", xds.url(true));
    readyz_when(sluice.admin_addr, |code, body| {
        code == 503 && body.starts_with(&why)
    })
    .await;
    assert_refused(&xds, "no certificates").await;
}

/// No request reaches `xds` (for 800 ms), and every TLS handshake failed with `reason`.
async fn assert_refused(xds: &XdsServer, reason: &str) {
    assert!(
        xds.request_within(Duration::from_millis(800))
            .await
            .is_none()
    );
    let handshakes = xds.handshakes();
    assert!(
        !handshakes.is_empty()
            && handshakes
                .iter()
                .all(|h| matches!(h, Handshake::Failed(e) if e.contains(reason))),
        "{handshakes:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_start_answers_unavailable_until_the_first_config() {
    let xds = XdsServer::start().await;
    let mut settings = xds_settings(xds.url(false));
    settings.force_start = true;
    let sluice = serve(settings);
    xds.next_request().await;

    // Served at once, but nothing is known yet: UNAVAILABLE (Envoy's failure_mode_deny
    // decides), and not ready, saying why.
    let refused = decide(&sluice, "10.4.0.1")
        .await
        .expect_err("no config yet");
    assert_eq!(refused.code(), tonic::Code::Unavailable);
    assert!(
        refused
            .message()
            .starts_with("no rate-limit config loaded yet"),
        "{}",
        refused.message()
    );
    let (status, body) = readyz(sluice.admin_addr).await;
    assert_eq!(
        (status, body),
        (
            503,
            format!(
                "no config yet: waiting for the first config from the xDS server {}\n",
                xds.url(false)
            )
        )
    );
    // A NACKed first push leaves it so, with the reason.
    xds.push("0", &[broken_limits()]).await;
    assert!(xds.next_request().await.request.error_detail.is_some());
    let body = readyz(sluice.admin_addr).await.1;
    assert!(
        body.contains("version 0 rejected: xds:envoy-gateway/gateway-1/http:"),
        "{body}"
    );

    assert_eq!(grpc_health(&sluice).await, ServingStatus::NotServing);

    xds.push("1", &[gateway_limits(1)]).await;
    xds.next_request().await;
    assert_eq!(readyz_until(sluice.admin_addr, 200).await, "ready\n");
    assert_eq!(
        decide_n(&sluice, "10.4.0.1", 2).await,
        [Code::Ok, Code::OverLimit]
    );
    // gRPC health follows at the next readiness probe (every second by default).
    let deadline = Instant::now() + Duration::from_secs(5);
    while grpc_health(&sluice).await != ServingStatus::Serving {
        assert!(Instant::now() < deadline, "gRPC health still not SERVING");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// gRPC health of the service `""` (readiness).
async fn grpc_health(sluice: &TestServer) -> ServingStatus {
    let mut health = HealthClient::new(sluice.channel().await);
    let response = health
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .expect("health answers");
    ServingStatus::try_from(response.into_inner().status).expect("a known status")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_force_start_grpc_waits_for_the_first_config() {
    let xds = XdsServer::start().await;
    let sluice = serve(xds_settings(xds.url(false)));
    xds.next_request().await;

    // The admin port answers; the gRPC port accepts nothing yet.
    let healthz = tokio::task::spawn_blocking({
        let addr = sluice.admin_addr;
        move || http_get(addr, "/healthz")
    });
    assert_eq!(healthz.await.unwrap().0, 200);
    assert_eq!(readyz(sluice.admin_addr).await.0, 503);
    let early = tokio::time::timeout(Duration::from_millis(700), decide(&sluice, "10.5.0.1")).await;
    assert!(
        early.is_err(),
        "gRPC answered before the first config: {early:?}"
    );

    xds.push("1", &[gateway_limits(1)]).await;
    xds.next_request().await;
    // Another client: the early call waited in the port's backlog, and a loaded machine may
    // still be sending it when the port opens, to be decided then.
    assert_eq!(
        decide_n(&sluice, "10.5.0.2", 2).await,
        [Code::Ok, Code::OverLimit]
    );
    assert_eq!(readyz_until(sluice.admin_addr, 200).await, "ready\n");

    // Shutdown while still waiting for a first config is clean too.
    let silent = XdsServer::start().await;
    let waiting = serve(xds_settings(silent.url(false)));
    silent.next_request().await;
    waiting.stop().await.expect("clean stop before any config");
}

/// The binary with the environment Envoy Gateway gives envoyproxy/ratelimit (its xDS and TLS
/// variables, `RUNTIME_ROOT` pointing nowhere), on ephemeral loopback ports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_envoy_gateway_environment_subscribes_over_mutual_tls() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new(dir.path(), "envoy-gateway");
    // No server name override in Envoy Gateway's environment: the address dialled is named.
    let xds = tls_double(&ca, &ca, &["envoy-gateway", "127.0.0.1"]).await;
    let client = client_cert(&ca);
    let address = xds.addr.to_string();
    let (cert, key, ca_file) = (
        client.cert.display().to_string(),
        client.key.display().to_string(),
        ca.cert.display().to_string(),
    );
    let env = [
        ("RUNTIME_ROOT", "/data"),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ("RUNTIME_IGNOREDOTFILES", "true"),
        ("RUNTIME_WATCH_ROOT", "false"),
        ("LOG_LEVEL", "info"),
        ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
        ("CONFIG_GRPC_XDS_SERVER_URL", address.as_str()),
        ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit"),
        ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", cert.as_str()),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", key.as_str()),
        ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", ca_file.as_str()),
        ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
        ("SLUICE_GRPC_ADDR", "127.0.0.1:0"),
        ("SLUICE_ADMIN_ADDR", "127.0.0.1:0"),
    ];
    // Listens at once (forced start), before any config: nothing to wait for here.
    let sluice = Sluice::start_env_only(&env);
    let subscribe = xds.next_request().await;
    assert!(subscribe.client_cert);
    assert_eq!(
        subscribe.request.node.map(|n| n.id),
        Some("envoy-ratelimit".into())
    );
    xds.push("1", &[gateway_limits(1)]).await;
    assert!(xds.next_request().await.request.error_detail.is_none());
    let mut client = sluice.client().await;
    let req = || {
        request(
            LISTENER,
            vec![descriptor(&[
                (ROUTE, ROUTE),
                ("remote_address", "10.6.0.1"),
            ])],
        )
    };
    let mut codes = Vec::new();
    for _ in 0..2 {
        let response = client.should_rate_limit(req()).await.unwrap();
        codes.push(response.into_inner().overall_code);
    }
    assert_eq!(codes, [Code::Ok as i32, Code::OverLimit as i32]);
    xds.push("2", &[broken_limits()]).await;
    assert!(xds.next_request().await.request.error_detail.is_some());

    let admin = sluice.admin_addr;
    let metrics = tokio::task::spawn_blocking(move || scrape(admin))
        .await
        .unwrap();
    for series in [
        "sluice_xds_connected",
        r#"sluice_xds_config_version_info{version="1"}"#,
        r#"sluice_xds_responses_total{result="applied"}"#,
        r#"sluice_xds_responses_total{result="invalid_config"}"#,
        r#"sluice_config_loads_total{result="failure"}"#,
    ] {
        assert_eq!(value(&metrics, series), 1.0, "{series}");
    }
    // Every xDS family on the page is documented.
    let docs = std::fs::read_to_string(
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs/metrics.md"),
    )
    .expect("docs/metrics.md");
    for family in samples(&metrics)
        .iter()
        .map(|s| s.family())
        .filter(|f| f.starts_with("sluice_xds_"))
    {
        assert!(
            docs.contains(&format!("`{family}`")),
            "{family} undocumented"
        );
    }
    let log = sluice.log_text();
    for expected in [
        "RUNTIME_ROOT ignored: CONFIG_TYPE=GRPC_XDS_SOTW takes the limits from xDS",
        "xds config applied",
        "xds: config rejected (NACK); keeping the previous config",
    ] {
        assert!(log.contains(expected), "log lacks `{expected}`:\n{log}");
    }
}
