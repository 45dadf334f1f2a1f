//! What `sluice serve` is asked to do, as one plain value ([`Settings`]) that flows down once:
//! `main` fills it from flags and environment variables (tests build it directly),
//! [`Server::build`](super::Server::build) takes it whole and each part goes to the one place
//! that uses it. [`StartError`] says why a value cannot be served.

use std::path::PathBuf;
use std::time::Duration;

use crate::config::{ConfigErrors, LoadOptions};
use crate::decision::EngineOptions;
use crate::headers::LegacyNames;
use crate::limiter::cache;
use crate::limiter::guard;
use crate::limiter::redis::{RedisOptions, SettingError};
use crate::metrics::MetricsSettings;
use crate::otel::{TracingError, TracingSettings};
use crate::xds::{XdsError, XdsSettings};

use super::listen::PortLimits;
use super::tls::{TlsError, TlsSettings};

/// Seconds between backend readiness probes, by default and at least.
pub const DEFAULT_PROBE_INTERVAL: Duration = Duration::from_secs(1);
/// Time between checks of the config for changes, by default.
pub const DEFAULT_WATCH_INTERVAL: Duration = Duration::from_millis(1000);
/// Shortest check interval: a floor keeps a typo (0) from turning the poll into a busy loop.
pub const MIN_WATCH_INTERVAL: Duration = Duration::from_millis(50);
/// Shortest backend deadline.
pub const MIN_DEADLINE: Duration = Duration::from_millis(1);
/// How long sluice keeps serving after SIGTERM, reporting NOT_SERVING, by default. Long enough
/// for what routes calls to it to notice: an Envoy health-checking its cluster as
/// `deploy/envoy/envoy.yaml` does (two failed checks a second apart, each given 1 s), a
/// Kubernetes Service or an xDS push taking the terminating pod's endpoint out (seconds); short
/// enough that the drain delay plus the calls in flight (each within `--request-timeout-ms`,
/// 10 s) end inside Kubernetes' default grace period of 30 s.
pub const DEFAULT_DRAIN_DELAY: Duration = Duration::from_secs(10);

/// Everything `sluice serve` needs, as plain values; [`Settings::new`] gives the defaults of
/// `sluice serve --help`.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Where the limits come from.
    pub config: ConfigSource,
    /// How the config's files (or xDS resources) are combined, at start-up and on every
    /// reload.
    pub load: LoadOptions,
    pub backend: BackendSettings,
    /// The engine's switches, what a request may carry and what it gets when the backend
    /// fails.
    pub engine: EngineOptions,
    pub metrics: MetricsSettings,
    /// How often readiness re-probes the backend (at least [`DEFAULT_PROBE_INTERVAL`]).
    pub probe_interval: Duration,
    /// How often the config is checked for changes; `None` serves the start-up config until
    /// exit. Files only: xDS pushes its changes.
    pub watch_interval: Option<Duration>,
    /// Connection, request and message limits of the ports.
    pub ports: PortLimits,
    /// TLS of the gRPC server (certificates reloaded when they change); `None`: plaintext.
    pub grpc_tls: Option<TlsSettings>,
    /// OpenTelemetry tracing of decisions; `None`: off.
    pub tracing: Option<TracingSettings>,
    /// Names of the `legacy` style's response headers.
    pub legacy_names: LegacyNames,
    /// Responses describe the request in their dynamic metadata, with the config `metadata` of
    /// what passed (envoyproxy/ratelimit's `RESPONSE_DYNAMIC_METADATA`).
    pub response_dynamic_metadata: bool,
    /// How long the servers keep serving once shutdown is requested, reporting NOT_SERVING,
    /// before they stop accepting and drain (a second signal cuts it short).
    pub drain_delay: Duration,
}

/// Where the limits come from: `--config` or `--config-xds`.
#[derive(Debug, Clone)]
pub enum ConfigSource {
    /// A limits YAML file or a directory of `*.yaml` files.
    Files(PathBuf),
    /// A management server pushing envoyproxy/ratelimit's `RateLimitConfig` resources.
    Xds(XdsSettings),
}

