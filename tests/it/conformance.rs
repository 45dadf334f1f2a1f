//! One conformance suite for every limiter backend.
//!
//! Why: the trait's semantics (src/limiter/mod.rs) are only worth something if every backend
//! implements them identically. Each check below is written once against `Arc<dyn Limiter>` and
//! instantiated per backend by `conformance!`: memory, standalone Redis (batched and not) and a
//! 3-primary Redis Cluster, each Redis instance on its own `redis-server` from `helpers`;
//! and memory, Redis and Redis Cluster again behind the local rejection cache.
//! Checks pass explicit times to `decide` so window edges are exact; only `real_clock` and
//! `concurrent_single_key` use the backend's own clock. The other suites of the limiter:
//! `differential` (random traces, every backend against the memory reference) and
//! `redis_backend` (what the script leaves in Redis, and failures).

use crate::helpers;

use std::sync::Arc;
use std::time::{Duration, Instant};

use helpers::limiter::{
    T, cluster_limiter, consume_hits, count_at, decide_at, decide_at_within, key_outcome, log_item,
    over, redis_limiter, with,
};
use sluice::limiter::cache::{self, MonotonicClock, RejectionCache};
use sluice::limiter::redis::{RedisLimiter, RedisOptions};
use sluice::limiter::{Algorithm, Item, ItemKind, Limiter, MAX_COUNT, OverLimit};

async fn admits_up_to_limit_then_rejects(l: Arc<dyn Limiter>) {
    for i in 0..3 {
        let out = decide_at(&l, &[consume_hits("k", 3, 1)], T + i).await;
        assert!(out.admitted, "hit {i}");
        assert_eq!(out.items[0], key_outcome(true, i + 1, 1000 - i));
    }
    let out = decide_at(&l, &[consume_hits("k", 3, 1)], T + 10).await;
    assert!(!out.admitted);
    assert_eq!(out.items[0], key_outcome(false, 3, 990));
}

async fn window_edge_is_exact(l: Arc<dyn Limiter>) {
    assert!(decide_at(&l, &[consume_hits("k", 1, 1)], T).await.admitted);
    assert_eq!(count_at(&l, "k", 1000, T + 999).await, 1);
    let out = decide_at(&l, &[consume_hits("k", 1, 1)], T + 999).await;
    assert!(!out.admitted);
    assert_eq!(out.items[0].reset_ms, 1);
    // Gone at exactly t + window.
    assert_eq!(count_at(&l, "k", 1000, T + 1000).await, 0);
    let out = decide_at(&l, &[consume_hits("k", 1, 1)], T + 1000).await;
    assert!(out.admitted);
    assert_eq!(out.items[0], key_outcome(true, 1, 1000));
}

async fn sliding_not_fixed_window(l: Arc<dyn Limiter>) {
    // A fixed window aligned on 1000 would admit the second burst.
    assert!(
        decide_at(&l, &[consume_hits("k", 5, 5)], 999)
            .await
            .admitted
    );
    let out = decide_at(&l, &[consume_hits("k", 5, 5)], 1001).await;
    assert!(!out.admitted);
    assert_eq!(out.items[0], key_outcome(false, 5, 998));
    assert!(
        decide_at(&l, &[consume_hits("k", 5, 5)], 1999)
            .await
            .admitted
    );
}

async fn hits_addend_counts_each_hit(l: Arc<dyn Limiter>) {
    let out = decide_at(&l, &[consume_hits("k", 10, 4)], T).await;
    assert_eq!(out.items[0], key_outcome(true, 4, 1000));
    let out = decide_at(&l, &[consume_hits("k", 10, 6)], T + 100).await;
    assert_eq!(out.items[0], key_outcome(true, 10, 900));
    let out = decide_at(&l, &[consume_hits("k", 10, 1)], T + 200).await;
    assert!(!out.admitted);
    assert_eq!(out.items[0].count, 10);
}

/// Huge costs are decided at once: each call is waited for 2 s at most (a loop over the hits
/// would take ages; one call takes milliseconds, even on a loaded 2-core machine).
async fn hits_over_limit_rejected_quickly(l: Arc<dyn Limiter>) {
    let quick = |batch: Vec<Item>, now| {
        let l = Arc::clone(&l);
        async move { decide_at_within(&l, &batch, now, Duration::from_secs(2)).await }
    };
    let refuse = |limit, hits| over(OverLimit::Refuse, consume_hits("k", limit, hits));
    let out = quick(vec![refuse(10, 11)], T).await;
    assert!(!out.admitted);
    assert_eq!(out.items[0], key_outcome(false, 0, 1000));
    let out = quick(vec![refuse(10, u64::MAX)], T).await;
    assert!(!out.admitted);
    let out = quick(vec![refuse(u64::MAX - 1, u64::MAX)], T).await;
    assert!(!out.admitted);
    assert_eq!(count_at(&l, "k", 1000, T).await, 0);
    // Filled or recorded, a huge cost is one entry: as quick, and cut at MAX_COUNT.
    let out = quick(vec![consume_hits("f", 10, u64::MAX)], T).await;
    assert_eq!(out.items[0], key_outcome(false, 10, 1000));
    let out = quick(
        vec![over(OverLimit::Record, consume_hits("r", 10, u64::MAX))],
        T,
    )
    .await;
    assert_eq!(out.items[0], key_outcome(false, MAX_COUNT, 1000));
    let out = quick(
        vec![over(OverLimit::Record, consume_hits("r", 10, 5))],
        T + 1,
    )
    .await;
    assert_eq!(out.items[0].count, MAX_COUNT);
    // A huge refund of a huge log is as quick.
    let out = quick(
        vec![log_item("r", 10, 1000, u64::MAX, ItemKind::Refund)],
        T + 2,
    )
    .await;
    assert_eq!(out.items[0], key_outcome(true, 0, 1000));
}

