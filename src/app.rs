//! The production stack, assembled in the library: settings in, a ready-to-run server out.
//!
//! Why here and not in `main`: what `sluice serve` runs (the config it loads or the xDS server
//! it subscribes to, the backend it picks, the guard and the rejection cache around it, the
//! metrics recorder) must be what tests run too. `main` only turns flags and environment variables into [`Settings`]; tests build
//! [`Settings`] directly, call [`assemble`] and hand the result to [`crate::run`] with listeners
//! bound to port 0, all in process.
//!
//! The backend stack, outermost first (each a [`Limiter`] wrapping the next):
//! - [`RejectionCache`]: answers requests certain to be rejected without a backend call
//!   (shared backends only, `local_cache_size > 0`);
//! - [`Guarded`]: the per-decision deadline and the bound on calls in flight (shared backends
//!   only);
//! - the backend: [`MemoryLimiter`] (no Redis given; it answers in microseconds and has no
//!   network to hang on, so it needs neither wrapper), [`RedisLimiter`] (one Redis, or the
//!   primary Sentinel names) or [`ClusterLimiter`] (chosen by the URL's scheme).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusHandle;

use crate::config::{Config, ConfigErrors, LoadOptions};
use crate::decision::{EngineOptions, FailurePolicy};
use crate::headers::LegacyNames;
use crate::limiter::cache::{self, MonotonicClock, RejectionCache};
use crate::limiter::guard::{self, Guarded};
use crate::limiter::memory::MemoryLimiter;
use crate::limiter::redis::cluster::ClusterLimiter;
use crate::limiter::redis::connect::{ClientCert, Topology, redact_url};
use crate::limiter::redis::{RedisLimiter, RedisOptions, SettingError};
use crate::limiter::{Limiter, SystemClock};
use crate::listen::PortLimits;
use crate::metrics::MetricsSettings;
use crate::otel::{TracingError, TracingSettings};
use crate::reload::ReloadSettings;
use crate::server::ServerSettings;
use crate::tls::{ServerTls, TlsError, TlsSettings};
use crate::xds::{XdsError, XdsSettings, XdsSource};

/// Seconds between backend readiness probes, by default and at least.
pub const DEFAULT_PROBE_INTERVAL: Duration = Duration::from_secs(1);
/// Time between checks of the config for changes, by default.
pub const DEFAULT_WATCH_INTERVAL: Duration = Duration::from_millis(1000);
/// Shortest check interval: a floor keeps a typo (0) from turning the poll into a busy loop.
pub const MIN_WATCH_INTERVAL: Duration = Duration::from_millis(50);
/// Shortest backend deadline.
pub const MIN_DEADLINE: Duration = Duration::from_millis(1);

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
    pub engine: EngineOptions,
    /// What a request gets when the backend fails.
    pub on_backend_error: FailurePolicy,
    pub metrics: MetricsSettings,
    /// How often readiness re-probes the backend (at least [`DEFAULT_PROBE_INTERVAL`]).
    pub probe_interval: Duration,
    /// How often the config is checked for changes; `None` serves the start-up config until
    /// exit. Files only: xDS pushes its changes.
    pub watch_interval: Option<Duration>,
    /// Connection and request limits of both ports.
    pub ports: PortLimits,
    /// TLS of the gRPC server (certificates reloaded when they change); `None`: plaintext.
    pub grpc_tls: Option<TlsSettings>,
    /// OpenTelemetry tracing of decisions; `None`: off.
    pub tracing: Option<TracingSettings>,
    /// Names of the `legacy` style's response headers.
    pub legacy_names: LegacyNames,
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
            on_backend_error: FailurePolicy::default(),
            metrics: MetricsSettings::default(),
            probe_interval: DEFAULT_PROBE_INTERVAL,
            watch_interval: Some(DEFAULT_WATCH_INTERVAL),
            ports: PortLimits::default(),
            grpc_tls: None,
            tracing: None,
            legacy_names: LegacyNames::default(),
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

