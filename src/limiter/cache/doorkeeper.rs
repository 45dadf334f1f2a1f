//! The doorkeeper in front of a full rejection cache: it lets through only keys learnt over
//! their limit twice within a recent period.
//!
//! Why: once the cache is full, every key it is offered takes the place of another (the key's
//! allocation, its map entry, an eviction), and under a flood of distinct over-limit keys far
//! more numerous than the cache's room, almost none of them is asked for again before it is
//! evicted in turn: the insertion buys nothing. A key seen over its limit for the first time is
//! only marked here, a few hundred instructions; the second time it is offered to the cache,
//! whose own policy then decides. A key a flood sends once never costs an insertion; a key sent
//! often is offered on its second rejection (one more backend call than with room in the
//! cache).
//!
//! The marks are a Bloom filter of 32 bits per cached key, cleared after twice the cache's
//! capacity of first sightings, so its memory is bounded and it keeps few false positives (a
//! false positive only offers a key to the cache early). It never decides what is true: a key
//! it keeps out is answered by the backend, as an evicted one is.

use std::sync::atomic::{AtomicUsize, Ordering};

use fastbloom::AtomicBloomFilter;
use foldhash::fast::RandomState;

/// Bits of the filter per key the cache can hold.
const BITS_PER_KEY: usize = 32;
/// The filter's size for the smallest caches.
const MIN_BITS: usize = 1024;
/// First sightings between two clearings, per key the cache can hold.
const PERIOD_PER_KEY: usize = 2;

pub(super) struct Doorkeeper {
    seen: AtomicBloomFilter<RandomState>,
    first_sightings: AtomicUsize,
    period: usize,
}

impl Doorkeeper {
    /// A doorkeeper for a cache of `capacity` keys.
    pub(super) fn new(capacity: usize) -> Self {
        let bits = capacity.saturating_mul(BITS_PER_KEY).max(MIN_BITS);
        Doorkeeper {
            seen: AtomicBloomFilter::with_num_bits(bits)
                .hasher(RandomState::default())
                .hashes(2),
            first_sightings: AtomicUsize::new(0),
            period: capacity.saturating_mul(PERIOD_PER_KEY).max(1),
        }
    }

    /// Whether `key` was marked since the last clearing (or collides with keys that were);
    /// marks it either way.
    pub(super) fn seen_before(&self, key: &str) -> bool {
        if self.seen.insert(key) {
            return true;
        }
        let sightings = self.first_sightings.fetch_add(1, Ordering::Relaxed);
        if sightings.saturating_add(1) >= self.period {
            self.first_sightings.store(0, Ordering::Relaxed);
            self.seen.clear();
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_passes_on_its_second_sighting() {
        let door = Doorkeeper::new(100);
        assert!(!door.seen_before("a"));
        assert!(door.seen_before("a"));
        assert!(door.seen_before("a"));
        assert!(!door.seen_before("b"));
    }

    #[test]
    fn marks_are_forgotten_after_a_period_of_first_sightings() {
        let door = Doorkeeper::new(100); // cleared after 200 first sightings
        assert!(!door.seen_before("old"));
        assert!(door.seen_before("old"));
        let (mut first, mut keys) = (1, 0);
        while first < 200 {
            first += usize::from(!door.seen_before(&format!("k{keys}")));
            keys += 1;
        }
        assert!(keys < 220, "{} false positives in 199 keys", keys - 199);
        assert!(!door.seen_before("old"), "the filter was cleared");
    }

    /// Under a flood of distinct keys, few pass for keys never seen: the filter's false
    /// positives stay rare however many keys go by.
    #[test]
    fn a_flood_of_distinct_keys_is_kept_out() {
        let door = Doorkeeper::new(10_000);
        let passed = (0..1_000_000)
            .filter(|i| door.seen_before(&format!("flood{i}")))
            .count();
        assert!(
            passed < 10_000,
            "{passed} of 1,000,000 distinct keys passed"
        );
    }
}
