//! A real Envoy calling sluice over mutual TLS the way Envoy Gateway configures it
//! (tests/it/helpers/gateway.rs): its certgen's certificates (RSA, PKCS#1 keys, no extended key
//! usage), its rate-limit cluster (`UpstreamTlsContext` from files, TLS 1.2 at most), its
//! route-side shapes in `RateLimitPerRoute` (a check with `hits_addend: {number: 0}`, then the
//! response's cost charged with `apply_on_stream_done`), sluice verifying Envoy's client
//! certificate against the CA of its Secret. Also: a client certificate of another CA is
//! refused, and a rotated Secret reaches Envoy without restarting sluice.
//!
//! sluice runs in process (memory backend), its certificates in a Secret-shaped volume polled
//! every 100 ms; a rotation must show within 10 s. The filter's timeout is 1 s, not Envoy
//! Gateway's 20 ms (a debug build on a busy 2-core machine misses 20 ms now and then; the
//! budget itself is tests/it/envoy_faults.rs's subject).

use crate::helpers;

use std::path::Path;
use std::time::{Duration, Instant};

use helpers::envoy_config::{bootstrap, cluster};
use helpers::gateway::{self, GatewayPki, Pem};
use helpers::secret::SecretVolume;
use helpers::{Envoy, Req, TestServer, Upstream, test_settings};
use sluice::server::tls::TlsSettings;

const TIMEOUT_MS: u64 = 1000;
/// Bound of the wait for a rotated Secret to be served (the watcher polls every 100 ms):
/// generous for a loaded machine.
const ROTATION_DEADLINE: Duration = Duration::from_secs(10);

/// sluice with the Secret `volume` (`tls.crt`, `tls.key`, `ca.crt`: Envoy's CA) and Envoy
/// Gateway's limits for [`ROUTE`]: `budget` tokens per minute.
fn sluice(dir: &Path, volume: &SecretVolume, budget: u32) -> TestServer {
    let limits = dir.join("limits.yaml");
    std::fs::write(&limits, gateway::limits_yaml(budget, "minute")).unwrap();
    let mut settings = test_settings(&limits, None);
    settings.grpc_tls = Some(TlsSettings {
        client_ca: vec![volume.path("ca.crt")],
        reload_interval: Duration::from_millis(100),
        ..TlsSettings::new(volume.path("tls.crt"), volume.path("tls.key"))
    });
    TestServer::start(settings)
}

/// An upstream and an Envoy whose rate-limit cluster presents `client` and trusts `ca`.
fn envoy(sluice: &TestServer, client: &Pem, ca: &Path) -> (Upstream, Envoy) {
    let upstream = Upstream::start();
    let clusters = vec![
        cluster("app", &[upstream.addr]),
        gateway::ratelimit_cluster(sluice.grpc_addr, client, ca),
    ];
    let envoy = Envoy::start_json(&bootstrap(
        vec![gateway::listener("app", TIMEOUT_MS)],
        clusters,
    ));
    (upstream, envoy)
}

/// Envoy Gateway's token budget over mutual TLS: 8 tokens per minute, each response costing 4
/// (`x-tokens`); the checks charge nothing, the charges land after each response, and the
/// third request finds the budget spent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_gateway_shapes_answered_over_mutual_tls() {
    let dir = tempfile::tempdir().unwrap();
    let pki = GatewayPki::new(dir.path(), "cluster");
    let volume = SecretVolume::new(&dir.path().join("certs"), &pki.ratelimit_secret());
    let sluice = sluice(dir.path(), &volume, 8);
    let (_upstream, envoy) = envoy(&sluice, &pki.envoy, &pki.ca);
    let edge = envoy.listener("gateway");
    let send = || {
        Req::get("/v1/chat")
            .header("x-reply-x-tokens", "4")
            .send(edge)
    };

    let mut statuses = Vec::new();
    for left_after in [4, 0] {
        let resp = send().await;
        statuses.push(resp.status);
        assert_eq!(resp.status, 200, "{resp:?}");
        assert!(
            resp.header("x-ratelimit-limit")
                .is_some_and(|l| l.starts_with("8")),
            "Envoy's X-RateLimit-Limit from sluice's answer: {resp:?}"
        );
        gateway::until_tokens_left(sluice.grpc_addr, &pki, left_after).await;
    }
    let spent = send().await;
    statuses.push(spent.status);
    assert_eq!(spent.status, 429, "{spent:?}");
    assert_eq!(
        spent.header("x-ratelimit-remaining"),
        Some("0"),
        "{spent:?}"
    );
    println!("statuses through Envoy over mutual TLS: {statuses:?}");
    assert_eq!(
        gateway::tokens_left(sluice.grpc_addr, &pki).await,
        0,
        "a refused check charges nothing"
    );

    // Envoy's own view: TLS handshakes to sluice, at TLS 1.2 (its upstream default).
    let handshakes = envoy.counter("cluster.ratelimit_cluster.ssl.handshake");
    let tls12 = envoy.counter("cluster.ratelimit_cluster.ssl.versions.TLSv1.2");
    assert!(
        handshakes >= 1 && tls12 == handshakes,
        "handshakes {handshakes}, TLS 1.2 {tls12}"
    );
    assert_eq!(
        envoy.counter("cluster.ratelimit_cluster.ssl.connection_error"),
        0
    );
}

/// Envoy with a client certificate of another CA: sluice refuses the handshake, Envoy's call
/// fails and its filter fails closed (500).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_of_another_ca_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let pki = GatewayPki::new(dir.path(), "cluster");
    let other = GatewayPki::new(dir.path(), "other");
    let volume = SecretVolume::new(&dir.path().join("certs"), &pki.ratelimit_secret());
    let sluice = sluice(dir.path(), &volume, 8);
    // Envoy trusts sluice's CA but presents a certificate sluice's CA did not sign.
    let (_upstream, envoy) = envoy(&sluice, &other.envoy, &pki.ca);
    let resp = Req::get("/v1/chat").send(envoy.listener("gateway")).await;
    assert_eq!(resp.status, 500, "fail closed: {resp:?}");
    assert!(
        envoy.counter("cluster.ratelimit_cluster.ssl.connection_error") >= 1,
        "{}",
        envoy.admin_get("/stats?filter=ratelimit_cluster.ssl")
    );
    assert_eq!(envoy.counter("cluster.ratelimit_cluster.ssl.handshake"), 0);
}

/// The Secret is rotated to a new CA (Envoy already has the new one's certificate and trusts
/// only it): refused until the swap, served after it, sluice never restarted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_secret_reaches_envoy_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let old = GatewayPki::new(dir.path(), "old");
    let new = GatewayPki::new(dir.path(), "new");
    let mut volume = SecretVolume::new(&dir.path().join("certs"), &old.ratelimit_secret());
    let sluice = sluice(dir.path(), &volume, 100);
    let (_upstream, envoy) = envoy(&sluice, &new.envoy, &new.ca);
    let edge = envoy.listener("gateway");
    assert_eq!(
        Req::get("/").send(edge).await.status,
        500,
        "old certificates"
    );

    volume.update(&new.ratelimit_secret());
    let start = Instant::now();
    loop {
        let resp = Req::get("/")
            .header("x-reply-x-tokens", "1")
            .send(edge)
            .await;
        if resp.status == 200 {
            break;
        }
        assert!(
            start.elapsed() < ROTATION_DEADLINE,
            "still {} {ROTATION_DEADLINE:?} after the rotation",
            resp.status
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!(
        "Envoy served {:?} after the Secret's rotation",
        start.elapsed()
    );
}
