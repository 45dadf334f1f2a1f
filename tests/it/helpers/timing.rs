//! Waiting for a condition under a deadline, and the percentiles of measured latencies.

use std::future::Future;
use std::time::{Duration, Instant};

/// Polls `done` every 50 ms until it holds; fails the test, naming `what`, if it still does not
/// after `timeout`.
pub async fn wait_until<F, Fut>(what: &str, timeout: Duration, mut done: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    while !done().await {
        assert!(Instant::now() < deadline, "{what}: not within {timeout:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// [`wait_until`] for a thread that may block (no runtime needed).
pub fn wait_until_blocking(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within {timeout:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The `p` quantile (0 to 1, nearest rank) of `sorted`; zero when there is no sample.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    debug_assert!(sorted.is_sorted(), "percentile of unsorted samples");
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(i).copied().unwrap_or_default()
}
