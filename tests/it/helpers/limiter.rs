//! Decisions straight through the `Limiter` trait: batch builders, a virtual clock, and the
//! backends the suites build (each Redis one on a server the test started).

use std::sync::Arc;

use sluice::limiter::redis::cluster::ClusterLimiter;
use sluice::limiter::redis::{RedisLimiter, RedisOptions};
use sluice::limiter::{Algorithm, BatchOutcome, Hit, HitKind, KeyOutcome, Limiter, OverLimit};

use super::redis_server::{RedisCluster, RedisServer};

/// Base time for virtual clocks: realistic epoch milliseconds, so Redis members take the same
/// shape as in production.
pub const T: u64 = 1_700_000_000_000;

/// A sliding-log hit, with the default `over_limit` (fill).
pub fn hit(key: &str, limit: u64, window_ms: u64, hits: u64, kind: HitKind) -> Hit {
    Hit {
        key: key.to_string(),
        limit,
        window_ms,
        hits,
        kind,
        over_limit: OverLimit::default(),
        algorithm: Algorithm::SlidingLog,
        lease: 0,
    }
}

/// A `Consume` hit on a 1 s window.
pub fn c(key: &str, limit: u64, hits: u64) -> Hit {
    hit(key, limit, 1000, hits, HitKind::Consume)
}

/// One consume hit of `key` on a sliding log: the decision shape of tests that exercise a Redis
/// backend rather than a rule.
pub fn consume(key: &str, limit: u64, window_ms: u64) -> Hit {
    hit(key, limit, window_ms, 1, HitKind::Consume)
}

/// `h` counted by `alg`.
pub fn with(alg: Algorithm, h: Hit) -> Hit {
    Hit {
        algorithm: alg,
        ..h
    }
}

/// `h` with `over_limit` set.
pub fn over(over_limit: OverLimit, h: Hit) -> Hit {
    Hit { over_limit, ..h }
}

pub fn ko(passed: bool, count: u64, reset_ms: u64) -> KeyOutcome {
    KeyOutcome {
        passed,
        count,
        reset_ms,
    }
}

/// Decides `batch` as if the time were `now`; panics on a backend error.
pub async fn at(l: &Arc<dyn Limiter>, batch: &[Hit], now: u64) -> BatchOutcome {
    l.decide(batch, Some(now))
        .await
        .unwrap_or_else(|e| panic!("decide at {now} failed: {e}"))
}

/// [`at`] on a task of its own, waited for `limit` at most: a decision that loops or deadlocks
/// fails the test instead of hanging it, even on the memory backend, whose decision never
/// yields (the task holds one worker; the waiting test runs on another, so the runtime needs
/// two or more).
pub async fn at_within(
    l: &Arc<dyn Limiter>,
    batch: &[Hit],
    now: u64,
    limit: std::time::Duration,
) -> BatchOutcome {
    let (l, owned) = (Arc::clone(l), batch.to_vec());
    let task = tokio::spawn(async move { at(&l, &owned, now).await });
    match tokio::time::timeout(limit, task).await {
        Ok(outcome) => outcome.unwrap_or_else(|e| panic!("decide at {now}: {e}")),
        Err(_) => panic!("no decision within {limit:?} for {batch:?}"),
    }
}

/// The key's count in the window at `now`, via a check-only probe with an unreachable limit.
pub async fn count_at(l: &Arc<dyn Limiter>, key: &str, window_ms: u64, now: u64) -> u64 {
    let out = at(
        l,
        &[hit(key, u64::MAX, window_ms, 0, HitKind::Consume)],
        now,
    )
    .await;
    out.items[0].count
}

/// A standalone limiter with 4 connections on `server`, connected.
pub async fn redis_limiter(server: &RedisServer) -> Arc<dyn Limiter> {
    let options = RedisOptions {
        pool_size: 4,
        ..RedisOptions::new(server.url())
    };
    let limiter = RedisLimiter::connect(&options)
        .await
        .unwrap_or_else(|e| panic!("connect to {}: {e}", server.url()));
    Arc::new(limiter)
}

/// A cluster limiter on `cluster`, connected.
pub async fn cluster_limiter(cluster: &RedisCluster) -> ClusterLimiter {
    ClusterLimiter::connect(&RedisOptions::new(cluster.url()))
        .await
        .unwrap_or_else(|e| panic!("connect to {}: {e}", cluster.url()))
}
