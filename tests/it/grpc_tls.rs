//! The gRPC port over TLS: mutual TLS for the RLS, the quota service, gRPC health and reflection
//! on the same port
//! (tonic clients and grpcurl with `-cacert/-cert/-key`), clients without the right certificate
//! refused, the client name check, a rotated Secret served without a restart (new connections
//! get the new certificates, open ones carry on, a broken rotation changes nothing), and the
//! start-up errors of the binary. Certificates are made by the test (rcgen); the files live in
//! a Secret-shaped volume (`..data` symlink swaps, tests/it/helpers/secret.rs).
//!
//! Rotation is polled every 100 ms here; a test waits up to 10 s for it to show (a loaded
//! 2-core machine may delay a poll, never by seconds).

use crate::helpers;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use helpers::certs::{Issued, TestCa, Usage};
use helpers::process::run_sluice;
use helpers::secret::SecretVolume;
use helpers::{
    QuotaStream, TestServer, descriptor, quota_actions, quota_line, request, test_settings,
};
use sluice::proto::envoy::service::ratelimit::v3::rate_limit_response::Code;
use sluice::proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use sluice::server::tls::TlsSettings;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

/// The name sluice's certificates carry (and clients check).
const SERVER_NAME: &str = "sluice.test";
const RELOAD: Duration = Duration::from_millis(100);
/// Bound of the wait for rotated certificates to be served (polled every [`RELOAD`]): generous
/// for a loaded machine.
const ROTATION_DEADLINE: Duration = Duration::from_secs(10);

/// A limits directory: domain `tls`, descriptor `k`, 100 per minute.
fn limits(dir: &Path) -> PathBuf {
    let path = dir.join("limits.yaml");
    std::fs::write(
        &path,
        "domain: tls\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 100}\n",
    )
    .unwrap();
    path
}

/// A CA, its server certificate for sluice and a client certificate, in one place.
struct Pki {
    ca: TestCa,
    server: Issued,
    client: Issued,
}

fn pki(dir: &Path, name: &str) -> Pki {
    let ca = TestCa::new(dir, name);
    let server = ca.issue(
        &format!("{name}-server"),
        &[SERVER_NAME, "127.0.0.1"],
        Usage::Server,
    );
    let client = ca.issue(&format!("{name}-envoy"), &["envoy.test"], Usage::Client);
    Pki { ca, server, client }
}

/// The Secret's files for `pki`: sluice's certificate and key, and the CA of its clients.
fn secret_files(pki: &Pki) -> [(&'static str, &str); 3] {
    [
        ("tls.crt", pki.server.cert_pem.as_str()),
        ("tls.key", pki.server.key_pem.as_str()),
        ("ca.crt", pki.ca.cert_pem.as_str()),
    ]
}

fn tls_settings(volume: &SecretVolume) -> TlsSettings {
    TlsSettings {
        client_ca: vec![volume.path("ca.crt")],
        reload_interval: RELOAD,
        ..TlsSettings::new(volume.path("tls.crt"), volume.path("tls.key"))
    }
}

fn serve(dir: &Path, tls: TlsSettings) -> TestServer {
    let mut settings = test_settings(&limits(dir), None);
    settings.grpc_tls = Some(tls);
    TestServer::start(settings)
}

/// A client that trusts `server_ca` and presents `identity`, if any.
fn client_tls(server_ca: &TestCa, identity: Option<&Issued>) -> ClientTlsConfig {
    let config = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&server_ca.cert_pem))
        .domain_name(SERVER_NAME);
    match identity {
        Some(id) => config.identity(Identity::from_pem(&id.cert_pem, &id.key_pem)),
        None => config,
    }
}

/// A new connection (its own TLS handshake) to `addr`.
async fn connect(addr: SocketAddr, tls: ClientTlsConfig) -> Result<Channel, String> {
    Channel::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(tls)
        .map_err(|e| format!("{e:?}"))?
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|e| format!("{e:?}"))
}

