//! Every metric family sluice exports, in one place, with bounded labels.
//!
//! Why bounded: per-request values (client IPs, user ids) must never become label values, or
//! the metrics themselves become the memory problem (envoyproxy/ratelimit #275, #181, #994).
//! Labels here are the domain (only when the config knows it), the rule's config path (bounded
//! by the config), fixed enums (outcome, kind), and two deliberately capped exceptions:
//! `detailed_metric` rules ([`DETAILED_SERIES_MAX`] distinct values, the rest folded into one
//! overflow value per rule) and the hottest keys (at most N series at any time, rendered here
//! rather than registered, so a key that cools down leaves no series behind).
//!
//! docs/metrics.md lists every family; keep it in step with this file.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use metrics::{Counter, Histogram};
use sha2::{Digest, Sha256};

use crate::cardinality::{Observation, Snapshot, Tracker};
use crate::config::Config;
use crate::decision::{Decision, DecisionError, Outcome, Request};
use crate::descriptor::Entry;
use crate::limiter::{BatchOutcome, Hit, Limiter, LimiterError};
use crate::sync::lock;

/// Label used for domains the config does not know, so client-chosen names cannot add series.
const OTHER: &str = "_unknown";

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

/// Latency buckets from 100 µs to 100 ms: Envoy's filter gives up at 20 ms by default.
pub const LATENCY_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1,
];

/// Distinct `detailed_metric` label values per process; later ones fold into `<rule>|_overflow`.
/// Once registered a series lives as long as the process, so this is a lifetime cap.
pub const DETAILED_SERIES_MAX: usize = 100;
/// Longest detailed label value; longer ones are cut and end in a hash.
const DETAILED_LABEL_MAX: usize = 96;
/// Keys the window tracker remembers (about 100 bytes each): bounds its memory to a few MB.
pub const TRACKED_KEYS_MAX: usize = 50_000;
/// One "recent" interval of the decaying per-rule max: it shows the largest window seen in the
/// last 10 to 20 seconds.
pub const RECENT_INTERVAL: Duration = Duration::from_secs(10);
/// Characters of the descriptor shown in a hot key's label, before its hash.
const HOT_KEY_TEXT_MAX: usize = 32;

/// Redis memory held per window key, measured on redis-server 7.0 with the script's 7-digit
/// integer members (docs/metrics.md has the commands): a key with its dict and expire entries.
pub const REDIS_KEY_OVERHEAD_BYTES: u64 = 160;
/// Per entry while a sorted set is a listpack (up to `zset-max-listpack-entries`, default 128).
pub const REDIS_LISTPACK_ENTRY_BYTES: u64 = 16;
/// Per entry once it is a skiplist (over 128 entries).
pub const REDIS_SKIPLIST_ENTRY_BYTES: u64 = 114;
const REDIS_LISTPACK_MAX_ENTRIES: u64 = 128;

/// Tunables of the metrics layer (flags `--near-limit-ratio`, `--hot-keys`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MetricsSettings {
    /// An admitted decision is "near the limit" when it leaves the window holding more than
    /// `floor(ratio × limit)` entries.
    pub near_limit_ratio: f64,
    /// How many of the hottest keys `/metrics` shows.
    pub hot_keys: usize,
}

impl Default for MetricsSettings {
    fn default() -> Self {
        MetricsSettings {
            near_limit_ratio: 0.8,
            hot_keys: 10,
        }
    }
}

pub fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(
        REQUESTS_TOTAL,
        "ShouldRateLimit calls by domain and overall code"
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
        BACKEND_SCRIPT_LOADS_TOTAL,
        "Lua script loads after NOSCRIPT (Redis restart, failover, SCRIPT FLUSH)"
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
    describe_counter!(CONFIG_LOADS_TOTAL, "Config loads by result");
    describe_gauge!(CONFIG_RULES, "Limits in the config being served");
    describe_gauge!(CONFIG_DOMAINS, "Domains in the config being served");
    describe_gauge!(
        CONFIG_LAST_SUCCESS_TIMESTAMP_SECONDS,
        Unit::Seconds,
        "Unix time of the last successful config load"
    );
}

