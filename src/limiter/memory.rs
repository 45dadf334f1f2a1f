//! In-process limiter backend: the embedded default when no Redis is configured.
//!
//! Why it looks like this: the decision itself is the pure [`super::window::decide_batch`] over
//! each key's [`State`] (every algorithm of [`super::algorithms`]); this module only supplies
//! locking and memory bounds around it.
//! - Logs live in `shards` of `std::sync::Mutex<HashMap>`, chosen by a hash of the key, so
//!   unrelated keys rarely contend. A batch locks the shards it touches in ascending index
//!   order (deduplicated), which makes multi-key batches atomic without deadlock. Nothing here
//!   awaits, so holding a std mutex is fine (and cheaper than an async one).
//! - Memory is bounded: a sliding-log key holds one entry per recording item in its window,
//!   whatever its weight (at most `limit` entries while items record within the limit; with
//!   `over_limit: record`, one per recorded request), a quantized log one per quantum, an
//!   `in_flight` key one per live lease (at most `limit`: only admitted requests take one), other
//!   algorithms O(1) (see [`Log`](super::log::Log)); expired entries are evicted whenever a key
//!   is touched and a key whose log becomes empty is removed; every [`SWEEP_EVERY`] decisions
//!   one shard is swept (at the `now` of that decision) so keys nobody touches again are
//!   reclaimed too.
//! - At most `max_keys` keys: the cap is split evenly across shards and enforced per shard, so
//!   it is checked under the one lock we already hold. When a new key meets a full shard, the
//!   shard is swept; if that left the shard more than 7/8 full, the keys whose newest entry is
//!   oldest (the least recently recorded, i.e. the ones closest to expiring on their own) are
//!   evicted down to 7/8 of the cap. Freeing an eighth at once makes the O(keys per shard) scan
//!   amortized O(1) per new key: a flood of distinct keys (hostile or not) at capacity pays one
//!   scan per `cap / 8` insertions, not one per insertion. Evicting a live key forgets its hits
//!   (fails open for that key), which is the price of bounded memory.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::sync::lock;

use async_trait::async_trait;

use super::algorithms::State;
use super::window::{decide_batch, slots_for};
use super::{BatchOutcome, Clock, Item, Limiter, LimiterError};

/// Default cap on the number of keys kept in memory.
pub const DEFAULT_MAX_KEYS: usize = 1_000_000;
/// Shard count for large key caps; fewer shards when `max_keys` is smaller, so that the
/// per-shard cap is at least one key and the shards' caps add up to at most `max_keys`.
const MAX_SHARDS: usize = 64;
/// One shard is swept every this many decisions.
pub const SWEEP_EVERY: u64 = 256;

/// A key's state plus the item it was last used with, which a sweep needs to expire it.
#[derive(Debug)]
struct Entry {
    last_hit: Item,
    state: State,
}

type Shard = HashMap<String, Entry>;

pub struct MemoryLimiter {
    clock: Arc<dyn Clock>,
    shards: Box<[Mutex<Shard>]>,
    per_shard_cap: usize,
    hasher: RandomState,
    decisions: AtomicU64,
}

impl std::fmt::Debug for MemoryLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryLimiter")
            .field("shards", &self.shards.len())
            .field("per_shard_cap", &self.per_shard_cap)
            .finish_non_exhaustive()
    }
}

