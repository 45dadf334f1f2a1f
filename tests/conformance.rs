//! One conformance suite for every limiter backend.
//!
//! Why: the trait's semantics (src/limiter/mod.rs) are only worth something if both backends
//! implement them identically. Each check below is written once against `Arc<dyn Limiter>` and
//! instantiated per backend by `conformance!`; the Redis instances each get their own
//! `redis-server` from `tests/common`. Checks pass explicit times to `decide` so window edges
//! are exact; only `real_clock` and `concurrent_single_key` use the backend's own clock.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice::limiter::redis::cluster::{key_slot, ClusterLimiter};
use sluice::limiter::redis::{RedisLimiter, RedisOptions};
use sluice::limiter::{Algorithm, BatchOutcome, Hit, HitKind, KeyOutcome, Limiter, LimiterError};

fn hit(key: &str, limit: u64, window_ms: u64, hits: u64, kind: HitKind) -> Hit {
    Hit {
        key: key.to_string(),
        limit,
        window_ms,
        hits,
        kind,
        algorithm: Algorithm::SlidingLog,
    }
}

/// A `Consume` hit on a 1 s window.
fn c(key: &str, limit: u64, hits: u64) -> Hit {
    hit(key, limit, 1000, hits, HitKind::Consume)
}

async fn at(l: &Arc<dyn Limiter>, batch: &[Hit], now: u64) -> BatchOutcome {
    l.decide(batch, Some(now))
        .await
        .unwrap_or_else(|e| panic!("decide at {now} failed: {e}"))
}

/// The key's count in the window at `now`, via a check-only probe with an unreachable limit.
async fn count_at(l: &Arc<dyn Limiter>, key: &str, window_ms: u64, now: u64) -> u64 {
    let out = at(
        l,
        &[hit(key, u64::MAX, window_ms, 0, HitKind::Consume)],
        now,
    )
    .await;
    out.items[0].count
}

fn ko(passed: bool, count: u64, reset_ms: u64) -> KeyOutcome {
    KeyOutcome {
        passed,
        count,
        reset_ms,
    }
}

// Base time for virtual clocks: realistic epoch milliseconds, so Redis members take the same
// shape as in production.
const T: u64 = 1_700_000_000_000;

async fn admits_up_to_limit_then_rejects(l: Arc<dyn Limiter>) {
    for i in 0..3 {
        let out = at(&l, &[c("k", 3, 1)], T + i).await;
        assert!(out.admitted, "hit {i}");
        assert_eq!(out.items[0], ko(true, i + 1, 1000 - i));
    }
    let out = at(&l, &[c("k", 3, 1)], T + 10).await;
    assert!(!out.admitted);
    assert_eq!(out.items[0], ko(false, 3, 990));
}

async fn window_edge_is_exact(l: Arc<dyn Limiter>) {
    assert!(at(&l, &[c("k", 1, 1)], T).await.admitted);
    assert_eq!(count_at(&l, "k", 1000, T + 999).await, 1);
    let out = at(&l, &[c("k", 1, 1)], T + 999).await;
    assert!(!out.admitted);
    assert_eq!(out.items[0].reset_ms, 1);
    // Gone at exactly t + window.
    assert_eq!(count_at(&l, "k", 1000, T + 1000).await, 0);
    let out = at(&l, &[c("k", 1, 1)], T + 1000).await;
    assert!(out.admitted);
    assert_eq!(out.items[0], ko(true, 1, 1000));
}

async fn sliding_not_fixed_window(l: Arc<dyn Limiter>) {
    // A fixed window aligned on 1000 would admit the second burst.
    assert!(at(&l, &[c("k", 5, 5)], 999).await.admitted);
    let out = at(&l, &[c("k", 5, 5)], 1001).await;
    assert!(!out.admitted);
    assert_eq!(out.items[0], ko(false, 5, 998));
    assert!(at(&l, &[c("k", 5, 5)], 1999).await.admitted);
}

async fn hits_addend_counts_each_hit(l: Arc<dyn Limiter>) {
    let out = at(&l, &[c("k", 10, 4)], T).await;
    assert_eq!(out.items[0], ko(true, 4, 1000));
    let out = at(&l, &[c("k", 10, 6)], T + 100).await;
    assert_eq!(out.items[0], ko(true, 10, 900));
    let out = at(&l, &[c("k", 10, 1)], T + 200).await;
    assert!(!out.admitted);
    assert_eq!(out.items[0].count, 10);
}

async fn hits_over_limit_rejected_quickly(l: Arc<dyn Limiter>) {
    let out = at(&l, &[c("k", 10, 11)], T).await;
    assert!(!out.admitted);
    assert_eq!(out.items[0], ko(false, 0, 1000));
    let started = Instant::now();
    let out = at(&l, &[c("k", 10, u64::MAX)], T).await;
    assert!(!out.admitted);
    let out = at(&l, &[c("k", u64::MAX - 1, u64::MAX)], T).await;
    assert!(!out.admitted);
    assert!(started.elapsed() < Duration::from_secs(1));
    assert_eq!(count_at(&l, "k", 1000, T).await, 0);
}

async fn large_hits_are_recorded_exactly(l: Arc<dyn Limiter>) {
    // More members than one ZADD chunk in the Redis script.
    let out = at(&l, &[c("k", 5000, 2500)], T).await;
    assert_eq!(out.items[0], ko(true, 2500, 1000));
    let out = at(&l, &[c("k", 5000, 2500)], T + 1).await;
    assert_eq!(out.items[0], ko(true, 5000, 999));
    assert!(!at(&l, &[c("k", 5000, 1)], T + 2).await.admitted);
}

async fn check_only_records_nothing(l: Arc<dyn Limiter>) {
    for _ in 0..5 {
        let out = at(&l, &[c("k", 2, 0)], T).await;
        assert!(out.admitted);
        assert_eq!(out.items[0], ko(true, 0, 1000));
    }
    assert!(at(&l, &[c("k", 2, 2)], T).await.admitted);
    let out = at(&l, &[c("k", 2, 0)], T + 1).await;
    assert!(!out.admitted, "a full key reports over even for a probe");
    assert_eq!(out.items[0], ko(false, 2, 999));
    assert_eq!(count_at(&l, "k", 1000, T + 1).await, 2);
    // One below the limit: the probe passes.
    assert!(at(&l, &[c("j", 2, 1)], T).await.admitted);
    assert!(at(&l, &[c("j", 2, 0)], T).await.admitted);
}

async fn all_or_nothing_across_keys(l: Arc<dyn Limiter>) {
    assert!(at(&l, &[c("full", 1, 1)], T).await.admitted);
    let out = at(&l, &[c("free", 5, 1), c("full", 1, 1)], T + 1).await;
    assert!(!out.admitted);
    assert_eq!(out.items, vec![ko(true, 0, 1000), ko(false, 1, 999)]);
    assert_eq!(count_at(&l, "free", 1000, T + 1).await, 0);
    assert_eq!(count_at(&l, "full", 1000, T + 1).await, 1);
    let out = at(&l, &[c("free", 5, 1), c("other", 5, 2)], T + 2).await;
    assert!(out.admitted);
    assert_eq!(out.items, vec![ko(true, 1, 1000), ko(true, 2, 1000)]);
}