/// Records a config load that succeeded (at start-up or on reload) and logs its one line.
pub fn record_config_loaded(source: &Path, config: &Config, unix_now: Duration) {
    metrics::counter!(CONFIG_LOADS_TOTAL, "result" => "success").increment(1);
    metrics::gauge!(CONFIG_RULES).set(config.rule_count() as f64);
    metrics::gauge!(CONFIG_DOMAINS).set(config.domains().count() as f64);
    metrics::gauge!(CONFIG_LAST_SUCCESS_TIMESTAMP_SECONDS).set(unix_now.as_secs_f64());
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
    metrics::counter!(CONFIG_LOADS_TOTAL, "result" => "failure").increment(1);
}

/// Publishes a backend probe result.
pub fn record_backend_up(up: bool) {
    metrics::gauge!(BACKEND_UP).set(if up { 1.0 } else { 0.0 });
}

/// The stateful part of the metrics: the near-limit ratio, the detailed-label budget, the
/// window tracker and the backend whose stats `/metrics` shows. Shared by the gRPC service
/// (which records) and the admin server (which collects before rendering).
pub struct Observer {
    settings: MetricsSettings,
    limiter: Arc<dyn Limiter>,
    detailed: Mutex<HashSet<(String, String)>>,
    windows: Mutex<Tracker>,
    started: Instant,
    /// Handles of the per-request series, by domain label (see [`DomainHandles`]).
    handles: RwLock<HashMap<String, Arc<DomainHandles>>>,
    request_duration: OnceLock<Histogram>,
}

/// Why cached handles: every `counter!(name, labels)` call builds its labels (one allocation per
/// label value) and looks the series up in the recorder's registry; per request that was about
/// a tenth of sluice's instructions (docs/performance.md). A handle is fetched once, through the
/// same macro, the first time its series is used, so `/metrics` shows exactly the series it
/// showed before. Domain labels are bounded (configured domains and `_unknown`), rule labels are
/// config paths; `detailed_metric` labels are not cached (they have their own cap).
#[derive(Default)]
struct DomainHandles {
    /// `sluice_requests_total` by code: ok, over_limit.
    requests: [OnceLock<Counter>; 2],
    hits: OnceLock<Counter>,
    rules: RwLock<HashMap<String, Arc<RuleHandles>>>,
}

#[derive(Default)]
struct RuleHandles {
    /// `sluice_decisions_total` by [`outcome_index`].
    decisions: [OnceLock<Counter>; OUTCOMES],
    near_limit: OnceLock<Counter>,
}

const OUTCOMES: usize = 10;

fn outcome_index(outcome: Outcome) -> usize {
    match outcome {
        Outcome::NoRule => 0,
        Outcome::Unlimited => 1,
        Outcome::Admitted => 2,
        Outcome::Rejected => 3,
        Outcome::NotRecorded => 4,
        Outcome::ShadowRejected => 5,
        Outcome::Refunded => 6,
        Outcome::BackendAllowed => 7,
        Outcome::BackendDenied => 8,
        Outcome::QuotaExhausted => 9,
    }
}

/// The value under `key`, inserted by `make` on first use (read lock in the common case).
fn cached<V>(map: &RwLock<HashMap<String, Arc<V>>>, key: &str, make: impl FnOnce() -> V) -> Arc<V> {
    let read = map.read().unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(v) = read.get(key) {
        return Arc::clone(v);
    }
    drop(read);
    let mut write = map.write().unwrap_or_else(|poisoned| poisoned.into_inner());
    Arc::clone(
        write
            .entry(key.to_owned())
            .or_insert_with(|| Arc::new(make())),
    )
}

