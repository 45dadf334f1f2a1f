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
//! Cost and memory: the entries live in a [`quick_cache`] cache: a hash table split into shards
//! (no lock shared by all decisions) with O(1) insertion and eviction and at most `capacity`
//! entries. It has no per-entry expiry: a lookup checks the entry's own deadline, an entry past
//! it is overwritten or removed by the outcome of the request that found it, and one nobody asks
//! for again leaves when its room is needed (S3-FIFO: entries looked up since their insertion
//! stay, the others go first). A decision never waits for a shard another thread is writing: a
//! tokio worker blocked on a lock would stall every request it serves (for milliseconds when
//! the writer is descheduled holding it, as happens on a busy machine). A busy shard at a
//! lookup is a miss, a new key it cannot take is not kept, and an entry it cannot replace or
//! forget is marked out of force instead (`cache/stale.rs`), so no older entry ever answers
//! after a newer answer. Once the cache is full (the last
//! insertion of a new key took another's place: its shards fill unevenly, so no count says
//! so), a key is offered to it only on its second answer over the limit within a recent period
//! (its doorkeeper, `cache/doorkeeper.rs`): a flood of distinct over-limit keys, most of which
//! the cache could not keep, thus costs each request one lookup and a mark, whatever the number
//! of keys. A key kept out, like an entry evicted early, only sends its key's next request to
//! the backend.
//! What a request's lookups found also says what its outcome must forget: a key the cache did
//! not hold is not looked up again.
//!
//! A local answer says so ([`AnsweredBy::LocalCache`] in its outcome); the cache never touches
//! metrics: the observer above it counts those answers.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use async_trait::async_trait;
use foldhash::fast::RandomState;
use quick_cache::Lifecycle;
use quick_cache::UnitWeighter;
use smallvec::SmallVec;

use super::window::{check, over_limit_take, slots_for};
use super::{
    AnsweredBy, BatchOutcome, Clock, Item, ItemKind, KeyOutcome, Limiter, LimiterError, OverLimit,
};

mod doorkeeper;
mod stale;
use doorkeeper::Doorkeeper;
use stale::Stale;

/// Default number of cached keys.
pub const DEFAULT_CAPACITY: usize = 10_000;

/// What the backend last said about a key.
#[derive(Debug, Clone, Copy)]
struct Entry {
    window_ms: u64,
    count: u64,
    /// Local clock (ms) at which the key's count may next drop (its reset).
    until_ms: u64,
    /// Local clock (ms) when the call it was learnt from was sent: a mark of the key at or
    /// after it (`cache/stale.rs`) puts it out of force.
    sent_at: u64,
}

/// What a request's lookup found for one item's key.
#[derive(Debug, Clone, Copy)]
enum Lookup {
    Absent,
    Held(Entry),
    /// The key's shard was busy (another thread writing it; not waited for), or its entry was
    /// marked out of force: the request goes to the backend, and its outcome replaces or
    /// forgets whatever the key may hold.
    Unknown,
}

impl Lookup {
    fn entry(self) -> Option<Entry> {
        match self {
            Lookup::Held(entry) => Some(entry),
            Lookup::Absent | Lookup::Unknown => None,
        }
    }

    /// Whether the cache may hold the key: its outcome must then replace or forget the entry.
    fn may_hold(self) -> bool {
        !matches!(self, Lookup::Absent)
    }
}

/// What the cache held for each item of a request when it arrived.
type Held = SmallVec<[Lookup; 4]>;

/// Keeps the keys an operation evicted (or replaced), so that the caller can tell an eviction
/// from a replacement, and frees them after the shard's lock is released, as quick_cache's
/// default lifecycle does.
#[derive(Clone, Default)]
struct KeepEvicted;

impl Lifecycle<String, Entry> for KeepEvicted {
    type RequestState = [Option<String>; 2];

    fn on_evict(&self, state: &mut Self::RequestState, key: String, _: Entry) {
        if let Some(slot) = state.iter_mut().find(|slot| slot.is_none()) {
            *slot = Some(key);
        }
    }
}

