//! What one rate-limit call adds to envoyproxy/ratelimit's stats, read from what the engine
//! returned (a [`Decision`] or a [`DecisionError`]); the engine knows nothing of these stats.
//!
//! envoyproxy/ratelimit counts hits, per descriptor with a limit (its `base_limiter.go`):
//! `total_hits` every hit asked for; `within_limit` the hits of a descriptor within its limit,
//! and `near_limit` those of them past `floor(limit × NEAR_LIMIT_RATIO)` (float32, as it
//! computes it); `over_limit` the hits of a descriptor over its limit, also
//! `over_limit_with_local_cache` when the local cache answered, and `shadow_mode` when a
//! `shadow_mode` rule let them through. Unknown domains count `domain_not_found` once per
//! descriptor; `unlimited` descriptors, descriptors without a rule and limits dropped by
//! `replaces` count nothing.
//!
//! sluice decides all-or-nothing, so: a descriptor within its own limit on a request another
//! descriptor rejected (nothing recorded) counts `within_limit`, as envoyproxy/ratelimit's
//! status for it would say; a rejected descriptor counts all its hits `over_limit` (a fixed
//! window counts there only the part past the limit and `near_limit` the rest, having recorded
//! them; sluice recorded none). Refunds (`is_negative_hits`) count nothing.

use super::names::{LimitStat, ServiceStat, sanitize, stat_key};
use super::store::{OVERFLOW_KEY, Store};
use crate::decision::{
    Code, Decision, DecisionError, Descriptor, Outcome, Request, StatKey, Verdict, split_lease,
};
use crate::limiter::AnsweredBy;

/// Adds what a decided call counts.
pub(super) fn decision(store: &Store, ratio: f32, request: &Request, decision: &Decision) {
    if !decision.known_domain {
        let domain = sanitize(&request.domain);
        for _ in &request.descriptors {
            store.add_domain_not_found(&domain);
        }
        return;
    }
    for (verdict, descriptor) in decision.verdicts.iter().zip(&request.descriptors) {
        verdict_stats(store, ratio, request, decision, (verdict, descriptor));
    }
    // The global shadow mode turned an OVER_LIMIT into OK.
    if decision.overall == Code::Ok && decision.verdicts.iter().any(|v| v.code == Code::OverLimit) {
        store.add_service(ServiceStat::GlobalShadowMode, 1);
    }
    if decision.backend_failed.is_some() {
        store.add_service(ServiceStat::RedisError, 1);
    }
}

/// Adds what a call answered with an error counts.
pub(super) fn error(store: &Store, err: &DecisionError) {
    let stat = match err {
        DecisionError::Backend(_) => ServiceStat::RedisError,
        DecisionError::Invalid(_) | DecisionError::NoConfig => ServiceStat::ServiceError,
    };
    store.add_service(stat, 1);
}

fn verdict_stats(
    store: &Store,
    ratio: f32,
    request: &Request,
    decision: &Decision,
    (verdict, descriptor): (&Verdict, &Descriptor),
) {
    let (Some(stat), Some(limit)) = (&verdict.stat, &verdict.limit) else {
        return;
    };
    if descriptor.negative {
        return;
    }
    let (entries, _) = split_lease(&descriptor.entries);
    let rule_path = verdict.rule.as_deref().unwrap_or_default();
    let key = stat_key(&request.domain, stat, rule_path, entries);
    // Where a client-chosen key folds when the store is full.
    let fallback = match stat {
        StatKey::Rule(path) if !path.uses_request_values() => None,
        StatKey::Rule(_) => Some(match &verdict.rule {
            Some(rule) => sanitize(&format!("{}.{rule}", request.domain)),
            None => OVERFLOW_KEY.to_owned(),
        }),
        StatKey::Override => Some(OVERFLOW_KEY.to_owned()),
    };
    let counters = store.limit_key(&key, fallback.as_deref());
    let add = |s: LimitStat, n: u64| store.add_limit(&counters, s, n);
    let hits = descriptor
        .hits_addend
        .unwrap_or(u64::from(request.hits_addend.max(1)));
    add(LimitStat::TotalHits, hits);
    let from_cache = decision.answered_by == AnsweredBy::LocalCache;
    match verdict.outcome {
        Outcome::Admitted | Outcome::NotRecorded => {
            // After the hits: what the window holds now (admitted), or would have held.
            let after = if verdict.outcome == Outcome::Admitted {
                verdict.window_count
            } else {
                verdict.window_count.saturating_add(hits)
            };
            add(
                LimitStat::NearLimit,
                near_limit_hits(limit.requests_per_unit, ratio, after, hits),
            );
            add(LimitStat::WithinLimit, hits);
        }
        Outcome::Rejected | Outcome::QuotaExhausted | Outcome::ShadowRejected => {
            add(LimitStat::OverLimit, hits);
            if from_cache {
                add(LimitStat::OverLimitWithLocalCache, hits);
            }
            // A `shadow_mode` rule reports OK; the global shadow mode leaves the status.
            if verdict.outcome == Outcome::ShadowRejected && verdict.code == Code::Ok {
                add(LimitStat::ShadowMode, hits);
            }
        }
        Outcome::BackendAllowed
        | Outcome::BackendDenied
        | Outcome::NoRule
        | Outcome::Unlimited
        | Outcome::Refunded => {}
    }
}

/// The hits past the near-limit threshold, of `hits` that took the count to `after`.
fn near_limit_hits(limit: u32, ratio: f32, after: u64, hits: u64) -> u64 {
    // envoyproxy/ratelimit: uint64(math.Floor(float64(float32(limit) * nearLimitRatio))).
    let threshold = f64::from(limit as f32 * ratio).floor() as u64;
    if after <= threshold {
        return 0;
    }
    let before = after.saturating_sub(hits);
    if before >= threshold {
        hits
    } else {
        after - threshold
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn near_limit_counts_the_hits_past_the_threshold() {
        // Limit 10 at 0.8: the threshold is 8; the 9th and 10th hits are near the limit.
        assert_eq!(near_limit_hits(10, 0.8, 8, 1), 0);
        assert_eq!(near_limit_hits(10, 0.8, 9, 1), 1);
        assert_eq!(near_limit_hits(10, 0.8, 10, 3), 2);
        assert_eq!(near_limit_hits(10, 0.8, 10, 1), 1);
        // float32: 3 × 0.7 is 2.0999999 -> 2.
        assert_eq!(near_limit_hits(3, 0.7, 3, 1), 1);
        assert_eq!(near_limit_hits(5, 0.8, 5, 5), 1);
    }
}
