//! The Envoy Gateway environment, black box: the binary started as `ratelimit` (a symlink named
//! so) with no arguments and nothing in its environment but what Envoy Gateway's rate-limit
//! Deployment sets (its `resource.go`, with Redis and Prometheus on), in a pod-like sandbox:
//! user and group 65534, no capabilities, no new privileges, the root filesystem read-only.
//! Changed for the test, and only these: the xDS server's address (the xDS test double on
//! loopback instead of `envoy-gateway:18001`), `REDIS_URL` (a test redis-server),
//! `PROMETHEUS_ADDR` (a free port instead of 19001), the certificate paths (a Secret-shaped
//! directory instead of `/certs`), and `GRPC_PORT` and `PORT`, which Envoy Gateway leaves unset
//! (envoyproxy/ratelimit's 8081 and 8080), set to free ports so parallel runs do not collide,
//! and `SLUICE_BACKEND_TIMEOUT_MS`, sluice's own per-decision deadline, raised from its 10 ms
//! default to the suite's test deadline: a debug build on a loaded 2-core machine misses 10 ms
//! now and then, like Envoy's 20 ms filter timeout below (tests/it/envoy_faults.rs tests both).
//!
//! It checks what Envoy Gateway relies on: the subscription over mutual TLS with node id
//! `envoy-ratelimit`, health before and after the first config (`/healthcheck` on `PORT`, the
//! path of its startup, readiness and liveness probes), limits pushed over xDS in its shapes
//! served to a real Envoy over mutual TLS (its cluster, its route-side check of 0 hits then the
//! response's cost on stream done), the Prometheus scrape on `PROMETHEUS_ADDR`, and a clean
//! SIGTERM. What it saw is printed.

use crate::helpers;

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use helpers::envoy_config::{bootstrap, cluster};
use helpers::gateway::{self, GatewayPki};
use helpers::in_process::TEST_BACKEND_TIMEOUT;
use helpers::prometheus::{scrape, sum, value};
use helpers::secret::SecretVolume;
use helpers::xds_server::{ServerTls, XdsServer};
use helpers::{Envoy, RedisServer, Req, Sluice, Upstream, free_port, http_get};
use sluice::proto::ratelimit::config::ratelimit::v3::RateLimitUnit;

/// The rate-limit filter's timeout: Envoy Gateway's default is 20 ms; a debug build on a
/// loaded 2-core machine misses that now and then (tests/it/envoy_faults.rs tests the budget).
const FILTER_TIMEOUT_MS: u64 = 1000;

