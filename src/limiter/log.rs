//! One key's sliding-window log: the pure data structure both the memory backend and the
//! algorithm models keep (the Redis script keeps the same log in a sorted set).
//!
//! Why its own file: the algorithm models ([`super::algorithms`]) hold a log, and the batch
//! planner ([`super::window`]) holds the models; with the log here, neither imports the other
//! both ways. Time is always passed in as `now`; the conventions (eviction edge, recording at
//! `max(now, newest)`) are [`super::window`]'s.

use std::collections::VecDeque;

/// One key's log of hits, oldest first.
///
/// Run-length encoded (`(timestamp, hits)` runs) rather than one slot per hit: a single item
/// with a large `hits` (a large limit is legal) then costs one run, so memory is bounded by the
/// number of recording decisions still in the window, not by the size of the limit.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Log {
    runs: VecDeque<(u64, u64)>,
    total: u64,
}

impl Log {
    pub fn new() -> Self {
        Self::default()
    }

    /// Drops the entries that have left the window at `now`.
    pub fn evict(&mut self, now: u64, window_ms: u64) {
        while let Some(&(t, n)) = self.runs.front() {
            if t.saturating_add(window_ms) > now {
                break;
            }
            self.total = self.total.saturating_sub(n);
            self.runs.pop_front();
        }
    }

    /// Entries in the log (call [`Log::evict`] first to get the count in the window).
    pub fn count(&self) -> u64 {
        self.total
    }

    /// Runs held: the log's memory grows with this, not with the hits it counts.
    pub fn runs(&self) -> usize {
        self.runs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// Timestamp of the newest entry, which decides when the whole key may be forgotten.
    pub fn newest(&self) -> Option<u64> {
        self.runs.back().map(|&(t, _)| t)
    }

    /// Milliseconds until the oldest entry leaves the window; `window_ms` when empty.
    pub fn reset_ms(&self, now: u64, window_ms: u64) -> u64 {
        match self.runs.front() {
            Some(&(t, _)) => t.saturating_add(window_ms).saturating_sub(now),
            None => window_ms,
        }
    }

    /// Records `hits` entries at `max(now, newest)`.
    pub fn record(&mut self, now: u64, hits: u64) {
        if hits == 0 {
            return;
        }
        let t = self.newest().map_or(now, |newest| newest.max(now));
        match self.runs.back_mut() {
            Some(run) if run.0 == t => run.1 = run.1.saturating_add(hits),
            _ => self.runs.push_back((t, hits)),
        }
        self.total = self.total.saturating_add(hits);
    }

    /// Removes up to `n` of the newest entries.
    pub fn refund(&mut self, mut n: u64) {
        while n > 0 {
            let Some(run) = self.runs.back_mut() else {
                break;
            };
            let take = run.1.min(n);
            run.1 -= take;
            n -= take;
            self.total -= take;
            if run.1 == 0 {
                self.runs.pop_back();
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
        assert_eq!(log.runs.len(), 1);
        log.evict(1499, 1000);
        assert_eq!(log.count(), 2);
        log.evict(1500, 1000);
        assert_eq!(log.count(), 0);
    }

    #[test]
    fn refund_removes_newest_across_runs() {
        let mut log = Log::new();
        log.record(100, 2);
        log.record(200, 3);
        log.refund(4);
        assert_eq!(log.count(), 1);
        assert_eq!(log.newest(), Some(100));
        log.refund(10);
        assert!(log.is_empty());
        assert_eq!(log.newest(), None);
    }
}
