//! The local first tier: a bounded in-process cache of what the backend last said about keys
//! that were over their limit, in front of any [`Limiter`].
//!
//! Why: a flood on a key that is already over its limit would otherwise cost one backend round
//! trip per request, although the answer cannot change until the key's oldest entry leaves the
//! window. For the sliding log that instant is exact: entries only leave by age, and admitted
//! requests only add entries, so until then the key's count can only stay or grow. A request
//! that would exceed the limit against the count seen then is certainly rejected, and is
//! answered here without calling the backend.
//!
//! What is kept: when a backend answer shows a `Consume` or `Quota` item over its limit (it did
//! not pass, or its key is full), the status of every item of that request (count and reset) is
//! kept until its reset, the over-limit key's and the others' alike: each holds until then for
//! the same reason (its count cannot drop before its reset). A key is forgotten when a later
//! answer shows no item of its request over the limit, or when its reset comes. Keys whose
//! count was 0 (nothing to wait for; an empty log's reset is not a deadline) are not kept.
//!
//! What makes a local answer safe and true:
//! - only a certain rejection is answered locally: some `Consume` item with
//!   `count + hits > capacity` (`count >= capacity` for a `hits = 0` probe) against its key's
//!   kept count, or quota items all so; Shadow items never veto, so they never trigger it;
//! - only when the status of every item of the request is kept: the answer reports each item as
//!   the backend would (its check, with the batch's earlier items on the same key, as
//!   [`super::window::decide_batch`] does it; the kept count; the kept reset). A request with any
//!   other key goes to the backend, so no status is ever invented;
//! - and only a rejection that would record nothing on the backend ([`super::OverLimit`]), so
//!   that answering it here changes nothing: every item is a probe, `refuse`, or `fill` with
//!   nothing to fill: its key kept as full, or a single hit on a key no other item of the
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
//! The bound on a local answer's statuses: through one instance, decisions in sequence, every
//! status is exactly the backend's. What other instances (or decisions of this one still in
//! flight when an entry was learnt) record on a key meanwhile can only add to its count, so a
//! reported count is at most that far behind (never above the backend's), and a reported reset
//! is never later than the real one. The verdict is exact either way.
//!
//! Other algorithms (src/limiter/algorithms.rs): the quantized log, the fixed window and GCRA
//! keep this exact (their count only drops at the reported `reset_ms` or later, GCRA's being the
//! exact time one token frees; the check uses the item's capacity, i.e. the GCRA burst). The
//! sliding counter does not (its estimate decays continuously), nor do `in_flight` leases (they
//! end whenever their requests do), so their items are never kept, and a request holding one
//! always goes to the backend.
//!
//! Cost and memory: the entries live in a [`moka`] cache: a concurrent hash table (no lock
//! shared by all decisions) with O(1) amortised insertion and eviction, at most `capacity`
//! entries, each leaving at its deadline (per-entry expiry on a timer wheel) or, when the cache
//! is full, by moka's admission and LRU policy. A flood of distinct over-limit keys thus costs
//! each request one lookup and one insertion, whatever the number of keys; an entry evicted
//! early only sends its key's next request to the backend.
//!
//! A local answer says so ([`AnsweredBy::LocalCache`] in its outcome); the cache never touches
//! metrics: the observer above it counts those answers.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;

use super::window::{check, over_limit_take, slots_for};
use super::{
    AnsweredBy, BatchOutcome, Clock, Hit, HitKind, KeyOutcome, Limiter, LimiterError, OverLimit,
};

/// Default number of cached keys.
pub const DEFAULT_CAPACITY: usize = 10_000;

/// What the backend last said about a key.
#[derive(Debug, Clone, Copy)]
struct Entry {
    window_ms: u64,
    count: u64,
    /// Local clock (ms) at which the key's count may next drop (its reset).
    until_ms: u64,
    /// The reset as learnt: how long moka keeps the entry from its insertion.
    ttl_ms: u64,
}

/// Each entry leaves the cache at its reset, measured from its insertion (a little after the
/// call was sent, so later than `until_ms`: the lookup checks `until_ms` itself).
struct UntilReset;

