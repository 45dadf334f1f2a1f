//! The name of every metric family sluice exports, its help text and its buckets: the one list
//! dashboards (deploy/grafana/sluice.json) and docs/metrics.md depend on.
//!
//! Why one file: a family's name is a contract with whoever scrapes it; seeing them all in one
//! place makes a rename or a duplicate obvious. Each family's labels are typed where the family
//! is recorded (`labels.rs`).

pub const REQUESTS_TOTAL: &str = "sluice_requests_total";
pub const DECISIONS_TOTAL: &str = "sluice_decisions_total";
pub const NEAR_LIMIT_TOTAL: &str = "sluice_near_limit_total";
pub const HITS_TOTAL: &str = "sluice_hits_total";
pub const REQUEST_ERRORS_TOTAL: &str = "sluice_request_errors_total";
pub const REQUEST_DURATION_SECONDS: &str = "sluice_request_duration_seconds";
pub const WINDOW_ENTRIES_MAX: &str = "sluice_window_entries_max";
pub const WINDOW_ENTRIES: &str = "sluice_window_entries";
pub const WINDOW_KEYS: &str = "sluice_window_keys";
pub const WINDOW_UNTRACKED_TOTAL: &str = "sluice_window_untracked_observations_total";
pub const HOT_KEY_ENTRIES: &str = "sluice_hot_key_entries";
pub const REDIS_MEMORY_ESTIMATE_BYTES: &str = "sluice_redis_memory_estimate_bytes";
pub const BACKEND_UP: &str = "sluice_backend_up";
pub const BACKEND_CALL_DURATION_SECONDS: &str = "sluice_backend_call_duration_seconds";
pub const BACKEND_ERRORS_TOTAL: &str = "sluice_backend_errors_total";
pub const BACKEND_FAILURES_TOTAL: &str = "sluice_backend_failures_total";
pub const LOCAL_CACHE_DECISIONS_TOTAL: &str = "sluice_local_cache_decisions_total";
pub const BACKEND_SCRIPT_LOADS_TOTAL: &str = "sluice_backend_script_loads_total";
pub const BACKEND_POOL_SIZE: &str = "sluice_backend_pool_size";
pub const BACKEND_POOL_CONNECTED: &str = "sluice_backend_pool_connected";
pub const BACKEND_IN_FLIGHT: &str = "sluice_backend_in_flight";
pub const BACKEND_WAITING: &str = "sluice_backend_waiting";
pub const BACKEND_SCRIPT_CALLS_TOTAL: &str = "sluice_backend_script_calls_total";
pub const BACKEND_SCRIPT_DECISIONS_TOTAL: &str = "sluice_backend_script_decisions_total";
pub const CONFIG_LOADS_TOTAL: &str = "sluice_config_loads_total";
pub const CONFIG_RULES: &str = "sluice_config_rules";
pub const CONFIG_DOMAINS: &str = "sluice_config_domains";
pub const CONFIG_LAST_SUCCESS_TIMESTAMP_SECONDS: &str =
    "sluice_config_last_success_timestamp_seconds";
pub const XDS_CONNECTED: &str = "sluice_xds_connected";
pub const XDS_RESPONSES_TOTAL: &str = "sluice_xds_responses_total";
pub const XDS_STREAM_FAILURES_TOTAL: &str = "sluice_xds_stream_failures_total";
pub const STATSD_DROPPED_LINES_TOTAL: &str = "sluice_statsd_dropped_lines_total";
pub const RATELIMIT_STATS_FOLDED_TOTAL: &str = "sluice_ratelimit_stats_folded_total";
/// Rendered at each scrape with the version as a label (one series), see `xds.rs`.
pub const XDS_CONFIG_VERSION_INFO: &str = "sluice_xds_config_version_info";

pub const RLQS_STREAMS: &str = "sluice_rlqs_streams";
pub const RLQS_REPORTS_TOTAL: &str = "sluice_rlqs_reports_total";
pub const RLQS_REPORT_ERRORS_TOTAL: &str = "sluice_rlqs_report_errors_total";
pub const RLQS_ASSIGNMENTS_TOTAL: &str = "sluice_rlqs_assignments_total";
pub const RLQS_TOKENS_TOTAL: &str = "sluice_rlqs_tokens_total";
pub const RLQS_ENVOY_REQUESTS_TOTAL: &str = "sluice_rlqs_envoy_requests_total";

/// Latency buckets from 100 µs to 100 ms: Envoy's filter gives up at 20 ms by default.
pub const LATENCY_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1,
];

/// Help text (and unit) of every registered family, a function per group of families.
/// `sluice_hot_key_entries` is rendered by hand at each scrape (see `windows.rs`) and carries
/// its own help line.
pub fn describe() {
    describe_requests();
    describe_windows();
    describe_backend();
    describe_config();
    describe_quota();
    describe_upstream();
}

/// Families of the calls and their verdicts.
fn describe_requests() {
    use metrics::{Unit, describe_counter, describe_histogram};
    describe_counter!(
        REQUESTS_TOTAL,
        "ShouldRateLimit calls (gRPC and POST /json) by domain and overall code"
    );
    describe_counter!(
        DECISIONS_TOTAL,
        "Descriptor verdicts by domain, rule (config path) and outcome"
    );
    describe_counter!(
        NEAR_LIMIT_TOTAL,
        "Admitted descriptor verdicts that left the window above the near-limit ratio"
    );
    describe_counter!(HITS_TOTAL, "Hits asked for (sum of hits_addend) by domain");
    describe_counter!(
        REQUEST_ERRORS_TOTAL,
        "ShouldRateLimit calls answered with an error, by kind"
    );
    describe_histogram!(
        REQUEST_DURATION_SECONDS,
        Unit::Seconds,
        "ShouldRateLimit handling time"
    );
}

