//! TLS and ACL authentication against real `redis-server` processes: certificates are made by
//! the test with `openssl` (a private CA and a server certificate for 127.0.0.1), the ACL user
//! is created with `--user`. TLS runs in process; the password test runs the binary, because
//! what it checks is `main`'s: passwords reach sluice from a file or an environment variable
//! and must never appear in its log.

mod helpers;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use helpers::{descriptor, fixture, request, test_settings, RedisServer, Sluice, TestServer};
use sluice::limiter::redis::{RedisLimiter, RedisOptions};
use sluice::limiter::{Hit, HitKind, Limiter, LimiterError};
use sluice::proto::envoy::service::ratelimit::v3::rate_limit_response::Code;
use tempfile::TempDir;

fn limits() -> PathBuf {
    fixture("e2e/limits")
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl not found: run scripts/test.sh, which installs it");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA and a server certificate for IP 127.0.0.1, signed by it, in a fresh temp dir.
fn certificates() -> TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path();
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    openssl(
        d,
        &[
            &["req", "-x509"][..],
            &ec,
            &[
                "-keyout",
                "ca.key",
                "-out",
                "ca.crt",
                "-days",
                "1",
                "-subj",
                "/CN=sluice test CA",
            ],
        ]
        .concat(),
    );
    openssl(
        d,
        &[
            &["req"][..],
            &ec,
            &[
                "-keyout",
                "server.key",
                "-out",
                "server.csr",
                "-subj",
                "/CN=127.0.0.1",
            ],
        ]
        .concat(),
    );
    std::fs::write(d.join("san.ext"), "subjectAltName=IP:127.0.0.1\n").expect("write ext");
    openssl(
        d,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.crt",
            "-days",
            "1",
            "-extfile",
            "san.ext",
        ],
    );
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
        path("server.crt"),
        "--tls-key-file".into(),
        path("server.key"),
        "--tls-ca-cert-file".into(),
        path("ca.crt"),
        "--tls-auth-clients".into(),
        "no".into(),
    ]);
    (server, tls_port)
}

fn one_hit() -> Vec<Hit> {
    vec![Hit {
        key: "sluice:{k}".into(),
        limit: 5,
        window_ms: 1000,
        hits: 1,
        kind: HitKind::Consume,
        over_limit: sluice::limiter::OverLimit::default(),
        algorithm: sluice::limiter::Algorithm::SlidingLog,
    }]
}

#[tokio::test]
async fn rediss_with_the_ca_file_decides_and_without_it_fails() {
    let certs = certificates();
    let (_server, tls_port) = tls_server(certs.path());
    let url = format!("rediss://127.0.0.1:{tls_port}/");
    let options = RedisOptions {
        ca_file: Some(certs.path().join("ca.crt")),
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
        Err(LimiterError::Unavailable(_)) => {}
        other => panic!("untrusted certificate accepted: {other:?}"),
    }
    // Plain text to the TLS port is not Redis talking.
    let plain = format!("redis://127.0.0.1:{tls_port}/");
    assert!(RedisLimiter::connect(&RedisOptions::new(plain))
        .await
        .is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sluice_serves_over_tls_with_a_ca_file() {
    let certs = certificates();
    let (_server, tls_port) = tls_server(certs.path());
    let mut settings = test_settings(&limits(), None);
    settings.backend.redis = Some(RedisOptions {
        ca_file: Some(certs.path().join("ca.crt")),
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
