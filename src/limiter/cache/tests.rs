use super::*;
use crate::limiter::memory::MemoryLimiter;
use crate::limiter::{Algorithm, SystemClock};
use proptest::prelude::*;

/// The memory backend, counting the calls that reach it.
struct Counting {
    inner: MemoryLimiter,
    calls: AtomicU64,
}

#[async_trait]
impl Limiter for Counting {
    async fn decide(&self, batch: &[Item], now: Option<u64>) -> Result<BatchOutcome, LimiterError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.inner.decide(batch, now).await
    }
    async fn ping(&self) -> Result<(), LimiterError> {
        Ok(())
    }
    fn name(&self) -> &'static str {
        "counting"
    }
}

fn setup(capacity: usize) -> (RejectionCache, Arc<Counting>) {
    let inner = Arc::new(Counting {
        inner: MemoryLimiter::new(Arc::new(SystemClock)),
        calls: AtomicU64::new(0),
    });
    let cache = RejectionCache::new(inner.clone(), Arc::new(SystemClock), capacity);
    (cache, inner)
}

fn hit(key: &str, limit: u64, hits: u64, kind: ItemKind) -> Item {
    Item {
        key: key.into(),
        limit,
        window_ms: 1000,
        hits,
        kind,
        over_limit: crate::limiter::OverLimit::default(),
        algorithm: crate::limiter::Algorithm::SlidingLog,
        lease: 0,
        hold_ms: 0,
    }
}

const T: u64 = 1_700_000_000_000;

#[tokio::test]
async fn flood_on_a_full_key_reaches_the_backend_once_until_the_oldest_entry_leaves() {
    let (cache, inner) = setup(100);
    let b = [hit("k", 2, 1, ItemKind::Consume)];
    assert!(cache.decide(&b, Some(T)).await.unwrap().admitted);
    assert!(cache.decide(&b, Some(T + 100)).await.unwrap().admitted);
    assert_eq!(inner.calls.load(Ordering::Relaxed), 2);
    for i in 0..1000 {
        let out = cache.decide(&b, Some(T + 100 + i % 900)).await.unwrap();
        assert!(!out.admitted);
        assert_eq!(out.items[0].count, 2);
        assert_eq!(out.answered_by, AnsweredBy::LocalCache);
    }
    assert_eq!(inner.calls.load(Ordering::Relaxed), 2);
    assert_eq!(cache.answered_locally(), 1000);
    // One ms before the oldest entry leaves: still local; at the instant: the backend.
    let out = cache.decide(&b, Some(T + 999)).await.unwrap();
    assert_eq!(out.items[0].reset_ms, 1);
    assert_eq!(inner.calls.load(Ordering::Relaxed), 2);
    let out = cache.decide(&b, Some(T + 1000)).await.unwrap();
    assert!(out.admitted);
    assert_eq!(out.answered_by, AnsweredBy::Backend);
    assert_eq!(inner.calls.load(Ordering::Relaxed), 3);
}

#[tokio::test]
async fn sliding_counters_bypass_the_cache_and_gcra_checks_its_burst() {
    use crate::limiter::Algorithm;
    let (cache, inner) = setup(100);
    let calls = || inner.calls.load(Ordering::Relaxed);
    // A full sliding counter: its estimate decays continuously, so never answered here.
    let s = [Item {
        algorithm: Algorithm::SlidingCounter,
        ..hit("s", 1, 1, ItemKind::Consume)
    }];
    assert!(cache.decide(&s, Some(T)).await.unwrap().admitted);
    for i in 1..4 {
        assert!(!cache.decide(&s, Some(T + i)).await.unwrap().admitted);
        assert_eq!(calls(), 1 + i);
    }
    assert!(cache.is_empty());
    // GCRA at 1 per second with a burst of 3: full only at 3 tokens, not at the rate.
    let g = [Item {
        algorithm: Algorithm::Gcra { burst: 3 },
        ..hit("g", 1, 1, ItemKind::Consume)
    }];
    let before = calls();
    for i in 0..3 {
        assert!(cache.decide(&g, Some(T)).await.unwrap().admitted);
        assert_eq!(
            calls(),
            before + i + 1,
            "within the burst: the backend decides"
        );
    }
    let out = cache.decide(&g, Some(T + 999)).await.unwrap();
    assert!(!out.admitted);
    assert_eq!(out.items[0].count, 3);
    assert_eq!(
        calls(),
        before + 3,
        "full at the burst: certain until a token frees"
    );
    assert_eq!(cache.answered_locally(), 1);
    // One token every 1000 ms: free again at T + 1000 exactly.
    assert!(cache.decide(&g, Some(T + 1000)).await.unwrap().admitted);
}