/// Families of the windows of the keys this instance tracks.
fn describe_windows() {
    use metrics::{Unit, describe_counter, describe_gauge};
    describe_gauge!(
        WINDOW_ENTRIES_MAX,
        "Largest window (entries) returned by a decision in the last 10 to 20 s, by rule"
    );
    describe_gauge!(
        WINDOW_ENTRIES,
        "Entries in the live windows of the keys this instance tracks, by rule (upper bound)"
    );
    describe_gauge!(WINDOW_KEYS, "Live keys this instance tracks, by rule");
    describe_counter!(
        WINDOW_UNTRACKED_TOTAL,
        "Window observations not tracked because the key tracker was full"
    );
    describe_gauge!(
        REDIS_MEMORY_ESTIMATE_BYTES,
        Unit::Bytes,
        "Estimated Redis memory of the live windows this instance tracks"
    );
}

/// Families of the backend: its probe, its calls and their failures, its connections.
fn describe_backend() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_gauge!(BACKEND_UP, "1 when the last backend probe succeeded");
    describe_histogram!(
        BACKEND_CALL_DURATION_SECONDS,
        Unit::Seconds,
        "Backend decision call time"
    );
    describe_counter!(
        BACKEND_ERRORS_TOTAL,
        "Backend decision calls that failed, by kind"
    );
    describe_counter!(
        BACKEND_FAILURES_TOTAL,
        "Requests the backend could not decide (error, deadline, overload), by the failure policy that answered"
    );
    describe_counter!(
        LOCAL_CACHE_DECISIONS_TOTAL,
        "Requests rejected by the local cache of keys known to be over their limit, without a backend call"
    );
    describe_counter!(
        BACKEND_SCRIPT_LOADS_TOTAL,
        "Lua library loads (FUNCTION LOAD) when Redis did not hold sluice's function (restart, failover, FUNCTION FLUSH)"
    );
    describe_gauge!(BACKEND_POOL_SIZE, "Backend connections kept (round-robin)");
    describe_gauge!(BACKEND_POOL_CONNECTED, "Backend connections established");
    describe_gauge!(
        BACKEND_IN_FLIGHT,
        "Backend calls sent, awaiting their reply"
    );
    describe_gauge!(
        BACKEND_WAITING,
        "Backend calls waiting for a connection to be established"
    );
    describe_counter!(
        BACKEND_SCRIPT_CALLS_TOTAL,
        "Redis script calls sent (one carries several decisions when batched)"
    );
    describe_counter!(
        BACKEND_SCRIPT_DECISIONS_TOTAL,
        "Decisions carried by Redis script calls; divided by the calls: the mean batch"
    );
}

/// Families of the config served and the xDS client that delivers it.
fn describe_config() {
    use metrics::{Unit, describe_counter, describe_gauge};
    describe_counter!(CONFIG_LOADS_TOTAL, "Config loads by result");
    describe_gauge!(CONFIG_RULES, "Limits in the config being served");
    describe_gauge!(CONFIG_DOMAINS, "Domains in the config being served");
    describe_gauge!(
        CONFIG_LAST_SUCCESS_TIMESTAMP_SECONDS,
        Unit::Seconds,
        "Unix time of the last successful config load"
    );
    describe_gauge!(
        XDS_CONNECTED,
        "1 while connected to the xDS management server (--config-xds)"
    );
    describe_counter!(
        XDS_RESPONSES_TOTAL,
        "xDS responses by result: applied (ACKed), or NACKed as invalid_resource / invalid_config"
    );
    describe_counter!(
        XDS_STREAM_FAILURES_TOTAL,
        "xDS connection attempts that failed and streams that broke (each followed by a reconnect)"
    );
}

/// Families of envoyproxy/ratelimit's stats: statsd lines dropped, keys folded.
fn describe_upstream() {
    use metrics::describe_counter;
    describe_counter!(
        STATSD_DROPPED_LINES_TOTAL,
        "envoyproxy/ratelimit statsd lines dropped: the daemon unreachable with the queue full, or too many distinct response times pending"
    );
    describe_counter!(
        RATELIMIT_STATS_FOLDED_TOTAL,
        "envoyproxy/ratelimit stats whose client-chosen key was folded into its rule's key (or _overflow) past the bound on such keys"
    );
}

/// Families of the Rate Limit Quota Service.
fn describe_quota() {
    use metrics::{describe_counter, describe_gauge};
    describe_gauge!(
        RLQS_STREAMS,
        "Rate Limit Quota Service streams open (one per Envoy and domain)"
    );
    describe_counter!(
        RLQS_REPORTS_TOTAL,
        "Rate Limit Quota Service usage reports answered, by domain"
    );
    describe_counter!(
        RLQS_REPORT_ERRORS_TOTAL,
        "Rate Limit Quota Service usage reports refused (the stream ends), by kind"
    );
    describe_counter!(
        RLQS_ASSIGNMENTS_TOTAL,
        "Rate Limit Quota Service answers, one per bucket of a report, by domain and answer"
    );
    describe_counter!(
        RLQS_TOKENS_TOTAL,
        "Tokens reserved in the windows for Rate Limit Quota Service assignments, by domain"
    );
    describe_counter!(
        RLQS_ENVOY_REQUESTS_TOTAL,
        "Requests Envoys report they allowed or denied under Rate Limit Quota Service assignments, by domain and verdict"
    );
}