impl Observer {
    pub fn new(settings: MetricsSettings, limiter: Arc<dyn Limiter>) -> Self {
        Observer {
            settings,
            limiter,
            detailed: Mutex::new(HashSet::new()),
            windows: Mutex::new(Tracker::new(
                TRACKED_KEYS_MAX,
                RECENT_INTERVAL.as_millis() as u64,
                0,
            )),
            started: Instant::now(),
            handles: RwLock::new(HashMap::new()),
            request_duration: OnceLock::new(),
        }
    }

    /// Milliseconds on a monotonic clock, for the tracker.
    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Records one ShouldRateLimit call: its latency, its outcome per descriptor, near-limit
    /// verdicts and the window counts the backend returned.
    pub fn record_request(
        &self,
        request: &Request,
        result: Result<&Decision, &DecisionError>,
        elapsed: Duration,
    ) {
        self.request_duration
            .get_or_init(|| metrics::histogram!(REQUEST_DURATION_SECONDS))
            .record(elapsed.as_secs_f64());
        let decision = match result {
            Ok(d) => d,
            Err(err) => {
                let kind = match err {
                    DecisionError::Invalid(_) => "invalid_argument",
                    DecisionError::Backend(_) => {
                        record_backend_failure(crate::decision::FailurePolicy::Error.as_str());
                        "backend"
                    }
                };
                metrics::counter!(REQUEST_ERRORS_TOTAL, "kind" => kind).increment(1);
                return;
            }
        };
        if let Some(policy) = decision.backend_failed {
            record_backend_failure(policy.as_str());
        }
        let domain = if decision.known_domain {
            request.domain.as_str()
        } else {
            OTHER
        };
        let code = match decision.overall {
            crate::decision::Code::Ok => "ok",
            crate::decision::Code::OverLimit => "over_limit",
        };
        let handles = cached(&self.handles, domain, DomainHandles::default);
        let code_index = usize::from(decision.overall != crate::decision::Code::Ok);
        handles.requests[code_index]
            .get_or_init(
                || metrics::counter!(REQUESTS_TOTAL, "domain" => domain.to_owned(), "code" => code),
            )
            .increment(1);
        if decision.hits > 0 {
            handles
                .hits
                .get_or_init(|| metrics::counter!(HITS_TOTAL, "domain" => domain.to_owned()))
                .increment(decision.hits);
        }
        let now = self.now_ms();
        // Verdicts are in descriptor order (the engine keeps one per descriptor).
        for (verdict, descriptor) in decision.verdicts.iter().zip(&request.descriptors) {
            let path = verdict.rule.as_deref().unwrap_or_default();
            let near_limit = verdict.outcome == Outcome::Admitted
                && verdict.limit.as_ref().is_some_and(|limit| {
                    verdict.window_count > near_limit_threshold(limit.requests_per_unit, self)
                });
            if verdict.detailed_metric {
                let rule = self.detailed_label(domain, path, &descriptor.entries);
                metrics::counter!(
                    DECISIONS_TOTAL,
                    "domain" => domain.to_owned(),
                    "rule" => rule.clone(),
                    "outcome" => verdict.outcome.as_str()
                )
                .increment(1);
                if near_limit {
                    metrics::counter!(NEAR_LIMIT_TOTAL, "domain" => domain.to_owned(), "rule" => rule)
                        .increment(1);
                }
            } else {
                let rule = cached(&handles.rules, path, RuleHandles::default);
                rule.decisions[outcome_index(verdict.outcome)]
                    .get_or_init(|| {
                        metrics::counter!(
                            DECISIONS_TOTAL,
                            "domain" => domain.to_owned(),
                            "rule" => path.to_owned(),
                            "outcome" => verdict.outcome.as_str()
                        )
                    })
                    .increment(1);
                if near_limit {
                    rule.near_limit
                        .get_or_init(|| {
                            metrics::counter!(
                                NEAR_LIMIT_TOTAL,
                                "domain" => domain.to_owned(),
                                "rule" => path.to_owned()
                            )
                        })
                        .increment(1);
                }
            }
            let Some(limit) = &verdict.limit else {
                continue;
            };
            let window_ms = limit.window_ms;
            let Some(key) = verdict.key.as_deref() else {
                continue;
            };
            // Identifies the key inside the tracker only; a collision would merge two keys'
            // gauges, never decisions, so a fast hash will do.
            let mut hasher = std::hash::DefaultHasher::new();
            std::hash::Hash::hash(key, &mut hasher);
            let key_hash = std::hash::Hasher::finish(&hasher);
            lock(&self.windows).record(
                Observation {
                    domain,
                    rule: path,
                    key_hash,
                    count: verdict.window_count,
                    window_ms,
                },
                || hot_key_label(&descriptor.entries, key_hash),
                now,
            );
        }
    }