impl moka::Expiry<String, Entry> for UntilReset {
    fn expire_after_create(&self, _: &String, entry: &Entry, _: Instant) -> Option<Duration> {
        Some(Duration::from_millis(entry.ttl_ms))
    }

    fn expire_after_update(
        &self,
        _: &String,
        entry: &Entry,
        _: Instant,
        _: Option<Duration>,
    ) -> Option<Duration> {
        Some(Duration::from_millis(entry.ttl_ms))
    }
}

pub struct RejectionCache {
    inner: Arc<dyn Limiter>,
    clock: Arc<dyn Clock>,
    capacity: usize,
    entries: moka::sync::Cache<String, Entry>,
    answered: AtomicU64,
}

impl RejectionCache {
    /// `clock` is only used to age entries (a monotonic source is best); `capacity` 0 is allowed
    /// but pointless: callers skip the wrapper instead.
    pub fn new(inner: Arc<dyn Limiter>, clock: Arc<dyn Clock>, capacity: usize) -> Self {
        let entries = moka::sync::Cache::builder()
            .max_capacity(capacity as u64)
            .expire_after(UntilReset)
            .build();
        RejectionCache {
            inner,
            clock,
            capacity,
            entries,
            answered: AtomicU64::new(0),
        }
    }

    /// Requests answered locally so far.
    pub fn answered_locally(&self) -> u64 {
        self.answered.load(Ordering::Relaxed)
    }