#[tokio::test]
async fn only_certain_rejections_are_local() {
    let (cache, inner) = setup(100);
    // Full at 2 of limit 2, but a probe with a bigger limit, a shadow item and another
    // window on the same key are not certain to fail.
    cache
        .decide(&[hit("k", 2, 2, ItemKind::Consume)], Some(T))
        .await
        .unwrap();
    let calls = || inner.calls.load(Ordering::Relaxed);
    assert!(
        cache
            .decide(&[hit("k", 3, 1, ItemKind::Consume)], Some(T + 1))
            .await
            .unwrap()
            .admitted
    );
    assert_eq!(calls(), 2);
    let shadow = [
        hit("k", 1, 1, ItemKind::Shadow),
        hit("x", 5, 1, ItemKind::Consume),
    ];
    assert!(cache.decide(&shadow, Some(T + 2)).await.unwrap().admitted);
    assert_eq!(calls(), 3);
    // A two-item request with one certain rejection goes to the backend while the other
    // key's status is unknown; its answer keeps both, so the next one is local, and exact.
    assert!(
        cache
            .decide(&[hit("y", 5, 1, ItemKind::Consume)], Some(T + 3))
            .await
            .unwrap()
            .admitted
    );
    let both = [
        hit("y", 5, 1, ItemKind::Consume),
        hit("k", 3, 1, ItemKind::Consume),
    ];
    let out = cache.decide(&both, Some(T + 4)).await.unwrap();
    assert_eq!(
        (out.admitted, out.answered_by, calls()),
        (false, AnsweredBy::Backend, 5)
    );
    let out = cache.decide(&both, Some(T + 5)).await.unwrap();
    assert_eq!(
        (out.admitted, out.answered_by, calls()),
        (false, AnsweredBy::LocalCache, 5)
    );
    assert_eq!(
        out.items,
        [
            KeyOutcome {
                passed: true,
                count: 1,
                reset_ms: 998
            },
            KeyOutcome {
                passed: false,
                count: 3,
                reset_ms: 995
            }
        ]
    );
    let mut other_window = hit("k", 3, 1, ItemKind::Consume);
    other_window.window_ms = 2000;
    cache.decide(&[other_window], Some(T + 5)).await.unwrap();
    assert_eq!(calls(), 6);
    let probe = [hit("y", 5, 0, ItemKind::Consume)];
    assert_eq!(
        cache.decide(&probe, Some(T + 5)).await.unwrap().items[0].count,
        1
    );
}

/// envoyproxy/ratelimit's two-descriptor case: `key2` 20 per minute and `key3` 10 per hour,
/// 15 calls. Once `key3` is over its limit the cache answers, and reports `key2` as the
/// backend holds it: 10 hits, its oldest entry's reset.
#[tokio::test]
async fn a_local_answer_reports_every_key_as_the_backend_holds_it() {
    let (cache, inner) = setup(100);
    let bare = MemoryLimiter::new(Arc::new(SystemClock));
    let batch = [
        Item {
            window_ms: 60_000,
            ..hit("key2", 20, 1, ItemKind::Consume)
        },
        Item {
            window_ms: 3_600_000,
            ..hit("key3", 10, 1, ItemKind::Consume)
        },
    ];
    for i in 0..15 {
        let out = cache.decide(&batch, Some(T + i)).await.unwrap();
        let expected = bare.decide(&batch, Some(T + i)).await.unwrap();
        assert_eq!(
            (out.admitted, &out.items),
            (expected.admitted, &expected.items),
            "call {i}"
        );
        assert_eq!(out.admitted, i < 10);
        if i >= 10 {
            assert_eq!(out.answered_by, AnsweredBy::LocalCache, "call {i}");
            assert_eq!(out.items[0].count, 10);
            assert_eq!(out.items[0].reset_ms, 60_000 - i);
        }
    }
    assert_eq!(inner.calls.load(Ordering::Relaxed), 10);
}

