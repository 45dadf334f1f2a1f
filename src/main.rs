//! The `sluice` command: parses flags (each also read from a `SLUICE_*` variable) into
//! [`sluice::app::Settings`], and wires the result: logging, the metrics recorder, the stack
//! [`sluice::app::assemble`] builds, the listeners, SIGTERM, [`sluice::run`]. What the commands
//! do lives in the library ([`sluice::app`]), where tests run it in process.
#![forbid(unsafe_code)]
#![deny(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use sluice::app::{self, BackendSettings, Settings};
use sluice::config::{HeaderFormat, HeaderPolicy, LoadOptions};
use sluice::decision::{EngineOptions, FailurePolicy, InputLimits};
use sluice::headers::{self, LegacyNames};
use sluice::limiter::cache;
use sluice::limiter::guard;
use sluice::limiter::redis::{RedisOptions, DEFAULT_BATCH_MAX, DEFAULT_POOL_SIZE};
use sluice::metrics::MetricsSettings;
use sluice::{run, Listeners};

/// Per-request allocations (h2 frames, prost messages, Redis commands) are many and short-lived;
/// mimalloc serves them from thread-local pages where glibc malloc spent ~16% of the CPU.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "sluice",
    version,
    about = "Envoy rate-limit service with an exact sliding-window log"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve Envoy's RateLimitService over gRPC.
    Serve(Box<ServeArgs>),
    /// Validate a config file or directory; prints every error and exits non-zero on any.
    CheckConfig {
        /// A limits YAML file or a directory of *.yaml files.
        path: PathBuf,
        /// Merge files that name the same domain instead of rejecting them.
        #[arg(long, env = "SLUICE_MERGE_DOMAIN_CONFIG")]
        merge_domain_config: bool,
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

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Clone, Copy, ValueEnum)]
enum OnBackendError {
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
struct ServeArgs {
    /// A limits YAML file or a directory of *.yaml files (envoyproxy/ratelimit's format).
    #[arg(long, env = "SLUICE_CONFIG")]
    config: PathBuf,
    /// Address of the gRPC server (RLS, health, reflection). Loopback: a sidecar serves its pod.
    #[arg(long, env = "SLUICE_GRPC_ADDR", default_value = "127.0.0.1:8081")]
    grpc_addr: SocketAddr,
    /// Address of the admin HTTP server: /healthz, /readyz, /metrics, and envoyproxy/ratelimit's
    /// POST /json and GET /rlconfig.
    #[arg(long, env = "SLUICE_ADMIN_ADDR", default_value = "127.0.0.1:9102")]
    admin_addr: SocketAddr,
    /// Redis URL: redis://[user[:password]@]host:port[/db] (rediss:// for TLS), or a cluster:
    /// redis+cluster://[user[:password]@]host1:port1,host2:port2 (rediss+cluster:// for TLS).
    /// Without it the embedded in-memory backend serves (one instance only).
    #[arg(long, env = "SLUICE_REDIS_URL")]
    redis_url: Option<String>,
    /// PEM file of the CA that signs the Redis server certificate (rediss only; default: the
    /// system roots).
    #[arg(long, env = "SLUICE_REDIS_CA_FILE")]
    redis_ca_file: Option<PathBuf>,
    /// File holding the Redis password (trailing newline ignored); wins over
    /// SLUICE_REDIS_PASSWORD, which wins over a password in the URL. Keeps secrets off command
    /// lines and manifests.
    #[arg(long, env = "SLUICE_REDIS_PASSWORD_FILE")]
    redis_password_file: Option<PathBuf>,
    /// Redis connections kept open (multiplexed, round-robin). Two by default: concurrent
    /// decisions share script calls per connection, and fewer connections make fuller calls
    /// (docs/performance.md, "Connections").
    #[arg(long, env = "SLUICE_REDIS_POOL_SIZE", default_value_t = DEFAULT_POOL_SIZE)]
    redis_pool_size: usize,
    /// Concurrent decisions sent to Redis in one script call at most (each still decided on its
    /// own, all-or-nothing); 1 sends one call per decision. Never waits for a batch to fill.
    #[arg(long, env = "SLUICE_REDIS_BATCH_MAX", default_value_t = DEFAULT_BATCH_MAX)]
    redis_batch_max: usize,
    /// Per-decision backend deadline in milliseconds (Envoy's filter gives up at 20 ms).
    #[arg(long, env = "SLUICE_BACKEND_TIMEOUT_MS", default_value_t = guard::DEFAULT_DEADLINE.as_millis() as u64)]
    backend_timeout_ms: u64,
    /// Backend calls allowed in flight (abandoned ones included); beyond it calls fail fast.
    #[arg(long, env = "SLUICE_BACKEND_MAX_IN_FLIGHT", default_value_t = guard::DEFAULT_MAX_IN_FLIGHT)]
    backend_max_in_flight: usize,
    /// Answer when the backend fails or misses the deadline: error (UNAVAILABLE), allow (OK) or
    /// deny (OVER_LIMIT).
    #[arg(
        long,
        env = "SLUICE_ON_BACKEND_ERROR",
        value_enum,
        default_value = "error"
    )]
    on_backend_error: OnBackendError,
    /// Keys kept in the local cache of keys known to be over their limit; 0 disables it.
    #[arg(long, env = "SLUICE_LOCAL_CACHE_SIZE", default_value_t = cache::DEFAULT_CAPACITY)]
    local_cache_size: usize,
    /// Seconds between backend readiness probes.
    #[arg(long, env = "SLUICE_PROBE_INTERVAL_SECS", default_value_t = app::DEFAULT_PROBE_INTERVAL.as_secs())]
    probe_interval_secs: u64,
    /// Merge config files that name the same domain (a top-level descriptor repeated across
    /// them is still an error) instead of rejecting the duplicate domain.
    #[arg(long, env = "SLUICE_MERGE_DOMAIN_CONFIG")]
    merge_domain_config: bool,
    /// Response headers (none, draft, legacy) for domains whose config sets no
    /// `response_headers` of its own.
    #[arg(long, env = "SLUICE_RESPONSE_HEADERS", default_value = "none", value_parser = parse_header_format)]
    response_headers: HeaderFormat,
    /// Name of the `legacy` style's header carrying the limit.
    #[arg(long, env = "SLUICE_LEGACY_LIMIT_HEADER", value_name = "NAME", default_value = headers::DEFAULT_LIMIT_HEADER, value_parser = parse_header_name)]
    legacy_limit_header: String,
    /// Name of the `legacy` style's header carrying the remaining hits.
    #[arg(long, env = "SLUICE_LEGACY_REMAINING_HEADER", value_name = "NAME", default_value = headers::DEFAULT_REMAINING_HEADER, value_parser = parse_header_name)]
    legacy_remaining_header: String,
    /// Name of the `legacy` style's header carrying the seconds until the window frees a slot.
    #[arg(long, env = "SLUICE_LEGACY_RESET_HEADER", value_name = "NAME", default_value = headers::DEFAULT_RESET_HEADER, value_parser = parse_header_name)]
    legacy_reset_header: String,
    /// Global shadow mode: every limit is evaluated and reported, but every request is
    /// answered OK overall.
    #[arg(long, env = "SLUICE_SHADOW_MODE")]
    shadow_mode: bool,
    /// Prefix of every limiter key (no braces, at most 64 bytes).
    #[arg(long, env = "SLUICE_KEY_PREFIX", default_value = sluice::descriptor::KEY_PREFIX)]
    key_prefix: String,
    /// An admitted decision counts as near the limit (sluice_near_limit_total) when it leaves
    /// more than floor(ratio x limit) entries in the window.
    #[arg(long, env = "SLUICE_NEAR_LIMIT_RATIO", default_value_t = MetricsSettings::default().near_limit_ratio, value_parser = parse_ratio)]
    near_limit_ratio: f64,
    /// How many of the hottest keys /metrics shows (sluice_hot_key_entries).
    #[arg(long, env = "SLUICE_HOT_KEYS", default_value_t = MetricsSettings::default().hot_keys)]
    hot_keys: usize,
    /// Log format on stderr.
    #[arg(long, env = "SLUICE_LOG_FORMAT", value_enum, default_value = "text")]
    log_format: LogFormat,
    /// Reload the config when it changes (a Kubernetes ConfigMap's `..data` swap included);
    /// an invalid change is logged and the previous config keeps serving.
    #[arg(
        long,
        env = "SLUICE_WATCH_CONFIG",
        default_value_t = true,
        action = clap::ArgAction::Set,
        value_name = "BOOL"
    )]
    watch_config: bool,
    /// Milliseconds between checks of the config for changes.
    #[arg(long, env = "SLUICE_WATCH_INTERVAL_MS", default_value_t = app::DEFAULT_WATCH_INTERVAL.as_millis() as u64)]
    watch_interval_ms: u64,
    /// Longest `domain` accepted, in bytes; longer requests get INVALID_ARGUMENT.
    #[arg(long, env = "SLUICE_MAX_DOMAIN_BYTES", default_value_t = InputLimits::DEFAULT_MAX_DOMAIN_BYTES)]
    max_domain_bytes: usize,
    /// Most descriptors accepted in one request.
    #[arg(long, env = "SLUICE_MAX_DESCRIPTORS", default_value_t = InputLimits::DEFAULT_MAX_DESCRIPTORS)]
    max_descriptors: usize,
    /// Most entries accepted in one descriptor.
    #[arg(long, env = "SLUICE_MAX_ENTRIES", default_value_t = InputLimits::DEFAULT_MAX_ENTRIES)]
    max_entries: usize,
    /// Longest descriptor entry key accepted, in bytes.
    #[arg(long, env = "SLUICE_MAX_KEY_BYTES", default_value_t = InputLimits::DEFAULT_MAX_KEY_BYTES)]
    max_key_bytes: usize,
    /// Longest descriptor entry value accepted, in bytes.
    #[arg(long, env = "SLUICE_MAX_VALUE_BYTES", default_value_t = InputLimits::DEFAULT_MAX_VALUE_BYTES)]
    max_value_bytes: usize,
    /// Largest hits_addend accepted (request or descriptor level).
    #[arg(long, env = "SLUICE_MAX_HITS_ADDEND", default_value_t = InputLimits::DEFAULT_MAX_HITS_ADDEND)]
    max_hits_addend: u64,
    /// Largest encoded gRPC request accepted, in bytes (refused before decoding).
    #[arg(long, env = "SLUICE_MAX_MESSAGE_BYTES", default_value_t = InputLimits::DEFAULT_MAX_MESSAGE_BYTES)]
    max_message_bytes: usize,
    #[command(flatten)]
    tracing: sluice::otel::TracingArgs,
}