async fn rejected_batch_changes_nothing(l: Arc<dyn Limiter>) {
    assert!(at(&l, &[c("a", 3, 2), c("b", 1, 1)], T).await.admitted);
    let batch = [
        c("a", 3, 1),
        hit("a", 3, 1000, 2, HitKind::Refund),
        hit("s", 9, 1000, 1, HitKind::Shadow),
        c("b", 1, 1),
    ];
    let out = at(&l, &batch, T + 5).await;
    assert!(!out.admitted);
    assert_eq!(
        out.items,
        vec![
            ko(true, 2, 995),
            ko(true, 2, 995),
            ko(true, 0, 1000),
            ko(false, 1, 995)
        ]
    );
    assert_eq!(count_at(&l, "a", 1000, T + 5).await, 2);
    assert_eq!(count_at(&l, "s", 1000, T + 5).await, 0);
}

async fn same_key_twice_is_cumulative(l: Arc<dyn Limiter>) {
    assert!(at(&l, &[c("k", 10, 4)], T).await.admitted);
    let out = at(&l, &[c("k", 10, 3), c("k", 10, 3)], T + 1).await;
    assert!(out.admitted);
    assert_eq!(out.items, vec![ko(true, 10, 999), ko(true, 10, 999)]);
    // Room for one, two items of one hit: the second sees the first's hit and fails, so the
    // whole batch records nothing.
    let out = at(&l, &[c("j", 1, 1), c("j", 1, 1)], T).await;
    assert!(!out.admitted);
    assert_eq!(out.items, vec![ko(true, 0, 1000), ko(false, 0, 1000)]);
    assert_eq!(count_at(&l, "j", 1000, T).await, 0);
}

async fn shadow_never_vetoes(l: Arc<dyn Limiter>) {
    let batch = [
        c("c", 5, 1),
        hit("s", 1, 1000, 2, HitKind::Shadow),
        hit("p", 5, 1000, 2, HitKind::Shadow),
    ];
    let out = at(&l, &batch, T).await;
    assert!(out.admitted);
    assert_eq!(
        out.items,
        vec![ko(true, 1, 1000), ko(false, 0, 1000), ko(true, 2, 1000)]
    );
    // A shadow item on a rejected batch records nothing even when it passed.
    let out = at(
        &l,
        &[hit("p", 5, 1000, 1, HitKind::Shadow), c("c", 1, 1)],
        T + 1,
    )
    .await;
    assert!(!out.admitted);
    assert_eq!(count_at(&l, "p", 1000, T + 1).await, 2);
}

/// quota_mode: an over-limit quota item fails the batch only when every quota item is over.
async fn quota_mode_needs_one_quota_item(l: Arc<dyn Limiter>) {
    let batch = |n: u64| {
        [
            hit("qa", 1, 1000, 1, HitKind::Quota),
            hit("qb", 2, 1000, 1, HitKind::Quota),
            hit("qc", 10, 1000, 1, HitKind::Consume),
        ]
        .map(|mut h| {
            h.hits = n;
            h
        })
    };
    // Both quota items pass: everything records.
    let out = at(&l, &batch(1), T).await;
    assert!(out.admitted);
    assert_eq!(
        out.items.iter().map(|i| i.count).collect::<Vec<_>>(),
        [1, 1, 1]
    );
    // `qa` is over, `qb` still has room: admitted; `qa` records nothing.
    let out = at(&l, &batch(1), T + 1).await;
    assert!(out.admitted);
    assert_eq!(
        out.items.iter().map(|i| i.passed).collect::<Vec<_>>(),
        [false, true, true]
    );
    assert_eq!(
        out.items.iter().map(|i| i.count).collect::<Vec<_>>(),
        [1, 2, 2]
    );
    // Both over: rejected, and the consume item records nothing either.
    let out = at(&l, &batch(1), T + 2).await;
    assert!(!out.admitted);
    assert_eq!(
        out.items.iter().map(|i| i.passed).collect::<Vec<_>>(),
        [false, false, true]
    );
    assert_eq!(count_at(&l, "qc", 1000, T + 2).await, 2);
    assert_eq!(count_at(&l, "qa", 1000, T + 2).await, 1);
    assert_eq!(count_at(&l, "qb", 1000, T + 2).await, 2);
}

async fn refund_removes_newest(l: Arc<dyn Limiter>) {
    assert!(at(&l, &[c("k", 10, 2)], T).await.admitted);
    assert!(at(&l, &[c("k", 10, 3)], T + 500).await.admitted);
    let out = at(&l, &[hit("k", 10, 1000, 4, HitKind::Refund)], T + 600).await;
    assert!(out.admitted);
    // The 3 at T+500 and one at T went; one entry at T is left.
    assert_eq!(out.items[0], ko(true, 1, 400));
    assert_eq!(count_at(&l, "k", 1000, T + 999).await, 1);
    assert_eq!(count_at(&l, "k", 1000, T + 1000).await, 0);
    // Refunding more than there is empties the key; refunds never reject.
    assert!(at(&l, &[c("r", 10, 2)], T).await.admitted);
    let out = at(&l, &[hit("r", 10, 1000, 99, HitKind::Refund)], T).await;
    assert_eq!(out.items[0], ko(true, 0, 1000));
    let out = at(&l, &[hit("none", 1, 1000, 5, HitKind::Refund)], T).await;
    assert!(out.admitted);
    assert_eq!(out.items[0], ko(true, 0, 1000));
}

async fn reset_ms_tracks_oldest_entry(l: Arc<dyn Limiter>) {
    assert_eq!(at(&l, &[c("k", 9, 1)], T).await.items[0].reset_ms, 1000);
    assert_eq!(
        at(&l, &[c("k", 9, 1)], T + 300).await.items[0].reset_ms,
        700
    );
    assert_eq!(
        at(&l, &[c("k", 9, 1)], T + 900).await.items[0].reset_ms,
        100
    );
    // The T entry left; the oldest is now the one at T+300.
    let out = at(&l, &[c("k", 9, 0)], T + 1000).await;
    assert_eq!(out.items[0], ko(true, 2, 300));
    let out = at(&l, &[hit("w", 9, 60_000, 1, HitKind::Consume)], T).await;
    assert_eq!(out.items[0].reset_ms, 60_000);
}

async fn clock_step_back_does_not_shorten_entries(l: Arc<dyn Limiter>) {
    assert!(at(&l, &[c("k", 5, 1)], T + 1000).await.admitted);
    // An earlier `now` (another instance's clock, a clock step) records at the newest time.
    assert!(at(&l, &[c("k", 5, 1)], T + 500).await.admitted);
    assert_eq!(count_at(&l, "k", 1000, T + 1999).await, 2);
    assert_eq!(count_at(&l, "k", 1000, T + 2000).await, 0);
}

