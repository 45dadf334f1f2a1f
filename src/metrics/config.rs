//! Config load metrics: every load (at start-up and on reload) counted by result, and the
//! served config's size and age.
//!
//! Why its own file: config loads are the one family recorded outside the request path, by
//! `main` and the reloader, and they log the load's one line at the same time.

use std::path::Path;
use std::time::Duration;

use super::labels::ConfigLoad;
use super::names::{
    CONFIG_DOMAINS, CONFIG_LAST_SUCCESS_TIMESTAMP_SECONDS, CONFIG_LOADS_TOTAL, CONFIG_RULES,
};
use crate::config::Config;

/// Records a config load that succeeded (at start-up or on reload) and logs its one line.
pub fn record_config_loaded(source: &Path, config: &Config, unix_now: Duration) {
    record_config_served(config, unix_now);
    tracing::info!(
        path = %source.display(),
        domains = config.domains().count(),
        limits = config.rule_count(),
        "config loaded"
    );
}

/// Counts a config load that failed; a reload keeps serving the previous config. The caller
/// logs each error (file, line, rule) itself.
pub fn record_config_failed() {
    super::upstream::count_config_load(false);
    metrics::counter!(CONFIG_LOADS_TOTAL, "result" => ConfigLoad::Failure.as_str()).increment(1);
}

/// Records a config that started serving, whatever its source (files or xDS): the load
/// counted as a success, the config's size, the time.
pub(super) fn record_config_served(config: &Config, unix_now: Duration) {
    super::upstream::count_config_load(true);
    metrics::counter!(CONFIG_LOADS_TOTAL, "result" => ConfigLoad::Success.as_str()).increment(1);
    metrics::gauge!(CONFIG_RULES).set(config.rule_count() as f64);
    metrics::gauge!(CONFIG_DOMAINS).set(config.domains().count() as f64);
    metrics::gauge!(CONFIG_LAST_SUCCESS_TIMESTAMP_SECONDS).set(unix_now.as_secs_f64());
}
