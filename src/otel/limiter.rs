//! The backend span: a decorator over the backend stack (rejection cache, guard, backend) that
//! opens a child of the decision span around each decision call and records what the limiter
//! returned. Installed only when tracing is on; a call made outside a sampled decision span
//! (none is, today) passes straight through.

use std::sync::Arc;

use async_trait::async_trait;
use opentelemetry::trace::{
    Span as _, SpanKind, Status as SpanStatus, TraceContextExt as _, Tracer as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::SdkTracer;

use crate::limiter::{AnsweredBy, BackendStats, BatchOutcome, Item, Limiter, LimiterError};
use crate::metrics::backend_error_label;

/// Name of the span around a backend decision call.
pub const BACKEND_SPAN: &str = "backend.decide";

pub struct TracedLimiter {
    inner: Arc<dyn Limiter>,
    tracer: SdkTracer,
}

impl TracedLimiter {
    pub fn new(inner: Arc<dyn Limiter>, tracer: SdkTracer) -> Self {
        TracedLimiter { inner, tracer }
    }
}

#[async_trait]
impl Limiter for TracedLimiter {
    async fn decide(
        &self,
        batch: &[Item],
        now_ms: Option<u64>,
    ) -> Result<BatchOutcome, LimiterError> {
        let parent = Context::current();
        if !parent.span().is_recording() {
            return self.inner.decide(batch, now_ms).await;
        }
        let backend = self.inner.name();
        let remote = backend != "memory";
        let mut attributes = vec![
            KeyValue::new("sluice.backend", backend),
            KeyValue::new(
                "sluice.batch.items",
                i64::try_from(batch.len()).unwrap_or(i64::MAX),
            ),
        ];
        if remote {
            attributes.push(KeyValue::new("db.system.name", "redis"));
        }
        let mut span = self
            .tracer
            .span_builder(BACKEND_SPAN)
            .with_kind(if remote {
                SpanKind::Client
            } else {
                SpanKind::Internal
            })
            .with_attributes(attributes)
            .start_with_context(&self.tracer, &parent);
        let result = self.inner.decide(batch, now_ms).await;
        match &result {
            Ok(outcome) => {
                let answered_by = match outcome.answered_by {
                    AnsweredBy::Backend => "backend",
                    AnsweredBy::LocalCache => "local_cache",
                };
                span.set_attribute(KeyValue::new("sluice.answered_by", answered_by));
                span.set_attribute(KeyValue::new("sluice.admitted", outcome.admitted));
            }
            Err(err) => {
                span.set_attribute(KeyValue::new("error.type", backend_error_label(err)));
                span.set_status(SpanStatus::error(err.to_string()));
            }
        }
        span.end();
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
