//! One key's sliding-window log: the pure data structure both the memory backend and the
//! algorithm models keep (the Redis script keeps the same log in a sorted set).
//!
//! Why its own file: the algorithm models ([`super::algorithms`]) hold a log, and the batch
//! planner ([`super::window`]) holds the models; with the log here, neither imports the other
//! both ways. Time is always passed in as `now`; the conventions (eviction edge, recording at
//! `max(now, newest)`) are [`super::window`]'s.

use std::collections::VecDeque;

/// One key's log, oldest entry first: `(timestamp, weight)` pairs and their total.
///
/// Exactly what the Redis script stores for the key (`redis/lua/decide.lua`): the sliding log
/// keeps one entry per recording item, whatever its weight ([`Log::record`]), so memory grows
/// with the requests in the window, not with their hits; the quantized log keeps one entry per
/// bucket, which every hit of the bucket adds to ([`Log::add_to_bucket`], the script's hash
/// field). The total is kept beside the entries, as the script keeps it beside its set.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Log {
    entries: VecDeque<(u64, u64)>,
    total: u64,
}

impl Log {
    pub fn new() -> Self {
        Self::default()
    }

    /// Drops the entries that have left the window at `now`.
    pub fn evict(&mut self, now: u64, window_ms: u64) {
        while let Some(&(t, weight)) = self.entries.front() {
            if t.saturating_add(window_ms) > now {
                break;
            }
            self.total = self.total.saturating_sub(weight);
            self.entries.pop_front();
        }
    }

    /// The sum of the entries' weights (call [`Log::evict`] first to get the count in the
    /// window).
    pub fn count(&self) -> u64 {
        self.total
    }

    /// Entries held: the log's memory grows with this, not with the hits it counts.
    pub fn entries(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Timestamp of the newest entry, which decides when the whole key may be forgotten.
    pub fn newest(&self) -> Option<u64> {
        self.entries.back().map(|&(t, _)| t)
    }

    /// Milliseconds until the oldest entry leaves the window; `window_ms` when empty.
    pub fn reset_ms(&self, now: u64, window_ms: u64) -> u64 {
        match self.entries.front() {
            Some(&(t, _)) => t.saturating_add(window_ms).saturating_sub(now),
            None => window_ms,
        }
    }

    /// The time a new entry goes to: `max(now, newest)`, so timestamps never decrease.
    fn next_time(&self, now: u64) -> u64 {
        self.newest().map_or(now, |newest| newest.max(now))
    }

    /// Records one entry of `weight` at `max(now, newest)` (nothing for a weight of 0).
    pub fn record(&mut self, now: u64, weight: u64) {
        if weight == 0 {
            return;
        }
        let t = self.next_time(now);
        self.entries.push_back((t, weight));
        self.total = self.total.saturating_add(weight);
    }

    /// Adds `hits` to the bucket starting at `max(start, newest)`, a new entry unless the newest
    /// bucket is that one.
    pub fn add_to_bucket(&mut self, start: u64, hits: u64) {
        if hits == 0 {
            return;
        }
        let t = self.next_time(start);
        match self.entries.back_mut() {
            Some(entry) if entry.0 == t => entry.1 = entry.1.saturating_add(hits),
            _ => self.entries.push_back((t, hits)),
        }
        self.total = self.total.saturating_add(hits);
    }

    /// Removes up to `n` of the newest weight: whole entries, newest first, and part of the
    /// last one reached.
    pub fn refund(&mut self, mut n: u64) {
        while n > 0 {
            let Some(entry) = self.entries.back_mut() else {
                break;
            };
            let take = entry.1.min(n);
            entry.1 -= take;
            n -= take;
            self.total -= take;
            if entry.1 == 0 {
                self.entries.pop_back();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_leaves_at_exactly_t_plus_window() {
        let mut log = Log::new();
        log.record(1000, 2);
        log.evict(1999, 1000);
        assert_eq!(log.count(), 2);
        assert_eq!(log.reset_ms(1999, 1000), 1);
        log.evict(2000, 1000);
        assert_eq!(log.count(), 0);
        assert!(log.is_empty());
        assert_eq!(log.reset_ms(2000, 1000), 1000);
    }

    #[test]
    fn record_never_goes_back_in_time() {
        let mut log = Log::new();
        log.record(500, 1);
        log.record(400, 1);
        assert_eq!(log.newest(), Some(500));
        assert_eq!(log.entries(), 2, "one entry per record, also at one time");
        log.evict(1499, 1000);
        assert_eq!(log.count(), 2);
        log.evict(1500, 1000);
        assert_eq!(log.count(), 0);
    }

    #[test]
    fn one_entry_per_record_whatever_its_weight() {
        let mut log = Log::new();
        log.record(100, 100_000);
        log.record(100, 1);
        assert_eq!((log.entries(), log.count()), (2, 100_001));
        log.record(100, 0);
        assert_eq!(log.entries(), 2, "a weight of 0 is no entry");
    }

    #[test]
    fn buckets_merge() {
        let mut log = Log::new();
        log.add_to_bucket(100, 2);
        log.add_to_bucket(100, 3);
        log.add_to_bucket(50, 1);
        assert_eq!(
            (log.entries(), log.count()),
            (1, 6),
            "an older start joins the newest"
        );
        log.add_to_bucket(200, 1);
        assert_eq!(log.entries(), 2);
    }

    #[test]
    fn refund_removes_newest_and_splits_an_entry() {
        let mut log = Log::new();
        log.record(100, 2);
        log.record(200, 3);
        log.refund(4);
        assert_eq!(log.count(), 1);
        assert_eq!(log.entries(), 1);
        assert_eq!(log.newest(), Some(100));
        log.refund(10);
        assert!(log.is_empty());
        assert_eq!(log.newest(), None);
    }
}
