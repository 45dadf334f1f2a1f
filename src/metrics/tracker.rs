//! How full the sliding-window logs are: per rule and per key, from the entry counts the backend
//! returns with every decision (no extra round trip), in bounded memory.
//!
//! Why a structure of its own: the interesting numbers ("how many entries does this rule keep
//! in Redis", "which keys are hottest") are sums and rankings over keys, and keys are
//! per-request values, so they can never be metric labels wholesale. The tracker keeps the last
//! count of at most `max_keys` keys and derives the per-rule gauges and the top N from them.
//!
//! Definitions (all documented in docs/metrics.md):
//! - A key is *live* from a decision until `window_ms` after it: no entry recorded before that
//!   decision can still be in the window later (Redis also expires the key by then). Its count is
//!   the one the latest decision returned; with no later decision it can only shrink, so sums
//!   over live keys are upper bounds of what the backend holds for the keys this instance saw.
//! - `entries` of a rule: the sum of the counts of its live tracked keys; `keys`: how many.
//! - `max` of a rule ("largest over recent decisions"): the largest count returned by any
//!   decision in the current interval or the one before it, so a spike stays visible for one to
//!   two intervals and then decays to what recent traffic shows.
//! - Keys beyond `max_keys` are not tracked (counted in `untracked`): sums are then low.
//!
//! Pure: every method takes `now_ms` from the caller's clock.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

/// One key's last observation.
#[derive(Debug)]
struct KeyState {
    rule: usize,
    count: u64,
    live_until_ms: u64,
    label: Box<str>,
}

#[derive(Debug, Clone, Default)]
struct RuleState {
    domain: String,
    rule: String,
    entries: u64,
    keys: u64,
    max_current: u64,
    max_previous: u64,
}

/// A rule's gauges at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleStats {
    pub domain: String,
    pub rule: String,
    /// Largest window count returned in the current or previous interval.
    pub max: u64,
    /// Sum of the counts of live tracked keys.
    pub entries: u64,
    /// Live tracked keys.
    pub keys: u64,
}

/// One of the hottest keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HotKey {
    pub domain: String,
    pub rule: String,
    /// Truncated, hashed display form given to [`Tracker::record`].
    pub label: String,
    pub count: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    pub rules: Vec<RuleStats>,
    /// Highest counts first.
    pub hot: Vec<HotKey>,
    /// Per live tracked key, its count (for memory estimates that depend on the encoding).
    pub key_counts: Vec<u64>,
    /// Observations of keys that could not be tracked because `max_keys` were.
    pub untracked: u64,
}

/// One observation of a key, as [`Tracker::record`] takes it.
#[derive(Debug, Clone, Copy)]
pub struct Observation<'a> {
    pub domain: &'a str,
    pub rule: &'a str,
    /// A stable hash of the limiter key (collisions merge two keys' counts, nothing worse).
    pub key_hash: u64,
    /// Entries in the key's window after the decision.
    pub count: u64,
    pub window_ms: u64,
}

#[derive(Debug)]
pub struct Tracker {
    max_keys: usize,
    interval_ms: u64,
    keys: HashMap<u64, KeyState>,
    rules: Vec<RuleState>,
    /// domain -> rule path -> index in `rules`.
    rule_index: HashMap<String, HashMap<String, usize>>,
    interval_start_ms: u64,
    untracked: u64,
}

impl Tracker {
    /// `interval_ms` is the length of one "recent" interval for the decaying max (at least 1).
    pub fn new(max_keys: usize, interval_ms: u64, now_ms: u64) -> Self {
        Tracker {
            max_keys,
            interval_ms: interval_ms.max(1),
            keys: HashMap::new(),
            rules: Vec::new(),
            rule_index: HashMap::new(),
            interval_start_ms: now_ms,
            untracked: 0,
        }
    }

    /// Records one decision's count for a key. `label` builds the key's display form; it is
    /// called only when the key starts being tracked.
    pub fn record(&mut self, obs: Observation<'_>, label: impl FnOnce() -> String, now_ms: u64) {
        self.advance(now_ms);
        let rule = self.rule_slot(obs.domain, obs.rule);
        let live_until_ms = now_ms.saturating_add(obs.window_ms);
        if let Some(state) = self.keys.get_mut(&obs.key_hash) {
            let old = &mut self.rules[state.rule];
            old.entries = old.entries.saturating_sub(state.count);
            old.keys = old.keys.saturating_sub(1);
            state.rule = rule;
            state.count = obs.count;
            state.live_until_ms = live_until_ms;
        } else if self.keys.len() < self.max_keys {
            self.keys.insert(
                obs.key_hash,
                KeyState {
                    rule,
                    count: obs.count,
                    live_until_ms,
                    label: label().into_boxed_str(),
                },
            );
        } else {
            self.untracked = self.untracked.saturating_add(1);
            let r = &mut self.rules[rule];
            r.max_current = r.max_current.max(obs.count);
            return;
        }
        let r = &mut self.rules[rule];
        r.entries = r.entries.saturating_add(obs.count);
        r.keys += 1;
        r.max_current = r.max_current.max(obs.count);
    }

