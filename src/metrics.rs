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

// --- Config hot reload (src/reload.rs) ---------------------------------------------------------
// Kept apart from the families above so the reload metrics can be merged independently.

pub const CONFIG_RELOADS_TOTAL: &str = "sluice_config_reloads_total";
pub const CONFIG_RULES: &str = "sluice_config_rules";
pub const CONFIG_LAST_RELOAD_OK: &str = "sluice_config_last_reload_ok";

pub fn describe_config_reload() {
    metrics::describe_counter!(
        CONFIG_RELOADS_TOTAL,
        "Config reload attempts after a change, by result (ok, error)"
    );
    metrics::describe_gauge!(CONFIG_RULES, "Limits in the config generation serving now");
    metrics::describe_gauge!(
        CONFIG_LAST_RELOAD_OK,
        "1 when the latest config change was loaded, 0 when it was rejected (the previous \
         generation keeps serving)"
    );
}

/// The config serving at start-up; reloads then update the same gauge.
pub fn record_config_loaded(rules: usize) {
    metrics::gauge!(CONFIG_RULES).set(rules as f64);
    metrics::gauge!(CONFIG_LAST_RELOAD_OK).set(1.0);
}

/// One reload attempt; `rules` is the new generation's limit count when `ok`.
pub fn record_config_reload(ok: bool, rules: usize) {
    let result = if ok { "ok" } else { "error" };
    metrics::counter!(CONFIG_RELOADS_TOTAL, "result" => result).increment(1);
    metrics::gauge!(CONFIG_LAST_RELOAD_OK).set(if ok { 1.0 } else { 0.0 });
    if ok {
        metrics::gauge!(CONFIG_RULES).set(rules as f64);
    }
}
