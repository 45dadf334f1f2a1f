//! Backend metrics: the decorator that times every decision call and counts its failures and
//! the local cache's answers, the readiness probe's gauge, the failure policy's counter, and
//! the backend's own stats published at scrape time.
//!
//! Why a decorator: the limiters never touch the metrics library. A call's time and error are
//! seen from outside; everything else a limiter knows it returns (the outcome's
//! [`AnsweredBy`], [`BackendStats`]) and this file records it.

use std::sync::{Arc, OnceLock};
use std::time::Instant;

use async_trait::async_trait;
use metrics::{Counter, Histogram};

use super::labels::backend_error_label;
use super::names::{
    BACKEND_CALL_DURATION_SECONDS, BACKEND_ERRORS_TOTAL, BACKEND_FAILURES_TOTAL, BACKEND_IN_FLIGHT,
    BACKEND_POOL_CONNECTED, BACKEND_POOL_SIZE, BACKEND_SCRIPT_CALLS_TOTAL,
    BACKEND_SCRIPT_DECISIONS_TOTAL, BACKEND_SCRIPT_LOADS_TOTAL, BACKEND_UP, BACKEND_WAITING,
    LOCAL_CACHE_DECISIONS_TOTAL,
};
use crate::decision::FailurePolicy;
use crate::limiter::{AnsweredBy, BackendStats, BatchOutcome, Item, Limiter, LimiterError};

/// Wraps the backend stack (rejection cache, guard, backend) to time its decision calls, count
/// their failures by kind and count the batches the local cache answered.
pub struct ObservedLimiter {
    inner: Arc<dyn Limiter>,
    /// Handles fetched on first use (why: see the observer's cached handles).
    call_duration: OnceLock<Histogram>,
    local_answers: OnceLock<Counter>,
}

impl ObservedLimiter {
    pub fn new(inner: Arc<dyn Limiter>) -> Self {
        ObservedLimiter {
            inner,
            call_duration: OnceLock::new(),
            local_answers: OnceLock::new(),
        }
    }

    fn observe(&self, started: Instant, result: &Result<BatchOutcome, LimiterError>) {
        let backend = self.inner.name();
        self.call_duration
            .get_or_init(
                || metrics::histogram!(BACKEND_CALL_DURATION_SECONDS, "backend" => backend),
            )
            .record(started.elapsed().as_secs_f64());
        match result {
            Ok(outcome) => match outcome.answered_by {
                AnsweredBy::Backend => {}
                AnsweredBy::LocalCache => self
                    .local_answers
                    .get_or_init(|| metrics::counter!(LOCAL_CACHE_DECISIONS_TOTAL))
                    .increment(1),
            },
            Err(err) => metrics::counter!(
                BACKEND_ERRORS_TOTAL,
                "backend" => backend,
                "kind" => backend_error_label(err)
            )
            .increment(1),
        }
    }
}

#[async_trait]
impl Limiter for ObservedLimiter {
    async fn decide(
        &self,
        batch: &[Item],
        now_ms: Option<u64>,
    ) -> Result<BatchOutcome, LimiterError> {
        let started = Instant::now();
        let result = self.inner.decide(batch, now_ms).await;
        self.observe(started, &result);
        result
    }

    async fn ping(&self) -> Result<(), LimiterError> {
        self.inner.ping().await
    }

    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn stats(&self) -> Option<BackendStats> {
        self.inner.stats()
    }
}

/// Publishes a backend probe result.
pub fn record_backend_up(up: bool) {
    metrics::gauge!(BACKEND_UP).set(if up { 1.0 } else { 0.0 });
}

/// One request the backend could not decide, answered by `policy`.
pub(super) fn record_backend_failure(policy: FailurePolicy) {
    metrics::counter!(BACKEND_FAILURES_TOTAL, "policy" => policy.as_str()).increment(1);
}

/// Publishes the backend's own counters and gauges (connections, script calls), read when
/// `/metrics` is scraped; backends without connections have none.
pub(super) fn publish_stats(limiter: &dyn Limiter) {
    let Some(stats) = limiter.stats() else {
        return;
    };
    metrics::counter!(BACKEND_SCRIPT_LOADS_TOTAL).absolute(stats.script_loads);
    metrics::gauge!(BACKEND_POOL_SIZE).set(stats.connections as f64);
    metrics::gauge!(BACKEND_POOL_CONNECTED).set(stats.connected as f64);
    metrics::gauge!(BACKEND_IN_FLIGHT).set(stats.in_flight as f64);
    metrics::gauge!(BACKEND_WAITING).set(stats.waiting as f64);
    metrics::counter!(BACKEND_SCRIPT_CALLS_TOTAL).absolute(stats.script_calls);
    metrics::counter!(BACKEND_SCRIPT_DECISIONS_TOTAL).absolute(stats.script_decisions);
}
