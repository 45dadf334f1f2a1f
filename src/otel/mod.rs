//! OpenTelemetry traces of decisions, exported over OTLP (gRPC or HTTP/protobuf), as
//! envoyproxy/ratelimit and Envoy Gateway configure them (`TRACING_ENABLED`,
//! `OTEL_EXPORTER_OTLP_ENDPOINT`, ...; the translation is in `compat`).
//!
//! Span layout, per call of either face:
//! - one SERVER span per decision, named after the call
//!   (`envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`, or `POST /json`), child of
//!   the W3C `traceparent` the caller sent (Envoy's rate-limit filter propagates its active
//!   span in the gRPC metadata), with the domain, the matched rules' config paths, each
//!   descriptor's outcome and the overall code as attributes ([`span`] lists them);
//! - under it, one span per backend call (`backend.decide`: the backend, the batch's size, who
//!   answered, whether it admitted, the error kind).
//!
//! What is never exported: descriptor values and keys, limiter keys, passwords. Domains the
//! config does not know are exported as `_unknown`, as the metrics label them, so a caller
//! cannot put its own strings into traces either. docs/security.md keeps the list.
//!
//! Why here, in the faces' layer: the engine and the limiters never touch tracing (facts flow
//! up). The faces open the decision span and run the engine inside its context; the
//! [`TracedLimiter`] decorator, installed above the backend stack only when tracing is on, opens
//! the backend span from that context and reads what the limiter returned.
//!
//! Cost: with tracing off, [`Tracer::off`] holds nothing, the faces check one `Option` per call
//! and no decorator is installed (docs/performance.md measures it). With tracing on, a span ends
//! by a non-blocking push onto the batch processor's bounded queue (spans beyond it are
//! dropped); a thread of the SDK's own exports the batches. An export that fails or hangs is
//! logged by the exporter and never reaches a decision.
//!
//! Sampling is envoyproxy/ratelimit's: parent-based, so a sampled `traceparent` is always
//! followed and an unsampled one never; traces that start here are sampled at
//! `--tracing-sampling-rate`.

mod cli;
mod export;
mod limiter;
mod span;

use std::sync::Arc;
use std::time::Duration;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{
    Span as _, SpanKind, TraceContextExt as _, Tracer as _, TracerProvider,
};
use opentelemetry_http::HeaderExtractor;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};

use crate::limiter::Limiter;

pub use cli::{OtlpProtocol, TracingArgs};
pub use export::{DEFAULT_SERVICE_NAME, Protocol, TracingError, TracingSettings};
pub use limiter::{BACKEND_SPAN, TracedLimiter};
pub use span::{DecisionSpan, Face};

/// How long stopping waits for the last spans to be exported.
pub const SHUTDOWN_FLUSH: Duration = Duration::from_secs(5);

/// The tracer both faces and the backend decorator share: off (nothing at all), or an SDK
/// tracer with its batch exporter. Cheap to clone.
#[derive(Clone, Default)]
pub struct Tracer {
    inner: Option<Arc<Inner>>,
}

struct Inner {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
    propagator: TraceContextPropagator,
}

impl Tracer {
    /// No tracing: every call costs one `None` check.
    pub fn off() -> Self {
        Tracer { inner: None }
    }

    /// Starts the exporter and its batch processor. Must run inside the Tokio runtime that
    /// serves (the gRPC exporter's channel and the HTTP client run their connections on it).
    pub fn start(settings: &TracingSettings) -> Result<Self, TracingError> {
        let provider = export::provider(settings)?;
        let tracer = provider.tracer("sluice");
        tracing::info!(
            protocol = settings.protocol.as_str(),
            endpoint = %settings.export_url()?,
            sampling_rate = settings.sampling_rate,
            service_name = %settings.service_name,
            "tracing: exporting spans over OTLP"
        );
        Ok(Tracer {
            inner: Some(Arc::new(Inner {
                provider,
                tracer,
                propagator: TraceContextPropagator::new(),
            })),
        })
    }

    pub fn is_on(&self) -> bool {
        self.inner.is_some()
    }

    /// The span of one decision, child of the `traceparent` in `headers` (gRPC metadata or
    /// HTTP headers); `None` when tracing is off or the sampler drops it.
    pub fn start_decision(&self, face: Face, headers: &http::HeaderMap) -> Option<DecisionSpan> {
        let inner = self.inner.as_ref()?;
        let parent = inner.propagator.extract(&HeaderExtractor(headers));
        let span = inner
            .tracer
            .span_builder(face.span_name())
            .with_kind(SpanKind::Server)
            .with_attributes(face.attributes())
            .start_with_context(&inner.tracer, &parent);
        if !span.is_recording() {
            return None;
        }
        Some(DecisionSpan::new(parent.with_span(span)))
    }

    /// `limiter`, with a span per backend call when tracing is on; `limiter` itself when off.
    pub fn limiter(&self, limiter: Arc<dyn Limiter>) -> Arc<dyn Limiter> {
        match &self.inner {
            None => limiter,
            Some(inner) => Arc::new(TracedLimiter::new(limiter, inner.tracer.clone())),
        }
    }

    /// Exports what is still queued (waiting at most [`SHUTDOWN_FLUSH`]) and stops the
    /// exporter. Blocking work: it runs off the runtime's threads, which the gRPC exporter's
    /// channel needs meanwhile.
    pub async fn shutdown(self) {
        let Some(inner) = self.inner else {
            return;
        };
        let provider = inner.provider.clone();
        let flushed =
            tokio::task::spawn_blocking(move || provider.shutdown_with_timeout(SHUTDOWN_FLUSH))
                .await;
        match flushed {
            Ok(Ok(())) => tracing::info!("tracing: last spans exported"),
            Ok(Err(err)) => tracing::warn!(error = %err, "tracing: last spans not exported"),
            Err(err) => tracing::warn!(error = %err, "tracing: shutdown did not finish"),
        }
    }
}