impl MemoryLimiter {
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        Self::with_max_keys(clock, DEFAULT_MAX_KEYS)
    }

    /// `max_keys` is clamped to at least 1.
    pub fn with_max_keys(clock: Arc<dyn Clock>, max_keys: usize) -> Self {
        let max_keys = max_keys.max(1);
        let shard_count = max_keys.min(MAX_SHARDS);
        let shards = (0..shard_count)
            .map(|_| Mutex::new(HashMap::new()))
            .collect();
        MemoryLimiter {
            clock,
            shards,
            per_shard_cap: max_keys / shard_count,
            hasher: RandomState::new(),
            decisions: AtomicU64::new(0),
        }
    }

    /// Keys currently held (including ones whose entries expired but were not yet swept).
    pub fn key_count(&self) -> usize {
        self.shards.iter().map(|s| lock(s).len()).sum()
    }

    /// Entries a log key holds (sliding-log entries or quantized-log buckets; 0 for an unknown
    /// key or another algorithm): what the Redis script stores for it, which the differential
    /// tests compare.
    pub fn log_entries(&self, key: &str) -> usize {
        match lock(&self.shards[self.shard_of(key)]).get(key) {
            Some(Entry {
                state: State::Log(log),
                ..
            }) => log.entries(),
            _ => 0,
        }
    }

    /// The leases an `in_flight` key holds, as (time, token), sorted (none for an unknown key
    /// or another algorithm): what the Redis script stores for it, which the differential tests
    /// compare.
    pub fn leases(&self, key: &str) -> Vec<(u64, u64)> {
        let mut leases = match lock(&self.shards[self.shard_of(key)]).get(key) {
            Some(Entry {
                state: State::Leases(leases),
                ..
            }) => leases.held().collect(),
            _ => Vec::new(),
        };
        leases.sort_unstable();
        leases
    }

    fn shard_of(&self, key: &str) -> usize {
        // The modulo result is < shards.len(), so the cast back cannot truncate.
        (self.hasher.hash_one(key) % self.shards.len() as u64) as usize
    }

    fn decide_sync(&self, batch: &[Item], now: u64) -> BatchOutcome {
        let (slots, distinct) = slots_for(batch);
        let keys = BatchKeys::of(batch, &slots, distinct, |key| self.shard_of(key));
        let mut locked = Locked::new(self, &keys.shard);
        let (mut states, owned) = locked.take(batch, &keys);
        let outcome = decide_batch(batch, &slots, &mut states, now);
        locked.put_back(batch, &keys, states, owned, now);
        drop(locked);

        let n = self.decisions.fetch_add(1, Ordering::Relaxed);
        if n % SWEEP_EVERY == SWEEP_EVERY - 1 {
            let shard = ((n / SWEEP_EVERY) % self.shards.len() as u64) as usize;
            sweep(&mut lock(&self.shards[shard]), now);
        }
        outcome
    }
}

/// The distinct keys of a batch: per key slot, its shard and the first batch item naming it.
struct BatchKeys {
    shard: Vec<usize>,
    item: Vec<usize>,
}

impl BatchKeys {
    fn of(
        batch: &[Item],
        slots: &[usize],
        distinct: usize,
        shard_of: impl Fn(&str) -> usize,
    ) -> Self {
        let mut keys = BatchKeys {
            shard: vec![0; distinct],
            item: vec![0; distinct],
        };
        let mut seen = vec![false; distinct];
        for (i, (item, &slot)) in batch.iter().zip(slots).enumerate() {
            if !seen[slot] {
                seen[slot] = true;
                keys.shard[slot] = shard_of(&item.key);
                keys.item[slot] = i;
            }
        }
        keys
    }
}

/// The shards a batch's keys live in, locked in shard order (so two batches never wait on each
/// other in opposite orders) for the whole decision.
struct Locked<'a> {
    /// The locked shards' indices, ascending: `guards[i]` holds shard `order[i]`.
    order: Vec<usize>,
    guards: Vec<MutexGuard<'a, Shard>>,
    per_shard_cap: usize,
}

impl<'a> Locked<'a> {
    fn new(limiter: &'a MemoryLimiter, shards: &[usize]) -> Self {
        let mut order = shards.to_vec();
        order.sort_unstable();
        order.dedup();
        let guards = order.iter().map(|&s| lock(&limiter.shards[s])).collect();
        Locked {
            order,
            guards,
            per_shard_cap: limiter.per_shard_cap,
        }
    }

