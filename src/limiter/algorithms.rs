//! The limiting algorithms and the pure reference model of each one's per-key state.
//!
//! Why a separate, pure module: every algorithm must behave identically on the memory backend
//! (which runs these functions) and in the Redis script (a transcription of them), and the
//! property test in tests/it/differential.rs holds the two to that on random traces over a virtual
//! clock. Time is always passed in, so every edge is testable with explicit numbers.
//!
//! One key holds one [`State`]; its transition for one batch item is
//! `settle(now)` (evict / rotate / decay: a pure function of time, idempotent at one `now`),
//! then the check `count + earlier + hits <= capacity` (shared by every algorithm, see
//! [`super::window::check`]), then `record` of what the verdict records (see
//! [`super::OverLimit`]) or, on an admitted batch, `refund`, and finally the report `count` /
//! `reset_ms`. Every state counts weights exactly: recording `h` hits adds exactly `h` to the
//! count, in one step, whatever `h` is.
//!
//! - [`Algorithm::SlidingLog`]: one entry per recording item, carrying its hits as its weight,
//!   counted while `now - t < window`. Exact.
//! - [`Algorithm::QuantizedLog`]: hits counted per quantum-aligned bucket (recorded at
//!   `floor(now / q) * q`); a bucket counts while `start + q + window > now`, so every hit counts
//!   for at least the window (never more admitted than the limit in any window) and at most one
//!   quantum longer. Memory O(window / quantum).
//! - [`Algorithm::SlidingCounter`]: counters of the current and the previous fixed window;
//!   `count = cur + ceil(prev * (window - elapsed) / window)` (computed in `f64`, exactly as the
//!   Lua script does). O(1), approximate: it assumes the previous window's hits were spread
//!   evenly.
//! - [`Algorithm::Gcra`]: a token bucket of `burst` tokens refilled at `limit` per window, kept
//!   as GCRA: a theoretical arrival time `tat` (ms) and a remainder, so that the tokens in use ×
//!   window, in integer "token-ms" (the refill of `limit` token-ms per ms is exact), are
//!   `max(0, (tat - now) × limit + rem)`. One time and one small number, which the Redis script
//!   packs into one integer. `count` is the tokens in use, rounded up; `reset_ms` the exact time
//!   until one more token is free. O(1).
//! - [`Algorithm::FixedWindow`]: envoyproxy/ratelimit's counter per `floor(now / window)`. O(1).
//!   Admits up to twice the limit across a window boundary.
//! - [`Algorithm::InFlight`]: leases, not a rate: an admitted item holds one lease named by its
//!   token ([`Item::lease`]) until a refund naming that token releases it or `window_ms` (the
//!   lease) has passed ([`Leases`]). `count` is the live leases, `reset_ms` the time until the
//!   oldest expires. It counts requests, not hits (an item's hits count as at most 1) and a
//!   refused item never holds a lease, whatever its [`super::OverLimit`]. O(requests in
//!   flight).
//!
//! Clock steps back: logs record at `max(now, newest)` and window starts never move backwards,
//! so a lagging instance never rewinds a key. GCRA keeps no "last update" at all: an instance
//! whose clock lags sees its earlier `now` against the same arrival time, i.e. more tokens in
//! use than a punctual one (conservative: it may reject what a punctual clock would admit, never
//! the other way round), and what it records stacks onto the same arrival time.

use super::Item;
use super::leases::Leases;
use super::log::Log;

/// How a limit counts. Part of the limiter key (see [`Algorithm::key_tag`]), so one key is
/// only ever used with one algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Algorithm {
    #[default]
    SlidingLog,
    QuantizedLog {
        quantum_ms: u64,
    },
    SlidingCounter,
    Gcra {
        burst: u64,
    },
    FixedWindow,
    /// Concurrency: leases of `window_ms` each (see the module doc).
    InFlight,
}

/// Default quantum of `quantized_log`.
pub const DEFAULT_QUANTUM_MS: u64 = 1_000;

