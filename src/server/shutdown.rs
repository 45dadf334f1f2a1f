//! Shutdown in two steps, and every task `run` starts, owned.
//!
//! 1. **Shutdown requested** (SIGTERM, or the caller's future): readiness and gRPC health turn
//!    NOT_SERVING, the prober stops; the servers keep serving, so a load balancer that still
//!    sends traffic is answered while it notices.
//! 2. **Stop serving**: the servers stop accepting (HTTP/2 GOAWAY on the gRPC port), finish
//!    the calls in flight and return; every background task ends.
//!
//! Why two tokens even though the second follows the first at once: a drain delay between
//! them is one `sleep` in [`Lifecycle::drain`], and each task says which step it ends at.
//! Why a tracker: `run` returns only once every task it spawned has ended, so nothing is left
//! running behind it (a test that starts and stops servers in one process sees them gone).

use std::future::Future;

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
    /// Waits for `shutdown`, then takes both steps: NOT_SERVING, then stop serving.
    pub async fn drain(
        &self,
        shutdown: impl Future<Output = ()>,
        readiness: &Readiness,
        health: &Health,
    ) {
        shutdown.await;
        tracing::info!("shutdown requested: reporting NOT_SERVING and draining in-flight calls");
        readiness.set_draining();
        self.requested.cancel();
        health.publish(readiness).await;
        self.stop.cancel();
    }

    /// Waits until every task has ended (no task may be added after).
    pub async fn wait(&self) {
        self.tasks.close();
        self.tasks.wait().await;
    }
}