    /// The `rule` label of a `detailed_metric` verdict: the config path with the request's
    /// values (`key_value` segments, as envoyproxy/ratelimit names detailed stats), while the
    /// process has used fewer than [`DETAILED_SERIES_MAX`] of them; `<path>|_overflow` after.
    fn detailed_label(&self, domain: &str, path: &str, entries: &[Entry]) -> String {
        let mut label = String::new();
        for (i, entry) in entries.iter().enumerate() {
            if i > 0 {
                label.push('.');
            }
            let _ = write!(label, "{}_{}", entry.key, entry.value);
        }
        if label.len() > DETAILED_LABEL_MAX {
            let digest = Sha256::digest(label.as_bytes());
            label = truncate(&label, DETAILED_LABEL_MAX - 9).to_owned();
            let _ = write!(
                label,
                "#{:02x}{:02x}{:02x}{:02x}",
                digest[0], digest[1], digest[2], digest[3]
            );
        }
        let mut seen = lock(&self.detailed);
        let key = (domain.to_owned(), label);
        if seen.contains(&key) {
            return key.1;
        }
        if seen.len() < DETAILED_SERIES_MAX {
            seen.insert(key.clone());
            return key.1;
        }
        format!("{path}|_overflow")
    }

    /// Publishes the gauges read at scrape time (window tracker, backend stats) and returns the
    /// hot-key series as Prometheus text, to append after the recorder's rendering.
    pub fn collect(&self) -> String {
        let snapshot = lock(&self.windows).snapshot(self.settings.hot_keys, self.now_ms());
        for rule in &snapshot.rules {
            let labels = [("domain", rule.domain.clone()), ("rule", rule.rule.clone())];
            metrics::gauge!(WINDOW_ENTRIES_MAX, &labels).set(rule.max as f64);
            metrics::gauge!(WINDOW_ENTRIES, &labels).set(rule.entries as f64);
            metrics::gauge!(WINDOW_KEYS, &labels).set(rule.keys as f64);
        }
        metrics::counter!(WINDOW_UNTRACKED_TOTAL).absolute(snapshot.untracked);
        if self.limiter.backend() == "redis" {
            metrics::gauge!(REDIS_MEMORY_ESTIMATE_BYTES)
                .set(redis_bytes_estimate(&snapshot) as f64);
        }
        if let Some(stats) = self.limiter.stats() {
            metrics::counter!(BACKEND_SCRIPT_LOADS_TOTAL).absolute(stats.script_loads);
            metrics::gauge!(BACKEND_POOL_SIZE).set(stats.connections as f64);
            metrics::gauge!(BACKEND_POOL_CONNECTED).set(stats.connected as f64);
            metrics::gauge!(BACKEND_IN_FLIGHT).set(stats.in_flight as f64);
            metrics::gauge!(BACKEND_WAITING).set(stats.waiting as f64);
            metrics::counter!(BACKEND_SCRIPT_CALLS_TOTAL).absolute(stats.script_calls);
            metrics::counter!(BACKEND_SCRIPT_DECISIONS_TOTAL).absolute(stats.script_decisions);
        }
        render_hot_keys(&snapshot)
    }
}

