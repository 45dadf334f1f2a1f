//! The command line: every subcommand and flag of `sluice`, each flag also read from a
//! `SLUICE_*` variable, and how `serve`'s flags become [`sluice::Settings`]. A module of the
//! binary (not of the library): only `main.rs` uses it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use sluice::app;
use sluice::config::{ConfigLimits, HeaderFormat, HeaderPolicy, LoadOptions};
use sluice::decision::{EngineOptions, FailurePolicy, InputLimits};
use sluice::headers::{self, LegacyNames};
use sluice::limiter::cache;
use sluice::limiter::guard;
use sluice::limiter::redis::{DEFAULT_BATCH_MAX, DEFAULT_POOL_SIZE, RedisOptions};
use sluice::metrics::MetricsSettings;
use sluice::server::listen::PortLimits;
use sluice::server::tls::TlsSettings;
use sluice::server::{self, BackendSettings, ConfigSource, Settings, StartError};
use sluice::xds::{ClientTls, XdsLimits, XdsSettings};

mod given;
pub(crate) use given::{redis_settings_given, with_translated_defaults};

#[derive(Parser)]
#[command(
    name = "sluice",
    version,
    about = "Envoy rate-limit service with an exact sliding-window log"
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Subcommand)]
pub(crate) enum Command {
    /// Serve Envoy's RateLimitService over gRPC.
    Serve(Box<ServeArgs>),
    /// Validate a config file or directory; prints every error and exits non-zero on any.
    CheckConfig {
        /// A limits YAML file or a directory of *.yaml files.
        path: PathBuf,
        /// Merge files that name the same domain instead of rejecting them.
        #[arg(long, env = "SLUICE_MERGE_DOMAIN_CONFIG")]
        merge_domain_config: bool,
        #[command(flatten)]
        limits: ConfigLimitArgs,
    },
    /// Show which rule governs each descriptor of a request and why, and the limiter key it
    /// would use, without touching any backend.
    Explain {
        /// A limits YAML file or a directory of *.yaml files.
        #[arg(long, env = "SLUICE_CONFIG")]
        config: PathBuf,
        /// The request's domain.
        #[arg(long)]
        domain: String,
        /// One descriptor per argument, as key=value[,key=value...].
        #[arg(required = true)]
        descriptors: Vec<String>,
    },
}

/// What a config may cost to read (docs/security.md, "Config limits"): `serve` (start-up and
/// every reload) and `check-config` take the same flags.
#[derive(clap::Args)]
pub(crate) struct ConfigLimitArgs {
    /// Bytes the config may hold, all of its files together.
    #[arg(long, env = "SLUICE_MAX_CONFIG_BYTES", default_value_t = ConfigLimits::DEFAULT_MAX_BYTES)]
    max_config_bytes: u64,
    /// YAML nodes (scalars, sequences, mappings, aliases expanded) one config file may hold.
    #[arg(long, env = "SLUICE_MAX_YAML_NODES", default_value_t = ConfigLimits::DEFAULT_MAX_YAML_NODES)]
    max_yaml_nodes: usize,
    /// YAML nesting levels one config file may use (1 to 1024).
    #[arg(long, env = "SLUICE_MAX_YAML_DEPTH", default_value_t = ConfigLimits::DEFAULT_MAX_YAML_DEPTH, value_parser = depth_in(ConfigLimits::MAX_YAML_DEPTH))]
    max_yaml_depth: usize,
    /// Aliases per anchor one config file may use, once it has 100 aliases.
    #[arg(long, env = "SLUICE_MAX_YAML_ALIASES_PER_ANCHOR", default_value_t = ConfigLimits::DEFAULT_MAX_YAML_ALIASES_PER_ANCHOR)]
    max_yaml_aliases_per_anchor: usize,
}

impl ConfigLimitArgs {
    pub(crate) fn limits(&self) -> ConfigLimits {
        ConfigLimits {
            max_bytes: self.max_config_bytes,
            max_yaml_nodes: self.max_yaml_nodes,
            max_yaml_depth: self.max_yaml_depth,
            max_yaml_aliases_per_anchor: self.max_yaml_aliases_per_anchor,
        }
    }
}

#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum LogFormat {
    Text,
    Json,
}