async fn large_hits_are_recorded_exactly(l: Arc<dyn Limiter>) {
    // More members than one ZADD chunk in the Redis script.
    let out = decide_at(&l, &[consume_hits("k", 5000, 2500)], T).await;
    assert_eq!(out.items[0], key_outcome(true, 2500, 1000));
    let out = decide_at(&l, &[consume_hits("k", 5000, 2500)], T + 1).await;
    assert_eq!(out.items[0], key_outcome(true, 5000, 999));
    assert!(
        !decide_at(&l, &[consume_hits("k", 5000, 1)], T + 2)
            .await
            .admitted
    );
}

async fn check_only_records_nothing(l: Arc<dyn Limiter>) {
    for _ in 0..5 {
        let out = decide_at(&l, &[consume_hits("k", 2, 0)], T).await;
        assert!(out.admitted);
        assert_eq!(out.items[0], key_outcome(true, 0, 1000));
    }
    assert!(decide_at(&l, &[consume_hits("k", 2, 2)], T).await.admitted);
    let out = decide_at(&l, &[consume_hits("k", 2, 0)], T + 1).await;
    assert!(!out.admitted, "a full key reports over even for a probe");
    assert_eq!(out.items[0], key_outcome(false, 2, 999));
    assert_eq!(count_at(&l, "k", 1000, T + 1).await, 2);
    // One below the limit: the probe passes.
    assert!(decide_at(&l, &[consume_hits("j", 2, 1)], T).await.admitted);
    assert!(decide_at(&l, &[consume_hits("j", 2, 0)], T).await.admitted);
}

async fn all_or_nothing_across_keys(l: Arc<dyn Limiter>) {
    assert!(
        decide_at(&l, &[consume_hits("full", 1, 1)], T)
            .await
            .admitted
    );
    let out = decide_at(
        &l,
        &[consume_hits("free", 5, 1), consume_hits("full", 1, 1)],
        T + 1,
    )
    .await;
    assert!(!out.admitted);
    assert_eq!(
        out.items,
        vec![key_outcome(true, 0, 1000), key_outcome(false, 1, 999)]
    );
    assert_eq!(count_at(&l, "free", 1000, T + 1).await, 0);
    assert_eq!(count_at(&l, "full", 1000, T + 1).await, 1);
    let out = decide_at(
        &l,
        &[consume_hits("free", 5, 1), consume_hits("other", 5, 2)],
        T + 2,
    )
    .await;
    assert!(out.admitted);
    assert_eq!(
        out.items,
        vec![key_outcome(true, 1, 1000), key_outcome(true, 2, 1000)]
    );
}

async fn rejected_batch_changes_nothing(l: Arc<dyn Limiter>) {
    assert!(
        decide_at(&l, &[consume_hits("a", 3, 2), consume_hits("b", 1, 1)], T)
            .await
            .admitted
    );
    let batch = [
        consume_hits("a", 3, 1),
        log_item("a", 3, 1000, 2, ItemKind::Refund),
        log_item("s", 9, 1000, 1, ItemKind::Shadow),
        consume_hits("b", 1, 1),
    ];
    let out = decide_at(&l, &batch, T + 5).await;
    assert!(!out.admitted);
    assert_eq!(
        out.items,
        vec![
            key_outcome(true, 2, 995),
            key_outcome(true, 2, 995),
            key_outcome(true, 0, 1000),
            key_outcome(false, 1, 995)
        ]
    );
    assert_eq!(count_at(&l, "a", 1000, T + 5).await, 2);
    assert_eq!(count_at(&l, "s", 1000, T + 5).await, 0);
}

async fn same_key_twice_is_cumulative(l: Arc<dyn Limiter>) {
    assert!(decide_at(&l, &[consume_hits("k", 10, 4)], T).await.admitted);
    let out = decide_at(
        &l,
        &[consume_hits("k", 10, 3), consume_hits("k", 10, 3)],
        T + 1,
    )
    .await;
    assert!(out.admitted);
    assert_eq!(
        out.items,
        vec![key_outcome(true, 10, 999), key_outcome(true, 10, 999)]
    );
    // Room for one, two items of one hit: the second sees the first's hit and fails, so the
    // batch is rejected. Refused, it records nothing.
    let refuse = |key| over(OverLimit::Refuse, consume_hits(key, 1, 1));
    let out = decide_at(&l, &[refuse("j"), refuse("j")], T).await;
    assert!(!out.admitted);
    assert_eq!(
        out.items,
        vec![key_outcome(true, 0, 1000), key_outcome(false, 0, 1000)]
    );
    assert_eq!(count_at(&l, "j", 1000, T).await, 0);
    // Filled: the first fitted and is dropped with the verdict, so the second's cost fits.
    let out = decide_at(&l, &[consume_hits("i", 1, 1), consume_hits("i", 1, 1)], T).await;
    assert!(!out.admitted);
    assert_eq!(
        out.items,
        vec![key_outcome(true, 1, 1000), key_outcome(false, 1, 1000)]
    );
}