    fn shard(&mut self, shard: usize) -> Option<&mut Shard> {
        let g = self.order.binary_search(&shard).ok()?;
        self.guards.get_mut(g).map(|guard| &mut **guard)
    }

    /// Takes each key's state out of its map so the pure function can own it for the decision
    /// (a fresh one for a key not held); `remove_entry` hands the key `String` back, so putting
    /// it back allocates nothing.
    fn take(&mut self, batch: &[Item], keys: &BatchKeys) -> (Vec<State>, Vec<Option<String>>) {
        let distinct = keys.item.len();
        let mut owned = Vec::with_capacity(distinct);
        let mut states = Vec::with_capacity(distinct);
        for slot in 0..distinct {
            let item = &batch[keys.item[slot]];
            let taken = self
                .shard(keys.shard[slot])
                .and_then(|map| map.remove_entry(item.key.as_str()));
            match taken {
                Some((key, entry)) => {
                    owned.push(Some(key));
                    states.push(entry.state);
                }
                None => {
                    owned.push(None);
                    states.push(State::fresh(item.algorithm));
                }
            }
        }
        (states, owned)
    }

    /// Puts every state that still holds something back under its key, making room in a full
    /// shard first.
    fn put_back(
        &mut self,
        batch: &[Item],
        keys: &BatchKeys,
        states: Vec<State>,
        owned: Vec<Option<String>>,
        now: u64,
    ) {
        let cap = self.per_shard_cap;
        for (slot, (state, key)) in states.into_iter().zip(owned).enumerate() {
            if state.is_empty() {
                continue;
            }
            let item = &batch[keys.item[slot]];
            let Some(map) = self.shard(keys.shard[slot]) else {
                continue;
            };
            if map.len() >= cap {
                make_room(map, now, cap);
            }
            let key = key.unwrap_or_else(|| item.key.clone());
            let last_hit = Item {
                key: String::new(),
                ..*item
            };
            map.insert(key, Entry { last_hit, state });
        }
    }
}

/// Drops the keys of the shard whose state has emptied by `now`. Only logs and leases keep
/// their evictions; other states are settled on a copy (see [`decide_batch`] for why).
fn sweep(map: &mut Shard, now: u64) {
    map.retain(|_, entry| {
        if let State::Log(_) | State::Leases(_) = entry.state {
            entry.state.settle(&entry.last_hit, now);
            !entry.state.is_empty()
        } else {
            let mut settled = entry.state.clone();
            settled.settle(&entry.last_hit, now);
            !settled.is_empty()
        }
    });
}

/// Frees room in a full shard: sweeps, then evicts the least recently recorded keys until at
/// most 7/8 of `cap` remain (at least one slot is always freed). See the module doc.
fn make_room(map: &mut Shard, now: u64, cap: usize) {
    sweep(map, now);
    let keep = cap.saturating_sub((cap / 8).max(1));
    if map.len() <= keep {
        return;
    }
    let evict = map.len() - keep;
    let mut newest: Vec<u64> = map
        .values()
        .map(|entry| entry.state.last_activity())
        .collect();
    let (_, &mut cutoff, _) = newest.select_nth_unstable(evict - 1);
    // Every key older than the cutoff goes (fewer than `evict` of them), then keys at the cutoff
    // until `evict` are gone; newer keys stay.
    map.retain(|_, entry| entry.state.last_activity() >= cutoff);
    let mut ties = map.len().saturating_sub(keep);
    map.retain(|_, entry| {
        if ties > 0 && entry.state.last_activity() == cutoff {
            ties -= 1;
            false
        } else {
            true
        }
    });
}

#[async_trait]
impl Limiter for MemoryLimiter {
    async fn decide(
        &self,
        batch: &[Item],
        now_ms: Option<u64>,
    ) -> Result<BatchOutcome, LimiterError> {
        super::check_holds(batch)?;
        let now_ms = now_ms.unwrap_or_else(|| self.clock.now_ms());
        Ok(self.decide_sync(batch, now_ms))
    }

