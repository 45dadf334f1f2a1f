//! A deadline and a bound on in-flight work around any [`Limiter`].
//!
//! Why: Envoy's rate-limit filter gives up after 20 ms, and envoyproxy/ratelimit users report
//! multi-second stalls when Redis hangs. A decision must therefore come back within a fixed
//! per-decision deadline whatever the backend does, and a hung backend must not turn into an
//! ever-growing queue of calls waiting on it.
//!
//! How: each call takes a permit from a semaphore of `max_in_flight` permits without waiting
//! (none free: fail fast with [`LimiterError::Overloaded`]), runs the backend call in the caller's
//! task for at most `deadline`, and, if the caller stops waiting (deadline, or the caller was
//! dropped), hands the rest of the call to a task of its own that keeps the permit until the
//! backend call itself ends. A caller that gives up does not free the permit: the abandoned call
//! still occupies the backend connection (its request may already be on the wire and will be
//! answered or time out there, see `RESPONSE_TIMEOUT` of the Redis backend), so the bound covers
//! every call the backend still owes an answer, not just the ones someone is waiting for.
//!
//! A call that timed out may still have been executed by the backend (the script ran, the reply
//! was late): the caller reports an error, so at worst the hits were recorded for a request the
//! failure policy answered; that can only cause extra rejections later, never over-admission.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Semaphore;

use super::{BatchOutcome, Item, Limiter, LimiterError};

/// Default per-decision deadline: well under Envoy's 20 ms filter timeout, so sluice answers
/// (with its failure policy) before Envoy applies its own.
pub const DEFAULT_DEADLINE: Duration = Duration::from_millis(10);
/// Default bound on backend calls in flight, abandoned ones included.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 1024;

pub struct Guarded {
    inner: Arc<dyn Limiter>,
    deadline: Duration,
    permits: Arc<Semaphore>,
}

impl Guarded {
    pub fn new(inner: Arc<dyn Limiter>, deadline: Duration, max_in_flight: usize) -> Self {
        Guarded {
            inner,
            deadline,
            permits: Arc::new(Semaphore::new(max_in_flight.max(1))),
        }
    }

    pub fn deadline(&self) -> Duration {
        self.deadline
    }

    async fn bounded<F, Fut>(&self, call: F) -> Result<BatchOutcome, LimiterError>
    where
        F: FnOnce(Arc<dyn Limiter>) -> Fut,
        Fut: Future<Output = Result<BatchOutcome, LimiterError>> + Send + 'static,
    {
        let permit = Arc::clone(&self.permits)
            .try_acquire_owned()
            .map_err(|_| LimiterError::Overloaded)?;
        // The call runs in the caller's task (no spawn, no extra task hop per decision); only a
        // call the caller stops waiting for (deadline, or the caller itself dropped) is handed
        // to a task of its own, which keeps the permit until the backend call really ends.
        let call = Detachable {
            work: Some(Box::pin(call(Arc::clone(&self.inner)))),
            permit: Some(permit),
        };
        match tokio::time::timeout(self.deadline, call).await {
            Ok(result) => result,
            Err(_) => Err(LimiterError::Timeout(self.deadline.as_millis() as u64)),
        }
    }
}

/// A backend call and its permit. Polled to completion, it releases the permit when the call
/// ends; dropped before that, it spawns the rest of the call with the permit, so an abandoned
/// call still counts against `max_in_flight` until the backend answers (or its own timeout).
struct Detachable<Fut: Future<Output = Result<BatchOutcome, LimiterError>> + Send + 'static> {
    work: Option<std::pin::Pin<Box<Fut>>>,
    permit: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl<Fut> Future for Detachable<Fut>
where
    Fut: Future<Output = Result<BatchOutcome, LimiterError>> + Send + 'static,
{
    type Output = Result<BatchOutcome, LimiterError>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let Some(work) = self.work.as_mut() else {
            return std::task::Poll::Ready(Err(LimiterError::Unavailable(
                "backend call polled after completion".into(),
            )));
        };
        let result = std::task::ready!(work.as_mut().poll(cx));
        self.work = None;
        self.permit = None;
        std::task::Poll::Ready(result)
    }
}

