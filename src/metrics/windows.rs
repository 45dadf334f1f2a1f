//! Window cardinality and hot keys: how full the sliding-window logs are, per rule and for the
//! hottest keys, from the count every decision already returns (no extra round trip).
//!
//! Why rendered here: the per-rule gauges are published at scrape time from the bounded
//! [`Tracker`], and the hot keys are written as Prometheus text at each scrape rather than
//! registered, so a key that cools down leaves no series behind. The Redis memory estimate
//! comes from the Redis code's own figures (`crate::limiter::redis::footprint`).

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use std::sync::Mutex;

use super::names::{
    HOT_KEY_ENTRIES, REDIS_MEMORY_ESTIMATE_BYTES, WINDOW_ENTRIES, WINDOW_ENTRIES_MAX, WINDOW_KEYS,
    WINDOW_UNTRACKED_TOTAL,
};
use super::tracker::{Observation, Snapshot, Tracker};
use crate::descriptor::Entry;
use crate::limiter::redis::footprint;
use crate::sync::lock;

/// Keys the window tracker remembers (about 100 bytes each): bounds its memory to a few MB.
pub const TRACKED_KEYS_MAX: usize = 50_000;
/// One "recent" interval of the decaying per-rule max: it shows the largest window seen in the
/// last 10 to 20 seconds.
pub const RECENT_INTERVAL: Duration = Duration::from_secs(10);
/// Characters of the descriptor shown in a hot key's label, before its hash.
const HOT_KEY_TEXT_MAX: usize = 32;

/// One verdict's view of its key's window, as [`Windows::observe`] takes it.
pub(super) struct KeyWindow<'a> {
    pub domain: &'a str,
    pub rule: &'a str,
    /// The limiter key (hashed, never kept).
    pub key: &'a str,
    /// The descriptor's entries, for the hot-key label.
    pub entries: &'a [Entry],
    pub count: u64,
    pub window_ms: u64,
}

/// The window tracker and its monotonic clock.
pub(super) struct Windows {
    tracker: Mutex<Tracker>,
    started: Instant,
}

impl Windows {
    pub(super) fn new() -> Self {
        Windows {
            tracker: Mutex::new(Tracker::new(
                TRACKED_KEYS_MAX,
                RECENT_INTERVAL.as_millis() as u64,
                0,
            )),
            started: Instant::now(),
        }
    }

    /// Milliseconds on a monotonic clock, for the tracker.
    pub(super) fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Records the count one decision returned for a key.
    pub(super) fn observe(&self, window: KeyWindow<'_>, now_ms: u64) {
        // Identifies the key inside the tracker only; a collision would merge two keys'
        // gauges, never decisions, so a fast hash will do.
        let mut hasher = std::hash::DefaultHasher::new();
        std::hash::Hash::hash(window.key, &mut hasher);
        let key_hash = std::hash::Hasher::finish(&hasher);
        lock(&self.tracker).record(
            Observation {
                domain: window.domain,
                rule: window.rule,
                key_hash,
                count: window.count,
                window_ms: window.window_ms,
            },
            || hot_key_label(window.entries, key_hash),
            now_ms,
        );
    }

    /// Publishes the per-rule gauges (and, for Redis, the memory estimate) and returns the
    /// `hot_keys` hottest keys as Prometheus text.
    pub(super) fn collect(&self, hot_keys: usize, redis: bool) -> String {
        let snapshot = lock(&self.tracker).snapshot(hot_keys, self.now_ms());
        for rule in &snapshot.rules {
            let labels = [("domain", rule.domain.clone()), ("rule", rule.rule.clone())];
            metrics::gauge!(WINDOW_ENTRIES_MAX, &labels).set(rule.max as f64);
            metrics::gauge!(WINDOW_ENTRIES, &labels).set(rule.entries as f64);
            metrics::gauge!(WINDOW_KEYS, &labels).set(rule.keys as f64);
        }
        metrics::counter!(WINDOW_UNTRACKED_TOTAL).absolute(snapshot.untracked);
        if redis {
            metrics::gauge!(REDIS_MEMORY_ESTIMATE_BYTES)
                .set(footprint::keys_bytes(&snapshot.key_counts) as f64);
        }
        render_hot_keys(&snapshot)
    }
}

/// `key=value,...` cut to a few characters, then `#` and 8 hex digits of the key's hash: enough
/// to recognise a key and to look it up, without putting whole client values on a dashboard.
fn hot_key_label(entries: &[Entry], key_hash: u64) -> String {
    let mut text = String::new();
    for (i, entry) in entries.iter().enumerate() {
        if i > 0 {
            text.push(',');
        }
        let _ = write!(text, "{}={}", entry.key, entry.value);
    }
    let mut label = truncate(&text, HOT_KEY_TEXT_MAX).to_owned();
    let _ = write!(label, "#{:08x}", key_hash >> 32);
    label
}

/// The longest prefix of `s` of at most `max` bytes that ends on a char boundary.
pub(super) fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// A Prometheus label value, escaped as the text format requires.
pub(super) fn escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

fn render_hot_keys(snapshot: &Snapshot) -> String {
    let mut text = String::new();
    let _ = writeln!(
        text,
        "# HELP {HOT_KEY_ENTRIES} Entries in the window of the hottest live keys (key: truncated descriptor and hash)"
    );
    let _ = writeln!(text, "# TYPE {HOT_KEY_ENTRIES} gauge");
    for hot in &snapshot.hot {
        let _ = writeln!(
            text,
            "{HOT_KEY_ENTRIES}{{domain=\"{}\",rule=\"{}\",key=\"{}\"}} {}",
            escape(&hot.domain),
            escape(&hot.rule),
            escape(&hot.label),
            hot.count
        );
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hot_key_labels_are_short_and_escaped_on_output() {
        let label = hot_key_label(&[Entry::new("user", "é".repeat(40))], 0xdead_beef_0000_0000);
        assert!(label.len() <= HOT_KEY_TEXT_MAX + 9, "{label}");
        assert!(label.ends_with("#deadbeef"), "{label}");
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