    async fn ping(&self) -> Result<(), LimiterError> {
        Ok(())
    }

    fn name(&self) -> &'static str {
        "memory"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::{ItemKind, SystemClock};

    fn hit(key: &str, limit: u64, hits: u64) -> Item {
        Item {
            key: key.to_string(),
            limit,
            window_ms: 1000,
            hits,
            kind: ItemKind::Consume,
            over_limit: crate::limiter::OverLimit::default(),
            algorithm: crate::limiter::Algorithm::SlidingLog,
            lease: 0,
            hold_ms: 0,
        }
    }

    #[test]
    fn idle_keys_are_removed_on_touch_and_by_sweep() {
        let lim = MemoryLimiter::new(Arc::new(SystemClock));
        for i in 0..100 {
            lim.decide_sync(&[hit(&format!("k{i}"), 5, 1)], 0);
        }
        assert_eq!(lim.key_count(), 100);
        // Touching an expired key drops it.
        lim.decide_sync(&[hit("k0", 5, 0)], 5000);
        assert_eq!(lim.key_count(), 99);
        // Enough decisions sweep every shard.
        for _ in 0..(SWEEP_EVERY * MAX_SHARDS as u64) {
            lim.decide_sync(&[hit("probe", 5, 0)], 5000);
        }
        assert_eq!(lim.key_count(), 0);
    }

    #[test]
    fn max_keys_is_a_hard_cap() {
        let lim = MemoryLimiter::with_max_keys(Arc::new(SystemClock), 10);
        for i in 0..1000u64 {
            let out = lim.decide_sync(&[hit(&format!("k{i}"), 5, 1)], i);
            assert!(out.admitted);
            assert!(lim.key_count() <= 10);
        }
        // The most recent key survived eviction.
        let out = lim.decide_sync(&[hit("k999", 1, 1)], 1000);
        assert!(!out.admitted);
    }

    #[test]
    fn a_full_shard_frees_an_eighth_keeping_the_newest() {
        // One shard of 64 keys (64 shards share a cap of 64 * 64).
        let lim = MemoryLimiter::with_max_keys(Arc::new(SystemClock), 64 * 64);
        let mut map = Shard::new();
        for i in 0..64u64 {
            let mut last_hit = hit(&format!("k{i}"), 10, 1);
            last_hit.window_ms = 1_000_000;
            let mut state = State::fresh(last_hit.algorithm);
            state.record(&last_hit, 1000 + i, 1);
            map.insert(format!("k{i}"), Entry { last_hit, state });
        }
        assert_eq!(lim.per_shard_cap, 64);
        make_room(&mut map, 2000, 64);
        assert_eq!(map.len(), 56, "down to 7/8 of the cap");
        assert!(
            (8..64).all(|i| map.contains_key(&format!("k{i}"))),
            "the oldest 8 went"
        );
    }

    /// Batches lock their shards in opposite orders from 8 threads. A deadlock would block the
    /// threads forever, so the test waits for them with a deadline (30 s for what takes well
    /// under a second) instead of joining: it fails, not hangs.
    #[test]
    fn multi_key_batches_do_not_deadlock() {
        let lim = Arc::new(MemoryLimiter::new(Arc::new(SystemClock)));
        let (done, finished) = std::sync::mpsc::channel();
        for t in 0..8u64 {
            let lim = Arc::clone(&lim);
            let done = done.clone();
            std::thread::spawn(move || {
                for i in 0..2000u64 {
                    let a = format!("k{}", (i + t) % 50);
                    let b = format!("k{}", (i * 7 + t * 3) % 50);
                    lim.decide_sync(&[hit(&b, 1_000_000, 1), hit(&a, 1_000_000, 1)], i);
                }
                let _ = done.send(t);
            });
        }
        drop(done);
        for _ in 0..8 {
            finished
                .recv_timeout(std::time::Duration::from_secs(30))
                .expect("a worker did not finish within 30 s (deadlock) or panicked");
        }
    }
}