async fn shadow_never_vetoes(l: Arc<dyn Limiter>) {
    let batch = [
        consume_hits("c", 5, 1),
        over(
            OverLimit::Refuse,
            log_item("s", 1, 1000, 2, ItemKind::Shadow),
        ),
        log_item("p", 5, 1000, 2, ItemKind::Shadow),
        log_item("f", 1, 1000, 2, ItemKind::Shadow),
    ];
    let out = decide_at(&l, &batch, T).await;
    assert!(out.admitted);
    // Over its limit, a shadow item records what enforcement would: nothing when refused, its
    // key filled by default.
    assert_eq!(
        out.items,
        vec![
            key_outcome(true, 1, 1000),
            key_outcome(false, 0, 1000),
            key_outcome(true, 2, 1000),
            key_outcome(false, 1, 1000)
        ]
    );
    // A shadow item on a rejected batch records nothing even when it passed.
    let out = decide_at(
        &l,
        &[
            log_item("p", 5, 1000, 1, ItemKind::Shadow),
            consume_hits("c", 1, 1),
        ],
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
            log_item("qa", 1, 1000, 1, ItemKind::Quota),
            log_item("qb", 2, 1000, 1, ItemKind::Quota),
            log_item("qc", 10, 1000, 1, ItemKind::Consume),
        ]
        .map(|mut h| {
            h.hits = n;
            h
        })
    };
    // Both quota items pass: everything records.
    let out = decide_at(&l, &batch(1), T).await;
    assert!(out.admitted);
    assert_eq!(
        out.items.iter().map(|i| i.count).collect::<Vec<_>>(),
        [1, 1, 1]
    );
    // `qa` is over, `qb` still has room: admitted; `qa` records nothing.
    let out = decide_at(&l, &batch(1), T + 1).await;
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
    let out = decide_at(&l, &batch(1), T + 2).await;
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
    assert!(decide_at(&l, &[consume_hits("k", 10, 2)], T).await.admitted);
    assert!(
        decide_at(&l, &[consume_hits("k", 10, 3)], T + 500)
            .await
            .admitted
    );
    let out = decide_at(&l, &[log_item("k", 10, 1000, 4, ItemKind::Refund)], T + 600).await;
    assert!(out.admitted);
    // The 3 at T+500 and one at T went; one entry at T is left.
    assert_eq!(out.items[0], key_outcome(true, 1, 400));
    assert_eq!(count_at(&l, "k", 1000, T + 999).await, 1);
    assert_eq!(count_at(&l, "k", 1000, T + 1000).await, 0);
    // Refunding more than there is empties the key; refunds never reject.
    assert!(decide_at(&l, &[consume_hits("r", 10, 2)], T).await.admitted);
    let out = decide_at(&l, &[log_item("r", 10, 1000, 99, ItemKind::Refund)], T).await;
    assert_eq!(out.items[0], key_outcome(true, 0, 1000));
    let out = decide_at(&l, &[log_item("none", 1, 1000, 5, ItemKind::Refund)], T).await;
    assert!(out.admitted);
    assert_eq!(out.items[0], key_outcome(true, 0, 1000));
}

async fn reset_ms_tracks_oldest_entry(l: Arc<dyn Limiter>) {
    assert_eq!(
        decide_at(&l, &[consume_hits("k", 9, 1)], T).await.items[0].reset_ms,
        1000
    );
    assert_eq!(
        decide_at(&l, &[consume_hits("k", 9, 1)], T + 300)
            .await
            .items[0]
            .reset_ms,
        700
    );
    assert_eq!(
        decide_at(&l, &[consume_hits("k", 9, 1)], T + 900)
            .await
            .items[0]
            .reset_ms,
        100
    );
    // The T entry left; the oldest is now the one at T+300.
    let out = decide_at(&l, &[consume_hits("k", 9, 0)], T + 1000).await;
    assert_eq!(out.items[0], key_outcome(true, 2, 300));
    let out = decide_at(&l, &[log_item("w", 9, 60_000, 1, ItemKind::Consume)], T).await;
    assert_eq!(out.items[0].reset_ms, 60_000);
}

async fn clock_step_back_does_not_shorten_entries(l: Arc<dyn Limiter>) {
    assert!(
        decide_at(&l, &[consume_hits("k", 5, 1)], T + 1000)
            .await
            .admitted
    );
    // An earlier `now` (another instance's clock, a clock step) records at the newest time.
    assert!(
        decide_at(&l, &[consume_hits("k", 5, 1)], T + 500)
            .await
            .admitted
    );
    assert_eq!(count_at(&l, "k", 1000, T + 1999).await, 2);
    assert_eq!(count_at(&l, "k", 1000, T + 2000).await, 0);
}