/// One decision on `channel`: its overall code, or the error. With TLS 1.3 a refused client
/// certificate shows here, on the first call, not at connect.
async fn decide(channel: Channel) -> Result<Code, String> {
    let response = RateLimitServiceClient::new(channel)
        .should_rate_limit(request("tls", vec![descriptor(&[("k", "v")])]))
        .await
        .map_err(|e| format!("{e:?}"))?;
    Ok(response.into_inner().overall_code())
}

/// A decision over a new connection.
async fn decide_new(addr: SocketAddr, tls: ClientTlsConfig) -> Result<Code, String> {
    decide(connect(addr, tls).await?).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_serves_the_rls_health_and_reflection_on_one_port() {
    let dir = tempfile::tempdir().unwrap();
    let pki = pki(dir.path(), "one");
    let volume = SecretVolume::new(&dir.path().join("certs"), &secret_files(&pki));
    let sluice = serve(dir.path(), tls_settings(&volume));
    let tls = client_tls(&pki.ca, Some(&pki.client));

    let channel = connect(sluice.grpc_addr, tls).await.expect("mutual TLS");
    assert_eq!(decide(channel.clone()).await, Ok(Code::Ok));
    // The quota service on the same port and TLS.
    let mut quota = QuotaStream::open(channel.clone()).await;
    let answer = quota
        .report("tls", vec![quota_line(&[("k", "v")], 0, 1, 0)])
        .await
        .expect("an answer over mutual TLS");
    assert_eq!(quota_actions(&answer), ["k=v deny", "k=v tokens:8"]);
    let health = HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: "envoy.service.ratelimit.v3.RateLimitService".into(),
        })
        .await
        .expect("health over TLS")
        .into_inner();
    assert_eq!(health.status(), ServingStatus::Serving);

    // Plaintext gets nothing on the TLS port.
    let plain = Channel::from_shared(format!("http://{}", sluice.grpc_addr))
        .unwrap()
        .connect()
        .await;
    let plain = match plain {
        Ok(channel) => decide(channel).await,
        Err(e) => Err(e.to_string()),
    };
    assert!(plain.is_err(), "plaintext answered: {plain:?}");

    // grpcurl, as an operator runs it: reflection lists the services, health answers.
    let addr = sluice.grpc_addr.to_string();
    let files = [&pki.ca.cert, &pki.client.cert, &pki.client.key].map(|p| p.display().to_string());
    let grpcurl = |extra: &[&str]| {
        let out = Command::new("grpcurl")
            .args(["-max-time", "10", "-servername", SERVER_NAME])
            .args(["-cacert", &files[0], "-cert", &files[1], "-key", &files[2]])
            .args(extra)
            .output()
            .expect("grpcurl not found: scripts/setup.sh installs it");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, list, err) = grpcurl(&[&addr, "list"]);
    assert!(ok, "grpcurl list: {err}");
    for service in [
        "envoy.service.ratelimit.v3.RateLimitService",
        "envoy.service.rate_limit_quota.v3.RateLimitQuotaService",
        "grpc.health.v1.Health",
    ] {
        assert!(
            list.lines().any(|l| l == service),
            "{service} not listed:\n{list}"
        );
    }
    let (ok, check, err) = grpcurl(&[&addr, "grpc.health.v1.Health/Check"]);
    assert!(ok, "grpcurl health: {err}");
    assert!(check.contains("\"status\": \"SERVING\""), "{check}");
    // Without a client certificate grpcurl is refused too.
    let out = Command::new("grpcurl")
        .args(["-max-time", "10", "-servername", SERVER_NAME])
        .args(["-cacert", &files[0], &addr, "list"])
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "grpcurl without a client certificate was served"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_without_the_right_certificate_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let pki = pki(dir.path(), "good");
    let stranger = pki_of_other_ca(dir.path());
    let volume = SecretVolume::new(&dir.path().join("certs"), &secret_files(&pki));
    let sluice = serve(dir.path(), tls_settings(&volume));
    let addr = sluice.grpc_addr;

    assert_eq!(
        decide_new(addr, client_tls(&pki.ca, Some(&pki.client))).await,
        Ok(Code::Ok)
    );
    let none = decide_new(addr, client_tls(&pki.ca, None)).await;
    assert!(none.is_err(), "no client certificate was served: {none:?}");
    let other_ca = decide_new(addr, client_tls(&pki.ca, Some(&stranger))).await;
    assert!(
        other_ca.is_err(),
        "another CA's client was served: {other_ca:?}"
    );

    // With a name to check: only the client certificate that carries it.
    let mut named = tls_settings(&volume);
    named.client_san = Some("envoy.test".into());
    let checked = serve(dir.path(), named);
    let other_name = pki.ca.issue("other-name", &["other.test"], Usage::Client);
    assert_eq!(
        decide_new(checked.grpc_addr, client_tls(&pki.ca, Some(&pki.client))).await,
        Ok(Code::Ok)
    );
    let wrong = decide_new(checked.grpc_addr, client_tls(&pki.ca, Some(&other_name))).await;
    assert!(
        wrong.is_err(),
        "a client without the name was served: {wrong:?}"
    );
}