async fn real_clock(l: Arc<dyn Limiter>) {
    let batch = [hit("rt", 2, 300, 1, HitKind::Consume)];
    let decide = |l: &Arc<dyn Limiter>| {
        let l = Arc::clone(l);
        let batch = batch.clone();
        async move { l.decide(&batch, None).await.expect("decide") }
    };
    assert!(decide(&l).await.admitted);
    assert!(decide(&l).await.admitted);
    let out = decide(&l).await;
    assert!(!out.admitted);
    assert_eq!(out.items[0].count, 2);
    assert!(out.items[0].reset_ms <= 300 && out.items[0].reset_ms > 0);
    tokio::time::sleep(Duration::from_millis(350)).await;
    let out = decide(&l).await;
    assert!(out.admitted);
    assert_eq!(out.items[0].count, 1);
}

async fn concurrent_single_key(l: Arc<dyn Limiter>) {
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..64 {
        let l = Arc::clone(&l);
        tasks.spawn(async move {
            let batch = [hit("hot", 10, 60_000, 1, HitKind::Consume)];
            l.decide(&batch, None).await.expect("decide").admitted
        });
    }
    let mut admitted = 0;
    while let Some(res) = tasks.join_next().await {
        admitted += usize::from(res.expect("task"));
    }
    assert_eq!(admitted, 10);
}

fn with(alg: Algorithm, h: Hit) -> Hit {
    Hit {
        algorithm: alg,
        ..h
    }
}

const ALGORITHMS: [Algorithm; 5] = [
    Algorithm::SlidingLog,
    Algorithm::QuantizedLog { quantum_ms: 100 },
    Algorithm::SlidingCounter,
    Algorithm::Gcra { burst: 3 },
    Algorithm::FixedWindow,
];

/// Every algorithm keeps the all-or-nothing promise when mixed in one batch: a batch rejected
/// by one key records nothing on any other (on the cluster, compensation takes each
/// algorithm's hits back exactly), and an admitted one records on all.
async fn algorithms_mix_all_or_nothing(l: Arc<dyn Limiter>) {
    let item = |alg: Algorithm, hits: u64| {
        with(
            alg,
            hit(
                &format!("mix-{}", alg.name()),
                3,
                1000,
                hits,
                HitKind::Consume,
            ),
        )
    };
    let probe = |alg: Algorithm| item(alg, 0);
    assert!(at(&l, &[c("blocker", 1, 1)], T).await.admitted);
    let mut batch: Vec<Hit> = ALGORITHMS.iter().map(|&a| item(a, 2)).collect();
    batch.push(c("blocker", 1, 1));
    let out = at(&l, &batch, T + 10).await;
    assert!(!out.admitted);
    for (alg, o) in ALGORITHMS.iter().zip(&out.items) {
        assert!(o.passed, "{}", alg.name());
    }
    for &alg in &ALGORITHMS {
        let out = at(&l, &[probe(alg)], T + 20).await;
        assert_eq!(
            out.items[0].count,
            0,
            "{} after a rejected batch",
            alg.name()
        );
    }
    batch.pop();
    let out = at(&l, &batch, T + 30).await;
    assert!(out.admitted);
    for (alg, o) in ALGORITHMS.iter().zip(&out.items) {
        assert_eq!(o.count, 2, "{}", alg.name());
    }
    // Capacity 3 everywhere: two more hits are over on every algorithm.
    for &alg in &ALGORITHMS {
        let out = at(&l, &[item(alg, 2)], T + 40).await;
        assert!(!out.admitted, "{}", alg.name());
        assert_eq!(out.items[0].count, 2, "{}", alg.name());
    }
}

/// Per-algorithm arithmetic the models define, checked on every backend.
async fn algorithm_specifics(l: Arc<dyn Limiter>) {
    // GCRA: 10 per second, burst 3: one token every 100 ms, exact retry-after.
    let g = |hits: u64| {
        with(
            Algorithm::Gcra { burst: 3 },
            hit("g", 10, 1000, hits, HitKind::Consume),
        )
    };
    let out = at(&l, &[g(3)], T).await;
    assert_eq!(out.items[0], ko(true, 3, 100));
    let out = at(&l, &[g(1)], T + 99).await;
    assert_eq!(out.items[0], ko(false, 3, 1));
    let out = at(&l, &[g(1)], T + 100).await;
    assert_eq!(out.items[0], ko(true, 3, 100));
    // Refunds give tokens back.
    let refund = with(
        Algorithm::Gcra { burst: 3 },
        hit("g", 10, 1000, 2, HitKind::Refund),
    );
    assert_eq!(at(&l, &[refund], T + 100).await.items[0].count, 1);

    // Fixed window: resets at the boundary, reports the window's end.
    let f = |hits: u64| {
        with(
            Algorithm::FixedWindow,
            hit("f", 2, 1000, hits, HitKind::Consume),
        )
    };
    assert_eq!(at(&l, &[f(2)], T + 900).await.items[0], ko(true, 2, 100));
    assert!(!at(&l, &[f(1)], T + 999).await.admitted);
    assert_eq!(at(&l, &[f(2)], T + 1000).await.items[0], ko(true, 2, 1000));

    // Sliding counter: 25% into the next window, 75% of the previous count still counts.
    let s = |hits: u64| {
        with(
            Algorithm::SlidingCounter,
            hit("s", 10, 1000, hits, HitKind::Consume),
        )
    };
    assert!(at(&l, &[s(10)], T + 500).await.admitted);
    let out = at(&l, &[s(0)], T + 1250).await;
    assert_eq!(out.items[0], ko(true, 8, 750));
    assert!(at(&l, &[s(2)], T + 1250).await.admitted);
    assert!(!at(&l, &[s(1)], T + 1250).await.admitted);

    // Quantized log: buckets of 100 ms; a bucket counts until start + quantum + window.
    let q = |hits: u64| {
        with(
            Algorithm::QuantizedLog { quantum_ms: 100 },
            hit("q", 4, 1000, hits, HitKind::Consume),
        )
    };
    assert!(at(&l, &[q(2)], T + 50).await.admitted);
    assert!(at(&l, &[q(2)], T + 199).await.admitted);
    assert_eq!(at(&l, &[q(0)], T + 1099).await.items[0], ko(false, 4, 1));
    assert_eq!(at(&l, &[q(0)], T + 1100).await.items[0], ko(true, 2, 100));
}