/// A held item (`hold_ms`, the Rate Limit Quota Service's reservations): checked like any item,
/// its entry dated `hold_ms` after `now`, so it counts from the decision until `hold_ms +
/// window` later; entries after it are dated at its time; a hold on another algorithm is
/// refused with nothing recorded.
async fn held_items_count_until_hold_plus_window(l: Arc<dyn Limiter>) {
    let held = |hits, hold_ms| Item {
        hold_ms,
        over_limit: OverLimit::Refuse,
        ..log_item("r", 10, 1000, hits, ItemKind::Consume)
    };
    // Counted at once, until T + 500 + 1000.
    let out = decide_at(&l, &[held(6, 500)], T).await;
    assert_eq!(
        (out.admitted, out.items[0]),
        (true, key_outcome(true, 6, 1500))
    );
    // A reservation that does not fit records nothing.
    let out = decide_at(&l, &[held(5, 500)], T + 5).await;
    assert_eq!(
        (out.admitted, out.items[0]),
        (false, key_outcome(false, 6, 1495))
    );
    // A request after it is dated at its time (timestamps never decrease).
    let plain = |hits| log_item("r", 10, 1000, hits, ItemKind::Consume);
    assert!(decide_at(&l, &[plain(4)], T + 10).await.admitted);
    let out = decide_at(&l, &[plain(1)], T + 1400).await;
    assert_eq!(
        (out.admitted, out.items[0]),
        (false, key_outcome(false, 10, 100))
    );
    // An earlier clock sees them too.
    assert_eq!(count_at(&l, "r", 1000, T + 200).await, 10);
    assert_eq!(count_at(&l, "r", 1000, T + 1499).await, 10);
    assert_eq!(count_at(&l, "r", 1000, T + 1500).await, 0);
    // A hold on another algorithm refuses the whole batch before any key is touched.
    let gcra = Item {
        hold_ms: 5,
        ..with(
            Algorithm::Gcra { burst: 5 },
            log_item("g", 5, 1000, 1, ItemKind::Consume),
        )
    };
    let err = l
        .decide(&[plain(1), gcra], Some(T + 2000))
        .await
        .expect_err("a hold on gcra is refused");
    assert!(
        err.to_string().contains("only sliding_log keys take holds"),
        "{err}"
    );
    assert_eq!(count_at(&l, "r", 1000, T + 2000).await, 0);
}

/// The backend's own clock: two admitted in a 300 ms window, the third refused, and a window
/// later one admitted again. The three calls must fall within one window; an attempt a loaded
/// machine stretched past it proves nothing and is repeated on a fresh key (5 times at most).
async fn real_clock(l: Arc<dyn Limiter>) {
    for attempt in 0..5 {
        let batch = [log_item(
            &format!("rt{attempt}"),
            2,
            300,
            1,
            ItemKind::Consume,
        )];
        let decide = |l: &Arc<dyn Limiter>| {
            let l = Arc::clone(l);
            let batch = batch.clone();
            async move { l.decide(&batch, None).await.expect("decide") }
        };
        let started = Instant::now();
        assert!(decide(&l).await.admitted);
        assert!(decide(&l).await.admitted);
        let out = decide(&l).await;
        if started.elapsed() >= Duration::from_millis(300) {
            continue;
        }
        assert!(!out.admitted);
        assert_eq!(out.items[0].count, 2);
        assert!(out.items[0].reset_ms <= 300 && out.items[0].reset_ms > 0);
        tokio::time::sleep(Duration::from_millis(350)).await;
        let out = decide(&l).await;
        assert!(out.admitted);
        assert_eq!(out.items[0].count, 1);
        return;
    }
    panic!("5 attempts could not make three calls within one 300 ms window");
}

async fn concurrent_single_key(l: Arc<dyn Limiter>) {
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..64 {
        let l = Arc::clone(&l);
        tasks.spawn(async move {
            let batch = [log_item("hot", 10, 60_000, 1, ItemKind::Consume)];
            l.decide(&batch, None).await.expect("decide").admitted
        });
    }
    let mut admitted = 0;
    while let Some(res) = tasks.join_next().await {
        admitted += usize::from(res.expect("task"));
    }
    assert_eq!(admitted, 10);
}

