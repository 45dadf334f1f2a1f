//! TLS and ACL authentication against real `redis-server` processes (and a sentinel): certificates
//! are made by the test with rcgen (a private CA and a server certificate for 127.0.0.1), the
//! ACL user is created with `--user`. TLS runs in process; the password test runs the binary, because
//! what it checks is `main`'s: passwords reach sluice from a file or an environment variable
//! and must never appear in its log.

use crate::helpers;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use helpers::certs::{TestCa, Usage};
use helpers::{
    RedisServer, Sluice, TestServer, descriptor, fixture, http_get, request, test_settings,
};
use sluice::limiter::redis::connect::ClientCert;
use sluice::limiter::redis::{RedisLimiter, RedisOptions};
use sluice::limiter::{Item, ItemKind, Limiter, LimiterError};
use sluice::proto::envoy::service::ratelimit::v3::rate_limit_response::Code;
use tempfile::TempDir;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

fn limits() -> PathBuf {
    fixture("e2e/limits")
}

/// In a fresh temp dir: a CA (`redis-ca.pem`), a server certificate for IP 127.0.0.1
/// (`server.pem`, `server-key.pem`) and a client certificate (`client`) signed by it, and a
/// client certificate signed by another CA (`stranger`, by `other-ca.pem`).
fn certificates() -> TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    let ca = TestCa::new(dir.path(), "redis");
    ca.issue("server", &["127.0.0.1"], Usage::Server);
    ca.issue("client", &["sluice"], Usage::Client);
    TestCa::new(dir.path(), "other").issue("stranger", &["sluice"], Usage::Client);
    dir
}

/// A redis-server with a TLS port (clients need no certificate of their own).
fn tls_server(certs: &Path) -> (RedisServer, u16) {
    let tls_port = helpers::free_port();
    let path = |f: &str| certs.join(f).display().to_string();
    let server = RedisServer::start_with(&[
        "--tls-port".into(),
        tls_port.to_string(),
        "--tls-cert-file".into(),
        path("server.pem"),
        "--tls-key-file".into(),
        path("server-key.pem"),
        "--tls-ca-cert-file".into(),
        path("redis-ca.pem"),
        "--tls-auth-clients".into(),
        "no".into(),
    ]);
    (server, tls_port)
}

fn one_hit() -> Vec<Item> {
    vec![Item {
        key: "sluice:{k}".into(),
        limit: 5,
        window_ms: 1000,
        hits: 1,
        kind: ItemKind::Consume,
        over_limit: sluice::limiter::OverLimit::default(),
        algorithm: sluice::limiter::Algorithm::SlidingLog,
        lease: 0,
        hold_ms: 0,
    }]
}

