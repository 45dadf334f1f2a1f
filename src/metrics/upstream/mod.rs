//! envoyproxy/ratelimit's own stats, under its names, for what operators wired around it:
//! dashboards, alerts and Envoy Gateway's tests query `ratelimit_service_rate_limit_over_limit
//! {domain,key1,key2}` and its siblings, or read the statsd lines a statsd-exporter maps.
//!
//! Two sinks, as envoyproxy/ratelimit has them, both fed by one store of counters:
//! - statsd (`USE_STATSD`, `STATSD_HOST`, `STATSD_PORT`): the gostats lines, over TCP, each
//!   counter's increase per flush interval and each response time ([`statsd`]);
//! - Prometheus (`USE_PROMETHEUS`, `PROMETHEUS_ADDR`): the series statsd_exporter's mapper
//!   makes of the same names, with envoyproxy/ratelimit's default mapping or
//!   `PROMETHEUS_MAPPER_YAML`'s ([`mapper`], [`render`]), on the metrics port beside sluice's own
//!   families.
//!
//! Facts flow one way: the engine returns its verdicts (each with the stat key its rule
//! names, [`crate::decision::StatKey`]); [`UpstreamStats::record_request`], called by the
//! request observer, turns them into counts ([`observe`]); the gRPC layer reports each unary
//! call's method and time; config loads are counted where sluice's own are. One file per
//! concern: `names` (the typed stat names), `observe`, `store` (aggregation and its bounds),
//! `mapper`, `render`, `statsd`.

mod calls;
mod cli;
pub mod default_mapping;
mod mapper;
mod names;
mod observe;
mod render;
mod series;
mod statsd;
mod store;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

pub use calls::GrpcCallsLayer;
pub use cli::{StatsArgs, StatsdProtocol};
pub use mapper::{DEFAULT_HELP, Mapper, MappingError, escape_metric_name};
pub use names::{GrpcMethod, LimitStat, ServiceStat, Tags, sanitize, stat_key};
pub use render::go_float;
pub use statsd::{Protocol, QUEUE_BYTES_MAX, StatsdSettings};
pub use store::{OVERFLOW_KEY, PENDING_VALUES_MAX};

use crate::decision::{Decision, DecisionError, Request};
use store::{Sinks, Store};

/// Client-chosen stat keys kept (values of `detailed_metric`/`value_to_metric` rules, request
/// `limit`s, unknown domains); later ones fold into their rule's key (or `_overflow`).
pub const STAT_KEYS_MAX: usize = 10_000;

/// What the stats are sent to, and how they are named.
#[derive(Debug, Clone, Default)]
pub struct UpstreamSettings {
    /// `EXTRA_TAGS`.
    pub tags: Tags,
    /// The statsd sink, when on.
    pub statsd: Option<StatsdSettings>,
    /// The mapping of the Prometheus page, when it is on.
    pub prometheus: Option<Arc<Mapper>>,
    /// Bound on client-chosen keys ([`STAT_KEYS_MAX`] by default).
    pub max_keys: usize,
}

impl UpstreamSettings {
    /// Whether any sink is on (otherwise nothing is recorded).
    pub fn enabled(&self) -> bool {
        self.statsd.is_some() || self.prometheus.is_some()
    }
}

/// Config loads of the process (all config sources), counted where sluice's own are
/// ([`crate::metrics::record_config_loaded`]): success, error.
static CONFIG_LOADS: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];

/// Counts a config load for envoyproxy/ratelimit's `config_load_success` / `_error`.
pub(crate) fn count_config_load(success: bool) {
    CONFIG_LOADS[usize::from(!success)].fetch_add(1, Ordering::Relaxed);
}

/// The stats of one server: shared by the request observer, the gRPC layer, the statsd task
/// and the metrics page.
pub struct UpstreamStats {
    store: Arc<Store>,
    ratio: f32,
    statsd: Option<StatsdSettings>,
    prometheus: bool,
}

impl UpstreamStats {
    /// `near_limit_ratio`: `--near-limit-ratio` (`NEAR_LIMIT_RATIO`), used in float32 as
    /// envoyproxy/ratelimit computes with it.
    pub fn new(settings: UpstreamSettings, near_limit_ratio: f64) -> UpstreamStats {
        let sinks = Sinks {
            statsd: settings.statsd.is_some(),
            mapper: settings.prometheus.clone(),
        };
        let max_keys = if settings.max_keys == 0 {
            STAT_KEYS_MAX
        } else {
            settings.max_keys
        };
        UpstreamStats {
            store: Arc::new(Store::new(settings.tags, sinks, max_keys, &CONFIG_LOADS)),
            ratio: near_limit_ratio as f32,
            prometheus: settings.prometheus.is_some(),
            statsd: settings.statsd,
        }
    }

    /// What one rate-limit call (gRPC or `/json`) counts.
    pub fn record_request(&self, request: &Request, result: Result<&Decision, &DecisionError>) {
        match result {
            Ok(decision) => observe::decision(&self.store, self.ratio, request, decision),
            Err(err) => observe::error(&self.store, err),
        }
    }

    /// One unary gRPC call as envoyproxy/ratelimit's interceptor counts it: `total_requests`
    /// and `response_time` (whole milliseconds) of its method.
    pub fn record_grpc_call(&self, method: GrpcMethod, elapsed: Duration) {
        let millis = u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX);
        self.store.add_request(method, millis);
    }

    /// The Prometheus page's families of these stats (empty when the page is off).
    pub fn render(&self) -> String {
        if !self.prometheus {
            return String::new();
        }
        render::render(&self.store)
    }

    /// Client-chosen keys folded past [`STAT_KEYS_MAX`] so far.
    pub fn folded(&self) -> u64 {
        self.store.folded()
    }

    /// The statsd task, when the sink is on: flushes until `shutdown`, then once more.
    pub fn statsd_task(
        &self,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Option<impl std::future::Future<Output = ()> + Send + 'static> {
        let settings = self.statsd.clone()?;
        Some(statsd::run(Arc::clone(&self.store), settings, shutdown))
    }
}

#[cfg(test)]
mod tests;