/// `ratelimit` as Envoy Gateway's pod runs it: user and group 65534, no capabilities (none
/// inheritable, an empty bounding set), no new privileges, and `/` remounted read-only in a
/// private mount namespace (so `/tmp` too: sluice writes nothing). The environment is `env`
/// and nothing else; argv[0] is the symlink's path, with no argument.
fn pod(binary: &Path, env: &[(&str, String)]) -> Command {
    let mut cmd = Command::new("/usr/bin/unshare");
    cmd.args(["--mount", "--propagation", "private", "/bin/sh", "-c"])
        .arg(
            "/bin/mount -o remount,bind,ro / && exec /usr/bin/setpriv --reuid 65534 \
             --regid 65534 --clear-groups --no-new-privs --inh-caps=-all --bounding-set=-all \
             -- \"$0\"",
        )
        .arg(binary)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)));
    cmd
}

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
async fn get(addr: SocketAddr, path: &'static str) -> (u16, String) {
    tokio::task::spawn_blocking(move || http_get(addr, path))
        .await
        .expect("HTTP GET")
}

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_envoy_gateway_environment_serves_xds_limits_to_envoy_over_mutual_tls() {
    let dir = tempfile::tempdir().unwrap();
    // Readable by user 65534, like the pod's mounts.
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let pki = GatewayPki::new(dir.path(), "cluster");
    for file in std::fs::read_dir(dir.path().join("cluster")).unwrap() {
        let path = file.unwrap().path();
        let mode = if path.is_dir() { 0o755 } else { 0o644 };
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(mode))
            .unwrap();
    }
    let certs = SecretVolume::new(&dir.path().join("certs"), &pki.ratelimit_secret());
    let redis = RedisServer::start();
    let xds = XdsServer::start_tls(ServerTls {
        server: &pki.gateway,
        client_ca_pem: &pki.ca_pem,
    })
    .await;
    let binary = dir.path().join("ratelimit");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_sluice"), &binary).unwrap();

    let (grpc_port, http_port, prometheus_port) = (free_port(), free_port(), free_port());
    let file = |name: &str| certs.path(name).display().to_string();
    let env: Vec<(&str, String)> = vec![
        ("RUNTIME_ROOT", "/data".into()),
        ("RUNTIME_SUBDIRECTORY", "ratelimit".into()),
        ("RUNTIME_IGNOREDOTFILES", "true".into()),
        ("RUNTIME_WATCH_ROOT", "false".into()),
        ("LOG_LEVEL", "info".into()),
        ("USE_STATSD", "false".into()),
        ("CONFIG_TYPE", "GRPC_XDS_SOTW".into()),
        ("CONFIG_GRPC_XDS_SERVER_URL", xds.addr.to_string()),
        ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit".into()),
        ("GRPC_SERVER_USE_TLS", "true".into()),
        ("GRPC_SERVER_TLS_CERT", file("tls.crt")),
        ("GRPC_SERVER_TLS_KEY", file("tls.key")),
        ("GRPC_SERVER_TLS_CA_CERT", file("ca.crt")),
        ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true".into()),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", file("tls.crt")),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", file("tls.key")),
        ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", file("ca.crt")),
        ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true".into()),
        ("REDIS_SOCKET_TYPE", "tcp".into()),
        ("REDIS_URL", format!("127.0.0.1:{}", redis.port())),
        ("USE_PROMETHEUS", "true".into()),
        ("PROMETHEUS_ADDR", format!(":{prometheus_port}")),
        (
            "PROMETHEUS_MAPPER_YAML",
            "/etc/statsd-exporter/conf.yaml".into(),
        ),
        ("GRPC_PORT", grpc_port.to_string()),
        ("PORT", http_port.to_string()),
        (
            "SLUICE_BACKEND_TIMEOUT_MS",
            TEST_BACKEND_TIMEOUT.as_millis().to_string(),
        ),
    ];
    let mut ratelimit = Sluice::start_command(pod(&binary, &env));
    let (grpc, http, prometheus) = (
        loopback(grpc_port),
        loopback(http_port),
        loopback(prometheus_port),
    );
    assert_eq!(
        ratelimit.grpc_addr,
        format!("0.0.0.0:{grpc_port}").parse().unwrap()
    );
    assert_eq!(
        ratelimit.admin_addr,
        format!("0.0.0.0:{http_port}").parse().unwrap()
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

    // Forced start: serving, but not healthy and answering UNAVAILABLE until a config arrives.
    let before = get(http, "/healthcheck").await;
    let refused = gateway::check(grpc, &pki).await.expect_err("no config yet");
    println!(
        "before the first config: /healthcheck {} {:?}; RLS {:?}",
        before.0,
        before.1.trim(),
        refused.code()
    );
    assert_eq!(before.0, 500);
    assert_eq!(refused.code(), tonic::Code::Unavailable);

    // Envoy Gateway pushes its limits: 8 tokens per minute on the route's rule.
    xds.push("1", &[gateway::limits_config(8, RateLimitUnit::Minute)])
        .await;
    let ack = xds.next_request().await.request;
    assert_eq!(ack.version_info, "1");
    assert!(ack.error_detail.is_none(), "NACK: {ack:?}");
    let deadline = Instant::now() + Duration::from_secs(10);
    let healthy = loop {
        let probe = get(http, "/healthcheck").await;
        if probe.0 == 200 || Instant::now() > deadline {
            break probe;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    println!("after the push: /healthcheck {} {:?}", healthy.0, healthy.1);
    assert_eq!(healthy, (200, "OK".to_owned()));

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
        gateway::until_tokens_left(grpc, &pki, left_after).await;
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
    let requests: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("sluice_requests_total") || l.starts_with("sluice_xds_"))
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