/// A rejection that records something (a fill with room left, a `record` item) goes to the
/// backend, which records it; one that records nothing is answered here.
#[tokio::test]
async fn rejections_that_record_reach_the_backend() {
    let (cache, inner) = setup(100);
    let calls = || inner.calls.load(Ordering::Relaxed);
    let refuse = |hits| Item {
        over_limit: OverLimit::Refuse,
        ..hit("k", 10, hits, ItemKind::Consume)
    };
    cache.decide(&[refuse(8)], Some(T)).await.unwrap();
    // 8 + 3 > 10 under refuse: rejected and cached at 8 of 10, then answered here (refuse
    // records nothing).
    for now in [T + 1, T + 2] {
        let out = cache.decide(&[refuse(3)], Some(now)).await.unwrap();
        assert_eq!((out.admitted, calls()), (false, 2));
    }
    let record = Item {
        over_limit: OverLimit::Record,
        ..hit("k", 10, 1, ItemKind::Consume)
    };
    // Certainly rejected, but 2 of room would be filled: the backend fills it.
    let out = cache
        .decide(&[hit("k", 10, 4, ItemKind::Consume)], Some(T + 3))
        .await
        .unwrap();
    assert_eq!((out.admitted, out.items[0].count, calls()), (false, 10, 3));
    // Full now: a fill and a probe record nothing, a record item records.
    let out = cache
        .decide(&[hit("k", 10, 4, ItemKind::Consume)], Some(T + 4))
        .await
        .unwrap();
    assert_eq!((out.answered_by, calls()), (AnsweredBy::LocalCache, 3));
    let out = cache.decide(&[record], Some(T + 5)).await.unwrap();
    assert_eq!((out.items[0].count, calls()), (11, 4));
}

#[tokio::test]
async fn a_refund_through_this_instance_drops_the_entry() {
    let (cache, inner) = setup(100);
    cache
        .decide(&[hit("k", 2, 2, ItemKind::Consume)], Some(T))
        .await
        .unwrap();
    let refund = [
        hit("k", 2, 1, ItemKind::Refund),
        hit("z", 9, 1, ItemKind::Consume),
    ];
    assert!(cache.decide(&refund, Some(T + 1)).await.unwrap().admitted);
    let out = cache
        .decide(&[hit("k", 2, 1, ItemKind::Consume)], Some(T + 2))
        .await
        .unwrap();
    assert!(out.admitted);
    assert_eq!(inner.calls.load(Ordering::Relaxed), 3);
}

#[tokio::test]
async fn memory_is_bounded() {
    let (cache, _) = setup(10);
    for i in 0..100u64 {
        let key = format!("k{i}");
        cache
            .decide(&[hit(&key, 1, 1, ItemKind::Consume)], Some(T + i))
            .await
            .unwrap();
        assert!(cache.len() <= 10);
    }
    assert_eq!(cache.len(), 10);
}

/// Once the cache is full (an insertion took another key's place), a key over its limit is
/// offered to it only on its second rejection (its doorkeeper): a flood of keys each sent once
/// inserts none of them, and a key sent again is kept from then on, as with room in the cache.
#[tokio::test]
async fn a_full_cache_takes_a_key_on_its_second_rejection() {
    let (cache, inner) = setup(2);
    let calls = || inner.calls.load(Ordering::Relaxed);
    let cache = &cache;
    let over = |key: &str, now| {
        let batch = [hit(key, 1, 1, ItemKind::Consume)];
        async move { cache.decide(&batch, Some(now)).await.unwrap() }
    };
    // With room, a key is kept at its first answer over the limit (1 of 1).
    for (i, key) in ["a", "b"].into_iter().enumerate() {
        over(key, T).await;
        assert_eq!(over(key, T + 1).await.answered_by, AnsweredBy::LocalCache);
        assert_eq!(calls(), i as u64 + 1);
    }
    assert_eq!(cache.len(), 2);
    // The next key takes a place: the cache now knows it is full.
    assert!(over("flood0", T + 2).await.admitted);
    let held = |key: &str| cache.entries.peek(key).is_some();
    let survivors: Vec<&str> = ["a", "b", "flood0"]
        .into_iter()
        .filter(|k| held(k))
        .collect();
    assert_eq!(survivors.len(), 2, "{survivors:?}");
    // Full: a flood of keys each over its limit once inserts nothing.
    for i in 1..50 {
        assert!(over(&format!("flood{i}"), T + 2).await.admitted);
    }
    assert_eq!(calls(), 52);
    assert!(survivors.iter().all(|k| held(k)), "{survivors:?} evicted");
    // `c`: its first rejection is not kept (the backend answers again), its second is.
    assert!(over("c", T + 4).await.admitted);
    let second = over("c", T + 5).await;
    assert_eq!(
        (second.admitted, second.answered_by),
        (false, AnsweredBy::Backend)
    );
    assert_eq!(calls(), 54);
    let third = over("c", T + 6).await;
    assert_eq!(
        (third.admitted, third.answered_by),
        (false, AnsweredBy::LocalCache)
    );
    assert_eq!(third.items[0].count, 1);
    assert_eq!(calls(), 54);
    assert!(cache.len() <= 2);
}