/// Builds the backend stack `settings` describe (see the module documentation).
pub fn backend(settings: &BackendSettings) -> Result<Arc<dyn Limiter>, StartError> {
    let Some(options) = &settings.redis else {
        tracing::info!("backend: embedded memory (no --redis-url given)");
        return Ok(Arc::new(MemoryLimiter::new(Arc::new(SystemClock))));
    };
    let url = redact_url(&options.url);
    let deadline = settings.deadline.max(MIN_DEADLINE);
    // A WAIT that outlived the decision could only hold the connection after the caller left.
    let options = RedisOptions {
        wait_timeout: deadline,
        ..options.clone()
    };
    let shared: Arc<dyn Limiter> = match options.topology() {
        Topology::Cluster => {
            let limiter = ClusterLimiter::open(&options)?;
            tracing::info!(url = %url, "backend: redis cluster");
            Arc::new(limiter)
        }
        topology @ (Topology::Standalone | Topology::Sentinel) => {
            let limiter = RedisLimiter::open(&options)?;
            tracing::info!(
                url = %url,
                pool = options.pool_size,
                batch_max = options.batch_max,
                wait_replicas = options.wait_replicas,
                "backend: {}",
                if topology == Topology::Sentinel {
                    "redis sentinel"
                } else {
                    "redis"
                }
            );
            Arc::new(limiter)
        }
    };
    let guarded: Arc<dyn Limiter> =
        Arc::new(Guarded::new(shared, deadline, settings.max_in_flight));
    tracing::info!(
        deadline_ms = deadline.as_millis() as u64,
        max_in_flight = settings.max_in_flight,
        local_cache_size = settings.local_cache_size,
        "backend guard"
    );
    if settings.local_cache_size == 0 {
        return Ok(guarded);
    }
    Ok(Arc::new(RejectionCache::new(
        guarded,
        Arc::new(MonotonicClock::default()),
        settings.local_cache_size,
    )))
}

/// Loads and validates the config at `path`.
pub fn load_config(path: &Path, options: LoadOptions) -> Result<Config, StartError> {
    Config::load_with(path, options).map_err(|errors| StartError::Config {
        path: path.to_owned(),
        errors,
    })
}

/// Installs the process-wide Prometheus recorder and describes every metric family. There is
/// one recorder per process: a second call fails.
pub fn install_metrics() -> Result<PrometheusHandle, StartError> {
    let handle = metrics_exporter_prometheus::PrometheusBuilder::new()
        .set_buckets(crate::metrics::LATENCY_BUCKETS)?
        .install_recorder()?;
    crate::metrics::describe();
    Ok(handle)
}

/// Everything [`crate::run`] needs: the config loaded, the backend stack built (connecting on
/// first use, so Redis may still be down). `metrics` renders `/metrics` (`None`: no recorder
/// installed, `/metrics` answers so).
pub fn assemble(
    settings: Settings,
    metrics: Option<PrometheusHandle>,
) -> Result<ServerSettings, StartError> {
    crate::descriptor::validate_key_prefix(&settings.engine.key_prefix)
        .map_err(StartError::KeyPrefix)?;
    if let Some(tracing) = &settings.tracing {
        tracing.validate()?;
    }
    let (config, reload, xds) = match settings.config {
        ConfigSource::Files(path) => {
            // Before the load: a change made while sluice starts is then seen by the first poll.
            let loaded = settings
                .watch_interval
                .and_then(|_| crate::reload::Reloader::fingerprint(&path, &settings.load));
            let config = load_config(&path, settings.load)?;
            let unix_now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            crate::metrics::record_config_loaded(&path, &config, unix_now);
            let reload = settings.watch_interval.map(|interval| ReloadSettings {
                path,
                interval: interval.max(MIN_WATCH_INTERVAL),
                load_options: settings.load,
                loaded,
            });
            (config, reload, None)
        }
        ConfigSource::Xds(xds) => {
            xds.check()?;
            let source = XdsSource {
                settings: xds,
                load: settings.load,
            };
            (Config::empty(), None, Some(source))
        }
    };
    let grpc_tls = settings
        .grpc_tls
        .map(|tls| {
            ServerTls::load(TlsSettings {
                reload_interval: tls.reload_interval.max(MIN_WATCH_INTERVAL),
                ..tls
            })
        })
        .transpose()?;
    let limiter = backend(&settings.backend)?;
    if settings.backend.redis.is_some() {
        tracing::info!(
            on_backend_error = settings.on_backend_error.as_str(),
            "backend failure policy"
        );
    }
    if settings.engine.shadow_mode {
        tracing::warn!("global shadow mode: every request is answered OK overall");
    }
    if settings.engine.quota_mode {
        tracing::info!(
            "global quota mode: a request is over the limit only when all of its descriptors are"
        );
    }
    Ok(ServerSettings {
        config,
        limiter,
        metrics,
        probe_interval: settings.probe_interval.max(DEFAULT_PROBE_INTERVAL),
        engine: settings.engine,
        metrics_settings: settings.metrics,
        reload,
        xds,
        on_backend_error: settings.on_backend_error,
        ports: settings.ports,
        grpc_tls,
        tracing: settings.tracing,
        legacy_names: settings.legacy_names,
    })
}

