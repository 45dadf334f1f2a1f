//! The rate limiter as Envoy Gateway's pod runs it (its `resource.go`, with Redis and
//! Prometheus on): the binary started as `ratelimit` (a symlink named so) with no arguments and
//! nothing in its environment but what the Deployment sets, in a pod-like sandbox: user and
//! group 65534, no capabilities, no new privileges, the root filesystem read-only.
//!
//! Changed from the Deployment, and only these: the xDS server's address (the xDS test double
//! on loopback instead of `envoy-gateway:18001`), `REDIS_URL` (a test redis-server),
//! `PROMETHEUS_ADDR` (a free port instead of 19001), the certificate paths (a Secret-shaped
//! directory instead of `/certs`), `PROMETHEUS_MAPPER_YAML` (Envoy Gateway's mapping, the
//! ConfigMap `statsd-exporter-config`, in a directory of the test instead of
//! `/etc/statsd-exporter`), and `GRPC_PORT` and `PORT`, which Envoy Gateway leaves unset
//! (envoyproxy/ratelimit's 8081 and 8080), set to free ports so parallel runs do not collide,
//! and `SLUICE_BACKEND_TIMEOUT_MS`, sluice's own per-decision deadline, raised from its 10 ms
//! default to the suite's test deadline: a debug build on a loaded 2-core machine misses 10 ms
//! now and then. A test may change variables more ([`PodEnv`]).
//!
//! Also here: the Deployment's probes ([`STARTUP_PROBE`], [`READINESS_PROBE`]) as the kubelet
//! makes each attempt, and gRPC health asked over the pod's mutual TLS.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use tonic_health::ServingStatus;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

use super::gateway::GatewayPki;
use super::in_process::TEST_BACKEND_TIMEOUT;
use super::secret::SecretVolume;
use super::xds_server::{ServerTls, XdsServer};
use super::{RedisServer, Sluice, free_port, http_get};

/// One of the Deployment's probes: `GET /healthcheck` on the HTTP port (8080 there), every
/// `period`, each attempt failing after 1 s; `failure_threshold` failures in a row fail it.
#[derive(Debug, Clone, Copy)]
pub struct Probe {
    pub period: Duration,
    pub failure_threshold: u32,
}

/// The startup probe: 30 attempts 10 s apart, so a container that has not answered 200 within
/// 300 s is killed and restarted.
pub const STARTUP_PROBE: Probe = Probe {
    period: Duration::from_secs(10),
    failure_threshold: 30,
};

/// The readiness probe: every 5 s; one failure takes the pod out of the Service's endpoints.
pub const READINESS_PROBE: Probe = Probe {
    period: Duration::from_secs(5),
    failure_threshold: 1,
};

/// Each attempt's timeout (`timeoutSeconds: 1`).
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

impl Probe {
    /// One attempt, as the kubelet makes it: success is a status from 200 to 399 within
    /// [`PROBE_TIMEOUT`]; the status and body seen (0 when nothing answered).
    pub async fn attempt(&self, http: SocketAddr) -> (bool, u16, String) {
        let answer = tokio::time::timeout(
            PROBE_TIMEOUT,
            tokio::task::spawn_blocking(move || http_get(http, "/healthcheck")),
        )
        .await;
        match answer {
            Ok(Ok((status, body))) => ((200..400).contains(&status), status, body),
            _ => (false, 0, String::new()),
        }
    }

    /// How long the probe fails before the kubelet acts on it (restart or unready).
    pub fn gives_up_after(&self) -> Duration {
        self.period * self.failure_threshold
    }
}

/// The Deployment's environment, and what a test changes in it.
pub struct PodEnv {
    vars: Vec<(&'static str, String)>,
}

impl PodEnv {
    /// Sets `name` (added when absent).
    pub fn set(mut self, name: &'static str, value: &str) -> Self {
        self.vars.retain(|(n, _)| *n != name);
        self.vars.push((name, value.to_owned()));
        self
    }