impl ServeArgs {
    /// The settings these flags describe; reads the Redis password file (or
    /// `SLUICE_REDIS_PASSWORD`).
    fn settings(&self) -> Result<Settings, app::StartError> {
        let load = load_options(self.merge_domain_config, self.response_headers);
        let redis = match &self.redis_url {
            Some(url) => Some(RedisOptions {
                ca_file: self.redis_ca_file.clone(),
                password: app::redis_password(
                    self.redis_password_file.as_deref(),
                    std::env::var("SLUICE_REDIS_PASSWORD").ok(),
                )?,
                pool_size: self.redis_pool_size,
                batch_max: self.redis_batch_max,
                ..RedisOptions::new(url)
            }),
            None => None,
        };
        Ok(Settings {
            config: self.config.clone(),
            load,
            backend: BackendSettings {
                redis,
                deadline: Duration::from_millis(self.backend_timeout_ms),
                max_in_flight: self.backend_max_in_flight,
                local_cache_size: self.local_cache_size,
            },
            engine: EngineOptions {
                shadow_mode: self.shadow_mode,
                key_prefix: self.key_prefix.clone(),
                limits: InputLimits {
                    max_domain_bytes: self.max_domain_bytes,
                    max_descriptors: self.max_descriptors,
                    max_entries: self.max_entries,
                    max_key_bytes: self.max_key_bytes,
                    max_value_bytes: self.max_value_bytes,
                    max_hits_addend: self.max_hits_addend,
                    max_message_bytes: self.max_message_bytes,
                },
            },
            on_backend_error: self.on_backend_error.into(),
            metrics: MetricsSettings {
                near_limit_ratio: self.near_limit_ratio,
                hot_keys: self.hot_keys,
            },
            probe_interval: Duration::from_secs(self.probe_interval_secs),
            watch_interval: self
                .watch_config
                .then(|| Duration::from_millis(self.watch_interval_ms)),
            tracing: self.tracing.settings(),
            legacy_names: LegacyNames::new(
                &self.legacy_limit_header,
                &self.legacy_remaining_header,
                &self.legacy_reset_header,
            )
            .map_err(app::StartError::LegacyHeaders)?,
        })
    }
}

