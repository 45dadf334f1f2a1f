//! Every metric family sluice exports, in one place, with bounded labels.
//!
//! Why bounded: per-request values (client IPs, user ids) must never become label values, or
//! the metrics themselves become the memory problem. Labels here are the domain (only when the
//! config knows it), the rule's config path (bounded by the config) and a fixed outcome set.

use std::time::Duration;

use crate::decision::{Decision, DecisionError};

/// Label used for domains the config does not know, so client-chosen names cannot add series.
const OTHER: &str = "_unknown";

pub const REQUESTS_TOTAL: &str = "sluice_requests_total";
pub const DECISIONS_TOTAL: &str = "sluice_decisions_total";
pub const HITS_TOTAL: &str = "sluice_hits_total";
pub const REQUEST_ERRORS_TOTAL: &str = "sluice_request_errors_total";
pub const REQUEST_DURATION_SECONDS: &str = "sluice_request_duration_seconds";

/// Latency buckets from 100 µs to 100 ms: Envoy's filter gives up at 20 ms by default.
pub const LATENCY_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1,
];

pub fn describe() {
    metrics::describe_counter!(
        REQUESTS_TOTAL,
        "ShouldRateLimit calls by domain and overall code"
    );
    metrics::describe_counter!(
        DECISIONS_TOTAL,
        "Descriptor verdicts by domain, rule (config path) and outcome"
    );
    metrics::describe_counter!(HITS_TOTAL, "Hits asked for (sum of hits_addend) by domain");
    metrics::describe_counter!(
        REQUEST_ERRORS_TOTAL,
        "ShouldRateLimit calls answered with an error, by kind"
    );
    metrics::describe_histogram!(
        REQUEST_DURATION_SECONDS,
        metrics::Unit::Seconds,
        "ShouldRateLimit handling time"
    );
}

pub fn record_request(domain: &str, result: Result<&Decision, &DecisionError>, elapsed: Duration) {
    metrics::histogram!(REQUEST_DURATION_SECONDS).record(elapsed.as_secs_f64());
    let decision = match result {
        Ok(d) => d,
        Err(err) => {
            let kind = match err {
                DecisionError::Invalid(_) => "invalid_argument",
                DecisionError::Backend(_) => "backend",
            };
            metrics::counter!(REQUEST_ERRORS_TOTAL, "kind" => kind).increment(1);
            return;
        }
    };
    let domain = if decision.known_domain { domain } else { OTHER };
    let code = match decision.overall {
        crate::decision::Code::Ok => "ok",
        crate::decision::Code::OverLimit => "over_limit",
    };
    metrics::counter!(REQUESTS_TOTAL, "domain" => domain.to_owned(), "code" => code).increment(1);
    if decision.hits > 0 {
        metrics::counter!(HITS_TOTAL, "domain" => domain.to_owned()).increment(decision.hits);
    }
    for verdict in &decision.verdicts {
        metrics::counter!(
            DECISIONS_TOTAL,
            "domain" => domain.to_owned(),
            "rule" => verdict.rule.clone().unwrap_or_default(),
            "outcome" => verdict.outcome.as_str()
        )
        .increment(1);
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