impl Algorithm {
    /// The config name.
    pub const fn name(self) -> &'static str {
        match self {
            Algorithm::SlidingLog => "sliding_log",
            Algorithm::QuantizedLog { .. } => "quantized_log",
            Algorithm::SlidingCounter => "sliding_counter",
            Algorithm::Gcra { .. } => "gcra",
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::InFlight => "in_flight",
        }
    }

    /// What an item may hold: the burst for GCRA (none at a rate of 0), else the limit.
    pub const fn capacity(self, limit: u64) -> u64 {
        match self {
            Algorithm::Gcra { burst } => {
                if limit > 0 {
                    burst
                } else {
                    0
                }
            }
            _ => limit,
        }
    }

    /// Whether a rejection stays certain until `reset_ms` (what the local rejection cache
    /// needs): true when the count can only drop at `reset_ms` or later. Not for the sliding
    /// counter, whose estimate decays continuously, nor for leases, which end whenever their
    /// requests do.
    pub const fn rejection_is_stable(self) -> bool {
        !matches!(self, Algorithm::SlidingCounter | Algorithm::InFlight)
    }

    /// The hits an item of `hits` counts with: leases count requests, so at most 1 for
    /// `in_flight` (0 stays a check-only probe); the hits themselves otherwise.
    pub const fn counted_hits(self, hits: u64) -> u64 {
        match self {
            Algorithm::InFlight if hits > 0 => 1,
            _ => hits,
        }
    }

    /// Suffix that keeps each algorithm's keys apart (empty for the sliding log, whose keys stay
    /// as they always were). Letters, digits and `.` only; never all digits, never with `=`.
    pub fn key_tag(self) -> String {
        match self {
            Algorithm::SlidingLog => String::new(),
            Algorithm::QuantizedLog { quantum_ms } => format!("ql{quantum_ms}"),
            Algorithm::SlidingCounter => "sc".into(),
            Algorithm::Gcra { .. } => "gcra".into(),
            Algorithm::FixedWindow => "fw".into(),
            Algorithm::InFlight => "if".into(),
        }
    }
}

/// One key's state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    /// `sliding_log` entries, or `quantized_log` buckets (timestamps = bucket starts).
    Log(Log),
    Fixed {
        start: u64,
        count: u64,
    },
    Counter {
        start: u64,
        cur: u64,
        prev: u64,
    },
    /// Tokens in use × window_ms at `now`: `max(0, (tat - now) × rate + rem)` token-ms with
    /// `rate = max(limit, 1)` (see [`gcra_in_use`]); `(0, 0)` when empty.
    Gcra {
        tat: u64,
        rem: u64,
    },
    /// `in_flight` leases.
    Leases(Leases),
}

/// Ceiling of GCRA's token-ms (2^52, the script's `MAX_EXACT`): the script computes in doubles,
/// exact below 2^53. Configs are validated to `burst × window_ms <= 2^52`, so admitted hits
/// never reach it; it only bounds what a changed limit or a huge refund could compute.
pub const GCRA_MAX_TOKEN_MS: u64 = 1 << 52;

/// GCRA's refill per ms in token-ms. A limit of 0 (which configs reject for GCRA) refills
/// like 1, so the representation never divides by zero; its capacity is 0 anyway.
fn gcra_rate(limit: u64) -> u64 {
    limit.max(1)
}

/// Tokens in use × window at `now`, in token-ms (see [`State::Gcra`]).
pub fn gcra_in_use(tat: u64, rem: u64, limit: u64, now: u64) -> u64 {
    let rate = u128::from(gcra_rate(limit));
    let used = if tat >= now {
        u128::from(tat - now) * rate + u128::from(rem)
    } else {
        u128::from(rem).saturating_sub(u128::from(now - tat) * rate)
    };
    // Bounded by the clamp, so the cast back is lossless.
    used.min(u128::from(GCRA_MAX_TOKEN_MS)) as u64
}