    /// Keys currently cached (after the cache's pending housekeeping).
    pub fn len(&self) -> usize {
        self.entries.run_pending_tasks();
        usize::try_from(self.entries.entry_count()).unwrap_or(usize::MAX)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The kept status of `hit`'s key, if it holds for `hit` at `now`.
    fn known(&self, hit: &Hit, now: u64) -> Option<Entry> {
        if !hit.algorithm.rejection_is_stable() {
            return None;
        }
        self.entries
            .get(hit.key.as_str())
            .filter(|e| e.window_ms == hit.window_ms && now < e.until_ms)
    }

    /// The outcome when the cache proves the batch is rejected and knows every item's status,
    /// else `None`.
    fn certain_rejection(&self, batch: &[Hit], now: u64) -> Option<BatchOutcome> {
        let known = batch
            .iter()
            .map(|hit| self.known(hit, now))
            .collect::<Option<Vec<Entry>>>()?;
        let surely_fails = |hit: &Hit, e: &Entry| {
            let hits = hit.counted_hits();
            if hits == 0 {
                e.count >= hit.capacity()
            } else {
                e.count.saturating_add(hits) > hit.capacity()
            }
        };
        let mut consume_fails = false;
        let (mut any_quota, mut every_quota_fails) = (false, true);
        for (hit, e) in batch.iter().zip(&known) {
            match hit.kind {
                HitKind::Consume => consume_fails |= surely_fails(hit, e),
                HitKind::Quota => {
                    any_quota = true;
                    every_quota_fails &= surely_fails(hit, e);
                }
                HitKind::Shadow | HitKind::Refund => {}
            }
        }
        if !(consume_fails || (any_quota && every_quota_fails)) {
            return None;
        }
        let records_nothing = batch.iter().zip(&known).all(|(hit, e)| {
            let alone = || {
                batch
                    .iter()
                    .filter(|h| h.key == hit.key && h.kind != HitKind::Refund)
                    .count()
                    == 1
            };
            hit.kind == HitKind::Refund
                || hit.hits == 0
                || match hit.over_limit {
                    OverLimit::Refuse => true,
                    OverLimit::Fill => e.count >= hit.capacity() || (hit.hits == 1 && alone()),
                    OverLimit::Record => false,
                }
        });
        if !records_nothing {
            return None;
        }
        // Each item's check as the backend makes it (decide_batch's first step): against its
        // key's count and what the batch's earlier items on the key record if it is admitted.
        let (slots, distinct) = slots_for(batch);
        let mut earlier = vec![0u64; distinct];
        let items = batch
            .iter()
            .zip(&slots)
            .zip(&known)
            .map(|((hit, &slot), e)| {
                let passed = hit.kind == HitKind::Refund || {
                    let (hits, capacity) = (hit.counted_hits(), hit.capacity());
                    let passed = check(e.count, earlier[slot], hits, capacity);
                    let take = if passed || hit.kind == HitKind::Consume {
                        hits
                    } else {
                        over_limit_take(hit, false, e.count.saturating_add(earlier[slot]), capacity)
                    };
                    earlier[slot] = earlier[slot].saturating_add(take);
                    passed
                };
                KeyOutcome {
                    passed,
                    count: e.count,
                    reset_ms: e.until_ms - now,
                }
            })
            .collect();
        Some(BatchOutcome {
            admitted: false,
            items,
            answered_by: AnsweredBy::LocalCache,
        })
    }

    /// Learns from the backend's outcome of a call sent at `sent_at`: keeps every item's status
    /// when some `Consume` or `Quota` item is over its limit, else forgets the batch's keys.
    fn learn(&self, batch: &[Hit], outcome: &BatchOutcome, sent_at: u64) {
        // An empty key (a cost above its capacity was refused) has no entry to wait for: the
        // backend answers such requests, so a local answer always has a count to show.
        let keepable = |hit: &Hit, item: &KeyOutcome| {
            hit.kind != HitKind::Refund
                && hit.algorithm.rejection_is_stable()
                && item.count > 0
                && item.reset_ms > 0
        };
        let over = batch.iter().zip(&outcome.items).any(|(hit, item)| {
            matches!(hit.kind, HitKind::Consume | HitKind::Quota)
                && keepable(hit, item)
                && (!item.passed || item.count >= hit.capacity())
        });
        for (hit, item) in batch.iter().zip(&outcome.items) {
            if over && keepable(hit, item) {
                let entry = Entry {
                    window_ms: hit.window_ms,
                    count: item.count,
                    until_ms: sent_at.saturating_add(item.reset_ms),
                    ttl_ms: item.reset_ms,
                };
                self.entries.insert(hit.key.clone(), entry);
            } else if hit.kind != HitKind::Refund {
                self.entries.invalidate(hit.key.as_str());
            }
        }
    }

    async fn run(&self, batch: &[Hit], now: Option<u64>) -> Result<BatchOutcome, LimiterError> {
        let sent_at = now.unwrap_or_else(|| self.clock.now_ms());
        if self.capacity > 0 {
            if let Some(outcome) = self.certain_rejection(batch, sent_at) {
                self.answered.fetch_add(1, Ordering::Relaxed);
                return Ok(outcome);
            }
            for hit in batch.iter().filter(|h| h.kind == HitKind::Refund) {
                self.entries.invalidate(hit.key.as_str());
            }
        }
        let outcome = self.inner.decide(batch, now).await?;
        if self.capacity > 0 {
            self.learn(batch, &outcome, sent_at);
        }
        Ok(outcome)
    }
}

#[async_trait]
impl Limiter for RejectionCache {
    async fn decide(
        &self,
        batch: &[Hit],
        now_ms: Option<u64>,
    ) -> Result<BatchOutcome, LimiterError> {
        self.run(batch, now_ms).await
    }

    async fn ping(&self) -> Result<(), LimiterError> {
        self.inner.ping().await
    }

    fn backend(&self) -> &'static str {
        self.inner.backend()
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
            batch: &[Hit],
            now: Option<u64>,
        ) -> Result<BatchOutcome, LimiterError> {
            self.calls.fetch_add(1, Ordering::Relaxed);
            self.inner.decide(batch, now).await
        }
        async fn ping(&self) -> Result<(), LimiterError> {
            Ok(())
        }
        fn backend(&self) -> &'static str {
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

