//! The arithmetic of allotments, pure: how many tokens a bucket's reported demand asks for, the
//! most one assignment may take of a limit, and the token bucket that never spends more than
//! its allotment.
//!
//! Why these rules (docs/rlqs.md has the figures):
//! - An allotment counts for `HOLD_MS + window` from its grant, so the grants of any span of
//!   that length add up to the limit at most: a bucket granted one assignment per report can
//!   use the limit fully with at most `limit × TTL / (window + HOLD)` per assignment ([`cap`]).
//!   Capping every assignment there spreads the limit over the window and lets every Envoy
//!   reporting on the rule take a share as room frees, instead of the first to report taking
//!   the whole limit at once and the others waiting a window for it to free again.
//! - A bucket asks for its demand over one assignment's life, a quarter more for growth
//!   ([`want`]); demand is what Envoy allowed and denied, so a bucket held back by its
//!   allotment asks for more at the next report. A bucket with no request asks for nothing:
//!   idle Envoys give their share back with the next report.
//! - Envoy's token bucket refills continuously at `tokens_per_fill / fill_interval`, and starts
//!   full. Over its life (at most `HOLD_MS`) it spends `max_tokens` plus what it refilled, so
//!   [`token_bucket_for`] chooses `max_tokens` so that both together stay within the
//!   allotment. Two assignments in a row always differ (`tokens_per_fill` alternates between
//!   two values): Envoy replaces a bucket by a full new one only when the strategy changes, and
//!   would carry over an unchanged one's tokens with a longer life, past its reservation.

use super::{ASSIGNMENT_TTL_S, FILL_INTERVAL_S, HOLD_MS, TokenBucket};

/// A bucket's demand, from its reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Demand {
    /// No report with a time yet: the bucket's first, sent with its first request.
    First,
    /// Requests (allowed and denied) in so many seconds since the previous report (at least 1);
    /// none when idle.
    Rate { requests: u64, seconds: u64 },
}

/// The most one assignment may take of a limit of `limit` per `window_ms`: the limit's share
/// over one assignment's life when every allotment counts `HOLD_MS + window_ms`, rounded up
/// (`ceil(limit × TTL / (window + HOLD))`), so a limit of 1 still lets one token through.
pub fn cap(limit: u64, window_ms: u64) -> u64 {
    let ttl_ms = u128::from(ASSIGNMENT_TTL_S * 1_000);
    let span = u128::from(window_ms) + u128::from(HOLD_MS);
    let share = (u128::from(limit) * ttl_ms).div_ceil(span);
    u64::try_from(share).unwrap_or(u64::MAX)
}

/// Tokens a bucket asks for: its demand over one assignment's life and a quarter more, rounded
/// up; nothing when idle; `u64::MAX` (as much as one assignment may take) before its demand is
/// known.
pub fn want(demand: Demand) -> u64 {
    match demand {
        Demand::First => u64::MAX,
        Demand::Rate { requests, seconds } => {
            // ceil(requests / seconds × TTL × 5 / 4), exactly.
            let asked = u128::from(requests) * u128::from(ASSIGNMENT_TTL_S) * 5;
            let tokens = asked.div_ceil(u128::from(seconds.max(1)) * 4);
            u64::try_from(tokens).unwrap_or(u64::MAX)
        }
    }
}

/// What a bucket of `max_tokens` refilled at `tokens_per_fill` per [`FILL_INTERVAL_S`] can
/// spend within `HOLD_MS`: all its tokens and its refill, rounded down (a token is spent
/// whole).
pub fn spendable(max_tokens: u64, tokens_per_fill: u64) -> u64 {
    let refill =
        u128::from(tokens_per_fill) * u128::from(HOLD_MS) / (u128::from(FILL_INTERVAL_S) * 1_000);
    max_tokens.saturating_add(u64::try_from(refill).unwrap_or(u64::MAX))
}

