//! The Rate Limit Quota Service's metrics: streams open, usage reports, what each bucket was
//! answered, the tokens reserved, and the requests Envoy says it allowed and denied.
//!
//! Why its own file: the quota service answers streams, not calls, and its answers are
//! allotments, not verdicts; what it shares with the RLS path is the domain label (configured
//! domains only, others `_unknown`) and the backend metrics its reservations go through.

use super::UNKNOWN_DOMAIN;
use super::names::{
    RLQS_ASSIGNMENTS_TOTAL, RLQS_ENVOY_REQUESTS_TOTAL, RLQS_REPORT_ERRORS_TOTAL,
    RLQS_REPORTS_TOTAL, RLQS_STREAMS, RLQS_TOKENS_TOTAL,
};
use crate::config::Config;
use crate::quota::{Allotment, Usage};

/// A stream opened (`true`) or ended.
pub fn record_quota_stream(opened: bool) {
    let gauge = metrics::gauge!(RLQS_STREAMS);
    if opened {
        gauge.increment(1.0);
    } else {
        gauge.decrement(1.0);
    }
}

/// A usage report refused as invalid (the stream ends with INVALID_ARGUMENT).
pub fn record_quota_invalid() {
    metrics::counter!(RLQS_REPORT_ERRORS_TOTAL, "kind" => "invalid_argument").increment(1);
}

/// A usage report of a stream in `domain`, and what each of its buckets was answered.
pub fn record_quota_report(
    config: &Config,
    domain: &str,
    usages: &[Usage],
    allotments: &[Allotment],
) {
    let domain = if config.has_domain(domain) {
        domain.to_owned()
    } else {
        UNKNOWN_DOMAIN.to_owned()
    };
    metrics::counter!(RLQS_REPORTS_TOTAL, "domain" => domain.clone()).increment(1);
    let (allowed, denied) = usages.iter().fold((0u64, 0u64), |(a, d), u| {
        (a.saturating_add(u.allowed), d.saturating_add(u.denied))
    });
    metrics::counter!(RLQS_ENVOY_REQUESTS_TOTAL, "domain" => domain.clone(), "verdict" => "allowed")
        .increment(allowed);
    metrics::counter!(RLQS_ENVOY_REQUESTS_TOTAL, "domain" => domain.clone(), "verdict" => "denied")
        .increment(denied);
    let tokens = allotments
        .iter()
        .fold(0u64, |sum, a| sum.saturating_add(a.tokens));
    metrics::counter!(RLQS_TOKENS_TOTAL, "domain" => domain.clone()).increment(tokens);
    for allotment in allotments {
        metrics::counter!(
            RLQS_ASSIGNMENTS_TOTAL,
            "domain" => domain.clone(),
            "answer" => allotment.answer.as_str()
        )
        .increment(1);
    }
}