#[tokio::test]
async fn rediss_with_the_ca_file_decides_and_without_it_fails() {
    let certs = certificates();
    let (_server, tls_port) = tls_server(certs.path());
    let url = format!("rediss://127.0.0.1:{tls_port}/");
    let options = RedisOptions {
        ca_file: Some(certs.path().join("redis-ca.pem")),
        ..RedisOptions::new(url.clone())
    };
    let limiter: Arc<dyn Limiter> = Arc::new(
        RedisLimiter::connect(&options)
            .await
            .unwrap_or_else(|e| panic!("TLS connect: {e}")),
    );
    let out = limiter
        .decide(&one_hit(), None)
        .await
        .expect("decide over TLS");
    assert!(out.admitted);
    assert_eq!(out.items[0].count, 1);

    // The test CA is not among the system roots: the certificate must be refused.
    match RedisLimiter::connect(&RedisOptions::new(url)).await {
        Err(LimiterError::Unavailable(message)) => assert!(
            message.contains("the Redis server certificate is not trusted"),
            "{message}"
        ),
        other => panic!("untrusted certificate accepted: {other:?}"),
    }
    // Plain text to the TLS port is not Redis talking.
    let plain = format!("redis://127.0.0.1:{tls_port}/");
    assert!(
        RedisLimiter::connect(&RedisOptions::new(plain))
            .await
            .is_err()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sluice_serves_over_tls_with_a_ca_file() {
    let certs = certificates();
    let (_server, tls_port) = tls_server(certs.path());
    let mut settings = test_settings(&limits(), None);
    settings.backend.redis = Some(RedisOptions {
        ca_file: Some(certs.path().join("redis-ca.pem")),
        ..RedisOptions::new(format!("rediss://127.0.0.1:{tls_port}/"))
    });
    let sluice = TestServer::start(settings);
    let mut client = sluice.client().await;
    for expected in [Code::Ok, Code::Ok, Code::Ok, Code::OverLimit] {
        let resp = client
            .should_rate_limit(request(
                "edge",
                vec![descriptor(&[("generic_key", "demo")])],
            ))
            .await
            .expect("call over TLS backend")
            .into_inner();
        assert_eq!(resp.overall_code, expected as i32);
    }
}

const PASSWORD: &str = "s3cret-acl-pw";

fn acl_server() -> RedisServer {
    // `app` may run the script on sluice keys only; the default user stays open for the
    // harness's readiness PING.
    RedisServer::start_with(&[
        "--user".into(),
        "app".into(),
        "on".into(),
        format!(">{PASSWORD}"),
        "~sluice:*".into(),
        "+@all".into(),
    ])
}

async fn first_call_code(sluice: &Sluice) -> Result<i32, tonic::Code> {
    let mut client = sluice.client().await;
    client
        .should_rate_limit(request(
            "edge",
            vec![descriptor(&[("generic_key", "demo")])],
        ))
        .await
        .map(|r| r.into_inner().overall_code)
        .map_err(|s| s.code())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_user_with_password_from_a_file_or_the_environment() {
    let server = acl_server();
    let url = format!("redis://app@127.0.0.1:{}/", server.port());
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("redis-password");
    std::fs::write(&file, format!("{PASSWORD}\n")).expect("write password file");
    let file_arg = file.display().to_string();

    let from_file =
        Sluice::start_with(&limits(), Some(&url), &["--redis-password-file", &file_arg]);
    assert_eq!(first_call_code(&from_file).await, Ok(Code::Ok as i32));

    let from_env = Sluice::start_with_env(
        &limits(),
        Some(&url),
        &[],
        &[("SLUICE_REDIS_PASSWORD", PASSWORD)],
    );
    assert_eq!(first_call_code(&from_env).await, Ok(Code::Ok as i32));

    // The file wins over the environment; a wrong password is an outage, not a crash.
    std::fs::write(&file, "wrong\n").expect("write password file");
    let wrong = Sluice::start_with_env(
        &limits(),
        Some(&url),
        &["--redis-password-file", &file_arg],
        &[("SLUICE_REDIS_PASSWORD", PASSWORD)],
    );
    assert_eq!(first_call_code(&wrong).await, Err(tonic::Code::Unavailable));

    // A password in the URL works too, and never reaches the log.
    let in_url = format!("redis://app:{PASSWORD}@127.0.0.1:{}/", server.port());
    let from_url = Sluice::start(&limits(), Some(&in_url));
    assert_eq!(first_call_code(&from_url).await, Ok(Code::Ok as i32));
    for sluice in [&from_file, &from_env, &wrong, &from_url] {
        let log = sluice.log_text();
        assert!(!log.contains(PASSWORD), "password in the log:\n{log}");
        assert!(log.contains("backend: redis"), "{log}");
    }
}

/// A redis-server that serves TLS only (`--port 0`) and requires a client certificate signed
/// by the test CA (`--tls-auth-clients yes`); killed on drop.
struct MutualTlsRedis {
    child: std::process::Child,
    port: u16,
    _dir: TempDir,
}

impl MutualTlsRedis {
    fn start(certs: &Path) -> MutualTlsRedis {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = |f: &str| certs.join(f).display().to_string();
        let port = helpers::free_port();
        let child = helpers::redis_server::spawn_redis_server(
            Command::new("redis-server")
                .args(["--port", "0", "--tls-port", &port.to_string()])
                .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
                .args(["--tls-cert-file", &path("server.pem")])
                .args(["--tls-key-file", &path("server-key.pem")])
                .args(["--tls-ca-cert-file", &path("redis-ca.pem")])
                .args(["--tls-auth-clients", "yes"])
                .arg("--dir")
                .arg(dir.path()),
        );
        let server = MutualTlsRedis {
            child,
            port,
            _dir: dir,
        };
        // Listening is all a TLS-only server can show without a handshake.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "redis-server did not listen on its TLS port {port}"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        server
    }

    fn url(&self) -> String {
        format!("rediss://127.0.0.1:{}/", self.port)
    }
}

impl Drop for MutualTlsRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// TLS options for `server`, trusting the test CA and presenting the certificate `client`
/// (`client.pem`/`client-key.pem` in `certs`), if any.
fn mutual_tls(server: &MutualTlsRedis, certs: &Path, client: Option<&str>) -> RedisOptions {
    RedisOptions {
        ca_file: Some(certs.join("redis-ca.pem")),
        client_cert: client.map(|name| ClientCert {
            cert: certs.join(format!("{name}.pem")),
            key: certs.join(format!("{name}-key.pem")),
        }),
        ..RedisOptions::new(server.url())
    }
}

#[tokio::test]
async fn mutual_tls_decides_with_the_right_client_certificate_only() {
    let certs = certificates();
    let server = MutualTlsRedis::start(certs.path());
    let right = RedisLimiter::connect(&mutual_tls(&server, certs.path(), Some("client")))
        .await
        .unwrap_or_else(|e| panic!("mutual TLS connect: {e}"));
    let out = right.decide(&one_hit(), None).await.expect("decide");
    assert!(out.admitted);
    for client in [None, Some("stranger")] {
        let err = RedisLimiter::connect(&mutual_tls(&server, certs.path(), client))
            .await
            .expect_err("a client the server does not trust");
        let expected = match client {
            None => "Redis requires a client certificate",
            Some(_) => "Redis refused the TLS handshake",
        };
        assert!(matches!(err, LimiterError::Unavailable(_)), "{err:?}");
        assert!(err.to_string().contains(expected), "{client:?}: {err}");
    }
}

/// The readiness sluice reports on gRPC health (service "").
async fn health(sluice: &Sluice) -> i32 {
    HealthClient::new(sluice.channel().await)
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .expect("health check")
        .into_inner()
        .status
}

/// What an operator sees when Redis refuses sluice's certificate: sluice serves (starting is
/// not Redis's business) but is not ready, on /readyz and gRPC health, its log says why, and
/// a decision gets UNAVAILABLE with the same reason. The right certificate makes it ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_client_certificate_is_reported_and_keeps_sluice_unready() {
    let certs = certificates();
    let server = MutualTlsRedis::start(certs.path());
    let file = |f: &str| certs.path().join(f).display().to_string();
    let start = |name: &str| {
        Sluice::start_with(
            &limits(),
            Some(&server.url()),
            &[
                "--redis-ca-file",
                &file("redis-ca.pem"),
                "--redis-tls-cert",
                &file(&format!("{name}.pem")),
                "--redis-tls-key",
                &file(&format!("{name}-key.pem")),
            ],
        )
    };
    let stranger = start("stranger");
    // The first probe runs before the listeners are announced: its verdict is already there.
    assert_eq!(http_get(stranger.admin_addr, "/readyz").0, 503);
    assert_eq!(health(&stranger).await, ServingStatus::NotServing as i32);
    let refused = stranger
        .client()
        .await
        .should_rate_limit(request(
            "edge",
            vec![descriptor(&[("generic_key", "demo")])],
        ))
        .await
        .expect_err("no decision without a trusted certificate");
    assert_eq!(refused.code(), tonic::Code::Unavailable);
    assert!(
        refused
            .message()
            .contains("Redis refused the TLS handshake"),
        "{refused:?}"
    );
    let log = stranger.log_text();
    assert!(
        log.contains("backend unreachable: not serving")
            && log.contains("Redis refused the TLS handshake"),
        "{log}"
    );

    let client = start("client");
    // Ready at the first probe that completes (a loaded machine can make the first one, TLS
    // handshakes and script load included, miss its 500 ms; the next comes a second later).
    let ready_by = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while http_get(client.admin_addr, "/readyz").0 != 200 {
        assert!(
            std::time::Instant::now() < ready_by,
            "{}",
            client.log_text()
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    // Readiness flips before the probe logs, and the log is read from a pipe: wait for it.
    helpers::wait_until(
        "the log says the backend is reachable",
        std::time::Duration::from_secs(5),
        || async { client.log_text().contains("backend reachable: serving") },
    )
    .await;
    assert_eq!(health(&client).await, ServingStatus::Serving as i32);
    assert_eq!(first_call_code(&client).await, Ok(Code::Ok as i32));
}

/// `rediss+sentinel://` with a real sentinel on a TLS port that verifies clients and has a
/// password of its own, monitoring a primary over TLS that verifies clients too: the lookup
/// presents the client certificate and the sentinels' password to the sentinel, then the
/// certificate to the primary named, and decides there. Without the sentinels' password, with
/// a wrong one, or trusting another CA, the lookup fails naming the sentinel and why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_over_mutual_tls_with_a_password_of_its_own_names_the_primary() {
    const PASSWORD: &str = "sentinel-secret";
    let certs = certificates();
    let path = |f: &str| certs.path().join(f).display().to_string();
    let tls_port = helpers::free_port();
    let primary = RedisServer::start_with(&[
        "--tls-port".into(),
        tls_port.to_string(),
        "--tls-cert-file".into(),
        path("server.pem"),
        "--tls-key-file".into(),
        path("server-key.pem"),
        "--tls-ca-cert-file".into(),
        path("redis-ca.pem"),
        "--tls-auth-clients".into(),
        "yes".into(),
    ]);
    let sentinel = helpers::sentinel::start_tls_sentinel(
        tls_port,
        &format!(
            "tls-cert-file {}\ntls-key-file {}\ntls-client-cert-file {}\n\
             tls-client-key-file {}\ntls-ca-cert-file {}\ntls-auth-clients yes\n\
             tls-replication yes\nrequirepass {PASSWORD}",
            path("server.pem"),
            path("server-key.pem"),
            path("client.pem"),
            path("client-key.pem"),
            path("redis-ca.pem"),
        ),
    );
    let options = |password: Option<&str>, ca: &str| RedisOptions {
        ca_file: Some(certs.path().join(ca)),
        client_cert: Some(ClientCert {
            cert: certs.path().join("client.pem"),
            key: certs.path().join("client-key.pem"),
        }),
        sentinel_password: password.map(str::to_owned),
        pool_size: 1,
        ..RedisOptions::new(format!(
            "rediss+sentinel://127.0.0.1:{}/{}",
            sentinel.port,
            helpers::sentinel::MASTER
        ))
    };
    // The first lookup may miss its 1 s connects on a loaded machine (two TLS handshakes in a
    // debug build, a sentinel just started): tried again for up to 10 s.
    let by = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let limiter = loop {
        match RedisLimiter::connect(&options(Some(PASSWORD), "redis-ca.pem")).await {
            Ok(limiter) => break limiter,
            Err(e) if std::time::Instant::now() < by => {
                println!("not yet through the TLS sentinel: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
            Err(e) => panic!("through the TLS sentinel: {e}"),
        }
    };
    let out = limiter.decide(&one_hit(), None).await.expect("decided");
    assert!(out.admitted);
    assert_eq!(
        helpers::RedisCluster::cli(primary.port(), &["EXISTS", "sluice:{k}"]).trim(),
        "1",
        "not written on the primary"
    );

    let refused = |options: RedisOptions| async move {
        match RedisLimiter::connect(&options).await {
            Err(LimiterError::Unavailable(why)) => why,
            Err(other) => panic!("not unavailable: {other}"),
            Ok(_) => panic!("connected"),
        }
    };
    let named = format!("sentinel 127.0.0.1:{}", sentinel.port);
    let why = refused(options(None, "redis-ca.pem")).await;
    assert!(
        why.contains(&named) && why.contains("NOAUTH") && why.contains("password"),
        "{why}"
    );
    let why = refused(options(Some("not-the-password"), "redis-ca.pem")).await;
    assert!(
        why.contains(&named) && why.contains("AUTH refused") && !why.contains("not-the-password"),
        "{why}"
    );
    let why = refused(options(Some(PASSWORD), "other-ca.pem")).await;
    assert!(
        why.contains(&named) && why.contains("the Redis server certificate is not trusted"),
        "{why}"
    );
}