    /// The gauges now, with the `top` hottest live keys.
    pub fn snapshot(&mut self, top: usize, now_ms: u64) -> Snapshot {
        self.advance(now_ms);
        self.expire(now_ms);
        let rules = self
            .rules
            .iter()
            .map(|r| RuleStats {
                domain: r.domain.clone(),
                rule: r.rule.clone(),
                max: r.max_current.max(r.max_previous),
                entries: r.entries,
                keys: r.keys,
            })
            .collect();
        // A min-heap of the best `top` so far: O(keys log top), memory O(top).
        let mut heap: BinaryHeap<Reverse<(u64, &str, usize)>> = BinaryHeap::with_capacity(top + 1);
        if top > 0 {
            for state in self.keys.values() {
                heap.push(Reverse((state.count, &state.label, state.rule)));
                if heap.len() > top {
                    heap.pop();
                }
            }
        }
        let mut hot: Vec<HotKey> = heap
            .into_iter()
            .map(|Reverse((count, label, rule))| HotKey {
                domain: self.rules[rule].domain.clone(),
                rule: self.rules[rule].rule.clone(),
                label: label.to_owned(),
                count,
            })
            .collect();
        hot.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.label.cmp(&b.label)));
        Snapshot {
            rules,
            hot,
            key_counts: self.keys.values().map(|k| k.count).collect(),
            untracked: self.untracked,
        }
    }

    fn rule_slot(&mut self, domain: &str, rule: &str) -> usize {
        // Two levels so the lookup borrows: the common case allocates nothing.
        if let Some(&i) = self
            .rule_index
            .get(domain)
            .and_then(|rules| rules.get(rule))
        {
            return i;
        }
        self.rules.push(RuleState {
            domain: domain.to_owned(),
            rule: rule.to_owned(),
            ..RuleState::default()
        });
        let i = self.rules.len() - 1;
        self.rule_index
            .entry(domain.to_owned())
            .or_default()
            .insert(rule.to_owned(), i);
        i
    }

    /// Rolls the decaying max over when an interval has passed.
    fn advance(&mut self, now_ms: u64) {
        let elapsed = now_ms.saturating_sub(self.interval_start_ms);
        if elapsed < self.interval_ms {
            return;
        }
        let skipped_one = elapsed >= 2 * self.interval_ms;
        for r in &mut self.rules {
            r.max_previous = if skipped_one { 0 } else { r.max_current };
            r.max_current = 0;
        }
        self.interval_start_ms = now_ms - elapsed % self.interval_ms;
        self.expire(now_ms);
    }

    /// Forgets keys whose every entry has left the window.
    fn expire(&mut self, now_ms: u64) {
        let rules = &mut self.rules;
        self.keys.retain(|_, state| {
            let live = state.live_until_ms > now_ms;
            if !live {
                let r = &mut rules[state.rule];
                r.entries = r.entries.saturating_sub(state.count);
                r.keys = r.keys.saturating_sub(1);
            }
            live
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obs(rule: &'static str, key_hash: u64, count: u64) -> Observation<'static> {
        Observation {
            domain: "d",
            rule,
            key_hash,
            count,
            window_ms: 60_000,
        }
    }

    fn rule<'a>(s: &'a Snapshot, name: &str) -> &'a RuleStats {
        s.rules.iter().find(|r| r.rule == name).unwrap()
    }

    #[test]
    fn sums_the_latest_count_per_key_and_ranks_the_hottest() {
        let mut t = Tracker::new(100, 10_000, 0);
        for (hash, count) in [(1, 1), (1, 2), (1, 3), (2, 1), (3, 5)] {
            t.record(obs("user", hash, count), || format!("k{hash}"), 10);
        }
        t.record(obs("ip", 9, 4), || "ip".into(), 10);
        let s = t.snapshot(2, 20);
        let user = rule(&s, "user");
        assert_eq!((user.entries, user.keys, user.max), (3 + 1 + 5, 3, 5));
        assert_eq!(rule(&s, "ip").entries, 4);
        let hot: Vec<_> = s.hot.iter().map(|h| (h.label.as_str(), h.count)).collect();
        assert_eq!(hot, [("k3", 5), ("ip", 4)]);
    }

    #[test]
    fn keys_expire_after_their_window_and_the_max_decays() {
        let mut t = Tracker::new(100, 10_000, 0);
        t.record(obs("user", 1, 7), || "a".into(), 0);
        // Next interval: the max of the previous one still shows.
        t.record(obs("user", 2, 2), || "b".into(), 15_000);
        assert_eq!(rule(&t.snapshot(10, 15_000), "user").max, 7);
        // Key 1 leaves at 60 s; two intervals later the max only shows recent decisions.
        let s = t.snapshot(10, 61_000);
        let user = rule(&s, "user");
        assert_eq!((user.entries, user.keys, user.max), (2, 1, 0));
        assert_eq!(s.hot.len(), 1);
        let s = t.snapshot(10, 76_000);
        assert_eq!((rule(&s, "user").entries, s.hot.len()), (0, 0));
    }

    #[test]
    fn memory_is_bounded_by_max_keys() {
        let mut t = Tracker::new(10, 10_000, 0);
        for hash in 0..1_000 {
            t.record(obs("user", hash, 1), || format!("k{hash}"), 5);
        }
        let s = t.snapshot(3, 5);
        assert_eq!(t.keys.len(), 10);
        assert_eq!(s.untracked, 990);
        assert_eq!(rule(&s, "user").keys, 10);
        assert_eq!(s.hot.len(), 3);
    }
}
