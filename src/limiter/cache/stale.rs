//! The marks of keys whose entry could not be replaced or forgotten: their shard was busy.
//!
//! Why: a decision never waits for a cache shard another thread is writing (a tokio worker
//! blocked on a lock stalls every request it serves, and on a busy machine the writer may be
//! descheduled while it holds the lock: a stall of milliseconds). Learning an outcome must
//! still never leave an older entry in force after a newer answer: so when the write it needs
//! finds the shard busy, the key is marked here instead (one atomic maximum), and a lookup
//! takes an entry only if it was learnt from a call sent after the key's mark.
//!
//! A mark covers the entries learnt from calls sent at or before the marking call's sending
//! time: an entry learnt from a later call is newer knowledge than the marking answer and
//! stays. Marks live in slots indexed by the key's hash, so a key shares its slot with a few
//! others: a mark makes their entries of that time unknown too, which only sends their next
//! requests to the backend (whose answers replace them). Memory is bounded (one `u64` per key
//! the cache can hold, at most 4Mi of them) and nothing ever needs clearing: a slot only moves
//! forward in time.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};

use foldhash::fast::RandomState;

/// The fewest slots, for the smallest caches.
const MIN_SLOTS: usize = 64;
/// The most slots (32 MiB): keys of larger caches share slots more.
const MAX_SLOTS: usize = 1 << 22;

pub(super) struct Stale {
    /// Per slot: 1 + the latest sending time marked (0: never marked).
    slots: Box<[AtomicU64]>,
    mask: usize,
    hasher: RandomState,
}

impl Stale {
    /// Marks for a cache of `capacity` keys.
    pub(super) fn new(capacity: usize) -> Self {
        let len = capacity.clamp(MIN_SLOTS, MAX_SLOTS).next_power_of_two();
        Stale {
            slots: (0..len).map(|_| AtomicU64::new(0)).collect(),
            mask: len - 1,
            hasher: RandomState::default(),
        }
    }

    fn slot(&self, key: &str) -> &AtomicU64 {
        // The mask keeps the index in range; the truncation to usize only drops hash bits.
        &self.slots[(self.hasher.hash_one(key) as usize) & self.mask]
    }

    /// Makes every entry of `key` learnt from a call sent at or before `sent_at` unknown.
    pub(super) fn mark(&self, key: &str, sent_at: u64) {
        self.slot(key)
            .fetch_max(sent_at.saturating_add(1), Ordering::AcqRel);
    }

    /// Whether an entry of `key` learnt from a call sent at `sent_at` is in force (not marked).
    pub(super) fn in_force(&self, key: &str, sent_at: u64) -> bool {
        sent_at >= self.slot(key).load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mark_covers_what_was_learnt_until_then_and_no_later() {
        let stale = Stale::new(10);
        assert!(stale.in_force("k", 0), "nothing is marked at first");
        stale.mark("k", 100);
        assert!(!stale.in_force("k", 99));
        assert!(!stale.in_force("k", 100));
        assert!(stale.in_force("k", 101));
        stale.mark("k", 50);
        assert!(!stale.in_force("k", 100), "a mark never moves back");
    }

    #[test]
    fn a_huge_cache_gets_at_most_the_capped_slots() {
        assert_eq!(Stale::new(usize::MAX).slots.len(), MAX_SLOTS);
        assert_eq!(Stale::new(0).slots.len(), MIN_SLOTS);
    }

    #[test]
    fn a_mark_reaches_few_other_keys() {
        let stale = Stale::new(1000);
        stale.mark("k", 100);
        let reached = (0..1000)
            .filter(|i| !stale.in_force(&format!("other{i}"), 100))
            .count();
        assert!(reached < 10, "{reached} of 1000 other keys marked");
    }
}