#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum OnBackendError {
    Error,
    Allow,
    Deny,
}

impl From<OnBackendError> for FailurePolicy {
    fn from(p: OnBackendError) -> Self {
        match p {
            OnBackendError::Error => FailurePolicy::Error,
            OnBackendError::Allow => FailurePolicy::Allow,
            OnBackendError::Deny => FailurePolicy::Deny,
        }
    }
}

#[derive(clap::Args)]
pub(crate) struct ServeArgs {
    /// A limits YAML file or a directory of *.yaml files (envoyproxy/ratelimit's format).
    /// Either this or --config-xds.
    #[arg(long, env = "SLUICE_CONFIG")]
    pub(crate) config: Option<PathBuf>,
    /// Take the limits from an xDS management server instead of files: https://HOST:PORT
    /// (TLS) or http://HOST:PORT (plaintext), e.g. Envoy Gateway's
    /// https://envoy-gateway:18001.
    #[arg(long, env = "SLUICE_CONFIG_XDS", value_name = "URL")]
    pub(crate) config_xds: Option<String>,
    /// Node id sent to the xDS server, which keys its configs by it (Envoy Gateway:
    /// envoy-ratelimit; envoyproxy/ratelimit's default: default).
    #[arg(long, env = "SLUICE_CONFIG_XDS_NODE_ID", default_value = "default")]
    pub(crate) config_xds_node_id: String,
    /// PEM CA(s) that sign the xDS server's certificate (default: the system roots).
    #[arg(long, env = "SLUICE_CONFIG_XDS_CA_FILE", value_name = "PEM")]
    pub(crate) config_xds_ca_file: Option<PathBuf>,
    /// PEM client certificate for the xDS server (mutual TLS), with --config-xds-client-key.
    #[arg(long, env = "SLUICE_CONFIG_XDS_CLIENT_CERT", value_name = "PEM")]
    pub(crate) config_xds_client_cert: Option<PathBuf>,
    /// PEM private key of --config-xds-client-cert.
    #[arg(long, env = "SLUICE_CONFIG_XDS_CLIENT_KEY", value_name = "PEM")]
    pub(crate) config_xds_client_key: Option<PathBuf>,
    /// Name the xDS server's certificate must hold, instead of the URL's host.
    #[arg(long, env = "SLUICE_CONFIG_XDS_SERVER_NAME", value_name = "NAME")]
    pub(crate) config_xds_server_name: Option<String>,
    /// With --config-xds: serve before the first config arrives, answering UNAVAILABLE until
    /// it does, instead of waiting for it.
    #[arg(long, env = "SLUICE_FORCE_START_WITHOUT_INITIAL_CONFIG")]
    pub(crate) force_start_without_initial_config: bool,
    /// With --config-xds: nodes (resources, descriptors, `replaces` entries, `metadata`
    /// values) one response may hold; more is NACKed before decoding.
    #[arg(long, env = "SLUICE_MAX_XDS_NODES", default_value_t = XdsLimits::DEFAULT_MAX_NODES)]
    pub(crate) max_xds_nodes: usize,
    /// With --config-xds: levels of nested descriptors one response may hold (1 to 48).
    #[arg(long, env = "SLUICE_MAX_XDS_DEPTH", default_value_t = XdsLimits::DEFAULT_MAX_DEPTH, value_parser = depth_in(XdsLimits::MAX_DEPTH))]
    pub(crate) max_xds_depth: usize,
    /// With --config-xds: bytes the config paths of one response's descriptors may take.
    #[arg(long, env = "SLUICE_MAX_XDS_PATH_BYTES", default_value_t = XdsLimits::DEFAULT_MAX_PATH_BYTES)]
    pub(crate) max_xds_path_bytes: usize,
    /// Address of the gRPC server (RLS, health, reflection). Loopback: a sidecar serves its pod.
    #[arg(long, env = "SLUICE_GRPC_ADDR", default_value = "127.0.0.1:8081")]
    pub(crate) grpc_addr: SocketAddr,
    /// Address of the admin HTTP server: /healthz, /readyz, /metrics, and envoyproxy/ratelimit's
    /// POST /json and GET /rlconfig.
    #[arg(long, env = "SLUICE_ADMIN_ADDR", default_value = "127.0.0.1:9102")]
    pub(crate) admin_addr: SocketAddr,
    /// PEM certificate chain of the gRPC server: with --grpc-tls-key, the gRPC port (RLS,
    /// health, reflection) speaks TLS only. Reloaded when the file changes.
    #[arg(
        long,
        env = "SLUICE_GRPC_TLS_CERT",
        value_name = "PEM",
        requires = "grpc_tls_key"
    )]
    pub(crate) grpc_tls_cert: Option<PathBuf>,
    /// PEM private key of --grpc-tls-cert.
    #[arg(
        long,
        env = "SLUICE_GRPC_TLS_KEY",
        value_name = "PEM",
        requires = "grpc_tls_cert"
    )]
    pub(crate) grpc_tls_key: Option<PathBuf>,
    /// PEM CA file(s), comma-separated: every gRPC client must present a certificate one of
    /// them signs. Reloaded when a file changes.
    #[arg(
        long,
        env = "SLUICE_GRPC_CLIENT_CA",
        value_name = "PEM",
        value_delimiter = ',',
        requires = "grpc_tls_cert"
    )]
    pub(crate) grpc_client_ca: Vec<PathBuf>,
    /// A DNS name or IP address the client certificate must carry (with --grpc-client-ca).
    #[arg(
        long,
        env = "SLUICE_GRPC_CLIENT_SAN",
        value_name = "NAME",
        requires = "grpc_client_ca"
    )]
    pub(crate) grpc_client_san: Option<String>,
    /// Address of an extra HTTP listener serving only /metrics (envoyproxy/ratelimit's
    /// PROMETHEUS_ADDR); /metrics stays on the admin port too.
    #[arg(long, env = "SLUICE_METRICS_ADDR")]
    pub(crate) metrics_addr: Option<SocketAddr>,
    /// Redis URL: redis://[user[:password]@]host:port[/db] (rediss:// for TLS), a cluster:
    /// redis+cluster://[user[:password]@]host1:port1,host2:port2 (rediss+cluster:// for TLS), or
    /// the primary Sentinel names: redis+sentinel://[user[:password]@]host1:port1,host2:port2/
    /// master-name (rediss+sentinel:// for TLS). Without it the embedded in-memory backend serves
    /// (one instance only), and no other --redis-* setting may be given.
    #[arg(long, env = "SLUICE_REDIS_URL")]
    pub(crate) redis_url: Option<String>,
    /// PEM file of the CA that signs the Redis server certificate (rediss only; default: the
    /// system roots).
    #[arg(long, env = "SLUICE_REDIS_CA_FILE")]
    pub(crate) redis_ca_file: Option<PathBuf>,
    /// File holding the Redis password (trailing newline ignored); wins over
    /// SLUICE_REDIS_PASSWORD, which wins over a password in the URL. Keeps secrets off command
    /// lines and manifests.
    #[arg(long, env = "SLUICE_REDIS_PASSWORD_FILE")]
    pub(crate) redis_password_file: Option<PathBuf>,
    /// PEM file of the client certificate (chain) presented to Redis, for servers that verify
    /// clients (rediss only; with --redis-tls-key).
    #[arg(long, env = "SLUICE_REDIS_TLS_CERT")]
    pub(crate) redis_tls_cert: Option<PathBuf>,
    /// PEM file of the private key of --redis-tls-cert.
    #[arg(long, env = "SLUICE_REDIS_TLS_KEY")]
    pub(crate) redis_tls_key: Option<PathBuf>,
    /// ACL user the sentinels are asked as (redis+sentinel only; default: no user).
    #[arg(long, env = "SLUICE_REDIS_SENTINEL_USER")]
    pub(crate) redis_sentinel_user: Option<String>,
    /// File holding the sentinels' own password (redis+sentinel only); wins over
    /// SLUICE_REDIS_SENTINEL_PASSWORD. The primary's password is --redis-password-file's.
    #[arg(long, env = "SLUICE_REDIS_SENTINEL_PASSWORD_FILE")]
    pub(crate) redis_sentinel_password_file: Option<PathBuf>,
    /// Replicas that must acknowledge each script call's writes (Redis WAIT, pipelined behind
    /// it) before its decisions are answered; fewer within the backend deadline fail the call
    /// (--on-backend-error answers). Keeps a failover from losing admitted entries; costs the
    /// replicas' acknowledgement on every call (docs/redis.md, "WAIT"). 0: no WAIT.
    #[arg(long, env = "SLUICE_REDIS_WAIT_REPLICAS", default_value_t = 0)]
    pub(crate) redis_wait_replicas: u32,
    /// Redis connections kept open (multiplexed, round-robin). Two by default: concurrent
    /// decisions share script calls per connection, and fewer connections make fuller calls
    /// (docs/performance.md, "Connections").
    #[arg(long, env = "SLUICE_REDIS_POOL_SIZE", default_value_t = DEFAULT_POOL_SIZE)]
    pub(crate) redis_pool_size: usize,
    /// Concurrent decisions sent to Redis in one script call at most (each still decided on its
    /// own, all-or-nothing); 1 sends one call per decision. Never waits for a batch to fill.
    #[arg(long, env = "SLUICE_REDIS_BATCH_MAX", default_value_t = DEFAULT_BATCH_MAX)]
    pub(crate) redis_batch_max: usize,
    /// Per-decision backend deadline in milliseconds (Envoy's filter gives up at 20 ms).
    #[arg(long, env = "SLUICE_BACKEND_TIMEOUT_MS", default_value_t = guard::DEFAULT_DEADLINE.as_millis() as u64)]
    pub(crate) backend_timeout_ms: u64,
    /// Backend calls allowed in flight (abandoned ones included); beyond it calls fail fast.
    #[arg(long, env = "SLUICE_BACKEND_MAX_IN_FLIGHT", default_value_t = guard::DEFAULT_MAX_IN_FLIGHT)]
    pub(crate) backend_max_in_flight: usize,
    /// Answer when the backend fails or misses the deadline: error (UNAVAILABLE), allow (OK) or
    /// deny (OVER_LIMIT).
    #[arg(
        long,
        env = "SLUICE_ON_BACKEND_ERROR",
        value_enum,
        default_value = "error"
    )]
    pub(crate) on_backend_error: OnBackendError,
    /// Keys kept in the local cache of keys known to be over their limit; 0 disables it.
    #[arg(long, env = "SLUICE_LOCAL_CACHE_SIZE", default_value_t = cache::DEFAULT_CAPACITY)]
    pub(crate) local_cache_size: usize,
    /// Seconds between backend readiness probes.
    #[arg(long, env = "SLUICE_PROBE_INTERVAL_SECS", default_value_t = server::DEFAULT_PROBE_INTERVAL.as_secs())]
    pub(crate) probe_interval_secs: u64,
    /// Merge config files that name the same domain (a top-level descriptor repeated across
    /// them is still an error) instead of rejecting the duplicate domain.
    #[arg(long, env = "SLUICE_MERGE_DOMAIN_CONFIG")]
    pub(crate) merge_domain_config: bool,
    /// Response headers (none, draft, legacy) for domains whose config sets no
    /// `response_headers` of its own.
    #[arg(long, env = "SLUICE_RESPONSE_HEADERS", default_value = "none", value_parser = parse_header_format)]
    pub(crate) response_headers: HeaderFormat,
    /// Name of the `legacy` style's header carrying the limit.
    #[arg(long, env = "SLUICE_LEGACY_LIMIT_HEADER", value_name = "NAME", default_value = headers::DEFAULT_LIMIT_HEADER, value_parser = parse_header_name)]
    pub(crate) legacy_limit_header: String,
    /// Name of the `legacy` style's header carrying the remaining hits.
    #[arg(long, env = "SLUICE_LEGACY_REMAINING_HEADER", value_name = "NAME", default_value = headers::DEFAULT_REMAINING_HEADER, value_parser = parse_header_name)]
    pub(crate) legacy_remaining_header: String,
    /// Name of the `legacy` style's header carrying the seconds until the window frees a slot.
    #[arg(long, env = "SLUICE_LEGACY_RESET_HEADER", value_name = "NAME", default_value = headers::DEFAULT_RESET_HEADER, value_parser = parse_header_name)]
    pub(crate) legacy_reset_header: String,
    /// Global shadow mode: every limit is evaluated and reported, but every request is
    /// answered OK overall.
    #[arg(long, env = "SLUICE_SHADOW_MODE")]
    pub(crate) shadow_mode: bool,
    /// Global quota mode: every descriptor is a quota descriptor, so a request is over the
    /// limit only when all of its limited descriptors are.
    #[arg(long, env = "SLUICE_QUOTA_MODE")]
    pub(crate) quota_mode: bool,
    /// Prefix of every limiter key (no braces, at most 64 bytes).
    #[arg(long, env = "SLUICE_KEY_PREFIX", default_value = sluice::descriptor::KEY_PREFIX)]
    pub(crate) key_prefix: String,
    /// An admitted decision counts as near the limit (sluice_near_limit_total) when it leaves
    /// more than floor(ratio x limit) entries in the window.
    #[arg(long, env = "SLUICE_NEAR_LIMIT_RATIO", default_value_t = MetricsSettings::default().near_limit_ratio, value_parser = parse_ratio)]
    pub(crate) near_limit_ratio: f64,
    /// How many of the hottest keys /metrics shows (sluice_hot_key_entries).
    #[arg(long, env = "SLUICE_HOT_KEYS", default_value_t = MetricsSettings::default().hot_keys)]
    pub(crate) hot_keys: usize,
    /// Log format on stderr.
    #[arg(long, env = "SLUICE_LOG_FORMAT", value_enum, default_value = "text")]
    pub(crate) log_format: LogFormat,
    /// Reload the config when it changes (a Kubernetes ConfigMap's `..data` swap included);
    /// an invalid change is logged and the previous config keeps serving.
    #[arg(
        long,
        env = "SLUICE_WATCH_CONFIG",
        default_value_t = true,
        action = clap::ArgAction::Set,
        value_name = "BOOL"
    )]
    pub(crate) watch_config: bool,
    /// Milliseconds between checks of the config for changes.
    #[arg(long, env = "SLUICE_WATCH_INTERVAL_MS", default_value_t = server::DEFAULT_WATCH_INTERVAL.as_millis() as u64)]
    pub(crate) watch_interval_ms: u64,
    /// Longest `domain` accepted, in bytes; longer requests get INVALID_ARGUMENT.
    #[arg(long, env = "SLUICE_MAX_DOMAIN_BYTES", default_value_t = InputLimits::DEFAULT_MAX_DOMAIN_BYTES)]
    pub(crate) max_domain_bytes: usize,
    /// Most descriptors accepted in one request.
    #[arg(long, env = "SLUICE_MAX_DESCRIPTORS", default_value_t = InputLimits::DEFAULT_MAX_DESCRIPTORS)]
    pub(crate) max_descriptors: usize,
    /// Most entries accepted in one descriptor.
    #[arg(long, env = "SLUICE_MAX_ENTRIES", default_value_t = InputLimits::DEFAULT_MAX_ENTRIES)]
    pub(crate) max_entries: usize,
    /// Longest descriptor entry key accepted, in bytes.
    #[arg(long, env = "SLUICE_MAX_KEY_BYTES", default_value_t = InputLimits::DEFAULT_MAX_KEY_BYTES)]
    pub(crate) max_key_bytes: usize,
    /// Longest descriptor entry value accepted, in bytes.
    #[arg(long, env = "SLUICE_MAX_VALUE_BYTES", default_value_t = InputLimits::DEFAULT_MAX_VALUE_BYTES)]
    pub(crate) max_value_bytes: usize,
    /// Largest hits_addend accepted (request or descriptor level). A request's hits are one
    /// log entry whatever their number: this bounds what one request may claim of a limit.
    #[arg(long, env = "SLUICE_MAX_HITS_ADDEND", default_value_t = InputLimits::DEFAULT_MAX_HITS_ADDEND)]
    pub(crate) max_hits_addend: u64,
    /// Largest encoded gRPC request accepted, in bytes (refused before decoding).
    #[arg(long, env = "SLUICE_MAX_MESSAGE_BYTES", default_value_t = PortLimits::DEFAULT_MAX_MESSAGE_BYTES)]
    pub(crate) max_message_bytes: usize,
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
    /// Milliseconds a client has for the TLS handshake and the HTTP/2 preface after connecting,
    /// each gRPC call until answered; on the admin port the request head, then the body.
    #[arg(long, env = "SLUICE_REQUEST_TIMEOUT_MS", default_value_t = PortLimits::DEFAULT_REQUEST_TIMEOUT.as_millis() as u64)]
    pub(crate) request_timeout_ms: u64,
    /// Milliseconds a connection may stay open with nothing sent by the client (either port).
    #[arg(long, env = "SLUICE_IDLE_TIMEOUT_MS", default_value_t = PortLimits::DEFAULT_IDLE_TIMEOUT.as_millis() as u64)]
    pub(crate) idle_timeout_ms: u64,
    #[command(flatten)]
    pub(crate) config_limits: ConfigLimitArgs,
    #[command(flatten)]
    pub(crate) tracing: sluice::otel::TracingArgs,
}

