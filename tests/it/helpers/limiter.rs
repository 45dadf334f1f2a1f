//! Decisions straight through the `Limiter` trait: batch builders, a virtual clock, and the
//! backends the suites build (each Redis one on a server the test started).

use std::sync::Arc;

use sluice::limiter::redis::cluster::ClusterLimiter;
use sluice::limiter::redis::{RedisLimiter, RedisOptions};
use sluice::limiter::{Algorithm, BatchOutcome, Item, ItemKind, KeyOutcome, Limiter, OverLimit};

use super::redis_server::{RedisCluster, RedisServer};

/// Base time for virtual clocks: realistic epoch milliseconds, so Redis members take the same
/// shape as in production.
pub const T: u64 = 1_700_000_000_000;

/// A sliding-log item, with the default `over_limit` (fill).
pub fn log_item(key: &str, limit: u64, window_ms: u64, hits: u64, kind: ItemKind) -> Item {
    Item {
        key: key.to_string(),
        limit,
        window_ms,
        hits,
        kind,
        over_limit: OverLimit::default(),
        algorithm: Algorithm::SlidingLog,
        lease: 0,
        hold_ms: 0,
    }
}

/// A `Consume` item of `hits` on a 1 s sliding log.
pub fn consume_hits(key: &str, limit: u64, hits: u64) -> Item {
    log_item(key, limit, 1000, hits, ItemKind::Consume)
}

/// One consume hit of `key` on a sliding log: the decision shape of tests that exercise a Redis
/// backend rather than a rule.
pub fn consume(key: &str, limit: u64, window_ms: u64) -> Item {
    log_item(key, limit, window_ms, 1, ItemKind::Consume)
}

/// `h` counted by `alg`.
pub fn with(alg: Algorithm, h: Item) -> Item {
    Item {
        algorithm: alg,
        ..h
    }
}

/// `h` with `over_limit` set.
pub fn over(over_limit: OverLimit, h: Item) -> Item {
    Item { over_limit, ..h }
}

/// What a backend reports for one item.
pub fn key_outcome(passed: bool, count: u64, reset_ms: u64) -> KeyOutcome {
    KeyOutcome {
        passed,
        count,
        reset_ms,
    }
}

/// Decides `batch` as if the time were `now`; panics on a backend error.
pub async fn decide_at(l: &Arc<dyn Limiter>, batch: &[Item], now: u64) -> BatchOutcome {
    l.decide(batch, Some(now))
        .await
        .unwrap_or_else(|e| panic!("decide at {now} failed: {e}"))
}

/// [`decide_at`] on a task of its own, waited for `limit` at most: a decision that loops or
/// deadlocks fails the test instead of hanging it, even on the memory backend, whose decision
/// never yields (the task holds one worker; the waiting test runs on another, so the runtime
/// needs two or more).
pub async fn decide_at_within(
    l: &Arc<dyn Limiter>,
    batch: &[Item],
    now: u64,
    limit: std::time::Duration,
) -> BatchOutcome {
    let (l, owned) = (Arc::clone(l), batch.to_vec());
    let task = tokio::spawn(async move { decide_at(&l, &owned, now).await });
    match tokio::time::timeout(limit, task).await {
        Ok(outcome) => outcome.unwrap_or_else(|e| panic!("decide at {now}: {e}")),
        Err(_) => panic!("no decision within {limit:?} for {batch:?}"),
    }
}

/// The key's count in the window at `now`, via a check-only probe with an unreachable limit.
pub async fn count_at(l: &Arc<dyn Limiter>, key: &str, window_ms: u64, now: u64) -> u64 {
    let out = decide_at(
        l,
        &[log_item(key, u64::MAX, window_ms, 0, ItemKind::Consume)],
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

/// For property tests that run many traces on one Redis: a limiter on `server`, and a
/// function that empties the server (`FLUSHALL`) and returns the limiter, for each trace.
pub fn flushed_per_case(
    rt: &tokio::runtime::Runtime,
    server: &RedisServer,
) -> impl Fn() -> Arc<dyn Limiter> {
    let backend = rt.block_on(redis_limiter(server));
    let raw = rt.block_on(super::raw_connection(&server.url()));
    move || {
        rt.block_on(async {
            let _: () = redis::cmd("FLUSHALL")
                .query_async(&mut raw.clone())
                .await
                .expect("flushall");
        });
        backend.clone()
    }
}

/// A cluster limiter on `cluster`, connected.
pub async fn cluster_limiter(cluster: &RedisCluster) -> ClusterLimiter {
    ClusterLimiter::connect(&RedisOptions::new(cluster.url()))
        .await
        .unwrap_or_else(|e| panic!("connect to {}: {e}", cluster.url()))
}