/// Weighted entries: an item's hits are one entry, counted exactly whatever their number (and
/// whatever the window), and a refund takes the newest weight, splitting an entry.
async fn weights_count_exactly(l: Arc<dyn Limiter>) {
    let w = |hits, kind| log_item("w", 1_000_000, 2500, hits, kind);
    let consume = |hits| w(hits, ItemKind::Consume);
    let out = decide_at(&l, &[consume(100_000)], T).await;
    assert_eq!(out.items[0], key_outcome(true, 100_000, 2500));
    let out = decide_at(&l, &[consume(1)], T + 1000).await;
    assert_eq!(out.items[0], key_outcome(true, 100_001, 1500));
    let out = decide_at(&l, &[consume(2000)], T + 2000).await;
    assert_eq!(out.items[0], key_outcome(true, 102_001, 500));
    // The newest 2000 and 1 go whole, 500 comes off the entry of T, which stays with 99,500.
    let out = decide_at(&l, &[w(2501, ItemKind::Refund)], T + 2100).await;
    assert_eq!(out.items[0], key_outcome(true, 99_500, 400));
    assert_eq!(count_at(&l, "w", 2500, T + 2499).await, 99_500);
    assert_eq!(count_at(&l, "w", 2500, T + 2500).await, 0);
    // At the limit exactly, and one past it.
    let out = decide_at(&l, &[consume(1_000_000)], T + 2500).await;
    assert_eq!(out.items[0], key_outcome(true, 1_000_000, 2500));
    let out = decide_at(&l, &[consume(1)], T + 2501).await;
    assert_eq!(out.items[0], key_outcome(false, 1_000_000, 2499));
    // Several entries leave at once, some of them more than the two oldest.
    for i in 0..5 {
        assert!(
            decide_at(&l, &[consume_hits("many", 100, i + 1)], T + i)
                .await
                .admitted
        );
    }
    let probe = [consume_hits("many", 100, 0)];
    assert_eq!(
        decide_at(&l, &probe, T + 1002).await.items[0],
        key_outcome(true, 9, 1)
    );
    assert_eq!(
        decide_at(&l, &probe, T + 1003).await.items[0],
        key_outcome(true, 5, 1)
    );
    assert!(
        decide_at(&l, &[consume_hits("many", 100, 1)], T + 1003)
            .await
            .admitted
    );
    assert_eq!(
        decide_at(&l, &probe, T + 1004).await.items[0],
        key_outcome(true, 1, 999)
    );
}

/// The token budget of an AI or Envoy Gateway (a cost charged after the response): each request is checked with 0 hits on the request path, and its cost (4) is
/// charged when the stream ends, where the answer is ignored. On every algorithm, with a
/// window of 1.5 s: the third charge does not fit; by default it fills the budget (record:
/// overdraws it; refuse: drops it), so the fourth check is refused (refuse: admitted, the
/// budget never runs out), until the window frees room.
async fn charges_after_the_response_hold_the_budget(l: Arc<dyn Limiter>) {
    for alg in ALGORITHMS {
        let alg = match alg {
            Algorithm::Gcra { .. } => Algorithm::Gcra { burst: 10 },
            other => other,
        };
        for (over_limit, after_third) in [
            (OverLimit::Fill, 10),
            (OverLimit::Record, 12),
            (OverLimit::Refuse, 8),
        ] {
            let key = format!("budget-{}-{}", alg.name(), over_limit.name());
            let item = |hits| {
                over(
                    over_limit,
                    with(alg, log_item(&key, 10, 1500, hits, ItemKind::Consume)),
                )
            };
            let what = format!("{} {}", alg.name(), over_limit.name());
            for (i, count) in [(0, 4), (1, 8)] {
                assert!(
                    decide_at(&l, &[item(0)], T + i).await.admitted,
                    "{what}: check {i}"
                );
                let out = decide_at(&l, &[item(4)], T + i).await;
                assert_eq!((out.admitted, out.items[0].count), (true, count), "{what}");
            }
            let check = decide_at(&l, &[item(0)], T + 2).await;
            assert_eq!((check.admitted, check.items[0].count), (true, 8), "{what}");
            let charge = decide_at(&l, &[item(4)], T + 2).await;
            assert!(!charge.admitted, "{what}");
            assert_eq!(charge.items[0].count, after_third, "{what}: third charge");
            let next = decide_at(&l, &[item(0)], T + 3).await;
            assert_eq!(
                next.admitted,
                over_limit == OverLimit::Refuse,
                "{what}: fourth"
            );
            // One more hit: at the full budget it records nothing (fill) or overdraws it
            // (record); under refuse it still fits.
            let one = decide_at(&l, &[item(1)], T + 3).await;
            let expected = match over_limit {
                OverLimit::Fill => after_third,
                OverLimit::Record | OverLimit::Refuse => after_third + 1,
            };
            assert_eq!(one.items[0].count, expected, "{what}: one more hit");
            // Once the window has slid past every charge: admitted again.
            let later = decide_at(&l, &[item(0)], T + 3000).await;
            assert_eq!((later.admitted, later.items[0].count), (true, 0), "{what}");
        }
    }
}