impl<Fut> Drop for Detachable<Fut>
where
    Fut: Future<Output = Result<BatchOutcome, LimiterError>> + Send + 'static,
{
    fn drop(&mut self) {
        if let (Some(work), Some(permit)) = (self.work.take(), self.permit.take()) {
            // Outside a runtime (never in sluice) the call is dropped and the permit freed.
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(async move {
                    let _ = work.await;
                    drop(permit);
                });
            }
        }
    }
}

#[async_trait]
impl Limiter for Guarded {
    async fn decide(
        &self,
        batch: &[Item],
        now_ms: Option<u64>,
    ) -> Result<BatchOutcome, LimiterError> {
        let batch = batch.to_vec();
        self.bounded(move |l| async move { l.decide(&batch, now_ms).await })
            .await
    }

    /// Not bounded by the decision deadline: readiness has its own, longer timeout.
    async fn ping(&self) -> Result<(), LimiterError> {
        self.inner.ping().await
    }

    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn stats(&self) -> Option<super::BackendStats> {
        self.inner.stats()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::ItemKind;

    /// Never answers until told to.
    struct Hung(tokio::sync::Notify);

    #[async_trait]
    impl Limiter for Hung {
        async fn decide(&self, _: &[Item], _: Option<u64>) -> Result<BatchOutcome, LimiterError> {
            self.0.notified().await;
            Err(LimiterError::Unavailable("released".into()))
        }
        async fn ping(&self) -> Result<(), LimiterError> {
            Ok(())
        }
        fn name(&self) -> &'static str {
            "hung"
        }
    }

    fn batch() -> Vec<Item> {
        vec![Item {
            key: "k".into(),
            limit: 1,
            window_ms: 1000,
            hits: 1,
            kind: ItemKind::Consume,
            over_limit: crate::limiter::OverLimit::default(),
            algorithm: crate::limiter::Algorithm::SlidingLog,
            lease: 0,
            hold_ms: 0,
        }]
    }

    #[tokio::test]
    async fn a_dropped_caller_keeps_its_permit_until_the_backend_answers() {
        let hung = Arc::new(Hung(tokio::sync::Notify::new()));
        let g = Guarded::new(hung.clone(), Duration::from_secs(60), 1);
        // The caller gives up on its own (e.g. the gRPC call was cancelled): the call is dropped.
        let abandoned =
            tokio::time::timeout(Duration::from_millis(5), g.decide(&batch(), None)).await;
        assert!(abandoned.is_err());
        match g.decide(&batch(), None).await {
            Err(LimiterError::Overloaded) => {}
            other => panic!("expected overload while the abandoned call runs, got {other:?}"),
        }
        hung.0.notify_waiters();
        tokio::time::sleep(Duration::from_millis(20)).await;
        // The permit is back: the next call takes it and waits on the backend.
        let waiting =
            tokio::time::timeout(Duration::from_millis(20), g.decide(&batch(), None)).await;
        assert!(
            waiting.is_err(),
            "expected the call to wait, got {waiting:?}"
        );
    }

    #[tokio::test]
    async fn hung_backend_times_out_then_fails_fast_when_full() {
        let hung = Arc::new(Hung(tokio::sync::Notify::new()));
        let g = Guarded::new(hung.clone(), Duration::from_millis(5), 2);
        for _ in 0..2 {
            match g.decide(&batch(), None).await {
                Err(LimiterError::Timeout(5)) => {}
                other => panic!("expected a timeout, got {other:?}"),
            }
        }
        // Both permits are still held by the abandoned calls: the third fails without waiting,
        // i.e. on its first poll (no clock involved, so a loaded machine cannot flake it).
        use futures_util::FutureExt as _;
        match g.decide(&batch(), None).now_or_never() {
            Some(Err(LimiterError::Overloaded)) => {}
            other => panic!("expected overload on the first poll, got {other:?}"),
        }
        // Once the backend answers the abandoned calls, permits come back: a timeout again.
        hung.0.notify_waiters();
        tokio::time::sleep(Duration::from_millis(20)).await;
        match g.decide(&batch(), None).await {
            Err(LimiterError::Timeout(5)) => {}
            other => panic!("expected a timeout after release, got {other:?}"),
        }
    }
}