/// Entries above this count make an admitted verdict "near the limit".
fn near_limit_threshold(limit: u32, observer: &Observer) -> u64 {
    (f64::from(limit) * observer.settings.near_limit_ratio).floor() as u64
}

/// Memory the tracked live windows take in Redis, per key by its encoding (see the constants).
pub fn redis_bytes_estimate(snapshot: &Snapshot) -> u64 {
    snapshot
        .key_counts
        .iter()
        .map(|&n| {
            let per_entry = if n > REDIS_LISTPACK_MAX_ENTRIES {
                REDIS_SKIPLIST_ENTRY_BYTES
            } else {
                REDIS_LISTPACK_ENTRY_BYTES
            };
            REDIS_KEY_OVERHEAD_BYTES.saturating_add(n.saturating_mul(per_entry))
        })
        .fold(0u64, u64::saturating_add)
}

/// `key=value,...` cut to a few characters, then `#` and 8 hex digits of the key's hash: enough
/// to recognise a key and to look it up, without putting whole client values on a dashboard.
fn hot_key_label(entries: &[Entry], key_hash: u64) -> String {
    let mut text = String::new();
    for (i, entry) in entries.iter().enumerate() {
        if i > 0 {
            text.push(',');
        }
        let _ = write!(text, "{}={}", entry.key, entry.value);
    }
    let mut label = truncate(&text, HOT_KEY_TEXT_MAX).to_owned();
    let _ = write!(label, "#{:08x}", key_hash >> 32);
    label
}

/// The longest prefix of `s` of at most `max` bytes that ends on a char boundary.
fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// A Prometheus label value, escaped as the text format requires.
fn escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

fn render_hot_keys(snapshot: &Snapshot) -> String {
    let mut text = String::new();
    let _ = writeln!(
        text,
        "# HELP {HOT_KEY_ENTRIES} Entries in the window of the hottest live keys (key: truncated descriptor and hash)"
    );
    let _ = writeln!(text, "# TYPE {HOT_KEY_ENTRIES} gauge");
    for hot in &snapshot.hot {
        let _ = writeln!(
            text,
            "{HOT_KEY_ENTRIES}{{domain=\"{}\",rule=\"{}\",key=\"{}\"}} {}",
            escape(&hot.domain),
            escape(&hot.rule),
            escape(&hot.label),
            hot.count
        );
    }
    text
}

/// Wraps a backend to time its decision calls and count their failures by kind, so the limiter
/// itself never touches the metrics library.
pub struct ObservedLimiter {
    inner: Arc<dyn Limiter>,
    /// The call-time histogram's handle, fetched on first use (see [`DomainHandles`]).
    call_duration: OnceLock<Histogram>,
}

impl ObservedLimiter {
    pub fn new(inner: Arc<dyn Limiter>) -> Self {
        ObservedLimiter {
            inner,
            call_duration: OnceLock::new(),
        }
    }

    fn observe(
        &self,
        started: Instant,
        result: Result<BatchOutcome, LimiterError>,
    ) -> Result<BatchOutcome, LimiterError> {
        let backend = self.inner.backend();
        self.call_duration
            .get_or_init(
                || metrics::histogram!(BACKEND_CALL_DURATION_SECONDS, "backend" => backend),
            )
            .record(started.elapsed().as_secs_f64());
        if let Err(err) = &result {
            let kind = match err {
                LimiterError::Unavailable(_) => "unavailable",
                LimiterError::Timeout(_) => "timeout",
                LimiterError::Protocol(_) => "protocol",
                LimiterError::Overloaded => "overloaded",
            };
            metrics::counter!(BACKEND_ERRORS_TOTAL, "backend" => backend, "kind" => kind)
                .increment(1);
        }
        result
    }
}