impl ServeArgs {
    /// Where the limits come from: `--config` or `--config-xds` (exactly one).
    fn config_source(&self) -> Result<ConfigSource, StartError> {
        let usage = |text: &str| Err(StartError::Usage(text.to_owned()));
        let path = match (&self.config, &self.config_xds) {
            (Some(_), Some(_)) => {
                return usage(
                    "--config and --config-xds are exclusive: the limits come from files or \
                     from an xDS server, not both",
                );
            }
            (None, None) => {
                return usage(
                    "no config source: give --config PATH (a limits file or directory) or \
                     --config-xds URL (an xDS management server)",
                );
            }
            (None, Some(url)) => {
                return Ok(ConfigSource::Xds(XdsSettings {
                    tls: ClientTls {
                        ca_file: self.config_xds_ca_file.clone(),
                        client_cert: self.config_xds_client_cert.clone(),
                        client_key: self.config_xds_client_key.clone(),
                        server_name: self.config_xds_server_name.clone(),
                    },
                    force_start: self.force_start_without_initial_config,
                    limits: XdsLimits {
                        max_nodes: self.max_xds_nodes,
                        max_depth: self.max_xds_depth,
                        max_path_bytes: self.max_xds_path_bytes,
                    },
                    ..XdsSettings::new(url, &self.config_xds_node_id)
                }));
            }
            (Some(path), None) => path,
        };
        let xds_only = [
            ("--config-xds-ca-file", self.config_xds_ca_file.is_some()),
            (
                "--config-xds-client-cert",
                self.config_xds_client_cert.is_some(),
            ),
            (
                "--config-xds-client-key",
                self.config_xds_client_key.is_some(),
            ),
            (
                "--config-xds-server-name",
                self.config_xds_server_name.is_some(),
            ),
            (
                "--force-start-without-initial-config",
                self.force_start_without_initial_config,
            ),
        ];
        if let Some((flag, _)) = xds_only.iter().find(|(_, set)| *set) {
            return usage(&format!(
                "{flag} applies to --config-xds only; the limits come from --config"
            ));
        }
        Ok(ConfigSource::Files(path.clone()))
    }

