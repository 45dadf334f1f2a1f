//! Every metric family sluice exports, with bounded labels, recorded from what the lower layers
//! return: the engine's decisions, the limiters' outcomes and stats, config loads.
//!
//! Why bounded: per-request values (client IPs, user ids) must never become label values, or
//! the metrics themselves become the memory problem (envoyproxy/ratelimit users have seen it).
//! Labels here are the domain (only when the config knows it), the rule's config path (bounded
//! by the config), fixed enums (outcome, code, kind, policy, result), and two deliberately
//! capped exceptions: `detailed_metric` rules ([`DETAILED_SERIES_MAX`] distinct values, the rest
//! folded into one overflow value per rule) and the hottest keys (at most N series at any time,
//! rendered rather than registered, so a key that cools down leaves no series behind).
//!
//! Why facts flow one way: the engine and the limiters never call this module; they return what
//! happened (a decision's outcomes and failure policy, a batch's [`AnsweredBy`], a backend's
//! stats) and the observers here record it. One file per concern:
//! - `names`: every family's name, help text and buckets ([`describe`]);
//! - `labels`: typed label values and the per-outcome/per-code tables of series handles;
//! - `observer`: the [`Observer`] of requests, for the gRPC and `/json` faces alike;
//! - `backend`: the [`ObservedLimiter`] decorator, backend up, failures and stats;
//! - `windows` and `tracker`: window cardinality and hot keys;
//! - `config`: config loads;
//! - `quota`: the Rate Limit Quota Service's streams, reports and answers;
//! - `xds`: the xDS client's state (connected, responses applied or NACKed, the version served);
//! - `upstream`: envoyproxy/ratelimit's own stats under its names, for its statsd sink and its
//!   Prometheus page (a store of its own: its names carry request values by design, bounded
//!   there).
//!
//! docs/metrics.md lists every family; keep it in step with `names`.
//!
//! [`AnsweredBy`]: crate::limiter::AnsweredBy

mod backend;
mod config;
mod labels;
mod names;
mod observer;
mod quota;
mod tracker;
pub mod upstream;
mod windows;
mod xds;

use std::sync::Mutex;

use metrics_exporter_prometheus::{BuildError, PrometheusBuilder, PrometheusHandle};

pub use backend::{ObservedLimiter, record_backend_up};
pub use config::{record_config_failed, record_config_loaded};
pub use labels::{backend_error_label, code_label};
pub use names::*;
pub use observer::{DETAILED_SERIES_MAX, Observer, UNKNOWN_DOMAIN};
pub use quota::{record_quota_invalid, record_quota_report, record_quota_stream};
pub use windows::{RECENT_INTERVAL, TRACKED_KEYS_MAX};
pub use xds::{
    XdsRejection, record_xds_applied, record_xds_connected, record_xds_rejected,
    record_xds_stream_failure, render_xds_version,
};

/// Tunables of the metrics layer (flags `--near-limit-ratio`, `--hot-keys`, the metrics
/// port's path and envoyproxy/ratelimit's stats).
#[derive(Debug, Clone)]
pub struct MetricsSettings {
    /// An admitted decision is "near the limit" when it leaves the window holding more than
    /// `floor(ratio × limit)` entries.
    pub near_limit_ratio: f64,
    /// How many of the hottest keys `/metrics` shows.
    pub hot_keys: usize,
    /// Path of the page on the metrics port (`--metrics-path`).
    pub metrics_path: String,
    /// envoyproxy/ratelimit's stats: its statsd sink and the names on the metrics port.
    pub upstream: upstream::UpstreamSettings,
}

impl Default for MetricsSettings {
    fn default() -> Self {
        MetricsSettings {
            near_limit_ratio: 0.8,
            hot_keys: 10,
            metrics_path: "/metrics".to_owned(),
            upstream: upstream::UpstreamSettings::default(),
        }
    }
}

/// The process's Prometheus recorder, installed by the first call (with every family
/// described, [`describe`]) and shared by later ones: a process has one recorder, so servers
/// started in one process (tests) render the same one.
pub fn prometheus() -> Result<PrometheusHandle, BuildError> {
    static HANDLE: Mutex<Option<PrometheusHandle>> = Mutex::new(None);
    let mut handle = crate::sync::lock(&HANDLE);
    if let Some(installed) = &*handle {
        return Ok(installed.clone());
    }
    let installed = PrometheusBuilder::new()
        .set_buckets(LATENCY_BUCKETS)?
        .install_recorder()?;
    describe();
    *handle = Some(installed.clone());
    Ok(installed)
}