pub struct RejectionCache {
    inner: Arc<dyn Limiter>,
    clock: Arc<dyn Clock>,
    capacity: usize,
    /// Keys are the clients' values, hashed with foldhash under a per-process random seed: the
    /// map is bounded (a shard's probes are at most its entries even if keys collided), and
    /// SipHash was about a quarter of what a miss cost in a flood (Cargo.toml says more).
    entries: quick_cache::sync::Cache<String, Entry, UnitWeighter, RandomState, KeepEvicted>,
    doorkeeper: Doorkeeper,
    /// Keys whose entry a busy shard kept from being replaced or forgotten.
    stale: Stale,
    /// Whether the last insertion of a new key took another key's place: the cache (or the
    /// shard keys land in) is full. Its shards fill unevenly, so no count of all entries says
    /// that an insertion will take another's place; an eviction does.
    evicting: AtomicBool,
    answered: AtomicU64,
}

impl RejectionCache {
    /// `clock` is only used to age entries (a monotonic source is best); `capacity` 0 is allowed
    /// but pointless: callers skip the wrapper instead.
    pub fn new(inner: Arc<dyn Limiter>, clock: Arc<dyn Clock>, capacity: usize) -> Self {
        let entries = quick_cache::sync::Cache::with(
            capacity,
            capacity as u64,
            UnitWeighter,
            RandomState::default(),
            KeepEvicted,
        );
        RejectionCache {
            inner,
            clock,
            capacity,
            entries,
            doorkeeper: Doorkeeper::new(capacity),
            stale: Stale::new(capacity),
            evicting: AtomicBool::new(false),
            answered: AtomicU64::new(0),
        }
    }

    /// Requests answered locally so far.
    pub fn answered_locally(&self) -> u64 {
        self.answered.load(Ordering::Relaxed)
    }

    /// Keys currently held (some perhaps past their reset, until the cache needs their room).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// What the cache holds for each item's key (none for a refund's), looked up once per
    /// request: what a local answer reads, and what learning its outcome need not undo.
    fn look_up(&self, batch: &[Item]) -> Held {
        batch
            .iter()
            .map(|hit| match hit.kind {
                ItemKind::Refund => Lookup::Absent,
                _ => match self.entries.try_get(hit.key.as_str()) {
                    Ok(Some(entry)) if self.stale.in_force(&hit.key, entry.sent_at) => {
                        Lookup::Held(entry)
                    }
                    // Busy, or marked out of force.
                    Ok(Some(_)) | Err(_) => Lookup::Unknown,
                    Ok(None) => Lookup::Absent,
                },
            })
            .collect()
    }

    /// The held status of `hit`'s key, if it holds for `hit` at `now`.
    fn known(hit: &Item, held: Lookup, now: u64) -> Option<Entry> {
        if !hit.algorithm.rejection_is_stable() {
            return None;
        }
        held.entry()
            .filter(|e| e.window_ms == hit.window_ms && now < e.until_ms)
    }