/// On a rejected batch, what each setting records: refuse nothing; fill only the item that did
/// not fit, up to its capacity; record every item's whole cost.
async fn over_limit_on_a_rejected_batch(l: Arc<dyn Limiter>) {
    for (over_limit, fitted, filled) in [
        (OverLimit::Refuse, 0, 8),
        (OverLimit::Fill, 0, 10),
        (OverLimit::Record, 1, 12),
    ] {
        let item = |key: &str, hits| {
            over(
                over_limit,
                log_item(key, 10, 60_000, hits, ItemKind::Consume),
            )
        };
        let full = format!("full-{}", over_limit.name());
        let other = format!("other-{}", over_limit.name());
        assert!(decide_at(&l, &[item(&full, 8)], T).await.admitted);
        let out = decide_at(&l, &[item(&other, 1), item(&full, 4)], T + 10).await;
        assert!(!out.admitted, "{over_limit:?}");
        assert_eq!(
            out.items,
            vec![
                key_outcome(true, fitted, 60_000),
                key_outcome(false, filled, 59_990)
            ],
            "{over_limit:?}"
        );
        assert_eq!(count_at(&l, &other, 60_000, T + 11).await, fitted);
        assert_eq!(count_at(&l, &full, 60_000, T + 11).await, filled);
    }
}

/// `in_flight` (src/limiter/leases.rs): a lease per admitted request, ended by the refund that
/// names it (and no other) or after the lease; a refused request holds none, whatever its
/// `over_limit`, also when another key refused its batch (on the cluster: compensated).
async fn in_flight_leases(l: Arc<dyn Limiter>) {
    let lease = |token: u64, kind: ItemKind| Item {
        algorithm: Algorithm::InFlight,
        lease: token,
        ..log_item("conc", 2, 1000, 1, kind)
    };
    let probe = || Item {
        hits: 0,
        ..lease(0, ItemKind::Consume)
    };
    let out = decide_at(&l, &[lease(1, ItemKind::Consume)], T).await;
    assert_eq!(out.items[0], key_outcome(true, 1, 1000));
    let out = decide_at(&l, &[lease(2, ItemKind::Consume)], T + 400).await;
    assert_eq!(out.items[0], key_outcome(true, 2, 600));
    let refused = over(OverLimit::Record, lease(3, ItemKind::Consume));
    let out = decide_at(&l, &[refused], T + 500).await;
    assert!(!out.admitted);
    assert_eq!(out.items[0], key_outcome(false, 2, 500));
    // Request 2 is done: its refund ends lease 2, not the older lease 1.
    let out = decide_at(&l, &[lease(2, ItemKind::Refund)], T + 600).await;
    assert_eq!(out.items[0], key_outcome(true, 1, 400));
    // Its refund again, one for a lease never held, or for token 0: nothing more.
    for token in [2, 3, 9, 0] {
        let out = decide_at(&l, &[lease(token, ItemKind::Refund)], T + 700).await;
        assert_eq!(out.items[0].count, 1, "refund of {token}");
    }
    // More hits still take one lease; a probe takes none.
    let heavy = Item {
        hits: 5,
        ..lease(4, ItemKind::Consume)
    };
    assert_eq!(
        decide_at(&l, &[heavy], T + 800).await.items[0],
        key_outcome(true, 2, 200)
    );
    assert_eq!(
        decide_at(&l, &[probe()], T + 999).await.items[0],
        key_outcome(false, 2, 1)
    );
    // Lease 1, never released (a lost refund), ends at exactly T + 1000.
    assert_eq!(
        decide_at(&l, &[probe()], T + 1000).await.items[0],
        key_outcome(true, 1, 800)
    );
    // All or nothing: refused by another key, the request holds no lease.
    let out = decide_at(
        &l,
        &[lease(5, ItemKind::Consume), consume_hits("blocker", 0, 1)],
        T + 1000,
    )
    .await;
    assert!(!out.admitted);
    assert_eq!(
        decide_at(&l, &[probe()], T + 1001).await.items[0],
        key_outcome(true, 1, 799)
    );
    assert_eq!(
        decide_at(&l, &[probe()], T + 1800).await.items[0],
        key_outcome(true, 0, 1000)
    );
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
            log_item(
                &format!("mix-{}", alg.name()),
                3,
                1000,
                hits,
                ItemKind::Consume,
            ),
        )
    };
    let probe = |alg: Algorithm| item(alg, 0);
    assert!(
        decide_at(&l, &[consume_hits("blocker", 1, 1)], T)
            .await
            .admitted
    );
    let mut batch: Vec<Item> = ALGORITHMS.iter().map(|&a| item(a, 2)).collect();
    batch.push(consume_hits("blocker", 1, 1));
    let out = decide_at(&l, &batch, T + 10).await;
    assert!(!out.admitted);
    for (alg, o) in ALGORITHMS.iter().zip(&out.items) {
        assert!(o.passed, "{}", alg.name());
    }
    for &alg in &ALGORITHMS {
        let out = decide_at(&l, &[probe(alg)], T + 20).await;
        assert_eq!(
            out.items[0].count,
            0,
            "{} after a rejected batch",
            alg.name()
        );
    }
    batch.pop();
    let out = decide_at(&l, &batch, T + 30).await;
    assert!(out.admitted);
    for (alg, o) in ALGORITHMS.iter().zip(&out.items) {
        assert_eq!(o.count, 2, "{}", alg.name());
    }
    // Capacity 3 everywhere: two more hits are over on every algorithm, and fill the key.
    for &alg in &ALGORITHMS {
        let out = decide_at(&l, &[item(alg, 2)], T + 40).await;
        assert!(!out.admitted, "{}", alg.name());
        assert_eq!(out.items[0].count, 3, "{}", alg.name());
    }
}

