//! Shutdown in two steps, a drain delay between them, and every task `run` starts, owned.
//!
//! 1. **Shutdown requested** (SIGTERM, or the caller's first signal): readiness and gRPC health
//!    turn NOT_SERVING, the prober stops; the servers keep serving, so a load balancer that
//!    still sends traffic is answered while it notices.
//! 2. **Stop serving**, once the drain delay (`--drain-delay-secs`) has passed or a second
//!    signal cut it short: the servers stop accepting (HTTP/2 GOAWAY on the gRPC port), finish
//!    the calls in flight and return; every background task ends.
//!
//! Why a delay at all: an Envoy learns that an endpoint is going away from its health checks,
//! a Kubernetes Service or an xDS push, all seconds behind SIGTERM. Had the port closed at
//! once, the calls it sent meanwhile would meet a closed port, and with `failure_mode_deny`
//! every one of them is a failed request. Why a second signal cuts it short: an operator who
//! presses ctrl-c twice, or a supervisor that signals again, wants the process gone now (the
//! calls in flight still finish).
//! Why a tracker: `run` returns only once every task it spawned has ended, so nothing is left
//! running behind it (a test that starts and stops servers in one process sees them gone).

use std::pin::pin;
use std::time::Duration;

use futures_util::{Stream, StreamExt};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::grpc::Health;
use crate::readiness::Readiness;

/// The two steps of shutdown and the tasks that end with them.
#[derive(Clone, Default)]
pub struct Lifecycle {
    /// Cancelled when shutdown is requested.
    pub requested: CancellationToken,
    /// Cancelled when the servers must stop accepting and drain.
    pub stop: CancellationToken,
    /// Every task `run` starts.
    pub tasks: TaskTracker,
}

impl Lifecycle {
    /// Waits for the first of `signals` (or their end), takes the first step (NOT_SERVING),
    /// serves on for `delay` unless another signal comes first, then takes the second (stop
    /// serving).
    pub async fn drain(
        &self,
        signals: impl Stream<Item = ()>,
        delay: Duration,
        readiness: &Readiness,
        health: &Health,
    ) {
        let mut signals = pin!(signals);
        signals.next().await;
        tracing::info!(
            drain_delay_secs = delay.as_secs_f64(),
            "shutdown requested: reporting NOT_SERVING and serving on for the drain delay"
        );
        readiness.set_draining();
        self.requested.cancel();
        health.publish(readiness).await;
        if !delay_elapsed(signals, delay).await {
            tracing::info!("signalled again: the rest of the drain delay skipped");
        }
        tracing::info!("stopping: no new connections, draining in-flight calls");
        self.stop.cancel();
    }

    /// Waits until every task has ended (no task may be added after).
    pub async fn wait(&self) {
        self.tasks.close();
        self.tasks.wait().await;
    }
}

/// Waits out `delay`: true once it has passed, false when one more of `signals` came first
/// (their end does not cut it short).
async fn delay_elapsed(signals: impl Stream<Item = ()>, delay: Duration) -> bool {
    let mut signals = pin!(signals);
    tokio::select! {
        () = tokio::time::sleep(delay) => true,
        Some(()) = signals.next() => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::stream;
    use tokio::time::Instant;

    /// The delay is waited out when no other signal comes, even when the signals end.
    #[tokio::test(start_paused = true)]
    async fn the_delay_is_waited_out_without_a_second_signal() {
        let start = Instant::now();
        assert!(delay_elapsed(stream::pending(), Duration::from_secs(10)).await);
        assert_eq!(start.elapsed(), Duration::from_secs(10));
        let start = Instant::now();
        assert!(delay_elapsed(stream::empty(), Duration::from_secs(7)).await);
        assert_eq!(start.elapsed(), Duration::from_secs(7));
    }

    /// A second signal ends the delay when it comes.
    #[tokio::test(start_paused = true)]
    async fn a_second_signal_cuts_the_delay_short() {
        let start = Instant::now();
        let second = stream::once(tokio::time::sleep(Duration::from_secs(3)));
        assert!(!delay_elapsed(second, Duration::from_secs(10)).await);
        assert_eq!(start.elapsed(), Duration::from_secs(3));
    }

    /// No delay: stop serving at once.
    #[tokio::test(start_paused = true)]
    async fn no_delay_ends_at_once() {
        let start = Instant::now();
        assert!(delay_elapsed(stream::pending(), Duration::ZERO).await);
        assert_eq!(start.elapsed(), Duration::ZERO);
    }
}
