//! `serve`'s ports: their addresses, what a connection and a call may hold on them, how long
//! they serve on after SIGTERM, and the gRPC port's TLS.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use sluice::server::DEFAULT_DRAIN_DELAY;
use sluice::server::listen::PortLimits;
use sluice::server::tls::TlsSettings;

/// The addresses and limits of the ports.
#[derive(clap::Args)]
pub(crate) struct PortArgs {
    /// Address of the gRPC server (RLS, health, reflection). Loopback: a sidecar serves its pod.
    #[arg(long, env = "SLUICE_GRPC_ADDR", default_value = "127.0.0.1:8081")]
    pub(crate) grpc_addr: SocketAddr,
    /// Address of the admin HTTP server: /healthz, /readyz, /metrics, and envoyproxy/ratelimit's
    /// POST /json and GET /rlconfig.
    #[arg(long, env = "SLUICE_ADMIN_ADDR", default_value = "127.0.0.1:9102")]
    pub(crate) admin_addr: SocketAddr,
    /// Address of an extra HTTP listener serving only the metrics page, on --metrics-path
    /// (envoyproxy/ratelimit's PROMETHEUS_ADDR); /metrics stays on the admin port too.
    #[arg(long, env = "SLUICE_METRICS_ADDR")]
    pub(crate) metrics_addr: Option<SocketAddr>,
    /// Connections open at once on the gRPC port; one more is closed at once.
    #[arg(long, env = "SLUICE_GRPC_MAX_CONNECTIONS", default_value_t = PortLimits::DEFAULT_GRPC_MAX_CONNECTIONS)]
    pub(crate) grpc_max_connections: usize,
    /// Calls (HTTP/2 streams) open at once on one gRPC connection
    /// (SETTINGS_MAX_CONCURRENT_STREAMS); more are refused with REFUSED_STREAM.
    #[arg(long, env = "SLUICE_GRPC_MAX_CONCURRENT_STREAMS", default_value_t = PortLimits::DEFAULT_GRPC_MAX_CONCURRENT_STREAMS)]
    pub(crate) grpc_max_concurrent_streams: u32,
    /// Connections open at once on the admin port; one more is closed at once.
    #[arg(long, env = "SLUICE_ADMIN_MAX_CONNECTIONS", default_value_t = PortLimits::DEFAULT_ADMIN_MAX_CONNECTIONS)]
    pub(crate) admin_max_connections: usize,
    /// Largest encoded gRPC request accepted, in bytes (refused before decoding).
    #[arg(long, env = "SLUICE_MAX_MESSAGE_BYTES", default_value_t = PortLimits::DEFAULT_MAX_MESSAGE_BYTES)]
    pub(crate) max_message_bytes: usize,
    /// Milliseconds a client has for the TLS handshake and the HTTP/2 preface after connecting,
    /// each gRPC call until answered; on the admin port the request head, then the body.
    #[arg(long, env = "SLUICE_REQUEST_TIMEOUT_MS", default_value_t = PortLimits::DEFAULT_REQUEST_TIMEOUT.as_millis() as u64)]
    pub(crate) request_timeout_ms: u64,
    /// Milliseconds a connection may stay open with nothing sent by the client (either port).
    #[arg(long, env = "SLUICE_IDLE_TIMEOUT_MS", default_value_t = PortLimits::DEFAULT_IDLE_TIMEOUT.as_millis() as u64)]
    pub(crate) idle_timeout_ms: u64,
    /// Seconds sluice keeps serving after SIGTERM or SIGINT while health and /readyz report not
    /// serving, so load balancers stop sending first; then it stops accepting (GOAWAY), lets
    /// in-flight calls finish and exits. A second signal skips the rest. 0: stop at once.
    #[arg(long, env = "SLUICE_DRAIN_DELAY_SECS", default_value_t = DEFAULT_DRAIN_DELAY.as_secs())]
    pub(crate) drain_delay_secs: u64,
}

impl PortArgs {
    pub(super) fn limits(&self) -> PortLimits {
        PortLimits {
            grpc_max_connections: self.grpc_max_connections,
            grpc_max_concurrent_streams: self.grpc_max_concurrent_streams,
            max_message_bytes: self.max_message_bytes,
            admin_max_connections: self.admin_max_connections,
            request_timeout: Duration::from_millis(self.request_timeout_ms.max(1)),
            idle_timeout: Duration::from_millis(self.idle_timeout_ms.max(1)),
        }
    }

    /// How long serving goes on once shutdown is requested.
    pub(super) fn drain_delay(&self) -> Duration {
        Duration::from_secs(self.drain_delay_secs)
    }
}

/// The gRPC port's TLS.
#[derive(clap::Args)]
pub(crate) struct GrpcTlsArgs {
    /// PEM certificate chain of the gRPC server: with --grpc-tls-key, the gRPC port (RLS,
    /// health, reflection) speaks TLS only. Reloaded when the file changes.
    #[arg(
        long,
        env = "SLUICE_GRPC_TLS_CERT",
        value_name = "PEM",
        requires = "grpc_tls_key"
    )]
    pub(super) grpc_tls_cert: Option<PathBuf>,
    /// PEM private key of --grpc-tls-cert.
    #[arg(
        long,
        env = "SLUICE_GRPC_TLS_KEY",
        value_name = "PEM",
        requires = "grpc_tls_cert"
    )]
    pub(super) grpc_tls_key: Option<PathBuf>,
    /// PEM CA file(s), comma-separated: every gRPC client must present a certificate one of
    /// them signs. Reloaded when a file changes.
    #[arg(
        long,
        env = "SLUICE_GRPC_CLIENT_CA",
        value_name = "PEM",
        value_delimiter = ',',
        requires = "grpc_tls_cert"
    )]
    pub(super) grpc_client_ca: Vec<PathBuf>,
    /// A DNS name or IP address the client certificate must carry (with --grpc-client-ca).
    #[arg(
        long,
        env = "SLUICE_GRPC_CLIENT_SAN",
        value_name = "NAME",
        requires = "grpc_client_ca"
    )]
    pub(super) grpc_client_san: Option<String>,
}

impl GrpcTlsArgs {
    /// The gRPC server's TLS, its files checked every `check_interval` (the config's: even
    /// when the config is not watched, a rotated Secret must be picked up).
    pub(super) fn settings(&self, check_interval: Duration) -> Option<TlsSettings> {
        let (cert, key) = (self.grpc_tls_cert.clone()?, self.grpc_tls_key.clone()?);
        Some(TlsSettings {
            client_ca: self.grpc_client_ca.clone(),
            client_san: self.grpc_client_san.clone(),
            reload_interval: check_interval,
            ..TlsSettings::new(cert, key)
        })
    }
}