/// The edge table (docs/algorithms.md): `limit` single hits in the last `limit` ms before a
/// fixed-window boundary, `limit` more in the first ms after it; the most admitted within any
/// window of the configured length. The sliding log admits exactly the limit, the fixed window
/// twice the limit.
async fn edge_table(l: Arc<dyn Limiter>) {
    let window = 1000;
    for limit in [10u64, 100] {
        for alg in ALGORITHMS {
            let alg = match alg {
                Algorithm::Gcra { .. } => Algorithm::Gcra { burst: limit },
                other => other,
            };
            let key = format!("edge-{}-{limit}", alg.name());
            let boundary = T + 10 * window;
            let mut admitted = Vec::new();
            for i in 0..2 * limit {
                let now = boundary - limit + i;
                let out = at(
                    &l,
                    &[with(alg, hit(&key, limit, window, 1, HitKind::Consume))],
                    now,
                )
                .await;
                if out.admitted {
                    admitted.push(now);
                }
            }
            let most = admitted
                .iter()
                .map(|&start| {
                    admitted
                        .iter()
                        .filter(|&&t| t >= start && t < start + window)
                        .count()
                })
                .max()
                .unwrap_or(0) as u64;
            println!(
                "edge {:<16} limit {limit:>4}: {most:>4} admitted within one window ({} backend)",
                alg.name(),
                l.backend()
            );
            match alg {
                Algorithm::SlidingLog => assert_eq!(most, limit),
                Algorithm::FixedWindow => assert_eq!(most, 2 * limit),
                Algorithm::QuantizedLog { .. } => assert!(most <= limit),
                _ => assert!(most <= 2 * limit),
            }
        }
    }
}

/// Instantiates every check above for one backend: `$make` is an async block yielding
/// `(guard, Arc<dyn Limiter>)`, where the guard (e.g. a Redis server) must outlive the test.
macro_rules! conformance {
    ($backend:ident, $make:expr) => {
        mod $backend {
            use super::*;
            conformance!(@tests $make;
                admits_up_to_limit_then_rejects,
                window_edge_is_exact,
                sliding_not_fixed_window,
                hits_addend_counts_each_hit,
                hits_over_limit_rejected_quickly,
                large_hits_are_recorded_exactly,
                check_only_records_nothing,
                all_or_nothing_across_keys,
                rejected_batch_changes_nothing,
                same_key_twice_is_cumulative,
                shadow_never_vetoes,
                quota_mode_needs_one_quota_item,
                refund_removes_newest,
                reset_ms_tracks_oldest_entry,
                clock_step_back_does_not_shorten_entries,
                real_clock,
                concurrent_single_key,
                algorithms_mix_all_or_nothing,
                algorithm_specifics,
                edge_table
            );
        }
    };
    (@tests $make:expr; $($name:ident),*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $name() {
                let (_guard, limiter) = $make.await;
                super::$name(limiter).await;
            }
        )*
    };
}

conformance!(memory, async {
    let limiter: Arc<dyn Limiter> = Arc::new(sluice::limiter::memory::MemoryLimiter::new(
        Arc::new(sluice::limiter::SystemClock),
    ));
    ((), limiter)
});

async fn redis_limiter(server: &common::RedisServer) -> Arc<dyn Limiter> {
    let limiter = RedisLimiter::connect(&server.url(), 4)
        .await
        .unwrap_or_else(|e| panic!("connect to {}: {e}", server.url()));
    Arc::new(limiter)
}

conformance!(redis, async {
    let server = common::RedisServer::start();
    let limiter = redis_limiter(&server).await;
    (server, limiter)
});

// The same suite with every decision in a script call of its own (no batching).
conformance!(redis_unbatched, async {
    let server = common::RedisServer::start();
    let limiter: Arc<dyn Limiter> = Arc::new(
        RedisLimiter::open_batched(&server.url(), &RedisOptions::default(), 4, 1)
            .unwrap_or_else(|e| panic!("open {}: {e}", server.url())),
    );
    (server, limiter)
});

conformance!(redis_cluster, async {
    let cluster = common::RedisCluster::start();
    let limiter: Arc<dyn Limiter> = Arc::new(
        ClusterLimiter::connect(&cluster.url(), &RedisOptions::default())
            .await
            .unwrap_or_else(|e| panic!("connect to {}: {e}", cluster.url())),
    );
    (cluster, limiter)
});

/// Checks that only make sense for Redis: what the script leaves in the server, and failures.
mod redis_only {
    use super::*;
    use ::redis;
    use ::redis::AsyncCommands;

    async fn raw(server: &common::RedisServer) -> redis::aio::MultiplexedConnection {
        redis::Client::open(server.url())
            .expect("client")
            .get_multiplexed_async_connection()
            .await
            .expect("raw connection")
    }

    /// The script prints times as integers, so a clock that is not a whole number of ms is
    /// refused like a malformed one, before anything is written; a whole one is decided.
    #[tokio::test]
    async fn a_fractional_clock_is_refused_and_writes_nothing() {
        let server = common::RedisServer::start();
        let mut conn = raw(&server).await;
        let script = redis::Script::new(sluice::limiter::redis::script::SCRIPT);
        let call = |now: &str| {
            let mut call = script.prepare_invoke();
            call.arg(now)
                .key("clock-key")
                .arg(&["10", "1000", "1", "c", "l", "0"]);
            call
        };
        let refused: redis::RedisResult<redis::Value> =
            call(&format!("{T}.5")).invoke_async(&mut conn).await;
        let error = refused.expect_err("a fractional clock must be refused");
        // redis-rs splits the message at its first word: `"sluice:": bad now`.
        assert!(error.to_string().contains("bad now"), "{error}");
        let exists: bool = conn.exists("clock-key").await.expect("exists");
        assert!(!exists, "a refused call wrote the key");

        let reply: redis::Value = call(&T.to_string())
            .invoke_async(&mut conn)
            .await
            .expect("a whole clock is decided");
        let outcome = sluice::limiter::redis::script::decode_reply(&reply, 1).expect("reply");
        assert!(outcome.admitted);
        let score: Option<f64> = conn.zscore("clock-key", "1000000").await.expect("zscore");
        assert_eq!(
            score,
            Some(T as f64),
            "the entry's score is the clock, printed whole"
        );
    }