/// A full cache whose keys are forgotten (their requests admitted) sees its room again at the
/// next insertion that evicts nothing: keys are then kept at their first rejection again.
#[tokio::test]
async fn a_cache_that_empties_takes_keys_at_their_first_rejection_again() {
    let (cache, _) = setup(2);
    let decide = |key: String, limit, now| {
        let cache = &cache;
        async move {
            let batch = [hit(&key, limit, 1, ItemKind::Consume)];
            cache.decide(&batch, Some(now)).await.unwrap()
        }
    };
    // Three keys over their limit (2) in a cache of two: the third takes a place.
    for key in ["a", "b", "x"] {
        for _ in 0..3 {
            decide(key.into(), 2, T).await;
        }
    }
    assert!(cache.evicting.load(Ordering::Relaxed));
    // The window has passed: each is admitted with room left, so each is forgotten.
    for key in ["a", "b", "x"] {
        assert!(decide(key.into(), 2, T + 2_000).await.admitted);
    }
    assert_eq!(cache.len(), 0);
    // Still taken for full: `n0` is kept only at its second rejection, which evicts nothing.
    // `n2`, kept at its first rejection too, takes `n0`'s place: full again.
    for (key, kept_at_first, full) in [
        ("n0", false, false),
        ("n1", true, false),
        ("n2", true, true),
    ] {
        decide(key.into(), 1, T + 3_000).await;
        let second = decide(key.into(), 1, T + 3_001).await;
        assert!(!second.admitted);
        let local = second.answered_by == AnsweredBy::LocalCache;
        assert_eq!(local, kept_at_first, "{key}");
        assert_eq!(cache.evicting.load(Ordering::Relaxed), full, "{key}");
    }
}

/// The backend's outcome of a one-item request: `passed` or not, `count` held, reset in 500 ms.
fn one_item(passed: bool, count: u64) -> BatchOutcome {
    BatchOutcome {
        admitted: passed,
        items: vec![KeyOutcome {
            passed,
            count,
            reset_ms: 500,
        }],
        answered_by: AnsweredBy::Backend,
    }
}

/// A key whose shard was busy at the lookup may still be held: its outcome forgets it (or
/// replaces it) as if it had been found, so no older entry outlives a newer answer.
#[test]
fn a_busy_lookup_still_forgets_or_replaces_the_key() {
    let (cache, _) = setup(100);
    let old = Entry {
        window_ms: 1000,
        count: 2,
        until_ms: T + 900,
        sent_at: T - 100,
    };
    let batch = [hit("k", 2, 1, ItemKind::Consume)];
    cache.entries.insert("k".into(), old);
    cache.learn(&batch, &[Lookup::Unknown], &one_item(true, 1), T);
    assert!(
        cache.entries.get("k").is_none(),
        "an admitted answer forgets it"
    );
    cache.entries.insert("k".into(), old);
    cache.learn(&batch, &[Lookup::Unknown], &one_item(false, 2), T + 100);
    let kept = cache.entries.get("k").map(|e| e.until_ms);
    assert_eq!(kept, Some(T + 600), "a rejection replaces it");
    // What the lookup found absent is not forgotten (nothing to undo).
    cache.learn(&batch, &[Lookup::Absent], &one_item(true, 1), T + 200);
    assert!(cache.entries.get("k").is_some());
}

