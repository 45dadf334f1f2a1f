//! The local first tier: a bounded in-process cache of keys known to be over their limit, in
//! front of any [`Limiter`].
//!
//! Why: a flood on a key that is already over its limit would otherwise cost one backend round
//! trip per request, although the answer cannot change until the key's oldest entry leaves the
//! window. For the sliding log that instant is exact: entries only leave by age, and admitted
//! requests only add entries, so until then the key's count can only stay or grow. A request
//! that would exceed the limit against the count seen then is certainly rejected, and is
//! answered here without calling the backend.
//!
//! What makes a local answer safe:
//! - only a certain rejection is answered locally: some `Consume` item whose key has a live
//!   entry (same window) with `count + hits > limit` (`count >= limit` for a `hits = 0` probe);
//!   everything else goes to the backend. Entries are kept for keys over their limit that hold
//!   something: a cost above the capacity of an empty key is refused by the backend, with
//!   nothing in the key to wait for. Shadow items never veto, so they never trigger it;
//! - and only a rejection that would record nothing on the backend ([`super::OverLimit`]), so
//!   that answering it here changes nothing: every item is a probe, `refuse`, or `fill` with
//!   nothing to fill: its key cached as full, or a single hit on a key no other item of the
//!   batch records on (a single hit that does not fit means its key is full). A `record` item
//!   with hits, or a `fill` item that might fill, sends the request to the backend, which
//!   records it (a charge after the response must hold the budget);
//! - the entry's deadline is `now before the call + reset_ms`: the backend computed `reset_ms`
//!   after that instant, so the local deadline is never later than the real one;
//! - a GCRA key's count is measured at its rate: a reload that changes the rate of a cached key
//!   leaves the entry's count and deadline those of the old rate until it expires, which can
//!   only make this instance reject where the backend (refilling at the new rate) would admit;
//! - refunds are the one way a key's count drops early. A refund sent through this instance
//!   drops the key's entry before it goes out; a refund sent through another instance is not
//!   seen here, so until the entry expires this instance may reject a request the backend would
//!   have admitted. That errs only towards rejection, never over-admission (documented in
//!   docs/redis.md).
//!
//! In a locally answered request, the blocking item reports the cached count and reset; other
//! items report what the cache knows about them, or "passed, count 0" when it knows nothing
//! (the overall verdict is exact; those per-descriptor details are best effort).
//!
//! Other algorithms (src/limiter/algorithms.rs): the quantized log, the fixed window and GCRA
//! keep this exact (their count only drops at the reported `reset_ms` or later, GCRA's being the
//! exact time one token frees; the check uses the item's capacity, i.e. the GCRA burst). The
//! sliding counter does not (its estimate decays continuously), so its items are never cached
//! and never answered here; a batch holding one is answered locally only through another item.
//!
//! Memory is bounded by `capacity` entries: when full, expired entries are dropped, then the
//! entry expiring soonest.
//!
//! A local answer says so ([`AnsweredBy::LocalCache`] in its outcome); the cache never touches
//! metrics: the observer above it counts those answers.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::sync::lock;

use async_trait::async_trait;

use super::{
    AnsweredBy, BatchOutcome, Clock, Item, ItemKind, KeyOutcome, Limiter, LimiterError, OverLimit,
};

/// Default number of cached keys.
pub const DEFAULT_CAPACITY: usize = 10_000;

#[derive(Debug, Clone, Copy)]
struct Entry {
    window_ms: u64,
    count: u64,
    /// Local clock (ms) at which the key's oldest entry leaves the window.
    until_ms: u64,
}

pub struct RejectionCache {
    inner: Arc<dyn Limiter>,
    clock: Arc<dyn Clock>,
    capacity: usize,
    entries: Mutex<HashMap<String, Entry>>,
    answered: AtomicU64,
}