    fn hit(key: &str, limit: u64, hits: u64, kind: HitKind) -> Hit {
        Hit {
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
        let b = [hit("k", 2, 1, HitKind::Consume)];
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
        let s = [Hit {
            algorithm: Algorithm::SlidingCounter,
            ..hit("s", 1, 1, HitKind::Consume)
        }];
        assert!(cache.decide(&s, Some(T)).await.unwrap().admitted);
        for i in 1..4 {
            assert!(!cache.decide(&s, Some(T + i)).await.unwrap().admitted);
            assert_eq!(calls(), 1 + i);
        }
        assert!(cache.is_empty());
        // GCRA at 1 per second with a burst of 3: full only at 3 tokens, not at the rate.
        let g = [Hit {
            algorithm: Algorithm::Gcra { burst: 3 },
            ..hit("g", 1, 1, HitKind::Consume)
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
            .decide(&[hit("k", 2, 2, HitKind::Consume)], Some(T))
            .await
            .unwrap();
        let calls = || inner.calls.load(Ordering::Relaxed);
        assert!(
            cache
                .decide(&[hit("k", 3, 1, HitKind::Consume)], Some(T + 1))
                .await
                .unwrap()
                .admitted
        );
        assert_eq!(calls(), 2);
        let shadow = [
            hit("k", 1, 1, HitKind::Shadow),
            hit("x", 5, 1, HitKind::Consume),
        ];
        assert!(cache.decide(&shadow, Some(T + 2)).await.unwrap().admitted);
        assert_eq!(calls(), 3);
        // A two-item request with one certain rejection goes to the backend while the other
        // key's status is unknown; its answer keeps both, so the next one is local, and exact.
        assert!(
            cache
                .decide(&[hit("y", 5, 1, HitKind::Consume)], Some(T + 3))
                .await
                .unwrap()
                .admitted
        );
        let both = [
            hit("y", 5, 1, HitKind::Consume),
            hit("k", 3, 1, HitKind::Consume),
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
        let mut other_window = hit("k", 3, 1, HitKind::Consume);
        other_window.window_ms = 2000;
        cache.decide(&[other_window], Some(T + 5)).await.unwrap();
        assert_eq!(calls(), 6);
        let probe = [hit("y", 5, 0, HitKind::Consume)];
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
            Hit {
                window_ms: 60_000,
                ..hit("key2", 20, 1, HitKind::Consume)
            },
            Hit {
                window_ms: 3_600_000,
                ..hit("key3", 10, 1, HitKind::Consume)
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
        let refuse = |hits| Hit {
            over_limit: OverLimit::Refuse,
            ..hit("k", 10, hits, HitKind::Consume)
        };
        cache.decide(&[refuse(8)], Some(T)).await.unwrap();
        // 8 + 3 > 10 under refuse: rejected and cached at 8 of 10, then answered here (refuse
        // records nothing).
        for now in [T + 1, T + 2] {
            let out = cache.decide(&[refuse(3)], Some(now)).await.unwrap();
            assert_eq!((out.admitted, calls()), (false, 2));
        }
        let record = Hit {
            over_limit: OverLimit::Record,
            ..hit("k", 10, 1, HitKind::Consume)
        };
        // Certainly rejected, but 2 of room would be filled: the backend fills it.
        let out = cache
            .decide(&[hit("k", 10, 4, HitKind::Consume)], Some(T + 3))
            .await
            .unwrap();
        assert_eq!((out.admitted, out.items[0].count, calls()), (false, 10, 3));
        // Full now: a fill and a probe record nothing, a record item records.
        let out = cache
            .decide(&[hit("k", 10, 4, HitKind::Consume)], Some(T + 4))
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
            .decide(&[hit("k", 2, 2, HitKind::Consume)], Some(T))
            .await
            .unwrap();
        let refund = [
            hit("k", 2, 1, HitKind::Refund),
            hit("z", 9, 1, HitKind::Consume),
        ];
        assert!(cache.decide(&refund, Some(T + 1)).await.unwrap().admitted);
        let out = cache
            .decide(&[hit("k", 2, 1, HitKind::Consume)], Some(T + 2))
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
                .decide(&[hit(&key, 1, 1, HitKind::Consume)], Some(T + i))
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

    fn arb_batch() -> impl Strategy<Value = Vec<Hit>> {
        let kind = prop_oneof![
            5 => Just(HitKind::Consume),
            1 => Just(HitKind::Shadow),
            1 => Just(HitKind::Refund),
            1 => Just(HitKind::Quota),
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
                Hit {
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
                        !item.passed && matches!(hit.kind, HitKind::Consume | HitKind::Quota)
                    });
                    prop_assert!(blocking, "no item blocks {:?} at {}", batch, now);
                }
            }
        }
    }
}