fn main() -> ExitCode {
    // Before clap reads the environment: envoyproxy/ratelimit's variables become SLUICE_* ones
    // unless those are set. Single-threaded here, so changing the environment is sound.
    let compat = sluice::compat::translate(&|name| std::env::var(name).ok());
    for (name, value) in &compat.set {
        std::env::set_var(name, value);
    }
    let cli = Cli::parse();
    match cli.command {
        Command::CheckConfig {
            path,
            merge_domain_config,
        } => {
            let options = load_options(merge_domain_config, HeaderFormat::None);
            match app::check_config(&path, options) {
                Ok(summary) => {
                    println!("{summary}");
                    ExitCode::SUCCESS
                }
                Err(errors) => {
                    eprintln!("{errors}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Explain {
            config,
            domain,
            descriptors,
        } => match app::explain(&config, &domain, &descriptors) {
            Ok(report) => {
                print!("{report}");
                ExitCode::SUCCESS
            }
            Err(err) => {
                eprintln!("{err}");
                ExitCode::FAILURE
            }
        },
        Command::Serve(args) => {
            init_logging(args.log_format);
            for name in compat.set.keys() {
                tracing::info!("{name} set from an envoyproxy/ratelimit variable");
            }
            for note in &compat.notes {
                tracing::warn!("envoyproxy/ratelimit variable: {note}");
            }
            match serve(*args) {
                Ok(()) => ExitCode::SUCCESS,
                Err(err) => {
                    tracing::error!("{err:#}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

fn load_options(merge_domains: bool, default_headers: HeaderFormat) -> LoadOptions {
    LoadOptions {
        merge_domains,
        default_headers: HeaderPolicy {
            format: default_headers,
            hide_remaining: false,
        },
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

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("SLUICE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

#[tokio::main]
async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let settings = args.settings()?;
    let server = app::assemble(settings, Some(app::install_metrics()?))?;
    let shutdown = shutdown_signal()?;
    let listeners = Listeners::bind(args.grpc_addr, args.admin_addr).await?;
    run(server, listeners, shutdown).await?;
    Ok(())
}

/// Registers the SIGTERM (Kubernetes) and SIGINT handlers now, and returns a future that
/// resolves on either. Registering before the listeners are announced matters: a signal that
/// arrived before a lazily registered handler would kill the process instead of draining it.
fn shutdown_signal() -> anyhow::Result<impl std::future::Future<Output = ()>> {
    #[cfg(unix)]
    {
        use anyhow::Context;
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate()).context("registering SIGTERM")?;
        let mut int = signal(SignalKind::interrupt()).context("registering SIGINT")?;
        Ok(async move {
            tokio::select! {
                _ = term.recv() => {},
                _ = int.recv() => {},
            }
        })
    }
    #[cfg(not(unix))]
    {
        Ok(async {
            let _ = tokio::signal::ctrl_c().await;
        })
    }
}
