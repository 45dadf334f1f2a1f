//! The backend readiness probe: pings the limiter stack at start-up and then every
//! `--probe-interval-secs`, and publishes the result on [`Readiness`] and gRPC health.
//!
//! Why logged only on a change: a long outage is one line, not one per probe.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::grpc::Health;
use crate::limiter::Limiter;
use crate::metrics;
use crate::readiness::Readiness;

/// Probes the backend and publishes readiness; logs the first result and each change. Once
/// draining, it does nothing: readiness stays NOT_SERVING.
pub async fn probe(limiter: &dyn Limiter, readiness: &Readiness, health: &Health, first: bool) {
    if readiness.draining() {
        return;
    }
    let result = limiter.ping().await;
    let up = result.is_ok();
    metrics::record_backend_up(up);
    if readiness.set_backend_up(up) || first {
        match &result {
            Ok(()) => tracing::info!(backend = limiter.name(), "backend reachable: serving"),
            Err(err) => tracing::warn!(
                backend = limiter.name(),
                error = %err,
                "backend unreachable: not serving"
            ),
        }
    }
    // Not ready without a config either (xDS before its first push).
    health.publish(readiness).await;
}

/// Probes every `interval`, and publishes every change of readiness as it happens, until
/// `stop` is cancelled.
pub async fn run(
    limiter: Arc<dyn Limiter>,
    readiness: Arc<Readiness>,
    health: Health,
    interval: Duration,
    stop: CancellationToken,
) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut changes = readiness.subscribe();
    loop {
        tokio::select! {
            _ = ticker.tick() => probe(&*limiter, &readiness, &health, false).await,
            Ok(()) = changes.changed() => health.publish(&readiness).await,
            () = stop.cancelled() => return,
        }
    }
}