    /// Removes `name`.
    pub fn unset(mut self, name: &'static str) -> Self {
        self.vars.retain(|(n, _)| *n != name);
        self
    }
}

/// A rate-limit pod and what it talks to: its Secret, the xDS server, Redis.
pub struct GatewayPod {
    pub ratelimit: Sluice,
    /// The ports on loopback: gRPC (`GRPC_PORT`), HTTP (`PORT`), Prometheus.
    pub grpc: SocketAddr,
    pub http: SocketAddr,
    pub prometheus: SocketAddr,
    pub pki: GatewayPki,
    pub xds: XdsServer,
    _redis: RedisServer,
    _certs: SecretVolume,
    _dir: tempfile::TempDir,
}

impl GatewayPod {
    /// Starts the pod with Envoy Gateway's environment, changed by `change`; returns once it
    /// logs "listening".
    pub async fn start(change: impl FnOnce(PodEnv) -> PodEnv) -> GatewayPod {
        let dir = tempfile::tempdir().unwrap();
        // Readable by user 65534, like the pod's mounts.
        set_mode(dir.path(), 0o755);
        let pki = GatewayPki::new(dir.path(), "cluster");
        for file in std::fs::read_dir(dir.path().join("cluster")).unwrap() {
            let path = file.unwrap().path();
            set_mode(&path, if path.is_dir() { 0o755 } else { 0o644 });
        }
        let certs = SecretVolume::new(&dir.path().join("certs"), &pki.ratelimit_secret());
        let redis = RedisServer::start();
        let xds = XdsServer::start_tls(ServerTls {
            server: &pki.gateway,
            client_ca_pem: &pki.ca_pem,
        })
        .await;
        // Envoy Gateway's ConfigMap `statsd-exporter-config` (its `statsd_conf.yaml`):
        // envoyproxy/ratelimit's default mapping without `scale`.
        let mapping_dir = dir.path().join("statsd-exporter");
        std::fs::create_dir(&mapping_dir).unwrap();
        set_mode(&mapping_dir, 0o755);
        let mapping = mapping_dir.join("conf.yaml");
        let gateway_mapping = sluice::metrics::upstream::default_mapping::yaml(true);
        std::fs::write(&mapping, gateway_mapping).unwrap();
        set_mode(&mapping, 0o644);
        let binary = dir.path().join("ratelimit");
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_sluice"), &binary).unwrap();

        let (grpc_port, http_port, prometheus_port) = (free_port(), free_port(), free_port());
        let file = |name: &str| certs.path(name).display().to_string();
        let vars: Vec<(&'static str, String)> = vec![
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
            ("PROMETHEUS_MAPPER_YAML", mapping.display().to_string()),
            ("GRPC_PORT", grpc_port.to_string()),
            ("PORT", http_port.to_string()),
            (
                "SLUICE_BACKEND_TIMEOUT_MS",
                TEST_BACKEND_TIMEOUT.as_millis().to_string(),
            ),
            // The pod's own grace period (300 s) leaves the default delay room; a test that
            // stops the pod has nothing routing to it to wait for.
            ("SLUICE_DRAIN_DELAY_SECS", "0".into()),
        ];
        let env = change(PodEnv { vars }).vars;
        let ratelimit = Sluice::start_command(pod(&binary, &env));
        GatewayPod {
            ratelimit,
            grpc: loopback(grpc_port),
            http: loopback(http_port),
            prometheus: loopback(prometheus_port),
            pki,
            xds,
            _redis: redis,
            _certs: certs,
            _dir: dir,
        }
    }

    /// gRPC health of `service` over the pod's mutual TLS (Envoy's certificate), asked within
    /// [`PROBE_TIMEOUT`]; `None` when nothing answered (the port not serving yet) or the
    /// service is unknown.
    pub async fn grpc_health(&self, service: &str) -> Option<ServingStatus> {
        let ask = async {
            let channel = super::gateway::channel(self.grpc, &self.pki).await.ok()?;
            let response = HealthClient::new(channel)
                .check(HealthCheckRequest {
                    service: service.to_owned(),
                })
                .await
                .ok()?
                .into_inner();
            match response.status {
                1 => Some(ServingStatus::Serving),
                2 => Some(ServingStatus::NotServing),
                _ => Some(ServingStatus::Unknown),
            }
        };
        tokio::time::timeout(PROBE_TIMEOUT, ask)
            .await
            .ok()
            .flatten()
    }
}

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

fn set_mode(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(mode)).unwrap();
}

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