/// The arrival time and remainder that hold `used` token-ms at `now`.
fn gcra_at(used: u64, limit: u64, now: u64) -> (u64, u64) {
    if used == 0 {
        return (0, 0);
    }
    let rate = gcra_rate(limit);
    (now.saturating_add(used / rate), used % rate)
}

fn ceil_div(a: u64, b: u64) -> u64 {
    if b == 0 {
        return 0;
    }
    a.div_ceil(b)
}

/// The weighted share of the previous window still inside the sliding window (the script
/// computes the same IEEE-754 double operations in the same order).
fn weighted_prev(prev: u64, elapsed: u64, window: u64) -> u64 {
    let left = window.saturating_sub(elapsed);
    ((prev as f64) * (left as f64) / (window as f64)).ceil() as u64
}

impl State {
    pub fn fresh(algorithm: Algorithm) -> State {
        match algorithm {
            Algorithm::SlidingLog | Algorithm::QuantizedLog { .. } => State::Log(Log::new()),
            Algorithm::FixedWindow => State::Fixed { start: 0, count: 0 },
            Algorithm::SlidingCounter => State::Counter {
                start: 0,
                cur: 0,
                prev: 0,
            },
            Algorithm::Gcra { .. } => State::Gcra { tat: 0, rem: 0 },
            Algorithm::InFlight => State::Leases(Leases::new()),
        }
    }

    /// Whether this state belongs to `algorithm` (else the key is started afresh).
    pub fn fits(&self, algorithm: Algorithm) -> bool {
        matches!(
            (self, algorithm),
            (
                State::Log(_),
                Algorithm::SlidingLog | Algorithm::QuantizedLog { .. }
            ) | (State::Fixed { .. }, Algorithm::FixedWindow)
                | (State::Counter { .. }, Algorithm::SlidingCounter)
                | (State::Gcra { .. }, Algorithm::Gcra { .. })
                | (State::Leases(_), Algorithm::InFlight)
        )
    }

    /// Brings the state to `now`. Idempotent at one `now`, and never moves backwards.
    pub fn settle(&mut self, hit: &Item, now: u64) {
        let w = hit.window_ms.max(1);
        match (self, hit.algorithm) {
            (State::Log(log), Algorithm::QuantizedLog { quantum_ms }) => {
                log.evict(now, hit.window_ms.saturating_add(quantum_ms.max(1)))
            }
            (State::Log(log), _) => log.evict(now, hit.window_ms),
            (State::Leases(leases), _) => leases.evict(now, hit.window_ms),
            (State::Fixed { start, count }, _) => {
                let s = now / w * w;
                if s > *start {
                    *start = s;
                    *count = 0;
                }
            }
            (State::Counter { start, cur, prev }, _) => {
                let s = now / w * w;
                if s > *start {
                    *prev = if s == start.saturating_add(w) {
                        *cur
                    } else {
                        0
                    };
                    *cur = 0;
                    *start = s;
                }
            }
            (State::Gcra { tat, rem }, _) => {
                // Only an emptied bucket changes: it forgets its arrival time.
                if gcra_in_use(*tat, *rem, hit.limit, now) == 0 {
                    (*tat, *rem) = (0, 0);
                }
            }
        }
    }

    /// What counts against the capacity at `now` (after [`State::settle`]).
    pub fn count(&self, hit: &Item, now: u64) -> u64 {
        let w = hit.window_ms.max(1);
        match self {
            State::Log(log) => log.count(),
            State::Leases(leases) => leases.count(),
            State::Fixed { count, .. } => *count,
            State::Counter { start, cur, prev } => {
                cur.saturating_add(weighted_prev(*prev, now.saturating_sub(*start), w))
            }
            State::Gcra { tat, rem } => ceil_div(gcra_in_use(*tat, *rem, hit.limit, now), w),
        }
    }

