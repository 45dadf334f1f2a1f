//! The limiter stack, built in one place from the settings. Outermost first, each a [`Limiter`]
//! wrapping the next:
//! - [`ObservedLimiter`]: the backend's metrics (call durations, local answers, its stats);
//! - [`TracedLimiter`](crate::otel::TracedLimiter): a span per backend call (tracing on only);
//! - [`RejectionCache`]: answers requests certain to be rejected without a backend call
//!   (shared backends only, `local_cache_size > 0`);
//! - [`Guarded`]: the per-decision deadline and the bound on calls in flight (shared backends
//!   only);
//! - the backend: [`MemoryLimiter`] (no Redis given; it answers in microseconds and has no
//!   network to hang on, so it needs neither wrapper), [`RedisLimiter`] (one Redis, or the
//!   primary Sentinel names) or [`ClusterLimiter`] (chosen by the URL's scheme).
//!
//! Beside it, what observes the calls above it: the [`Observer`] both faces record each call
//! on (and envoyproxy/ratelimit's stats it feeds, when on), and the [`Tracer`] they open a
//! span per decision with. A new decorator, or another
//! observer of the same facts, is added here.

use std::sync::Arc;

use crate::limiter::cache::{MonotonicClock, RejectionCache};
use crate::limiter::guard::Guarded;
use crate::limiter::memory::MemoryLimiter;
use crate::limiter::redis::cluster::ClusterLimiter;
use crate::limiter::redis::connect::{Topology, redact_url};
use crate::limiter::redis::{RedisLimiter, RedisOptions};
use crate::limiter::{Limiter, SystemClock};
use crate::metrics::upstream::UpstreamStats;
use crate::metrics::{ObservedLimiter, Observer};
use crate::otel::Tracer;

use super::settings::{BackendSettings, MIN_DEADLINE, Settings, StartError};

/// The limiter stack and its observers.
pub struct Stack {
    /// The whole stack: what the engine decides through.
    pub limiter: Arc<dyn Limiter>,
    /// The stack under its observing decorators: what readiness pings, and whose stats
    /// `/metrics` shows.
    pub backend: Arc<dyn Limiter>,
    pub observer: Arc<Observer>,
    pub tracer: Tracer,
    /// envoyproxy/ratelimit's stats, when a sink of theirs is on: recorded by the observer
    /// and the gRPC layer, sent by the statsd task, served on the metrics port.
    pub upstream: Option<Arc<UpstreamStats>>,
}

impl Stack {
    /// Builds the stack `settings` describe, without connecting (Redis may still be down).
    /// With tracing on it must run inside the Tokio runtime that serves: the exporter's
    /// connections run on it.
    pub fn build(settings: &Settings) -> Result<Stack, StartError> {
        let backend = backend(&settings.backend)?;
        let tracer = match &settings.tracing {
            Some(tracing) => Tracer::start(tracing)?,
            None => Tracer::off(),
        };
        let limiter = Arc::new(ObservedLimiter::new(tracer.limiter(backend.clone())));
        let metrics = &settings.metrics;
        let upstream = metrics.upstream.enabled().then(|| {
            Arc::new(UpstreamStats::new(
                metrics.upstream.clone(),
                metrics.near_limit_ratio,
            ))
        });
        let observer = Arc::new(
            Observer::new(metrics.clone(), backend.clone()).with_upstream(upstream.clone()),
        );
        Ok(Stack {
            limiter,
            backend,
            observer,
            tracer,
            upstream,
        })
    }
}

/// The backend `settings` describe, with its guard and rejection cache (see the module
/// documentation).
pub fn backend(settings: &BackendSettings) -> Result<Arc<dyn Limiter>, StartError> {
    let Some(options) = &settings.redis else {
        tracing::info!("backend: embedded memory (no --redis-url given)");
        return Ok(Arc::new(MemoryLimiter::new(Arc::new(SystemClock))));
    };
    let url = redact_url(&options.url);
    let deadline = settings.deadline.max(MIN_DEADLINE);
    // A WAIT that outlived the decision could only hold the connection after the caller left.
    let options = RedisOptions {
        wait_timeout: deadline,
        ..options.clone()
    };
    let shared: Arc<dyn Limiter> = match options.topology() {
        Topology::Cluster => {
            let limiter = ClusterLimiter::open(&options)?;
            tracing::info!(url = %url, "backend: redis cluster");
            Arc::new(limiter)
        }
        topology @ (Topology::Standalone | Topology::Sentinel) => {
            let limiter = RedisLimiter::open(&options)?;
            tracing::info!(
                url = %url,
                pool = options.pool_size,
                batch_max = options.batch_max,
                wait_replicas = options.wait_replicas,
                "backend: {}",
                if topology == Topology::Sentinel {
                    "redis sentinel"
                } else {
                    "redis"
                }
            );
            Arc::new(limiter)
        }
    };
    let guarded: Arc<dyn Limiter> =
        Arc::new(Guarded::new(shared, deadline, settings.max_in_flight));
    tracing::info!(
        deadline_ms = deadline.as_millis() as u64,
        max_in_flight = settings.max_in_flight,
        local_cache_size = settings.local_cache_size,
        "backend guard"
    );
    if settings.local_cache_size == 0 {
        return Ok(guarded);
    }
    Ok(Arc::new(RejectionCache::new(
        guarded,
        Arc::new(MonotonicClock::default()),
        settings.local_cache_size,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backend_follows_the_settings() {
        let memory = backend(&BackendSettings::default()).unwrap();
        assert_eq!(memory.name(), "memory");
        let redis = |url: &str| BackendSettings {
            redis: Some(RedisOptions::new(url)),
            ..BackendSettings::default()
        };
        // Built without connecting: nothing listens there.
        let standalone = backend(&redis("redis://127.0.0.1:1")).unwrap();
        assert_eq!(standalone.name(), "redis");
        let cluster = backend(&redis("redis+cluster://127.0.0.1:1,127.0.0.1:2")).unwrap();
        assert_eq!(cluster.name(), "redis-cluster");
        let err = backend(&redis("localhost:6379")).err().expect("no scheme");
        assert!(err.to_string().contains("the scheme is missing"), "{err}");
        let sentinel =
            backend(&redis("redis+sentinel://127.0.0.1:1,127.0.0.1:2/mymaster")).unwrap();
        assert_eq!(sentinel.name(), "redis");
        let mut waiting = redis("redis+cluster://127.0.0.1:1");
        if let Some(options) = waiting.redis.as_mut() {
            options.wait_replicas = 1;
        }
        let err = backend(&waiting).err().expect("WAIT on a cluster");
        assert!(err.to_string().contains("not to a cluster"), "{err}");
    }
}