/// A client certificate signed by a CA sluice does not trust.
fn pki_of_other_ca(dir: &Path) -> Issued {
    let other = TestCa::new(dir, "stranger");
    other.issue("stranger-envoy", &["envoy.test"], Usage::Client)
}

/// Retries a decision over new connections until it succeeds, within [`ROTATION_DEADLINE`].
async fn until_served(addr: SocketAddr, tls: &ClientTlsConfig) -> Duration {
    let start = Instant::now();
    loop {
        match decide_new(addr, tls.clone()).await {
            Ok(code) => {
                assert_eq!(code, Code::Ok);
                return start.elapsed();
            }
            Err(e) => assert!(
                start.elapsed() < ROTATION_DEADLINE,
                "not served {ROTATION_DEADLINE:?} after the rotation: {e}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_secret_is_served_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let old = pki(dir.path(), "old");
    let new = pki(dir.path(), "new");
    let mut volume = SecretVolume::new(&dir.path().join("certs"), &secret_files(&old));
    let sluice = serve(dir.path(), tls_settings(&volume));
    let addr = sluice.grpc_addr;
    let old_client = client_tls(&old.ca, Some(&old.client));
    let new_client = client_tls(&new.ca, Some(&new.client));

    let open = connect(addr, old_client.clone()).await.unwrap();
    assert_eq!(decide(open.clone()).await, Ok(Code::Ok));
    assert!(decide_new(addr, new_client.clone()).await.is_err());

    // A new CA, server certificate and client CA, swapped in as the kubelet does.
    volume.update(&secret_files(&new));
    let took = until_served(addr, &new_client).await;
    println!("rotation picked up after {took:?} (poll every {RELOAD:?})");
    let refused = decide_new(addr, old_client.clone()).await;
    assert!(
        refused.is_err(),
        "the old CA's client is still served: {refused:?}"
    );
    // The connection opened before the rotation carries on.
    assert_eq!(decide(open).await, Ok(Code::Ok));

    // A rotation that does not load (a key of another certificate) changes nothing.
    let stray = new.ca.issue("stray", &[SERVER_NAME], Usage::Server);
    volume.update(&[
        ("tls.crt", new.server.cert_pem.as_str()),
        ("tls.key", stray.key_pem.as_str()),
        ("ca.crt", new.ca.cert_pem.as_str()),
    ]);
    tokio::time::sleep(RELOAD * 5).await;
    assert_eq!(decide_new(addr, new_client).await, Ok(Code::Ok));
}

/// What `sluice serve` prints and exits with for `args` (on top of a valid config).
fn serve_fails(dir: &Path, args: &[&str]) -> String {
    let config = limits(dir);
    let mut all = vec!["serve", "--config", config.to_str().unwrap()];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--grpc-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0"]);
    let out = run_sluice(&all, &[]);
    assert!(!out.status.success(), "started with {args:?}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn missing_or_invalid_files_stop_the_start_with_the_file_named() {
    let dir = tempfile::tempdir().unwrap();
    let pki = pki(dir.path(), "cli");
    let missing = dir.path().join("absent.pem");
    let (cert, key, ca) = (
        pki.server.cert.to_str().unwrap(),
        pki.server.key.to_str().unwrap(),
        pki.ca.cert.to_str().unwrap(),
    );
    let err = serve_fails(
        dir.path(),
        &[
            "--grpc-tls-cert",
            missing.to_str().unwrap(),
            "--grpc-tls-key",
            key,
        ],
    );
    assert!(
        err.contains(&format!("reading --grpc-tls-cert {}: ", missing.display())),
        "{err}"
    );
    let err = serve_fails(dir.path(), &["--grpc-tls-cert", cert, "--grpc-tls-key", ca]);
    assert!(err.contains("holds no PRIVATE KEY"), "{err}");
    let err = serve_fails(dir.path(), &["--grpc-tls-cert", cert]);
    assert!(err.contains("--grpc-tls-key"), "{err}");
    let err = serve_fails(
        dir.path(),
        &[
            "--grpc-tls-cert",
            cert,
            "--grpc-tls-key",
            key,
            "--grpc-client-san",
            "x.test",
        ],
    );
    assert!(err.contains("--grpc-client-ca"), "{err}");
}

/// Refused handshakes are rate-limited in the log like the other per-connection lines (each
/// wrote a warning: 1,500 wrong-CA handshakes wrote 1,500 lines, a plain HTTP loop against
/// the port 1,400 lines/s), and a client that never finishes its handshake is dropped after
/// `--request-timeout-ms` (it was a fixed 10 s). The binary, for its log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_handshakes_write_a_bounded_log_and_time_out_with_the_request_timeout() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().unwrap();
    let pki = pki(dir.path(), "flood");
    let stranger = pki_of_other_ca(dir.path());
    let [(_, cert), (_, key), (_, ca)] = secret_files(&pki);
    for (name, text) in [("tls.crt", cert), ("tls.key", key), ("ca.crt", ca)] {
        std::fs::write(dir.path().join(name), text).unwrap();
    }
    let path = |name: &str| dir.path().join(name).display().to_string();
    let (cert, key, ca) = (path("tls.crt"), path("tls.key"), path("ca.crt"));
    let args = [
        "--grpc-tls-cert",
        cert.as_str(),
        "--grpc-tls-key",
        key.as_str(),
        "--grpc-client-ca",
        ca.as_str(),
        "--request-timeout-ms",
        "300",
    ];
    let sluice = helpers::Sluice::start_with(&limits(dir.path()), None, &args);
    let addr = sluice.grpc_addr;
    let lines_before = sluice.log.lock().unwrap().len();

    // 1,000 refused handshakes: plain HTTP to the TLS port, and wrong-CA clients.
    tokio::task::spawn_blocking(move || {
        for _ in 0..950 {
            let mut tcp = std::net::TcpStream::connect(addr).unwrap();
            let _ = tcp.write_all(b"GET / HTTP/1.1\r\nHost: sluice\r\n\r\n");
            let _ = tcp.read(&mut [0u8; 64]);
        }
    })
    .await
    .unwrap();
    for _ in 0..50 {
        let refused = decide_new(addr, client_tls(&pki.ca, Some(&stranger))).await;
        assert!(refused.is_err(), "a stranger was served");
    }

    // A client that connects and says nothing is closed after the request timeout.
    let started = Instant::now();
    let closed = tokio::task::spawn_blocking(move || {
        let mut tcp = std::net::TcpStream::connect(addr).unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        tcp.read(&mut [0u8; 64])
    })
    .await
    .unwrap();
    let waited = started.elapsed();
    assert!(
        matches!(closed, Ok(0)) || closed.is_err(),
        "the silent client got {closed:?}"
    );
    assert!(
        waited >= Duration::from_millis(250) && waited < Duration::from_secs(3),
        "closed after {waited:?}"
    );

    let log = sluice.log.lock().unwrap()[lines_before..].to_vec();
    let refused: Vec<_> = log
        .iter()
        .filter(|l| l.contains("gRPC TLS handshake refused"))
        .collect();
    println!(
        "1,000 refused handshakes: {} log lines, {} of them refusals",
        log.len(),
        refused.len()
    );
    assert!(!refused.is_empty(), "a refusal is still logged: {log:?}");
    assert!(log.len() <= 24, "{} lines: {log:#?}", log.len());
}