    /// Milliseconds until the count drops (exactly, except for the sliding counter, where it is
    /// the end of the current fixed window); `window_ms` for an empty log or bucket.
    pub fn reset_ms(&self, hit: &Item, now: u64) -> u64 {
        let w = hit.window_ms.max(1);
        match (self, hit.algorithm) {
            (State::Log(log), Algorithm::QuantizedLog { quantum_ms }) => {
                if log.is_empty() {
                    hit.window_ms
                } else {
                    log.reset_ms(now, hit.window_ms.saturating_add(quantum_ms.max(1)))
                }
            }
            (State::Log(log), _) => log.reset_ms(now, hit.window_ms),
            (State::Leases(leases), _) => leases.reset_ms(now, hit.window_ms),
            (State::Fixed { start, .. } | State::Counter { start, .. }, _) => {
                start.saturating_add(w).saturating_sub(now)
            }
            (State::Gcra { tat, rem }, _) => {
                let used = gcra_in_use(*tat, *rem, hit.limit, now);
                if used == 0 || hit.limit == 0 {
                    return hit.window_ms;
                }
                let c = ceil_div(used, w);
                ceil_div(used - (c - 1) * w, hit.limit)
            }
        }
    }

    /// Records `hits` hits at `now` (after [`State::settle`]): for the sliding log one entry of
    /// that weight (dated [`Item::hold_ms`] after `now`), for leases the lease of the item's
    /// token.
    pub fn record(&mut self, hit: &Item, now: u64, hits: u64) {
        let w = hit.window_ms.max(1);
        match (self, hit.algorithm) {
            (State::Log(log), Algorithm::QuantizedLog { quantum_ms }) => {
                let q = quantum_ms.max(1);
                log.add_to_bucket(now / q * q, hits)
            }
            (State::Log(log), _) => log.record(now.saturating_add(hit.hold_ms), hits),
            (State::Leases(leases), _) => leases.record(now, hit.lease),
            (State::Fixed { count, .. }, _) => *count = count.saturating_add(hits),
            (State::Counter { cur, .. }, _) => *cur = cur.saturating_add(hits),
            (State::Gcra { tat, rem }, _) => {
                let used = gcra_in_use(*tat, *rem, hit.limit, now)
                    .saturating_add(hits.saturating_mul(w))
                    .min(GCRA_MAX_TOKEN_MS);
                (*tat, *rem) = gcra_at(used, hit.limit, now);
            }
        }
    }

    /// Gives back up to `hits` at `now` (after [`State::settle`]), newest first; for leases,
    /// releases the lease of the item's token (none for token 0).
    pub fn refund(&mut self, hit: &Item, now: u64, hits: u64) {
        let w = hit.window_ms.max(1);
        match self {
            State::Log(log) => log.refund(hits),
            State::Leases(leases) => {
                if hit.lease != 0 {
                    leases.release(hit.lease);
                }
            }
            State::Fixed { count, .. } => *count = count.saturating_sub(hits),
            State::Counter { cur, prev, .. } => {
                let take = hits.min(*cur);
                *cur -= take;
                *prev = prev.saturating_sub(hits - take);
            }
            State::Gcra { tat, rem } => {
                let used =
                    gcra_in_use(*tat, *rem, hit.limit, now).saturating_sub(hits.saturating_mul(w));
                (*tat, *rem) = gcra_at(used, hit.limit, now);
            }
        }
    }

    /// Nothing left worth keeping: the key can be forgotten.
    pub fn is_empty(&self) -> bool {
        match self {
            State::Log(log) => log.is_empty(),
            State::Leases(leases) => leases.is_empty(),
            State::Fixed { count, .. } => *count == 0,
            State::Counter { cur, prev, .. } => *cur == 0 && *prev == 0,
            State::Gcra { tat, rem } => *tat == 0 && *rem == 0,
        }
    }

    /// When the key was last written (the memory backend evicts the least recent at capacity);
    /// for GCRA its arrival time, which is at or after its last write.
    pub fn last_activity(&self) -> u64 {
        match self {
            State::Log(log) => log.newest().unwrap_or(0),
            State::Leases(leases) => leases.newest().unwrap_or(0),
            State::Fixed { start, .. } | State::Counter { start, .. } => *start,
            State::Gcra { tat, .. } => *tat,
        }
    }
}

#[cfg(test)]
mod tests;