impl Settings {
    /// The defaults of `sluice serve` for the config at `config`: memory backend, config
    /// watched.
    pub fn new(config: impl Into<PathBuf>) -> Self {
        Self::with_source(ConfigSource::Files(config.into()))
    }

    /// The defaults of `sluice serve` with the limits from `source`.
    pub fn with_source(source: ConfigSource) -> Self {
        Settings {
            config: source,
            load: LoadOptions::default(),
            backend: BackendSettings::default(),
            engine: EngineOptions::default(),
            metrics: MetricsSettings::default(),
            probe_interval: DEFAULT_PROBE_INTERVAL,
            watch_interval: Some(DEFAULT_WATCH_INTERVAL),
            ports: PortLimits::default(),
            grpc_tls: None,
            tracing: None,
            legacy_names: LegacyNames::default(),
            response_dynamic_metadata: false,
            drain_delay: DEFAULT_DRAIN_DELAY,
        }
    }
}

/// Which backend decides, and how a shared one is guarded.
#[derive(Debug, Clone)]
pub struct BackendSettings {
    /// Redis (standalone or cluster, by the URL's scheme); `None` serves from the embedded
    /// memory backend (one instance only).
    pub redis: Option<RedisOptions>,
    /// Per-decision deadline of a shared backend (at least [`MIN_DEADLINE`]).
    pub deadline: Duration,
    /// Shared-backend calls allowed in flight (abandoned ones included); beyond it calls fail
    /// fast.
    pub max_in_flight: usize,
    /// Keys kept in the local cache of keys known to be over their limit; 0 disables it.
    pub local_cache_size: usize,
}

impl Default for BackendSettings {
    fn default() -> Self {
        BackendSettings {
            redis: None,
            deadline: guard::DEFAULT_DEADLINE,
            max_in_flight: guard::DEFAULT_MAX_IN_FLIGHT,
            local_cache_size: cache::DEFAULT_CAPACITY,
        }
    }
}

/// Why sluice cannot start. Each message is whole (it carries no `source`), so a report of
/// the error chain shows it once.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("--key-prefix: {0}")]
    KeyPrefix(String),
    #[error("loading config from {}: {errors}", path.display())]
    Config { path: PathBuf, errors: ConfigErrors },
    #[error("Redis backend: {0}")]
    Redis(SettingError),
    #[error("reading {what} {}: {error}", path.display())]
    PasswordFile {
        what: &'static str,
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{what} {} is empty", path.display())]
    EmptyPasswordFile { what: &'static str, path: PathBuf },
    #[error("{given} without {missing}: both are needed for a client certificate")]
    HalfClientCert {
        given: &'static str,
        missing: &'static str,
    },
    #[error(
        "{0} given but no Redis URL (--redis-url, SLUICE_REDIS_URL or envoyproxy/ratelimit's \
         REDIS_URL): it would be ignored and the embedded memory backend would serve; give the \
         URL, or remove the setting"
    )]
    RedisSettingWithoutUrl(String),
    #[error("installing the metrics recorder: {0}")]
    Metrics(String),
    #[error("{0}")]
    GrpcTls(#[from] TlsError),
    #[error("{0}")]
    Xds(#[from] XdsError),
    /// Flags that do not fit together (e.g. two config sources).
    #[error("{0}")]
    Usage(String),
    #[error("tracing: {0}")]
    Tracing(#[from] TracingError),
    #[error("legacy response headers: {0}")]
    LegacyHeaders(String),
}

impl From<SettingError> for StartError {
    fn from(e: SettingError) -> Self {
        StartError::Redis(e)
    }
}

impl From<metrics_exporter_prometheus::BuildError> for StartError {
    fn from(e: metrics_exporter_prometheus::BuildError) -> Self {
        StartError::Metrics(e.to_string())
    }
}