/// An entry that a busy shard keeps from being forgotten or replaced is marked out of force
/// instead: it answers nothing again, and the next answer over the limit is kept. The shard is
/// held busy by a write of the key itself (the cache's own write lock, in this thread).
#[tokio::test]
async fn an_entry_a_busy_shard_keeps_is_put_out_of_force() {
    use futures_util::FutureExt;
    use quick_cache::sync::EntryAction;
    let (cache, inner) = setup(100);
    let calls = || inner.calls.load(Ordering::Relaxed);
    let full = [hit("k", 2, 1, ItemKind::Consume)];
    let while_busy = |work: &dyn Fn()| {
        cache.entries.entry("k", None, |_, _| {
            work();
            EntryAction::Retain(())
        });
    };
    for (sent_at, passed) in [(T, true), (T + 10, false)] {
        let old = Entry {
            window_ms: 1000,
            count: 2,
            until_ms: T + 900,
            sent_at: sent_at - 5,
        };
        cache.entries.insert("k".into(), old);
        assert!(matches!(cache.look_up(&full)[0], Lookup::Held(_)));
        // Admitted (forget) or rejected again (replace): the write finds the shard busy.
        while_busy(&|| {
            let count = if passed { 1 } else { 2 };
            cache.learn(
                &full,
                &[Lookup::Held(old)],
                &one_item(passed, count),
                sent_at,
            )
        });
        assert_eq!(
            cache.entries.peek("k").map(|e| e.sent_at),
            Some(sent_at - 5),
            "the write could not happen"
        );
        assert!(
            matches!(cache.look_up(&full)[0], Lookup::Unknown),
            "{sent_at}"
        );
    }
    // The backend answers the next request, and that answer (sent later) is kept.
    cache
        .decide(&[hit("k", 2, 2, ItemKind::Consume)], Some(T + 20))
        .await
        .unwrap();
    let out = cache.decide(&full, Some(T + 21)).await.unwrap();
    assert_eq!(
        (out.answered_by, out.items[0].count, calls()),
        (AnsweredBy::LocalCache, 2, 1)
    );
    // A refund whose removal finds the shard busy puts the entry out of force too.
    let refund = [hit("k", 2, 1, ItemKind::Refund)];
    while_busy(&|| {
        // The memory backend answers without waiting: its future completes at its first poll.
        let outcome = cache.decide(&refund, Some(T + 30)).now_or_never();
        assert!(matches!(outcome, Some(Ok(o)) if o.admitted));
    });
    assert_eq!(calls(), 2);
    let out = cache.decide(&full, Some(T + 31)).await.unwrap();
    assert_eq!((out.answered_by, out.admitted), (AnsweredBy::Backend, true));
}

/// Each key has one algorithm and one window, as the engine's keys do: every algorithm the
/// cache answers for (and the sliding counter, which it must never answer for), windows
/// other than 1 s.
const KEYS: [(&str, Algorithm, u64); 5] = [
    ("log", Algorithm::SlidingLog, 1000),
    (
        "quantized",
        Algorithm::QuantizedLog { quantum_ms: 100 },
        700,
    ),
    ("gcra", Algorithm::Gcra { burst: 2 }, 1500),
    ("fixed", Algorithm::FixedWindow, 600),
    ("counter", Algorithm::SlidingCounter, 900),
];

fn arb_batch() -> impl Strategy<Value = Vec<Item>> {
    let kind = prop_oneof![
        5 => Just(ItemKind::Consume),
        1 => Just(ItemKind::Shadow),
        1 => Just(ItemKind::Refund),
        1 => Just(ItemKind::Quota),
    ];
    let over_limit = prop_oneof![
        Just(OverLimit::Fill),
        Just(OverLimit::Refuse),
        Just(OverLimit::Record),
    ];
    let item = (0..KEYS.len(), 1..4u64, 0..3u64, kind, over_limit).prop_map(
        |(k, limit, hits, kind, over_limit)| {
            let (key, algorithm, window_ms) = KEYS[k];
            // A GCRA key keeps its rate, as between reloads (module doc).
            let limit = if key == "gcra" { 2 } else { limit };
            Item {
                over_limit,
                algorithm,
                window_ms,
                ..hit(key, limit, hits, kind)
            }
        },
    );
    prop::collection::vec(item, 1..4)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    /// Through one instance the cache is invisible: every outcome equals the bare
    /// backend's, on every algorithm, every item's status included, whoever answered. A
    /// local answer records exactly what the backend would have (nothing: the same traces
    /// stay equal afterwards) and holds a failing `Consume` or quota item.
    #[test]
    fn cache_never_changes_a_decision(
        steps in prop::collection::vec((0..400u64, arb_batch()), 1..60)
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let bare = MemoryLimiter::new(Arc::new(SystemClock));
        let (cache, _) = setup(2);
        let mut now = T;
        for (dt, batch) in steps {
            now += dt;
            let a = rt.block_on(bare.decide(&batch, Some(now))).unwrap();
            let b = rt.block_on(cache.decide(&batch, Some(now))).unwrap();
            prop_assert_eq!(a.admitted, b.admitted, "batch {:?} at {}", batch, now);
            prop_assert_eq!(&a.items, &b.items, "batch {:?} at {}", batch, now);
            if b.answered_by == AnsweredBy::LocalCache {
                let blocking = batch.iter().zip(&b.items).any(|(hit, item)| {
                    !item.passed && matches!(hit.kind, ItemKind::Consume | ItemKind::Quota)
                });
                prop_assert!(blocking, "no item blocks {:?} at {}", batch, now);
            }
        }
    }
}