    /// The settings these flags describe; reads the Redis password files (or
    /// `SLUICE_REDIS_PASSWORD`, `SLUICE_REDIS_SENTINEL_PASSWORD` through `variable`).
    /// `redis_given` names the Redis-only settings given, refused without a Redis URL.
    pub(crate) fn settings(
        &self,
        redis_given: &[String],
        variable: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Settings, StartError> {
        let load = load_options(
            self.merge_domain_config,
            self.response_headers,
            self.config_limits.limits(),
        );
        let redis = match &self.redis_url {
            Some(url) => Some(RedisOptions {
                ca_file: self.redis_ca_file.clone(),
                client_cert: app::client_cert(
                    self.redis_tls_cert.clone(),
                    self.redis_tls_key.clone(),
                )?,
                password: app::redis_password(
                    self.redis_password_file.as_deref(),
                    variable("SLUICE_REDIS_PASSWORD"),
                )?,
                sentinel_user: self.redis_sentinel_user.clone(),
                sentinel_password: app::sentinel_password(
                    self.redis_sentinel_password_file.as_deref(),
                    variable("SLUICE_REDIS_SENTINEL_PASSWORD"),
                )?,
                pool_size: self.redis_pool_size,
                batch_max: self.redis_batch_max,
                wait_replicas: self.redis_wait_replicas,
                ..RedisOptions::new(url)
            }),
            None if !redis_given.is_empty() => {
                return Err(StartError::RedisSettingWithoutUrl(redis_given.join(", ")));
            }
            None => None,
        };
        Ok(Settings {
            config: self.config_source()?,
            load,
            backend: BackendSettings {
                redis,
                deadline: Duration::from_millis(self.backend_timeout_ms),
                max_in_flight: self.backend_max_in_flight,
                local_cache_size: self.local_cache_size,
            },
            engine: EngineOptions {
                on_backend_error: self.on_backend_error.into(),
                shadow_mode: self.shadow_mode,
                quota_mode: self.quota_mode,
                key_prefix: self.key_prefix.clone(),
                limits: InputLimits {
                    max_domain_bytes: self.max_domain_bytes,
                    max_descriptors: self.max_descriptors,
                    max_entries: self.max_entries,
                    max_key_bytes: self.max_key_bytes,
                    max_value_bytes: self.max_value_bytes,
                    max_hits_addend: self.max_hits_addend,
                },
            },
            metrics: MetricsSettings {
                near_limit_ratio: self.near_limit_ratio,
                hot_keys: self.hot_keys,
            },
            probe_interval: Duration::from_secs(self.probe_interval_secs),
            watch_interval: self
                .watch_config
                .then(|| Duration::from_millis(self.watch_interval_ms)),
            ports: PortLimits {
                grpc_max_connections: self.grpc_max_connections,
                grpc_max_concurrent_streams: self.grpc_max_concurrent_streams,
                max_message_bytes: self.max_message_bytes,
                admin_max_connections: self.admin_max_connections,
                request_timeout: Duration::from_millis(self.request_timeout_ms.max(1)),
                idle_timeout: Duration::from_millis(self.idle_timeout_ms.max(1)),
            },
            grpc_tls: self.grpc_tls(),
            tracing: self.tracing.settings(),
            legacy_names: LegacyNames::new(
                &self.legacy_limit_header,
                &self.legacy_remaining_header,
                &self.legacy_reset_header,
            )
            .map_err(StartError::LegacyHeaders)?,
        })
    }
}

impl ServeArgs {
    /// The gRPC server's TLS, its files checked as often as the config's (even when the config
    /// is not watched: a rotated Secret must be picked up).
    fn grpc_tls(&self) -> Option<TlsSettings> {
        let (cert, key) = (self.grpc_tls_cert.clone()?, self.grpc_tls_key.clone()?);
        Some(TlsSettings {
            client_ca: self.grpc_client_ca.clone(),
            client_san: self.grpc_client_san.clone(),
            reload_interval: Duration::from_millis(self.watch_interval_ms),
            ..TlsSettings::new(cert, key)
        })
    }
}

pub(crate) fn load_options(
    merge_domains: bool,
    default_headers: HeaderFormat,
    limits: ConfigLimits,
) -> LoadOptions {
    LoadOptions {
        merge_domains,
        default_headers: HeaderPolicy {
            format: default_headers,
            hide_remaining: false,
        },
        limits,
    }
}

/// A YAML nesting limit in 1..=[`ConfigLimits::MAX_YAML_DEPTH`].
/// A parser of nesting depths in `1..=max`.
fn depth_in(max: usize) -> impl Fn(&str) -> Result<usize, String> + Clone {
    move |text| match text.parse::<usize>() {
        Ok(depth) if (1..=max).contains(&depth) => Ok(depth),
        _ => Err(format!("{text:?} is not a depth in 1..={max}")),
    }
}

fn parse_header_format(text: &str) -> Result<HeaderFormat, String> {
    HeaderFormat::parse(text).ok_or_else(|| format!("{text:?} is not one of none, draft, legacy"))
}

fn parse_header_name(text: &str) -> Result<String, String> {
    headers::check_header_name(text).map(|()| text.to_owned())
}

/// A ratio in (0, 1].
fn parse_ratio(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(r) if r > 0.0 && r <= 1.0 => Ok(r),
        _ => Err(format!("{text:?} is not a ratio in (0, 1]")),
    }
}