/// Per-algorithm arithmetic the models define, checked on every backend.
async fn algorithm_specifics(l: Arc<dyn Limiter>) {
    // GCRA: 10 per second, burst 3: one token every 100 ms, exact retry-after.
    let g = |hits: u64| {
        with(
            Algorithm::Gcra { burst: 3 },
            log_item("g", 10, 1000, hits, ItemKind::Consume),
        )
    };
    let out = decide_at(&l, &[g(3)], T).await;
    assert_eq!(out.items[0], key_outcome(true, 3, 100));
    let out = decide_at(&l, &[g(1)], T + 99).await;
    assert_eq!(out.items[0], key_outcome(false, 3, 1));
    let out = decide_at(&l, &[g(1)], T + 100).await;
    assert_eq!(out.items[0], key_outcome(true, 3, 100));
    // Refunds give tokens back.
    let refund = with(
        Algorithm::Gcra { burst: 3 },
        log_item("g", 10, 1000, 2, ItemKind::Refund),
    );
    assert_eq!(decide_at(&l, &[refund], T + 100).await.items[0].count, 1);

    // Fixed window: resets at the boundary, reports the window's end.
    let f = |hits: u64| {
        with(
            Algorithm::FixedWindow,
            log_item("f", 2, 1000, hits, ItemKind::Consume),
        )
    };
    assert_eq!(
        decide_at(&l, &[f(2)], T + 900).await.items[0],
        key_outcome(true, 2, 100)
    );
    assert!(!decide_at(&l, &[f(1)], T + 999).await.admitted);
    assert_eq!(
        decide_at(&l, &[f(2)], T + 1000).await.items[0],
        key_outcome(true, 2, 1000)
    );

    // Sliding counter: 25% into the next window, 75% of the previous count still counts.
    let s = |hits: u64| {
        with(
            Algorithm::SlidingCounter,
            log_item("s", 10, 1000, hits, ItemKind::Consume),
        )
    };
    assert!(decide_at(&l, &[s(10)], T + 500).await.admitted);
    let out = decide_at(&l, &[s(0)], T + 1250).await;
    assert_eq!(out.items[0], key_outcome(true, 8, 750));
    assert!(decide_at(&l, &[s(2)], T + 1250).await.admitted);
    assert!(!decide_at(&l, &[s(1)], T + 1250).await.admitted);

    // Quantized log: buckets of 100 ms; a bucket counts until start + quantum + window.
    let q = |hits: u64| {
        with(
            Algorithm::QuantizedLog { quantum_ms: 100 },
            log_item("q", 4, 1000, hits, ItemKind::Consume),
        )
    };
    assert!(decide_at(&l, &[q(2)], T + 50).await.admitted);
    assert!(decide_at(&l, &[q(2)], T + 199).await.admitted);
    assert_eq!(
        decide_at(&l, &[q(0)], T + 1099).await.items[0],
        key_outcome(false, 4, 1)
    );
    assert_eq!(
        decide_at(&l, &[q(0)], T + 1100).await.items[0],
        key_outcome(true, 2, 100)
    );
}

/// The edge table (docs/algorithms.md): `limit` single hits in the last `limit` ms before a
/// fixed-window boundary, `limit` more in the first ms after it; the most admitted within any
/// window of the configured length, asserted equal to the published figures (the trace is on a
/// virtual clock, so they are exact on every backend). The loop makes `2 * limit` attempts, so
/// only figures below that can tell a sliding algorithm from a fixed window:
/// - sliding and quantized log: the limit (every hit lies within one window of the others);
/// - sliding counter: the limit, plus what the previous window's weight frees by the trace's
///   last attempt, `limit - 1` ms into the new window: `floor(limit * (limit - 1) / 1000)`
///   (0 at 10, 9 at 100);
/// - GCRA with burst = limit: the burst, plus one token per `1000 / limit` ms over the
///   `2 * limit - 1` ms the trace spans: `floor((2 * limit - 1) * limit / 1000)` (0 at 10, 19
///   at 100);
/// - fixed window: twice the limit.
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
                let out = decide_at(
                    &l,
                    &[with(
                        alg,
                        log_item(&key, limit, window, 1, ItemKind::Consume),
                    )],
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
                l.name()
            );
            let published = match (alg, limit) {
                (Algorithm::SlidingLog | Algorithm::QuantizedLog { .. }, _) => limit,
                (Algorithm::SlidingCounter, 10) => 10,
                (Algorithm::SlidingCounter, 100) => 109,
                (Algorithm::Gcra { .. }, 10) => 10,
                (Algorithm::Gcra { .. }, 100) => 119,
                (Algorithm::FixedWindow, _) => 2 * limit,
                other => unreachable!("no published figure for {other:?}"),
            };
            assert_eq!(most, published, "{} at limit {limit}", alg.name());
        }
    }
}