/// The token bucket for an allotment of `tokens` (at least 1): the largest `max_tokens` whose
/// [`spendable`] stays within `tokens` even at a `tokens_per_fill` of `max_tokens + 1`, with
/// `tokens_per_fill` `max_tokens`, or `max_tokens + 1` when `last` (the bucket's previous
/// assignment) was that very bucket. `None` for 0 tokens.
pub fn token_bucket_for(tokens: u64, last: Option<TokenBucket>) -> Option<TokenBucket> {
    if tokens == 0 {
        return None;
    }
    let fits = |m: u64| spendable(m, m + 1) <= tokens;
    let top = u64::from(u32::MAX - 1);
    let fill_ms = FILL_INTERVAL_S * 1_000;
    // About tokens / (1 + HOLD / FILL), then the last few steps exactly.
    let mut m = (u128::from(tokens) * u128::from(fill_ms) / u128::from(fill_ms + HOLD_MS))
        .min(u128::from(top)) as u64;
    m = m.max(1);
    while m > 1 && !fits(m) {
        m -= 1;
    }
    while m < top && fits(m + 1) {
        m += 1;
    }
    // `m` and `m + 1` both fit in a u32: `m <= top`.
    let max_tokens = u32::try_from(m).unwrap_or(u32::MAX - 1);
    let same = TokenBucket {
        max_tokens,
        tokens_per_fill: max_tokens,
        fill_interval_s: FILL_INTERVAL_S,
    };
    if last == Some(same) {
        Some(TokenBucket {
            tokens_per_fill: max_tokens + 1,
            ..same
        })
    } else {
        Some(same)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_share_the_limit_over_an_assignments_life() {
        // 6 s of a minute counted 67 s: 100 × 6 / 67 = 8.96.
        assert_eq!(cap(100, 60_000), 9);
        assert_eq!(cap(6_000, 60_000), 538);
        // A limit of 1 still lets a token through; 0 none.
        assert_eq!(cap(1, 3_600_000), 1);
        assert_eq!(cap(0, 60_000), 0);
        // No overflow at the largest limit.
        assert!(cap(u64::MAX, 1) > u64::MAX / 2);
    }

    #[test]
    fn want_is_a_quarter_more_than_the_demand_over_a_life() {
        let rate = |requests, seconds| want(Demand::Rate { requests, seconds });
        assert_eq!(rate(50, 5), 75);
        // 0.8 per second: exactly 6, no rounding up of a float's last bit.
        assert_eq!(rate(8, 10), 6);
        assert_eq!(rate(1, 10), 1);
        assert_eq!(rate(0, 5), 0);
        assert_eq!(rate(u64::MAX, 1), u64::MAX);
        assert_eq!(want(Demand::First), u64::MAX);
    }

    /// The bucket never spends more than its allotment, even at the higher of its two fills,
    /// and uses as much of it as that allows.
    #[test]
    fn a_token_bucket_spends_at_most_its_allotment() {
        for tokens in (1..3_000).chain([1 << 20, u64::from(u32::MAX), u64::MAX]) {
            let bucket = token_bucket_for(tokens, None).unwrap();
            let m = u64::from(bucket.max_tokens);
            assert!(m >= 1, "{tokens}");
            assert!(spendable(m, m + 1) <= tokens, "{tokens}: {bucket:?}");
            if m < u64::from(u32::MAX - 1) {
                assert!(spendable(m + 1, m + 2) > tokens, "{tokens}: {bucket:?}");
            }
            assert_eq!(bucket.fill_interval_s, FILL_INTERVAL_S);
        }
        // 100 tokens: 90 at once, and 10 of refill within the hold at a fill of 91 per
        // minute (91 × 7 / 60 = 10.6).
        assert_eq!(token_bucket_for(100, None).unwrap().max_tokens, 90);
        assert_eq!(token_bucket_for(0, None), None);
    }

    #[test]
    fn two_assignments_in_a_row_always_differ() {
        let first = token_bucket_for(50, None).unwrap();
        let second = token_bucket_for(50, Some(first)).unwrap();
        let third = token_bucket_for(50, Some(second)).unwrap();
        assert_ne!(first, second);
        assert_ne!(second, third);
        assert_eq!(first, third);
        assert_eq!(second.tokens_per_fill, second.max_tokens + 1);
        // A different allotment differs anyway.
        let other = token_bucket_for(60, Some(first)).unwrap();
        assert_eq!(other.tokens_per_fill, other.max_tokens);
    }
}