impl RejectionCache {
    /// `clock` is only used to age entries (a monotonic source is best); `capacity` 0 is allowed
    /// but pointless: callers skip the wrapper instead.
    pub fn new(inner: Arc<dyn Limiter>, clock: Arc<dyn Clock>, capacity: usize) -> Self {
        RejectionCache {
            inner,
            clock,
            capacity,
            entries: Mutex::new(HashMap::new()),
            answered: AtomicU64::new(0),
        }
    }

    /// Requests answered locally so far.
    pub fn answered_locally(&self) -> u64 {
        self.answered.load(Ordering::Relaxed)
    }

    /// Keys currently cached (expired ones included until evicted).
    pub fn len(&self) -> usize {
        lock(&self.entries).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The outcome when the cache proves the batch is rejected, else `None`.
    fn certain_rejection(&self, batch: &[Item], now: u64) -> Option<BatchOutcome> {
        let entries = lock(&self.entries);
        let mut rejected = false;
        let items = batch
            .iter()
            .map(|hit| {
                let live = entries.get(&hit.key).filter(|e| {
                    e.window_ms == hit.window_ms
                        && now < e.until_ms
                        && hit.algorithm.rejection_is_stable()
                });
                match live {
                    Some(e) => {
                        let fails = if hit.hits == 0 {
                            e.count >= hit.capacity()
                        } else {
                            e.count.saturating_add(hit.hits) > hit.capacity()
                        };
                        if fails && hit.kind == ItemKind::Consume {
                            rejected = true;
                        }
                        KeyOutcome {
                            passed: hit.kind == ItemKind::Refund || !fails,
                            count: e.count,
                            reset_ms: e.until_ms - now,
                        }
                    }
                    None => KeyOutcome {
                        passed: true,
                        count: 0,
                        reset_ms: hit.window_ms,
                    },
                }
            })
            .collect();
        let records_nothing = batch.iter().all(|hit| {
            let full = || {
                entries.get(&hit.key).is_some_and(|e| {
                    e.window_ms == hit.window_ms
                        && now < e.until_ms
                        && hit.algorithm.rejection_is_stable()
                        && e.count >= hit.capacity()
                })
            };
            let alone = || {
                batch
                    .iter()
                    .filter(|h| h.key == hit.key && h.kind != ItemKind::Refund)
                    .count()
                    == 1
            };
            hit.kind == ItemKind::Refund
                || hit.hits == 0
                || match hit.over_limit {
                    OverLimit::Refuse => true,
                    OverLimit::Fill => full() || (hit.hits == 1 && alone()),
                    OverLimit::Record => false,
                }
        });
        (rejected && records_nothing).then_some(BatchOutcome {
            admitted: false,
            items,
            answered_by: AnsweredBy::LocalCache,
        })
    }

    /// Learns from the backend's outcome of a call sent at `sent_at`.
    fn learn(&self, batch: &[Item], outcome: &BatchOutcome, sent_at: u64) {
        let mut entries = lock(&self.entries);
        for (hit, item) in batch.iter().zip(&outcome.items) {
            if hit.kind == ItemKind::Refund {
                continue;
            }
            if !hit.algorithm.rejection_is_stable() {
                entries.remove(&hit.key);
                continue;
            }
            // An empty key (a cost above its capacity was refused) has no entry to wait for:
            // the backend answers such requests, so a local answer always has a count to show.
            let full = !item.passed || item.count >= hit.capacity();
            if !full || item.reset_ms == 0 || item.count == 0 {
                entries.remove(&hit.key);
                continue;
            }
            let entry = Entry {
                window_ms: hit.window_ms,
                count: item.count,
                until_ms: sent_at.saturating_add(item.reset_ms),
            };
            if !entries.contains_key(&hit.key) && entries.len() >= self.capacity {
                evict(&mut entries, sent_at);
                if entries.len() >= self.capacity {
                    continue;
                }
            }
            entries.insert(hit.key.clone(), entry);
        }
    }

    async fn run(&self, batch: &[Item], now: Option<u64>) -> Result<BatchOutcome, LimiterError> {
        let sent_at = now.unwrap_or_else(|| self.clock.now_ms());
        if self.capacity > 0 {
            if let Some(outcome) = self.certain_rejection(batch, sent_at) {
                self.answered.fetch_add(1, Ordering::Relaxed);
                return Ok(outcome);
            }
            let mut entries = lock(&self.entries);
            for hit in batch.iter().filter(|h| h.kind == ItemKind::Refund) {
                entries.remove(&hit.key);
            }
        }
        let outcome = self.inner.decide(batch, now).await?;
        if self.capacity > 0 {
            self.learn(batch, &outcome, sent_at);
        }
        Ok(outcome)
    }
}

/// Makes room in a full map: expired entries first, else the one expiring soonest.
fn evict(entries: &mut HashMap<String, Entry>, now: u64) {
    entries.retain(|_, e| now < e.until_ms);
    let soonest = entries
        .iter()
        .min_by_key(|(_, e)| e.until_ms)
        .map(|(k, _)| k.clone());
    if let Some(key) = soonest {
        entries.remove(&key);
    }
}

#[async_trait]
impl Limiter for RejectionCache {
    async fn decide(
        &self,
        batch: &[Item],
        now_ms: Option<u64>,
    ) -> Result<BatchOutcome, LimiterError> {
        self.run(batch, now_ms).await
    }

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

/// Milliseconds since this clock was made, from the monotonic clock: cache entries age by
/// durations, and a wall-clock step must not make an entry outlive its real deadline.
#[derive(Debug)]
pub struct MonotonicClock(std::time::Instant);

impl Default for MonotonicClock {
    fn default() -> Self {
        MonotonicClock(std::time::Instant::now())
    }
}

impl Clock for MonotonicClock {
    fn now_ms(&self) -> u64 {
        u64::try_from(self.0.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}

#[cfg(test)]
mod tests {
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
        async fn decide(
            &self,
            batch: &[Item],
            now: Option<u64>,
        ) -> Result<BatchOutcome, LimiterError> {
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
        // A two-item request with one certain rejection is local, and records nothing.
        let both = [
            hit("y", 5, 1, ItemKind::Consume),
            hit("k", 3, 1, ItemKind::Consume),
        ];
        assert!(!cache.decide(&both, Some(T + 4)).await.unwrap().admitted);
        assert_eq!(calls(), 3);
        let mut other_window = hit("k", 3, 1, ItemKind::Consume);
        other_window.window_ms = 2000;
        cache.decide(&[other_window], Some(T + 5)).await.unwrap();
        assert_eq!(calls(), 4);
        let probe = [hit("y", 5, 0, ItemKind::Consume)];
        assert_eq!(
            cache.decide(&probe, Some(T + 5)).await.unwrap().items[0].count,
            0
        );
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
        /// Through one instance the cache is invisible: every admission decision equals the
        /// bare backend's, on every algorithm. An answer from the backend is the backend's,
        /// counts included. A local answer records exactly what the backend would have
        /// (nothing: the same traces stay equal afterwards), and each item it reports as
        /// failing is the backend's item exactly (its cached count and reset), with at least
        /// one such `Consume` item; the module doc leaves the other items best effort.
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
                match b.answered_by {
                    AnsweredBy::LocalCache => {
                        let mut blocking = 0;
                        for ((hit, local), backend) in batch.iter().zip(&b.items).zip(&a.items) {
                            if !local.passed {
                                prop_assert_eq!(local, backend, "{:?} in {:?} at {}", hit, batch, now);
                                prop_assert!(hit.algorithm.rejection_is_stable(), "{:?}", hit);
                                blocking += usize::from(hit.kind == ItemKind::Consume);
                            }
                        }
                        prop_assert!(blocking > 0, "no item blocks {:?} at {}", batch, now);
                    }
                    _ => prop_assert_eq!(&a.items, &b.items, "batch {:?} at {}", batch, now),
                }
            }
        }
    }
}
