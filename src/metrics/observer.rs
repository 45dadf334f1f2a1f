//! The observer of requests: what every decided call (gRPC or `POST /json`) adds to the
//! metrics: its latency, its overall code, a verdict per descriptor, near-limit verdicts, the
//! hits asked for, the failure policy that answered a failed backend, and the window counts for
//! the cardinality gauges.
//!
//! Why one observer for both faces: a `/json` decision spends the same quota as a gRPC one, so
//! it must show on the same dashboards. The engine returns what happened (a [`Decision`] or a
//! [`DecisionError`]) and the faces hand it here; nothing below records on its own.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::Duration;

use metrics::{Counter, Histogram};
use sha2::{Digest, Sha256};

use super::MetricsSettings;
use super::backend::{publish_stats, record_backend_failure};
use super::labels::{PerCode, PerOutcome, RequestError, code_label};
use super::names::{
    DECISIONS_TOTAL, HITS_TOTAL, NEAR_LIMIT_TOTAL, REQUEST_DURATION_SECONDS, REQUEST_ERRORS_TOTAL,
    REQUESTS_TOTAL,
};
use super::upstream::UpstreamStats;
use super::windows::{KeyWindow, Windows, truncate};
use crate::decision::{Decision, DecisionError, FailurePolicy, Outcome, Request, Verdict};
use crate::descriptor::Entry;
use crate::limiter::Limiter;
use crate::sync::lock;

/// Label used for domains the config does not know, so client-chosen names cannot add series
/// (traces export the same).
pub const UNKNOWN_DOMAIN: &str = "_unknown";

/// Distinct `detailed_metric` label values per process; later ones fold into `<rule>|_overflow`.
/// Once registered a series lives as long as the process, so this is a lifetime cap.
pub const DETAILED_SERIES_MAX: usize = 100;
/// Longest detailed label value; longer ones are cut and end in a hash.
const DETAILED_LABEL_MAX: usize = 96;

/// The stateful part of the metrics: the near-limit ratio, the detailed-label budget, the
/// window tracker and the backend whose stats `/metrics` shows. Shared by both faces (which
/// record) and the admin server (which collects before rendering).
pub struct Observer {
    settings: MetricsSettings,
    limiter: Arc<dyn Limiter>,
    detailed: Mutex<HashSet<(String, String)>>,
    windows: Windows,
    /// Handles of the per-request series, by domain label (see [`DomainHandles`]).
    handles: RwLock<HashMap<String, Arc<DomainHandles>>>,
    request_duration: OnceLock<Histogram>,
    /// envoyproxy/ratelimit's stats, when a sink of theirs is on.
    upstream: Option<Arc<UpstreamStats>>,
}

/// Why cached handles: every `counter!(name, labels)` call builds its labels (one allocation per
/// label value) and looks the series up in the recorder's registry; per request that was about
/// a tenth of sluice's instructions (docs/performance-history.md). A handle is fetched once,
/// through the same macro, the first time its series is used, so `/metrics` shows exactly the
/// series the macros would. Domain labels are bounded (configured domains and `_unknown`), rule labels are
/// config paths; `detailed_metric` labels are not cached (they have their own cap).
#[derive(Default)]
struct DomainHandles {
    requests: PerCode<OnceLock<Counter>>,
    hits: OnceLock<Counter>,
    rules: RwLock<HashMap<String, Arc<RuleHandles>>>,
}

#[derive(Default)]
struct RuleHandles {
    decisions: PerOutcome<OnceLock<Counter>>,
    near_limit: OnceLock<Counter>,
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
    /// `limiter` is the backend stack whose stats `/metrics` shows (and whose name tells whether
    /// the Redis memory estimate applies).
    pub fn new(settings: MetricsSettings, limiter: Arc<dyn Limiter>) -> Self {
        Observer {
            settings,
            limiter,
            detailed: Mutex::new(HashSet::new()),
            windows: Windows::new(),
            handles: RwLock::new(HashMap::new()),
            request_duration: OnceLock::new(),
            upstream: None,
        }
    }

    /// Also records envoyproxy/ratelimit's stats of every call into `stats`.
    pub fn with_upstream(mut self, stats: Option<Arc<UpstreamStats>>) -> Self {
        self.upstream = stats;
        self
    }

    /// envoyproxy/ratelimit's stats, when recorded.
    pub fn upstream(&self) -> Option<&Arc<UpstreamStats>> {
        self.upstream.as_ref()
    }