    /// The outcome when the cache proves the batch is rejected and knows every item's status,
    /// else `None`.
    fn certain_rejection(&self, batch: &[Item], held: &[Lookup], now: u64) -> Option<BatchOutcome> {
        let known = batch
            .iter()
            .zip(held)
            .map(|(hit, &held)| Self::known(hit, held, now))
            .collect::<Option<Vec<Entry>>>()?;
        let surely_fails = |hit: &Item, e: &Entry| {
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
                ItemKind::Consume => consume_fails |= surely_fails(hit, e),
                ItemKind::Quota => {
                    any_quota = true;
                    every_quota_fails &= surely_fails(hit, e);
                }
                ItemKind::Shadow | ItemKind::Refund => {}
            }
        }
        if !(consume_fails || (any_quota && every_quota_fails)) {
            return None;
        }
        let records_nothing = batch.iter().zip(&known).all(|(hit, e)| {
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
                let passed = hit.kind == ItemKind::Refund || {
                    let (hits, capacity) = (hit.counted_hits(), hit.capacity());
                    let passed = check(e.count, earlier[slot], hits, capacity);
                    let take = if passed || hit.kind == ItemKind::Consume {
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
    /// `held` is what the cache held for them when the request arrived: a key it did not hold
    /// has nothing to forget, and while the cache is full it is offered one only on its
    /// doorkeeper's word.
    fn learn(&self, batch: &[Item], held: &[Lookup], outcome: &BatchOutcome, sent_at: u64) {
        // An empty key (a cost above its capacity was refused) has no entry to wait for: the
        // backend answers such requests, so a local answer always has a count to show.
        let keepable = |hit: &Item, item: &KeyOutcome| {
            hit.kind != ItemKind::Refund
                && hit.algorithm.rejection_is_stable()
                && item.count > 0
                && item.reset_ms > 0
        };
        let over = batch.iter().zip(&outcome.items).any(|(hit, item)| {
            matches!(hit.kind, ItemKind::Consume | ItemKind::Quota)
                && keepable(hit, item)
                && (!item.passed || item.count >= hit.capacity())
        });
        for ((hit, item), held) in batch.iter().zip(&outcome.items).zip(held) {
            if over && keepable(hit, item) {
                let entry = Entry {
                    window_ms: hit.window_ms,
                    count: item.count,
                    until_ms: sent_at.saturating_add(item.reset_ms),
                    sent_at,
                };
                if held.may_hold() {
                    if self.entries.try_insert(hit.key.clone(), entry).is_err() {
                        self.stale.mark(&hit.key, sent_at);
                    }
                } else if self.has_room() || self.doorkeeper.seen_before(&hit.key) {
                    self.keep_new(&hit.key, entry);
                }
            } else if held.may_hold() {
                self.forget(&hit.key, sent_at);
            }
        }
    }

    /// Removes `key`'s entry, or, if its shard is busy, marks it out of force: either way no
    /// entry learnt from a call sent until `sent_at` answers for it again.
    fn forget(&self, key: &str, sent_at: u64) {
        if self.entries.try_remove(key).is_err() {
            self.stale.mark(key, sent_at);
        }
    }

    /// Keeps a key the cache did not hold, unless its shard is busy (like a key kept out), and
    /// notes whether that took another key's place (the cache is full) or not (it has room).
    fn keep_new(&self, key: &String, entry: Entry) {
        let mut evicted = Default::default();
        let kept = self
            .entries
            .try_insert_with_lifecycle(key.clone(), entry, &mut evicted);
        let evicted_another = evicted.iter().flatten().any(|other| other != key);
        if kept.is_ok() && evicted_another != self.evicting.load(Ordering::Relaxed) {
            self.evicting.store(evicted_another, Ordering::Relaxed);
        }
    }

    /// Whether a new key may be kept without taking another's place: the last insertion of a new
    /// key evicted none. While they evict, only keys the doorkeeper lets through are inserted,
    /// and the first of them that evicts nothing shows the room again (a key that never comes
    /// back twice would gain nothing from the room).
    fn has_room(&self) -> bool {
        !self.evicting.load(Ordering::Relaxed)
    }

    async fn run(&self, batch: &[Item], now: Option<u64>) -> Result<BatchOutcome, LimiterError> {
        if self.capacity == 0 {
            return self.inner.decide(batch, now).await;
        }
        let sent_at = now.unwrap_or_else(|| self.clock.now_ms());
        let held = self.look_up(batch);
        if let Some(outcome) = self.certain_rejection(batch, &held, sent_at) {
            self.answered.fetch_add(1, Ordering::Relaxed);
            return Ok(outcome);
        }
        for hit in batch.iter().filter(|h| h.kind == ItemKind::Refund) {
            self.forget(&hit.key, sent_at);
        }
        let outcome = self.inner.decide(batch, now).await?;
        self.learn(batch, &held, &outcome, sent_at);
        Ok(outcome)
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
mod tests;