/// The Redis password from `file` (trailing newline ignored), else `from_env` (the value of
/// `SLUICE_REDIS_PASSWORD`) unless empty, else none (the URL's own, if any, then applies).
/// Never logged.
pub fn redis_password(
    file: Option<&Path>,
    from_env: Option<String>,
) -> Result<Option<String>, StartError> {
    password("Redis password file", file, from_env)
}

/// The sentinels' own password, like [`redis_password`] (`--redis-sentinel-password-file`,
/// else `SLUICE_REDIS_SENTINEL_PASSWORD`).
pub fn sentinel_password(
    file: Option<&Path>,
    from_env: Option<String>,
) -> Result<Option<String>, StartError> {
    password("Redis Sentinel password file", file, from_env)
}

fn password(
    what: &'static str,
    file: Option<&Path>,
    from_env: Option<String>,
) -> Result<Option<String>, StartError> {
    if let Some(path) = file {
        let text = std::fs::read_to_string(path).map_err(|error| StartError::PasswordFile {
            what,
            path: path.to_owned(),
            error,
        })?;
        let password = text.trim_end_matches(['\n', '\r']).to_owned();
        if password.is_empty() {
            return Err(StartError::EmptyPasswordFile {
                what,
                path: path.to_owned(),
            });
        }
        return Ok(Some(password));
    }
    Ok(from_env.filter(|p| !p.is_empty()))
}

/// The client certificate of `--redis-tls-cert` and `--redis-tls-key`: both or neither.
pub fn client_cert(
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
) -> Result<Option<ClientCert>, StartError> {
    match (cert, key) {
        (Some(cert), Some(key)) => Ok(Some(ClientCert { cert, key })),
        (None, None) => Ok(None),
        (Some(_), None) => Err(StartError::HalfClientCert {
            given: "--redis-tls-cert",
            missing: "--redis-tls-key",
        }),
        (None, Some(_)) => Err(StartError::HalfClientCert {
            given: "--redis-tls-key",
            missing: "--redis-tls-cert",
        }),
    }
}

/// `sluice check-config`: the summary line of a valid config.
pub fn check_config(path: &Path, options: LoadOptions) -> Result<String, ConfigErrors> {
    let config = Config::load_with(path, options)?;
    let domains: Vec<&str> = config.domains().collect();
    Ok(format!(
        "{}: ok ({} domain(s): {}; {} limit(s))",
        path.display(),
        domains.len(),
        domains.join(", "),
        config.rule_count()
    ))
}