    /// Records one call the engine answered, with a decision or an error.
    pub fn record_request(
        &self,
        request: &Request,
        result: Result<&Decision, &DecisionError>,
        elapsed: Duration,
    ) {
        self.record_duration(elapsed);
        if let Some(upstream) = &self.upstream {
            upstream.record_request(request, result);
        }
        match result {
            Ok(decision) => self.record_decision(request, decision),
            Err(err) => {
                if matches!(err, DecisionError::Backend(_)) {
                    record_backend_failure(FailurePolicy::Error);
                }
                record_error(RequestError::from(err));
            }
        }
    }

    /// Records one call refused before it reached the engine: its body or fields could not be
    /// mapped to a request (INVALID_ARGUMENT, HTTP 400).
    pub fn record_unmappable(&self, elapsed: Duration) {
        self.record_duration(elapsed);
        record_error(RequestError::InvalidArgument);
    }

    fn record_duration(&self, elapsed: Duration) {
        self.request_duration
            .get_or_init(|| metrics::histogram!(REQUEST_DURATION_SECONDS))
            .record(elapsed.as_secs_f64());
    }

    fn record_decision(&self, request: &Request, decision: &Decision) {
        if let Some(policy) = decision.backend_failed {
            record_backend_failure(policy);
        }
        let domain = if decision.known_domain {
            request.domain.as_str()
        } else {
            UNKNOWN_DOMAIN
        };
        let handles = cached(&self.handles, domain, DomainHandles::default);
        handles
            .requests
            .get(decision.overall)
            .get_or_init(|| {
                metrics::counter!(
                    REQUESTS_TOTAL,
                    "domain" => domain.to_owned(),
                    "code" => code_label(decision.overall)
                )
            })
            .increment(1);
        if decision.hits > 0 {
            handles
                .hits
                .get_or_init(|| metrics::counter!(HITS_TOTAL, "domain" => domain.to_owned()))
                .increment(decision.hits);
        }
        let now = self.windows.now_ms();
        // Verdicts are in descriptor order (the engine keeps one per descriptor).
        for (verdict, descriptor) in decision.verdicts.iter().zip(&request.descriptors) {
            let path = verdict.rule.as_deref().unwrap_or_default();
            self.record_verdict(&handles, domain, path, verdict, &descriptor.entries);
            if let (Some(limit), Some(key)) = (&verdict.limit, verdict.key.as_deref()) {
                let window = KeyWindow {
                    domain,
                    rule: path,
                    key,
                    entries: &descriptor.entries,
                    count: verdict.window_count,
                    window_ms: limit.window_ms,
                };
                self.windows.observe(window, now);
            }
        }
    }

    /// `sluice_decisions_total` and `sluice_near_limit_total` for one verdict.
    fn record_verdict(
        &self,
        handles: &DomainHandles,
        domain: &str,
        path: &str,
        verdict: &Verdict,
        entries: &[Entry],
    ) {
        let near_limit = verdict.outcome == Outcome::Admitted
            && verdict.limit.as_ref().is_some_and(|limit| {
                verdict.window_count > self.near_limit_threshold(limit.requests_per_unit)
            });
        let outcome = verdict.outcome.as_str();
        if verdict.detailed_metric {
            let rule = self.detailed_label(domain, path, entries);
            metrics::counter!(
                DECISIONS_TOTAL,
                "domain" => domain.to_owned(),
                "rule" => rule.clone(),
                "outcome" => outcome
            )
            .increment(1);
            if near_limit {
                metrics::counter!(NEAR_LIMIT_TOTAL, "domain" => domain.to_owned(), "rule" => rule)
                    .increment(1);
            }
            return;
        }
        let rule = cached(&handles.rules, path, RuleHandles::default);
        rule.decisions
            .get(verdict.outcome)
            .get_or_init(|| {
                metrics::counter!(
                    DECISIONS_TOTAL,
                    "domain" => domain.to_owned(),
                    "rule" => path.to_owned(),
                    "outcome" => outcome
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

    /// Entries above this count make an admitted verdict "near the limit".
    fn near_limit_threshold(&self, limit: u32) -> u64 {
        (f64::from(limit) * self.settings.near_limit_ratio).floor() as u64
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
        let redis = self.limiter.name() == "redis";
        let hot_keys = self.windows.collect(self.settings.hot_keys, redis);
        publish_stats(&*self.limiter);
        hot_keys
    }
}

/// `sluice_request_errors_total` for one call answered with an error.
fn record_error(kind: RequestError) {
    metrics::counter!(REQUEST_ERRORS_TOTAL, "kind" => kind.as_str()).increment(1);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::SystemClock;
    use crate::limiter::memory::MemoryLimiter;

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
    fn near_limit_starts_above_the_ratio() {
        let o = observer();
        assert_eq!(o.near_limit_threshold(10), 8);
        assert_eq!(o.near_limit_threshold(7), 5);
        assert_eq!(o.near_limit_threshold(1), 0);
    }
}
