//! The xDS client's state (`--config-xds`): connected or not, each response applied or NACKed
//! (with a bounded reason), each broken stream, and the version being served.
//!
//! Why the version is rendered rather than registered: it is an opaque string the management
//! server chooses, so as a registered label every version ever served would stay a series; here
//! `/metrics` shows exactly one series, the version served now (none before the first).

use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::Duration;

use super::config::record_config_served;
use super::names::{
    XDS_CONFIG_VERSION_INFO, XDS_CONNECTED, XDS_RESPONSES_TOTAL, XDS_STREAM_FAILURES_TOTAL,
};
use super::record_config_failed;
use super::windows::escape;
use crate::config::Config;

/// The version of the xDS config being served (process-wide, as the recorder is).
static SERVED_VERSION: Mutex<Option<String>> = Mutex::new(None);

/// Versions longer than this are cut in the label (the log line has them whole).
const MAX_VERSION_LABEL: usize = 128;

/// Why a response was NACKed: `sluice_xds_responses_total{result}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XdsRejection {
    /// A resource of another type, or one that does not decode as a `RateLimitConfig`.
    InvalidResource,
    /// The resources decode but break a config rule (the errors a file would get).
    InvalidConfig,
    /// Over `--max-xds-nodes`, `--max-xds-depth` or `--max-xds-path-bytes`: not decoded.
    TooLarge,
}

impl XdsRejection {
    pub const fn as_str(self) -> &'static str {
        match self {
            XdsRejection::InvalidResource => "invalid_resource",
            XdsRejection::InvalidConfig => "invalid_config",
            XdsRejection::TooLarge => "too_large",
        }
    }
}

pub fn record_xds_connected(connected: bool) {
    metrics::gauge!(XDS_CONNECTED).set(if connected { 1.0 } else { 0.0 });
}

/// A connection attempt that failed, or a stream that broke.
pub fn record_xds_stream_failure() {
    metrics::counter!(XDS_STREAM_FAILURES_TOTAL).increment(1);
}

/// A response applied (and ACKed): counted, the config's size and time recorded as for a file
/// load, its version shown, one log line.
pub fn record_xds_applied(server: &str, version: &str, config: &Config, unix_now: Duration) {
    metrics::counter!(XDS_RESPONSES_TOTAL, "result" => "applied").increment(1);
    record_config_served(config, unix_now);
    *crate::sync::lock(&SERVED_VERSION) = Some(version.to_owned());
    tracing::info!(
        server,
        version,
        domains = config.domains().count(),
        limits = config.rule_count(),
        "xds config applied"
    );
}

/// A response NACKed; the previous config keeps serving. The caller logs the reason.
pub fn record_xds_rejected(why: XdsRejection) {
    metrics::counter!(XDS_RESPONSES_TOTAL, "result" => why.as_str()).increment(1);
    record_config_failed();
}

/// `sluice_xds_config_version_info{version="..."} 1` for the version served, with its help
/// lines; empty before the first xDS config.
pub fn render_xds_version() -> String {
    let Some(version) = crate::sync::lock(&SERVED_VERSION).clone() else {
        return String::new();
    };
    let mut label: String = version.chars().take(MAX_VERSION_LABEL).collect();
    if label.len() < version.len() {
        label.push('~');
    }
    let mut text = String::new();
    let _ = writeln!(
        text,
        "# HELP {XDS_CONFIG_VERSION_INFO} The xDS config version being served (--config-xds)"
    );
    let _ = writeln!(text, "# TYPE {XDS_CONFIG_VERSION_INFO} gauge");
    let _ = writeln!(
        text,
        "{XDS_CONFIG_VERSION_INFO}{{version=\"{}\"}} 1",
        escape(&label)
    );
    text
}