/// `sluice explain`: the report of [`crate::explain::explain`] for `descriptors` given as
/// `key=value[,key=value...]`, or what stopped it.
pub fn explain(path: &Path, domain: &str, descriptors: &[String]) -> Result<String, String> {
    let config = Config::load(path).map_err(|errors| errors.to_string())?;
    let parsed = descriptors
        .iter()
        .enumerate()
        .map(|(i, text)| {
            crate::explain::parse_descriptor(text)
                .map_err(|err| format!("descriptor {i} `{text}`: {err}"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(crate::explain::explain(&config, domain, &parsed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_password_file_wins_over_the_environment() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pw");
        std::fs::write(&file, "from-file\r\n").unwrap();
        let env = Some("from-env".to_owned());
        assert_eq!(
            redis_password(Some(&file), env.clone()).unwrap().as_deref(),
            Some("from-file")
        );
        assert_eq!(
            redis_password(None, env).unwrap().as_deref(),
            Some("from-env")
        );
        assert_eq!(redis_password(None, Some(String::new())).unwrap(), None);
        std::fs::write(&file, "\n").unwrap();
        let err = redis_password(Some(&file), None).unwrap_err();
        assert!(err.to_string().ends_with("is empty"), "{err}");
        let missing = dir.path().join("missing");
        let err = redis_password(Some(&missing), None).unwrap_err();
        assert!(err.to_string().contains("missing"), "{err}");
    }

    #[test]
    fn the_backend_follows_the_settings() {
        let memory = backend(&BackendSettings::default()).unwrap();
        assert_eq!(memory.name(), "memory");
        let redis = |url: &str| BackendSettings {
            redis: Some(RedisOptions::new(url)),
            ..BackendSettings::default()
        };
        // Built without connecting: nothing listens there.
        let standalone = backend(&redis("redis://127.0.0.1:1")).unwrap();
        assert_eq!(standalone.name(), "redis");
        let cluster = backend(&redis("redis+cluster://127.0.0.1:1,127.0.0.1:2")).unwrap();
        assert_eq!(cluster.name(), "redis-cluster");
        let err = backend(&redis("localhost:6379")).err().expect("no scheme");
        assert!(err.to_string().contains("the scheme is missing"), "{err}");
        let sentinel =
            backend(&redis("redis+sentinel://127.0.0.1:1,127.0.0.1:2/mymaster")).unwrap();
        assert_eq!(sentinel.name(), "redis");
        let mut waiting = redis("redis+cluster://127.0.0.1:1");
        if let Some(options) = waiting.redis.as_mut() {
            options.wait_replicas = 1;
        }
        let err = backend(&waiting).err().expect("WAIT on a cluster");
        assert!(err.to_string().contains("not to a cluster"), "{err}");
    }

    #[test]
    fn a_bad_key_prefix_or_config_stops_the_start() {
        let dir = tempfile::tempdir().unwrap();
        let mut settings = Settings::new(dir.path().join("absent.yaml"));
        settings.engine.key_prefix = "a{b".into();
        let err = assemble(settings.clone(), None).err().expect("bad prefix");
        assert!(err.to_string().starts_with("--key-prefix: "), "{err}");
        settings.engine.key_prefix = EngineOptions::default().key_prefix;
        let err = assemble(settings, None).err().expect("no config");
        assert!(err.to_string().starts_with("loading config from "), "{err}");
    }

    #[test]
    fn an_xds_source_is_checked_and_starts_without_limits() {
        let xds = |url: &str| Settings::with_source(ConfigSource::Xds(XdsSettings::new(url, "n")));
        let err = assemble(xds("ftp://xds:18001"), None)
            .err()
            .expect("bad scheme");
        assert!(
            err.to_string()
                .starts_with("--config-xds `ftp://xds:18001`: "),
            "{err}"
        );
        let server = assemble(xds("http://127.0.0.1:18001"), None).expect("assembled");
        assert!(server.reload.is_none(), "xDS pushes its changes");
        assert_eq!(server.config.domains().count(), 0);
        assert_eq!(
            server.xds.map(|x| x.settings.url),
            Some("http://127.0.0.1:18001".to_owned())
        );
    }
}