    /// Concurrent requests share script calls, and each is still decided on its own, in some
    /// order, all-or-nothing: 400 requests of two items (one of 5 keys with limit 10, and a
    /// shared key with limit 30) admit exactly 30, at most 10 per key, whatever the batches.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn batched_calls_decide_each_request_on_its_own() {
        let server = common::RedisServer::start();
        let l = Arc::new(
            RedisLimiter::open_batched(&server.url(), &RedisOptions::default(), 1, 16)
                .expect("open"),
        );
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..400u64 {
            let l = Arc::clone(&l);
            tasks.spawn(async move {
                let own = format!("k{}", i % 5);
                let batch = [
                    hit(&own, 10, 60_000, 1, HitKind::Consume),
                    hit("shared", 30, 60_000, 1, HitKind::Consume),
                ];
                let out = l.decide(&batch, None).await.expect("decide");
                // The outcome belongs to this request: its own items, its own counts.
                assert_eq!(out.items.len(), 2);
                assert_eq!(out.admitted, out.items.iter().all(|item| item.passed));
                (i % 5, out.admitted)
            });
        }
        let mut per_key = [0u64; 5];
        while let Some(res) = tasks.join_next().await {
            let (key, admitted) = res.expect("task");
            per_key[key as usize] += u64::from(admitted);
        }
        assert_eq!(per_key.iter().sum::<u64>(), 30, "{per_key:?}");
        assert!(per_key.iter().all(|&n| n <= 10), "{per_key:?}");
        let mut conn = raw(&server).await;
        let shared: u64 = conn.zcard("shared").await.expect("zcard");
        assert_eq!(shared, 30);
        for (k, &admitted) in per_key.iter().enumerate() {
            let n: u64 = conn.zcard(format!("k{k}")).await.expect("zcard");
            assert_eq!(n, admitted, "k{k}");
        }
        let stats = l.stats().expect("redis stats");
        assert_eq!(stats.script_decisions, 400);
        assert!(
            stats.script_calls < 400,
            "no call carried two requests: {} calls",
            stats.script_calls
        );
        println!(
            "400 requests in {} script calls (mean batch {:.1})",
            stats.script_calls,
            400.0 / stats.script_calls as f64
        );
    }

    /// The first readiness probe opens every connection and loads the script, so the first
    /// decisions pay neither a connect nor a NOSCRIPT round trip inside their deadline.
    #[tokio::test]
    async fn first_probe_warms_every_connection_and_the_script() {
        let server = common::RedisServer::start();
        let l = RedisLimiter::open(&server.url(), 4).expect("open");
        let cold = l.stats().expect("stats");
        assert_eq!((cold.connected, cold.script_loads), (0, 0));
        l.ping().await.expect("ping");
        let warm = l.stats().expect("stats");
        assert_eq!((warm.connected, warm.script_loads), (4, 1));
        let mut conn = raw(&server).await;
        let loaded: Vec<bool> = redis::cmd("SCRIPT")
            .arg("EXISTS")
            .arg(redis::Script::new(sluice::limiter::redis::script::SCRIPT).get_hash())
            .query_async(&mut conn)
            .await
            .expect("SCRIPT EXISTS");
        assert_eq!(loaded, [true]);
        // The first decision finds the script: no reload.
        l.decide(&[c("w", 1, 1)], None).await.expect("decide");
        assert_eq!(l.stats().expect("stats").script_loads, 1);
    }

    #[tokio::test]
    async fn keys_expire_within_the_window() {
        let server = common::RedisServer::start();
        let l = redis_limiter(&server).await;
        let mut conn = raw(&server).await;
        assert!(
            at(&l, &[hit("k", 5, 2000, 1, HitKind::Consume)], T)
                .await
                .admitted
        );
        let ttl: i64 = conn.pttl("k").await.expect("pttl");
        assert!(ttl > 0 && ttl <= 2000, "pttl {ttl}");
        // A later hit extends the TTL to the newest entry's exit: 1500 + 2000 - 1600.
        assert!(
            at(&l, &[hit("k", 5, 2000, 1, HitKind::Consume)], T + 1500)
                .await
                .admitted
        );
        let _ = at(&l, &[hit("k", 5, 2000, 0, HitKind::Consume)], T + 1600).await;
        let ttl: i64 = conn.pttl("k").await.expect("pttl");
        assert!(ttl > 1900 && ttl <= 2000, "pttl {ttl} after a later hit");
        // A rejected batch does not touch the TTL.
        assert!(
            !at(&l, &[hit("k", 2, 2000, 1, HitKind::Consume)], T + 1600)
                .await
                .admitted
        );
        let after: i64 = conn.pttl("k").await.expect("pttl");
        assert!(after <= ttl, "pttl grew from {ttl} to {after}");
        // Check-only batches create nothing.
        let _ = at(&l, &[hit("probe", 5, 2000, 0, HitKind::Consume)], T).await;
        let exists: bool = conn.exists("probe").await.expect("exists");
        assert!(!exists);
    }

    #[tokio::test]
    async fn members_are_short_increasing_integers() {
        let server = common::RedisServer::start();
        let l = redis_limiter(&server).await;
        let mut conn = raw(&server).await;
        // A tiny explicit clock (tests) and the real TIME (production) give the same shape.
        assert!(at(&l, &[c("small", 100, 3)], 5).await.admitted);
        assert!(at(&l, &[c("small", 100, 2)], 5).await.admitted);
        let real = [hit("real", 100, 60_000, 2, HitKind::Consume)];
        for _ in 0..2 {
            assert!(l.decide(&real, None).await.expect("decide").admitted);
        }
        for (key, expected) in [("small", 5), ("real", 4)] {
            let members: Vec<String> = conn.zrange(key, 0, -1).await.expect("zrange");
            assert_eq!(members.len(), expected, "{key}: {members:?}");
            let numbers: Vec<u64> = members
                .iter()
                .map(|m| {
                    assert_eq!(m.len(), 7, "member {m}");
                    m.parse().expect("integer member")
                })
                .collect();
            // A new key starts at the bottom of the 24-bit range, then +1 per hit.
            let expected_numbers: Vec<u64> = (1_000_000..).take(expected).collect();
            assert_eq!(numbers, expected_numbers, "{key}");
            let encoding: String = redis::cmd("OBJECT")
                .arg("ENCODING")
                .arg(key)
                .query_async(&mut conn)
                .await
                .expect("object encoding");
            assert_eq!(encoding, "listpack");
        }
    }

    async fn encoding(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> String {
        redis::cmd("OBJECT")
            .arg("ENCODING")
            .arg(key)
            .query_async(conn)
            .await
            .expect("object encoding")
    }

    /// The O(1) algorithms store one integer (which Redis keeps without an allocation).
    #[tokio::test]
    async fn counters_are_integers() {
        let server = common::RedisServer::start();
        let l = redis_limiter(&server).await;
        let mut conn = raw(&server).await;
        let gcra = Algorithm::Gcra { burst: 5 };
        // Width digit, counts padded to it, then the window index / the arrival time: GCRA holds
        // 2 × 1000 token-ms at a rate of 5 per ms, i.e. 400 ms past T + 250, remainder 0.
        for (key, alg, value) in [
            ("fw", Algorithm::FixedWindow, "121700000000"),
            ("sc", Algorithm::SlidingCounter, "1201700000000"),
            ("g", gcra, "101700000000650"),
        ] {
            assert!(at(&l, &[with(alg, c(key, 5, 2))], T + 250).await.admitted);
            let v: String = conn.get(key).await.expect("get");
            assert_eq!(v, value, "{key}");
            assert_eq!(encoding(&mut conn, key).await, "int", "{key}");
        }
    }

    /// One decision item straight through the script: (reply, or the error text).
    async fn eval_log(
        conn: &mut redis::aio::MultiplexedConnection,
        key: &str,
        now: u64,
        hits: u64,
        kind: &str,
    ) -> Result<Vec<i64>, String> {
        redis::Script::new(sluice::limiter::redis::script::SCRIPT)
            .key(key)
            .arg(now)
            .arg(1000)
            .arg(1000)
            .arg(hits)
            .arg(kind)
            .arg("l")
            .arg(0)
            .invoke_async(conn)
            .await
            .map_err(|e| e.to_string())
    }

    async fn undo_log(
        conn: &mut redis::aio::MultiplexedConnection,
        key: &str,
        token: i64,
        hits: u64,
    ) -> i64 {
        redis::Script::new(sluice::limiter::redis::script::COMPENSATE)
            .key(key)
            .arg("l")
            .arg(token)
            .arg(hits)
            .arg(1000)
            .invoke_async(conn)
            .await
            .expect("compensate")
    }

    async fn entries(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> Vec<(u64, u64)> {
        conn.zrange_withscores(key, 0, -1).await.expect("zrange")
    }

    /// Members wrap from 8388607 to 1000000 one ms later (so the newest stays on top), cluster
    /// compensation spares entries that reused popped members, and a key whose members would
    /// reach a live one fails before writing.
    #[tokio::test]
    async fn log_members_wrap_and_undo_checks_scores() {
        let server = common::RedisServer::start();
        let mut conn = raw(&server).await;

        let first = eval_log(&mut conn, "k", T, 2, "c").await.expect("add");
        assert_eq!(
            entries(&mut conn, "k").await,
            [(1_000_000, T), (1_000_001, T)]
        );
        assert!(eval_log(&mut conn, "k", T, 2, "r").await.is_ok());
        let second = eval_log(&mut conn, "k", T + 5, 2, "c").await.expect("add");
        assert_eq!(
            entries(&mut conn, "k").await,
            [(1_000_000, T + 5), (1_000_001, T + 5)]
        );
        assert_eq!(undo_log(&mut conn, "k", first[4], 2).await, 0, "not ours");
        assert_eq!(undo_log(&mut conn, "k", second[4], 2).await, 2);
        assert!(entries(&mut conn, "k").await.is_empty());

        let _: () = conn.zadd("w", 8_388_606, T - 5).await.expect("zadd");
        let added = eval_log(&mut conn, "w", T, 3, "c").await.expect("add");
        assert_eq!(
            entries(&mut conn, "w").await,
            [
                (8_388_606, T - 5),
                (8_388_607, T),
                (1_000_000, T + 1),
                (1_000_001, T + 1)
            ]
        );
        assert!(eval_log(&mut conn, "w", T, 1, "r").await.is_ok());
        let next = eval_log(&mut conn, "w", T + 2, 1, "c").await.expect("add");
        assert_eq!(entries(&mut conn, "w").await[3], (1_000_001, T + 2));
        // The first item's undo finds its members across the wrap; 1000001 is the later item's
        // now (a reuse within the same ms would be indistinguishable, see COMPENSATE).
        assert_eq!(undo_log(&mut conn, "w", added[4], 3).await, 2);
        assert_eq!(undo_log(&mut conn, "w", next[4], 1).await, 1);
        assert_eq!(entries(&mut conn, "w").await, [(8_388_606, T - 5)]);

        // Top member 8388607 at the same ms as the new hit: the wrapped one goes 1 ms later.
        let _: () = conn.zadd("e", 8_388_607, T).await.expect("zadd");
        assert!(eval_log(&mut conn, "e", T, 1, "c").await.is_ok());
        assert_eq!(
            entries(&mut conn, "e").await,
            [(8_388_607, T), (1_000_000, T + 1)]
        );

        // Live members spanning every number: the next one would collide.
        let _: () = conn
            .zadd_multiple("full", &[(T, 1_000_000), (T, 8_388_607)])
            .await
            .expect("zadd");
        let err = eval_log(&mut conn, "full", T, 1, "c")
            .await
            .expect_err("full");
        assert!(err.contains("sluice:"), "{err}");
        assert_eq!(entries(&mut conn, "full").await.len(), 2);
    }

    #[tokio::test]
    async fn script_survives_script_flush() {
        let server = common::RedisServer::start();
        let l = redis_limiter(&server).await;
        let mut conn = raw(&server).await;
        assert!(at(&l, &[c("k", 3, 1)], T).await.admitted);
        // A fresh server has no script yet: the first call loaded it.
        let loads = |l: &Arc<dyn Limiter>| l.stats().expect("redis stats").script_loads;
        assert_eq!(loads(&l), 1);
        assert!(at(&l, &[c("k", 3, 1)], T).await.admitted);
        assert_eq!(loads(&l), 1, "a loaded script is not loaded again");
        let _: () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(&mut conn)
            .await
            .expect("script flush");
        let out = at(&l, &[c("k", 3, 1)], T + 1).await;
        assert!(out.admitted);
        assert_eq!(out.items[0].count, 3);
        assert_eq!(loads(&l), 2, "NOSCRIPT reloads are counted");
        let stats = l.stats().unwrap();
        assert_eq!((stats.in_flight, stats.waiting), (0, 0));
        assert!(stats.connected >= 1 && stats.connected <= stats.connections);
    }

    #[tokio::test]
    async fn ping_follows_the_server() {
        let mut server = common::RedisServer::start();
        let l = redis_limiter(&server).await;
        l.ping().await.expect("ping while up");
        server.stop();
        assert!(l.ping().await.is_err(), "ping while stopped");
        match l.decide(&[c("k", 1, 1)], None).await {
            Err(LimiterError::Unavailable(_)) | Err(LimiterError::Timeout(_)) => {}
            other => panic!("decide while stopped: {other:?}"),
        }
        server.start_again();
        let deadline = Instant::now() + Duration::from_secs(5);
        while l.ping().await.is_err() {
            assert!(
                Instant::now() < deadline,
                "ping did not recover after restart"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let out = at(&l, &[c("k", 1, 1)], T).await;
        assert!(out.admitted);
    }

    #[tokio::test]
    async fn paused_server_times_out() {
        let server = common::RedisServer::start();
        let l = redis_limiter(&server).await;
        server.pause();
        let started = Instant::now();
        assert!(l.ping().await.is_err());
        assert!(started.elapsed() < Duration::from_secs(2));
        server.resume();
        let deadline = Instant::now() + Duration::from_secs(5);
        while l.ping().await.is_err() {
            assert!(
                Instant::now() < deadline,
                "ping did not recover after SIGCONT"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    #[tokio::test]
    async fn unreachable_at_connect_is_unavailable() {
        let mut server = common::RedisServer::start();
        let url = server.url();
        server.stop();
        match RedisLimiter::connect(&url, 2).await {
            Err(LimiterError::Unavailable(_)) => {}
            other => panic!("connect to a stopped server: {other:?}"),
        }
        // The lazy constructor starts anyway and reports through ping.
        let l = RedisLimiter::open(&url, 2).expect("open");
        assert!(l.ping().await.is_err());
    }
}

/// Differential check: random batch sequences give identical outcomes on both backends.
/// The memory backend's logic is the pure reference in `window.rs`, so this pins the Lua
/// transcription to it, including cases nobody thought to write by hand.
mod differential {
    use super::*;
    use ::redis;
    use proptest::prelude::*;
    use sluice::limiter::memory::MemoryLimiter;
    use sluice::limiter::SystemClock;

    /// Each key has one algorithm, as the engine's keys do (the algorithm is part of the key).
    fn algorithm_of(key: &str, burst: u64) -> Algorithm {
        match key {
            "q" => Algorithm::QuantizedLog { quantum_ms: 100 },
            "s" => Algorithm::SlidingCounter,
            "g" => Algorithm::Gcra { burst },
            "f" => Algorithm::FixedWindow,
            _ => Algorithm::SlidingLog,
        }
    }

    /// The keys of the generated traces; see [`algorithm_of`].
    const KEYS: [&str; 7] = ["a", "b", "c", "q", "s", "g", "f"];

    fn arb_hit() -> impl Strategy<Value = Hit> {
        let kind = prop_oneof![
            4 => Just(HitKind::Consume),
            2 => Just(HitKind::Shadow),
            1 => Just(HitKind::Refund),
            2 => Just(HitKind::Quota),
        ];
        let hits = prop_oneof![8 => 0u64..4, 1 => Just(u64::MAX), 1 => 5u64..2000];
        (
            prop::sample::select(KEYS.to_vec()),
            0u64..6,
            hits,
            kind,
            0u64..6,
        )
            .prop_map(|(key, limit, hits, kind, burst)| Hit {
                algorithm: algorithm_of(key, burst),
                ..hit(key, limit, 1000, hits, kind)
            })
    }

    /// (time step in ms, may be negative: clocks of other instances lag; batch)
    fn arb_steps() -> impl Strategy<Value = Vec<(i64, Vec<Hit>)>> {
        prop::collection::vec(
            (-100i64..700, prop::collection::vec(arb_hit(), 0..4)),
            1..12,
        )
    }

    type Steps = Vec<(i64, Vec<Hit>)>;

    /// [`arb_steps`] without the cases in which the cluster backend cannot act like one script
    /// (docs/algorithms.md, "Redis Cluster"), each narrowed as little as it takes:
    ///
    /// 1. In a batch spanning slots, a refund item before a recording item of the same key. One
    ///    script (memory, standalone Redis, a single-slot batch) applies the refund to what the
    ///    key held before, then records; across slots the refund waits until every slot admitted
    ///    (it could not be taken back exactly if another slot rejected), so it takes back the
    ///    newest entries, the ones this batch just recorded: which entries remain differs, and
    ///    the count too when the refund exceeds what the key held. Such batches get their refund
    ///    items moved to the end, where both orders agree.
    /// 2. A fixed-window, sliding-counter or GCRA key touched at a `now` before a batch spanning
    ///    slots that recorded on it. If that batch was rejected, its slot had already stored the
    ///    key brought to that batch's `now` (window rotated, GCRA refill applied) and the
    ///    compensation only takes the hits back: the same state later, but not earlier, where one
    ///    script (which stores nothing on a rejection) still sees the old window or less refill.
    ///    Such a batch runs at that later time instead.
    /// 3. GCRA items of one key with different rates (`limit`) in one trace, for the same reason:
    ///    the refill up to the compensated batch's `now` was applied at that batch's rate, where
    ///    one script applies the next item's rate to the whole interval. Here a trace keeps the
    ///    first rate of its GCRA key (production keys keep their rate until a reload changes it).
    fn arb_steps_cluster() -> impl Strategy<Value = Steps> {
        arb_steps().prop_map(|steps| {
            let o1 = |h: &Hit| {
                matches!(
                    h.algorithm,
                    Algorithm::FixedWindow | Algorithm::SlidingCounter | Algorithm::Gcra { .. }
                )
            };
            let records = |h: &Hit| h.kind != HitKind::Refund && h.hits > 0;
            let gcra_rate = steps
                .iter()
                .flat_map(|(_, b)| b)
                .find(|h| matches!(h.algorithm, Algorithm::Gcra { .. }))
                .map(|h| h.limit);
            // Latest `now` of a batch spanning slots that recorded on each O(1) key (rule 2).
            let mut settled: std::collections::HashMap<String, u64> = Default::default();
            let (mut now, mut shifted) = (T, T);
            let mut out = Vec::with_capacity(steps.len());
            for (step, mut batch) in steps {
                now = now.saturating_add_signed(step);
                let spans_slots = batch
                    .iter()
                    .any(|h| key_slot(&h.key) != key_slot(&batch[0].key));
                if spans_slots {
                    // Rule 1. Stable: the order among refunds and among the rest is kept.
                    batch.sort_by_key(|h| h.kind == HitKind::Refund);
                }
                for h in batch.iter_mut() {
                    if let (Algorithm::Gcra { .. }, Some(rate)) = (h.algorithm, gcra_rate) {
                        h.limit = rate; // rule 3
                    }
                }
                let at = batch
                    .iter()
                    .filter_map(|h| settled.get(&h.key))
                    .fold(now, |at, &s| at.max(s)); // rule 2
                if spans_slots {
                    for h in batch.iter().filter(|h| o1(h) && records(h)) {
                        settled.insert(h.key.clone(), at);
                    }
                }
                out.push((at as i64 - shifted as i64, batch));
                shifted = at;
            }
            out
        })
    }

    /// Feeds each generated trace to a fresh memory limiter and to `backend` (emptied by `flush`
    /// first) at the same virtual times, and requires the same outcome for every batch.
    fn agrees_with_memory(
        rt: &tokio::runtime::Runtime,
        backend: &Arc<dyn Limiter>,
        flush: impl Fn(),
        steps: impl Strategy<Value = Steps>,
        cases: u32,
    ) {
        let config = ProptestConfig {
            cases,
            ..ProptestConfig::default()
        };
        proptest!(config, |(steps in steps)| {
            flush();
            let memory: Arc<dyn Limiter> = Arc::new(MemoryLimiter::new(Arc::new(SystemClock)));
            let mut now = T;
            for (step, batch) in steps {
                now = now.saturating_add_signed(step);
                let m = rt.block_on(at(&memory, &batch, now));
                let r = rt.block_on(at(backend, &batch, now));
                prop_assert_eq!(m, r, "batch {:?} at {}", batch, now);
            }
        });
    }

    async fn flushall(conn: &redis::aio::MultiplexedConnection) {
        let _: () = redis::cmd("FLUSHALL")
            .query_async(&mut conn.clone())
            .await
            .expect("flushall");
    }

    async fn raw(url: String) -> redis::aio::MultiplexedConnection {
        redis::Client::open(url)
            .expect("client")
            .get_multiplexed_async_connection()
            .await
            .expect("raw connection")
    }

    #[test]
    fn memory_and_redis_agree() {
        let server = common::RedisServer::start();
        let rt = tokio::runtime::Runtime::new().expect("runtime");
        let redis_limiter = rt.block_on(redis_limiter(&server));
        let raw = rt.block_on(raw(server.url()));
        let flush = || rt.block_on(flushall(&raw));
        agrees_with_memory(&rt, &redis_limiter, flush, arb_steps(), 500);
    }

    /// The six ARGV values of an item, as the Redis limiter sends them (script.rs documents them).
    fn item_argv(h: &Hit) -> Vec<String> {
        use sluice::limiter::redis::script::{
            KIND_CONSUME, KIND_QUOTA, KIND_REFUND, KIND_SHADOW, MAX_EXACT,
        };
        let kind = match h.kind {
            HitKind::Consume => KIND_CONSUME,
            HitKind::Shadow => KIND_SHADOW,
            HitKind::Refund => KIND_REFUND,
            HitKind::Quota => KIND_QUOTA,
        };
        vec![
            h.limit.min(MAX_EXACT - 1).to_string(),
            h.window_ms.min(MAX_EXACT).to_string(),
            h.hits.min(MAX_EXACT).to_string(),
            kind.to_string(),
            h.algorithm.code().to_string(),
            h.algorithm.param().min(MAX_EXACT - 1).to_string(),
        ]
    }

    /// A batched call (several requests in one `EVALSHA`, sharing one `now`) answers every
    /// request exactly as separate calls in the same order do: same replies, undo tokens
    /// included, on every algorithm. Database 0 gets the batched calls, database 1 the separate
    /// ones, each round of requests at its own time.
    #[test]
    fn batched_call_equals_separate_calls() {
        use sluice::limiter::redis::script::SCRIPT;
        let server = common::RedisServer::start();
        let rt = tokio::runtime::Runtime::new().expect("runtime");
        let batched_db = rt.block_on(raw(server.url()));
        let separate_db = rt.block_on(raw(format!("{}/1", server.url())));
        let script = redis::Script::new(SCRIPT);
        let rounds = prop::collection::vec(
            (
                0i64..700,
                prop::collection::vec(prop::collection::vec(arb_hit(), 1..4), 1..6),
            ),
            1..8,
        );
        let config = ProptestConfig {
            cases: 300,
            ..ProptestConfig::default()
        };
        proptest!(config, |(rounds in rounds)| {
            rt.block_on(flushall(&batched_db));
            let mut now = T;
            for (step, requests) in rounds {
                now += step as u64;
                let mut call = redis::cmd("EVALSHA");
                call.arg(script.get_hash())
                    .arg(requests.iter().map(Vec::len).sum::<usize>());
                for hit in requests.iter().flatten() {
                    call.arg(&hit.key);
                }
                call.arg("b").arg(now).arg(requests.len());
                for request in &requests {
                    call.arg(request.len());
                }
                for hit in requests.iter().flatten() {
                    call.arg(item_argv(hit));
                }
                let batched: redis::Value = rt.block_on(async {
                    script.load_async(&mut batched_db.clone()).await.expect("load");
                    call.query_async(&mut batched_db.clone()).await.expect("batched call")
                });
                let redis::Value::Array(batched) = batched else {
                    panic!("batched reply is not an array: {batched:?}");
                };
                prop_assert_eq!(batched.len(), requests.len());
                for (request, batched_reply) in requests.iter().zip(batched) {
                    let mut single = script.prepare_invoke();
                    single.arg(now);
                    for hit in request {
                        single.key(&hit.key).arg(item_argv(hit));
                    }
                    let separate: redis::Value = rt
                        .block_on(single.invoke_async(&mut separate_db.clone()))
                        .expect("separate call");
                    prop_assert_eq!(&batched_reply, &separate, "request {:?} at {}", request, now);
                }
            }
        });
    }

    /// The same traces against a 3-primary cluster. Every key of the generator hashes to its own
    /// slot and the slots spread over all three primaries, so any batch with two keys is a
    /// multi-slot request: parallel per-slot scripts, and compensation when one slot rejects.
    #[test]
    fn memory_and_redis_cluster_agree() {
        let cluster = common::RedisCluster::start();
        let slots: std::collections::BTreeSet<u16> = KEYS.iter().map(|k| key_slot(k)).collect();
        assert_eq!(slots.len(), KEYS.len(), "every key in its own slot");
        let owners: std::collections::BTreeSet<usize> =
            slots.iter().map(|&s| cluster.owner(s)).collect();
        assert_eq!(owners.len(), 3, "keys on every primary");

        let rt = tokio::runtime::Runtime::new().expect("runtime");
        let limiter: Arc<dyn Limiter> = Arc::new(
            rt.block_on(ClusterLimiter::connect(
                &cluster.url(),
                &RedisOptions::default(),
            ))
            .unwrap_or_else(|e| panic!("connect to {}: {e}", cluster.url())),
        );
        let nodes: Vec<_> = cluster
            .nodes
            .iter()
            .map(|n| rt.block_on(raw(n.url())))
            .collect();
        let flush = || {
            rt.block_on(async {
                for node in &nodes {
                    flushall(node).await;
                }
            })
        };
        agrees_with_memory(&rt, &limiter, flush, arb_steps_cluster(), 1000);
    }
}

/// Rough cost of one decision; not a benchmark suite, just a figure to sanity-check the design
/// (one round trip per batch, no checkout ping). Run with `--ignored --nocapture` in release.
mod measure {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    #[ignore]
    async fn redis_decision_cost() {
        let server = common::RedisServer::start();
        let l = redis_limiter(&server).await;
        let batch = |i: u64| {
            vec![
                hit(
                    &format!("k{}", i % 1000),
                    1_000_000,
                    60_000,
                    1,
                    HitKind::Consume,
                ),
                hit("global", 1_000_000, 60_000, 1, HitKind::Consume),
            ]
        };
        let n = 5000u64;
        let started = Instant::now();
        for i in 0..n {
            l.decide(&batch(i), None).await.expect("decide");
        }
        let sequential = started.elapsed() / n as u32;

        let tasks = 64u64;
        let started = Instant::now();
        let mut set = tokio::task::JoinSet::new();
        for t in 0..tasks {
            let l = Arc::clone(&l);
            set.spawn(async move {
                for i in 0..n / 10 {
                    l.decide(&batch(t * 1000 + i), None).await.expect("decide");
                }
            });
        }
        while let Some(res) = set.join_next().await {
            res.expect("task");
        }
        let total = tasks * (n / 10);
        let rate = total as f64 / started.elapsed().as_secs_f64();
        println!("redis: sequential {sequential:?}/decision (2 keys); {tasks} tasks: {rate:.0} decisions/s");
    }
}