#[async_trait]
impl Limiter for ObservedLimiter {
    async fn decide(
        &self,
        batch: &[Hit],
        now_ms: Option<u64>,
    ) -> Result<BatchOutcome, LimiterError> {
        let started = Instant::now();
        let result = self.inner.decide(batch, now_ms).await;
        self.observe(started, result)
    }

    async fn ping(&self) -> Result<(), LimiterError> {
        self.inner.ping().await
    }

    fn backend(&self) -> &'static str {
        self.inner.backend()
    }

    fn stats(&self) -> Option<crate::limiter::BackendStats> {
        self.inner.stats()
    }
}

// --- Backend failure policy and local rejection cache (issue 4). Kept as small separate
// functions at the end so they merge cleanly with the metrics rewrite.

pub const BACKEND_FAILURES_TOTAL: &str = "sluice_backend_failures_total";
pub const LOCAL_CACHE_DECISIONS_TOTAL: &str = "sluice_local_cache_decisions_total";

pub fn describe_backend() {
    metrics::describe_counter!(
        BACKEND_FAILURES_TOTAL,
        "Requests the backend could not decide (error, deadline, overload), by the failure policy that answered"
    );
    metrics::describe_counter!(
        LOCAL_CACHE_DECISIONS_TOTAL,
        "Requests rejected by the local cache of keys known to be over their limit, without a backend call"
    );
}

/// One request the backend failed; `policy` is `error`, `allow` or `deny`.
pub fn record_backend_failure(policy: &'static str) {
    metrics::counter!(BACKEND_FAILURES_TOTAL, "policy" => policy).increment(1);
}

/// One request answered by the local rejection cache.
pub fn record_local_cache_decision() {
    metrics::counter!(LOCAL_CACHE_DECISIONS_TOTAL).increment(1);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::memory::MemoryLimiter;
    use crate::limiter::SystemClock;

    fn observer() -> Observer {
        Observer::new(
            MetricsSettings::default(),
            Arc::new(MemoryLimiter::new(Arc::new(SystemClock))),
        )
    }

    #[test]
    fn detailed_labels_are_capped_and_fold_into_overflow() {
        let o = observer();
        let entries = |v: &str| vec![Entry::new("user", v)];
        assert_eq!(
            o.detailed_label("d", "user", &entries("alice")),
            "user_alice"
        );
        for i in 1..DETAILED_SERIES_MAX {
            o.detailed_label("d", "user", &entries(&format!("u{i}")));
        }
        assert_eq!(
            o.detailed_label("d", "user", &entries("late")),
            "user|_overflow"
        );
        // Values already labelled keep their series.
        assert_eq!(
            o.detailed_label("d", "user", &entries("alice")),
            "user_alice"
        );
        let long = o.detailed_label("e", "user", &entries(&"x".repeat(500)));
        assert!(long.len() <= DETAILED_LABEL_MAX, "{long}");
    }

    #[test]
    fn hot_key_labels_are_short_and_escaped_on_output() {
        let label = hot_key_label(&[Entry::new("user", "é".repeat(40))], 0xdead_beef_0000_0000);
        assert!(label.len() <= HOT_KEY_TEXT_MAX + 9, "{label}");
        assert!(label.ends_with("#deadbeef"), "{label}");
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }

    #[test]
    fn redis_estimate_follows_the_encoding() {
        let snapshot = Snapshot {
            rules: Vec::new(),
            hot: Vec::new(),
            key_counts: vec![5, 1000],
            untracked: 0,
        };
        assert_eq!(
            redis_bytes_estimate(&snapshot),
            (160 + 5 * 16) + (160 + 1000 * 114)
        );
    }

    #[test]
    fn near_limit_starts_above_the_ratio() {
        let o = observer();
        assert_eq!(near_limit_threshold(10, &o), 8);
        assert_eq!(near_limit_threshold(7, &o), 5);
        assert_eq!(near_limit_threshold(1, &o), 0);
    }
}
