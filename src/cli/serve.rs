//! `sluice serve`'s flags, in their families (each a group of its own, with a heading in
//! `--help`), and the one [`Settings`] value they describe.

use std::time::Duration;

use sluice::server::{ConfigSource, Settings, StartError};

use super::LogFormat;
use super::backend::{BackendArgs, RedisArgs};
use super::decisions::{EngineArgs, HeaderArgs, InputLimitArgs, MetricsArgs};
use super::load_options;
use super::ports::{GrpcTlsArgs, PortArgs};
use super::source::{self, ConfigArgs, XdsArgs};

#[derive(clap::Args)]
pub(crate) struct ServeArgs {
    #[command(flatten, next_help_heading = "Limits from files")]
    pub(super) config: ConfigArgs,
    #[command(flatten, next_help_heading = "Limits from an xDS server")]
    pub(super) xds: XdsArgs,
    #[command(flatten, next_help_heading = "Ports")]
    pub(crate) ports: PortArgs,
    #[command(flatten, next_help_heading = "gRPC TLS")]
    pub(super) grpc_tls: GrpcTlsArgs,
    #[command(flatten, next_help_heading = "Redis")]
    pub(super) redis: RedisArgs,
    #[command(flatten, next_help_heading = "Backend")]
    pub(super) backend: BackendArgs,
    #[command(flatten, next_help_heading = "Decisions")]
    pub(super) engine: EngineArgs,
    #[command(flatten, next_help_heading = "Request limits")]
    pub(super) input: InputLimitArgs,
    #[command(flatten, next_help_heading = "Response headers")]
    pub(super) headers: HeaderArgs,
    #[command(flatten, next_help_heading = "Metrics")]
    pub(super) metrics: MetricsArgs,
    #[command(flatten, next_help_heading = "envoyproxy/ratelimit's stats")]
    pub(super) stats: sluice::metrics::upstream::StatsArgs,
    /// Log format on stderr.
    #[arg(
        long,
        env = "SLUICE_LOG_FORMAT",
        value_enum,
        default_value = "text",
        help_heading = "Logs and traces"
    )]
    pub(crate) log_format: LogFormat,
    #[command(flatten, next_help_heading = "Logs and traces")]
    pub(super) tracing: sluice::otel::TracingArgs,
}

impl ServeArgs {
    /// The settings these flags describe; reads the Redis password files (or
    /// `SLUICE_REDIS_PASSWORD`, `SLUICE_REDIS_SENTINEL_PASSWORD` through `variable`).
    /// `redis_given` names the Redis-only settings given, refused without a Redis URL.
    pub(crate) fn settings(
        &self,
        redis_given: &[String],
        variable: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Settings, StartError> {
        let source: ConfigSource = source::source(&self.config, &self.xds)?;
        let redis = self.redis.options(redis_given, variable)?;
        let on_backend_error = self.backend.on_backend_error.into();
        Ok(Settings {
            config: source,
            load: load_options(
                self.config.merge_domain_config,
                self.headers.response_headers,
                self.config.limits.limits(),
            ),
            backend: self.backend.settings(redis),
            engine: self.engine.options(on_backend_error, self.input.limits()),
            metrics: self.metrics.settings(&self.stats)?,
            probe_interval: Duration::from_secs(self.backend.probe_interval_secs),
            watch_interval: self.config.watch_interval(),
            ports: self.ports.limits(),
            grpc_tls: self
                .grpc_tls
                .settings(Duration::from_millis(self.config.watch_interval_ms)),
            tracing: self.tracing.settings(),
            legacy_names: self.headers.legacy_names()?,
            response_dynamic_metadata: self.engine.response_dynamic_metadata,
            drain_delay: self.ports.drain_delay(),
        })
    }
}