/// envoyproxy/ratelimit's two-descriptor case: `key2` 20 per minute and `key3` 10 per hour, 15
/// calls. Every call reports both keys as the backend holds them, also once `key3` is over its
/// limit (with the local cache on, those calls are answered locally: `key2` keeps its 10 hits
/// and its oldest entry's reset).
async fn two_descriptors_report_every_key(l: Arc<dyn Limiter>) {
    let batch = [
        log_item("key2", 20, 60_000, 1, ItemKind::Consume),
        log_item("key3", 10, 3_600_000, 1, ItemKind::Consume),
    ];
    for i in 0..15u64 {
        let out = decide_at(&l, &batch, T + i).await;
        let n = (i + 1).min(10);
        assert_eq!(out.admitted, i < 10, "call {i}");
        assert_eq!(
            out.items,
            vec![
                key_outcome(true, n, 60_000 - i),
                key_outcome(i < 10, n, 3_600_000 - i)
            ],
            "call {i}"
        );
    }
}

/// The same multi-descriptor request again and again over a full key: a shadow item, one key
/// twice with a probe after it, then a refund that frees the full key. Every status of every
/// call is the backend's (the cache answers the repeats, and must forget a key a refund freed).
async fn repeated_multi_descriptor_requests(l: Arc<dyn Limiter>) {
    let shadow = |hits| log_item("sh", 5, 1000, hits, ItemKind::Shadow);
    assert!(
        decide_at(
            &l,
            &[
                consume_hits("full", 2, 2),
                consume_hits("some", 10, 3),
                shadow(5)
            ],
            T
        )
        .await
        .admitted
    );
    let refuse = |hits| over(OverLimit::Refuse, consume_hits("some", 10, hits));
    let batch = [
        refuse(4),
        shadow(1),
        consume_hits("full", 2, 1),
        refuse(4),
        consume_hits("some", 10, 0),
    ];
    for d in 1..5 {
        let out = decide_at(&l, &batch, T + d).await;
        assert!(!out.admitted);
        let r = 1000 - d;
        assert_eq!(
            out.items,
            vec![
                key_outcome(true, 3, r),
                key_outcome(false, 5, r),
                key_outcome(false, 2, r),
                key_outcome(false, 3, r),
                key_outcome(false, 3, r)
            ],
            "at T + {d}"
        );
    }
    let refund = [
        log_item("full", 2, 1000, 1, ItemKind::Refund),
        consume_hits("some", 10, 1),
    ];
    assert!(decide_at(&l, &refund, T + 5).await.admitted);
    for d in 6..9 {
        let out = decide_at(&l, &batch, T + d).await;
        assert!(!out.admitted);
        let r = 1000 - d;
        assert_eq!(
            out.items,
            vec![
                key_outcome(true, 4, r),
                key_outcome(false, 5, r),
                key_outcome(true, 1, r),
                key_outcome(false, 4, r),
                key_outcome(false, 4, r)
            ],
            "at T + {d}"
        );
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
                held_items_count_until_hold_plus_window,
                real_clock,
                concurrent_single_key,
                algorithms_mix_all_or_nothing,
                algorithm_specifics,
                edge_table,
                weights_count_exactly,
                charges_after_the_response_hold_the_budget,
                over_limit_on_a_rejected_batch,
                in_flight_leases,
                two_descriptors_report_every_key,
                repeated_multi_descriptor_requests
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

conformance!(redis, async {
    let server = helpers::RedisServer::start();
    let limiter = redis_limiter(&server).await;
    (server, limiter)
});

// The same suite with every decision in a script call of its own (no batching).
conformance!(redis_unbatched, async {
    let server = helpers::RedisServer::start();
    let options = RedisOptions {
        pool_size: 4,
        batch_max: 1,
        ..RedisOptions::new(server.url())
    };
    let limiter: Arc<dyn Limiter> = Arc::new(
        RedisLimiter::open(&options).unwrap_or_else(|e| panic!("open {}: {e}", server.url())),
    );
    (server, limiter)
});

conformance!(redis_cluster, async {
    let cluster = helpers::RedisCluster::start();
    let limiter: Arc<dyn Limiter> = Arc::new(cluster_limiter(&cluster).await);
    (cluster, limiter)
});

/// Each backend again behind the local rejection cache, as `sluice serve` runs it (the cache's
/// local answers must be indistinguishable from the backend's).
fn cached(limiter: Arc<dyn Limiter>) -> Arc<dyn Limiter> {
    Arc::new(RejectionCache::new(
        limiter,
        Arc::new(MonotonicClock::default()),
        cache::DEFAULT_CAPACITY,
    ))
}

conformance!(memory_cached, async {
    let limiter: Arc<dyn Limiter> = Arc::new(sluice::limiter::memory::MemoryLimiter::new(
        Arc::new(sluice::limiter::SystemClock),
    ));
    ((), cached(limiter))
});

conformance!(redis_cached, async {
    let server = helpers::RedisServer::start();
    let limiter = redis_limiter(&server).await;
    (server, cached(limiter))
});

conformance!(redis_cluster_cached, async {
    let cluster = helpers::RedisCluster::start();
    let limiter: Arc<dyn Limiter> = Arc::new(cluster_limiter(&cluster).await);
    (cluster, cached(limiter))
});
