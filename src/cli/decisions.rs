//! How `serve` decides and answers: the engine's switches, what one request may carry, the
//! response headers, the metrics' tunables.

use sluice::config::HeaderFormat;
use sluice::decision::{EngineOptions, FailurePolicy, InputLimits};
use sluice::headers::{self, LegacyNames};
use sluice::metrics::MetricsSettings;
use sluice::server::StartError;

use super::{parse_header_format, parse_header_name, parse_ratio};

/// The engine's switches.
#[derive(clap::Args)]
pub(crate) struct EngineArgs {
    /// Global shadow mode: every limit is evaluated and reported, but every request is
    /// answered OK overall.
    #[arg(long, env = "SLUICE_SHADOW_MODE")]
    pub(super) shadow_mode: bool,
    /// Global quota mode: every descriptor is a quota descriptor, so a request is over the
    /// limit only when all of its limited descriptors are.
    #[arg(long, env = "SLUICE_QUOTA_MODE")]
    pub(super) quota_mode: bool,
    /// Responses describe the request in their dynamic metadata (domain, descriptors, hits),
    /// with the config `metadata` of the descriptors that passed their limit.
    #[arg(long, env = "SLUICE_RESPONSE_DYNAMIC_METADATA")]
    pub(super) response_dynamic_metadata: bool,
    /// Prefix of every limiter key (no braces, at most 64 bytes).
    #[arg(long, env = "SLUICE_KEY_PREFIX", default_value = sluice::descriptor::KEY_PREFIX)]
    pub(super) key_prefix: String,
}

impl EngineArgs {
    pub(super) fn options(
        &self,
        on_backend_error: FailurePolicy,
        limits: InputLimits,
    ) -> EngineOptions {
        EngineOptions {
            on_backend_error,
            shadow_mode: self.shadow_mode,
            quota_mode: self.quota_mode,
            key_prefix: self.key_prefix.clone(),
            limits,
        }
    }
}

/// What one request may carry.
#[derive(clap::Args)]
pub(crate) struct InputLimitArgs {
    /// Longest `domain` accepted, in bytes; longer requests get INVALID_ARGUMENT.
    #[arg(long, env = "SLUICE_MAX_DOMAIN_BYTES", default_value_t = InputLimits::DEFAULT_MAX_DOMAIN_BYTES)]
    pub(super) max_domain_bytes: usize,
    /// Most descriptors accepted in one request.
    #[arg(long, env = "SLUICE_MAX_DESCRIPTORS", default_value_t = InputLimits::DEFAULT_MAX_DESCRIPTORS)]
    pub(super) max_descriptors: usize,
    /// Most entries accepted in one descriptor.
    #[arg(long, env = "SLUICE_MAX_ENTRIES", default_value_t = InputLimits::DEFAULT_MAX_ENTRIES)]
    pub(super) max_entries: usize,
    /// Longest descriptor entry key accepted, in bytes.
    #[arg(long, env = "SLUICE_MAX_KEY_BYTES", default_value_t = InputLimits::DEFAULT_MAX_KEY_BYTES)]
    pub(super) max_key_bytes: usize,
    /// Longest descriptor entry value accepted, in bytes.
    #[arg(long, env = "SLUICE_MAX_VALUE_BYTES", default_value_t = InputLimits::DEFAULT_MAX_VALUE_BYTES)]
    pub(super) max_value_bytes: usize,
    /// Largest hits_addend accepted (request or descriptor level). A request's hits are one
    /// log entry whatever their number: this bounds what one request may claim of a limit.
    #[arg(long, env = "SLUICE_MAX_HITS_ADDEND", default_value_t = InputLimits::DEFAULT_MAX_HITS_ADDEND)]
    pub(super) max_hits_addend: u64,
    /// Buckets one Rate Limit Quota Service stream may hold (one Envoy, one domain); a usage
    /// report that lists more is refused, a bucket past it answered DENY_ALL.
    #[arg(long, env = "SLUICE_RLQS_MAX_BUCKETS", default_value_t = InputLimits::DEFAULT_MAX_QUOTA_BUCKETS)]
    pub(super) rlqs_max_buckets: usize,
}

impl InputLimitArgs {
    pub(super) fn limits(&self) -> InputLimits {
        InputLimits {
            max_domain_bytes: self.max_domain_bytes,
            max_descriptors: self.max_descriptors,
            max_entries: self.max_entries,
            max_key_bytes: self.max_key_bytes,
            max_value_bytes: self.max_value_bytes,
            max_hits_addend: self.max_hits_addend,
            max_quota_buckets: self.rlqs_max_buckets,
        }
    }
}

/// The rate-limit response headers.
#[derive(clap::Args)]
pub(crate) struct HeaderArgs {
    /// Response headers (none, draft, legacy) for domains whose config sets no
    /// `response_headers` of its own.
    #[arg(long, env = "SLUICE_RESPONSE_HEADERS", default_value = "none", value_parser = parse_header_format)]
    pub(super) response_headers: HeaderFormat,
    /// Name of the `legacy` style's header carrying the limit.
    #[arg(long, env = "SLUICE_LEGACY_LIMIT_HEADER", value_name = "NAME", default_value = headers::DEFAULT_LIMIT_HEADER, value_parser = parse_header_name)]
    pub(super) legacy_limit_header: String,
    /// Name of the `legacy` style's header carrying the remaining hits.
    #[arg(long, env = "SLUICE_LEGACY_REMAINING_HEADER", value_name = "NAME", default_value = headers::DEFAULT_REMAINING_HEADER, value_parser = parse_header_name)]
    pub(super) legacy_remaining_header: String,
    /// Name of the `legacy` style's header carrying the seconds until the window frees a slot.
    #[arg(long, env = "SLUICE_LEGACY_RESET_HEADER", value_name = "NAME", default_value = headers::DEFAULT_RESET_HEADER, value_parser = parse_header_name)]
    pub(super) legacy_reset_header: String,
}

impl HeaderArgs {
    pub(super) fn legacy_names(&self) -> Result<LegacyNames, StartError> {
        LegacyNames::new(
            &self.legacy_limit_header,
            &self.legacy_remaining_header,
            &self.legacy_reset_header,
        )
        .map_err(StartError::LegacyHeaders)
    }
}

/// The metrics' tunables.
#[derive(clap::Args)]
pub(crate) struct MetricsArgs {
    /// An admitted decision counts as near the limit (sluice_near_limit_total) when it leaves
    /// more than floor(ratio x limit) entries in the window.
    #[arg(long, env = "SLUICE_NEAR_LIMIT_RATIO", default_value_t = MetricsSettings::default().near_limit_ratio, value_parser = parse_ratio)]
    pub(super) near_limit_ratio: f64,
    /// How many of the hottest keys /metrics shows (sluice_hot_key_entries).
    #[arg(long, env = "SLUICE_HOT_KEYS", default_value_t = MetricsSettings::default().hot_keys)]
    pub(super) hot_keys: usize,
}

impl MetricsArgs {
    /// With envoyproxy/ratelimit's stats as `stats` describes them (a bad value of those is an
    /// error naming its flag).
    pub(super) fn settings(
        &self,
        stats: &sluice::metrics::upstream::StatsArgs,
    ) -> Result<MetricsSettings, StartError> {
        Ok(MetricsSettings {
            near_limit_ratio: self.near_limit_ratio,
            hot_keys: self.hot_keys,
            metrics_path: stats.metrics_path.clone(),
            upstream: stats.settings().map_err(StartError::Usage)?,
        })
    }
}
