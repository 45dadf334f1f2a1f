//! The Rate Limit Quota Service (RLQS) without the wire: Envoy's usage reports in, assignments
//! out, each one an allotment reserved in the rule's window through the same [`Limiter`] as the
//! RLS path.
//!
//! Why allotments reserved in the window: Envoy enforces an assignment by itself, with no call
//! per request, and sluice never learns when a token is spent, only how many requests each
//! report interval allowed. So the promise of the RLS path (in any window of the rule's length,
//! never more than the limit, across every Envoy and sluice sharing a backend, RLS and RLQS
//! traffic together) holds only if every token handed out is counted as if spent at the worst
//! moment: an allotment of `n` tokens granted at `t0` is one held item of `n` hits
//! ([`Item::hold_ms`]), an entry dated at the last moment its tokens can be spent, which counts
//! from `t0` until a whole window after that (proof: docs/algorithms.md, "Reservations"; the
//! Envoy side of it: docs/rlqs.md).
//!
//! Files, each depending only on those above it:
//! - this file: the vocabulary (reports, assignments, what each answer was), the timing
//!   constants, and [`plan`]: which limits a bucket reserves on, or the blanket answer it gets
//!   (shared with `sluice explain`);
//! - `sizing`: pure arithmetic: how many tokens a bucket wants from its reported demand, the
//!   most one assignment may take of a limit, and the token bucket that spends no more;
//! - `stream`: one stream's buckets (demand, idleness, the last strategy sent), bounded;
//! - `validate`: what a usage report may carry (the engine's input limits), checked first;
//! - `allot`: the one async step: reserve each bucket's allotment through the limiter.
//!
//! Pure except `allot`, which knows the [`Limiter`] trait and nothing of tonic, protos or Redis;
//! what each bucket got is returned ([`Answer`]), for the face to send and the metrics to record.

mod allot;
mod sizing;
mod stream;
mod validate;

use std::collections::BTreeMap;

use crate::config::{Config, LimitSpec, Lookup};
use crate::decision::{self, Descriptor, EngineOptions, Request, Resolution};
use crate::descriptor::Entry;
use crate::limiter::{Algorithm, Item, ItemKind, OverLimit};

pub use allot::{Allotment, allot};
pub use sizing::{Demand, cap, spendable, token_bucket_for, want};
pub use stream::{Observed, Stream};
pub use validate::{Report, validate};

/// How often Envoy 1.40 reports every bucket, whatever the filter's `reporting_interval` says.
pub const REPORT_PERIOD_S: u64 = 5;

/// Every assignment's lifetime: one report period and a second, so that the next report's
/// assignment arrives before it expires. Whole seconds: Envoy ignores the nanos (and expires
/// an assignment without a lifetime at once).
pub const ASSIGNMENT_TTL_S: u64 = REPORT_PERIOD_S + 1;

/// How late after sluice's decision an assignment may still be applied by Envoy (the answer on
/// the wire, Envoy's main thread, its expiry timer firing late, the new bucket reaching its
/// workers): tokens can be spent until `ASSIGNMENT_TTL_S` after that.
pub const DELIVERY_MARGIN_MS: u64 = 1_000;

/// How long after the decision an allotment's tokens can be spent: its reservation's hold.
pub const HOLD_MS: u64 = ASSIGNMENT_TTL_S * 1_000 + DELIVERY_MARGIN_MS;

/// The token bucket's fill interval: a whole minute, so that Envoy starts the bucket full (it
/// does by backdating it `max_tokens / rate`, about this long) and refills it by a small part
/// within the assignment's life, which [`token_bucket_for`] counts.
pub const FILL_INTERVAL_S: u64 = 60;

/// Reports in a row with no request after which a bucket is abandoned: Envoy forgets it (its
/// next request starts it afresh, answered by the filter's `no_assignment_behavior`) and so does
/// sluice, so that buckets of clients gone stop costing memory on both sides.
pub const IDLE_REPORTS_BEFORE_ABANDON: u32 = 12;

/// A bucket's identity: Envoy's `BucketId`, its entries in key order.
pub type BucketId = BTreeMap<String, String>;

/// One bucket's line of a usage report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Usage {
    pub bucket: BucketId,
    /// Requests Envoy let through since the bucket's previous report.
    pub allowed: u64,
    /// Requests Envoy answered 429 since then.
    pub denied: u64,
    /// Whole seconds since the previous report (0 in a bucket's first, sent with its first
    /// request).
    pub elapsed_s: u64,
}

/// A token bucket as Envoy runs it: starts with `max_tokens`, gains `tokens_per_fill` every
/// `fill_interval_s` (continuously, a fraction at a time), never above `max_tokens`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenBucket {
    pub max_tokens: u32,
    pub tokens_per_fill: u32,
    pub fill_interval_s: u64,
}

/// What a bucket is told; every assignment lives [`ASSIGNMENT_TTL_S`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Assignment {
    /// A token bucket that spends at most the allotment reserved for it.
    Tokens(TokenBucket),
    /// `blanket_rule: ALLOW_ALL`.
    AllowAll,
    /// `blanket_rule: DENY_ALL`.
    DenyAll,
    /// Envoy forgets the bucket.
    Abandon,
}

/// Why a bucket got what it got (the `answer` label of the metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Answer {
    /// An allotment of all the tokens the bucket's demand asked for.
    Granted,
    /// An allotment of fewer tokens than asked for: the rest did not fit in the window.
    Squeezed,
    /// DENY_ALL: no token fits in the window.
    Exhausted,
    /// DENY_ALL: no request since the last report, so no allotment.
    Idle,
    /// Abandoned after [`IDLE_REPORTS_BEFORE_ABANDON`] idle reports.
    Abandoned,
    /// ALLOW_ALL: the rule is `unlimited`.
    Unlimited,
    /// ALLOW_ALL: the bucket reaches a descriptor without a limit (a whitelist).
    Whitelisted,
    /// ALLOW_ALL: shadow mode (the rule's or global): never enforced.
    Shadow,
    /// DENY_ALL: the bucket reaches no rule of the domain.
    NoRule,
    /// DENY_ALL: the stream's domain is not in the config.
    UnknownDomain,
    /// DENY_ALL: a limit of the rule counts with an algorithm other than `sliding_log`, which
    /// cannot hold a reservation.
    Unsupported,
    /// DENY_ALL: the stream already holds the most buckets it may (`--rlqs-max-buckets`).
    TooManyBuckets,
    /// The backend failed and the failure policy (`--on-backend-error`) answered: ALLOW_ALL,
    /// DENY_ALL, or (`error`) nothing, so that the assignment Envoy holds runs out.
    BackendAllowed,
    BackendDenied,
    BackendFailed,
    /// No config loaded yet (xDS): nothing sent.
    NoConfig,
}

impl Answer {
    /// The label value.
    pub const fn as_str(self) -> &'static str {
        match self {
            Answer::Granted => "granted",
            Answer::Squeezed => "squeezed",
            Answer::Exhausted => "exhausted",
            Answer::Idle => "idle",
            Answer::Abandoned => "abandoned",
            Answer::Unlimited => "unlimited",
            Answer::Whitelisted => "whitelisted",
            Answer::Shadow => "shadow",
            Answer::NoRule => "no_rule",
            Answer::UnknownDomain => "unknown_domain",
            Answer::Unsupported => "unsupported_algorithm",
            Answer::TooManyBuckets => "too_many_buckets",
            Answer::BackendAllowed => "backend_allowed",
            Answer::BackendDenied => "backend_denied",
            Answer::BackendFailed => "backend_failed",
            Answer::NoConfig => "no_config",
        }
    }

    /// Every answer, in declaration order.
    pub const ALL: [Answer; 16] = [
        Answer::Granted,
        Answer::Squeezed,
        Answer::Exhausted,
        Answer::Idle,
        Answer::Abandoned,
        Answer::Unlimited,
        Answer::Whitelisted,
        Answer::Shadow,
        Answer::NoRule,
        Answer::UnknownDomain,
        Answer::Unsupported,
        Answer::TooManyBuckets,
        Answer::BackendAllowed,
        Answer::BackendDenied,
        Answer::BackendFailed,
        Answer::NoConfig,
    ];

    /// The blanket assignment of an answer that needs no reservation (none for the others).
    pub const fn blanket(self) -> Option<Assignment> {
        match self {
            Answer::Unlimited | Answer::Whitelisted | Answer::Shadow | Answer::BackendAllowed => {
                Some(Assignment::AllowAll)
            }
            Answer::Exhausted
            | Answer::Idle
            | Answer::NoRule
            | Answer::UnknownDomain
            | Answer::Unsupported
            | Answer::TooManyBuckets
            | Answer::BackendDenied => Some(Assignment::DenyAll),
            Answer::Abandoned => Some(Assignment::Abandon),
            Answer::Granted | Answer::Squeezed | Answer::BackendFailed | Answer::NoConfig => None,
        }
    }
}

/// What a bucket gets under one config: a blanket answer, or allotments reserved on its rule's
/// limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The bucket read as a descriptor ([`Config::bucket_entries`]).
    pub entries: Vec<Entry>,
    pub kind: PlanKind,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlanKind {
    /// The same answer at every report.
    Blanket(Answer),
    /// Allotments: one held item per limit of the rule (the RLS path's keys), each allotment
    /// reserved on all of them at once.
    Reserve {
        /// The rule's config path.
        rule: String,
        /// Held `refuse` items of 0 hits, one per limit of the rule: the allotment sets the
        /// hits.
        items: Vec<Item>,
        /// One GCRA item per limit ([`pace_item`]): allotments are taken no faster than the
        /// limit can sustain them.
        pace: Vec<Item>,
        /// The most one assignment may take ([`cap`] of every limit).
        cap: u64,
    },
}

/// What `bucket` of a stream in `domain` gets under `config`: its entries in the rule tree's
/// order, looked up as the RLS path looks up that descriptor (same rule, same limiter keys).
pub fn plan(config: &Config, domain: &str, bucket: &BucketId, options: &EngineOptions) -> Plan {
    let entries =
        config.bucket_entries(domain, bucket.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    let kind = plan_kind(config, domain, &entries, options);
    Plan { entries, kind }
}

fn plan_kind(
    config: &Config,
    domain: &str,
    entries: &[Entry],
    options: &EngineOptions,
) -> PlanKind {
    let rule = match config.lookup(domain, entries) {
        Lookup::UnknownDomain => return PlanKind::Blanket(Answer::UnknownDomain),
        Lookup::NoRule => return PlanKind::Blanket(Answer::NoRule),
        Lookup::Rule { rule, .. } => rule,
    };
    match rule.limit {
        None => return PlanKind::Blanket(Answer::Whitelisted),
        Some(LimitSpec::Unlimited) => return PlanKind::Blanket(Answer::Unlimited),
        Some(LimitSpec::PerUnit { .. }) => {}
    }
    if options.shadow_mode || rule.shadow_mode {
        return PlanKind::Blanket(Answer::Shadow);
    }
    let request = Request {
        domain: domain.to_owned(),
        descriptors: vec![Descriptor::new(entries.to_vec())],
        hits_addend: 0,
    };
    let Some(Resolution::Limited { hit, stacked, .. }) =
        decision::resolve(config, &request, options)
            .into_iter()
            .next()
    else {
        return PlanKind::Blanket(Answer::NoRule);
    };
    let items: Vec<Item> = std::iter::once(hit)
        .chain(stacked.into_iter().map(|(_, item)| item))
        .map(|item| Item {
            hits: 0,
            kind: ItemKind::Consume,
            over_limit: OverLimit::Refuse,
            hold_ms: HOLD_MS,
            ..item
        })
        .collect();
    if items.iter().any(|i| i.algorithm != Algorithm::SlidingLog) {
        return PlanKind::Blanket(Answer::Unsupported);
    }
    let cap = items
        .iter()
        .map(|i| cap(i.limit, i.window_ms))
        .min()
        .unwrap_or(0);
    let pace = items.iter().map(|item| pace_item(item, cap)).collect();
    PlanKind::Reserve {
        rule: rule.path.clone(),
        items,
        pace,
        cap,
    }
}

/// What a pace key's name adds to its limit's key: outside the braces, so that it hashes to the
/// same Redis Cluster slot, and no RLS key ends so.
pub const PACE_KEY_SUFFIX: &str = "|pace";

/// How much longer than an allotment counts the pace spreads a limit over: the pace runs a
/// little slower than the limit sustains, so that at steady load the window itself never has
/// the last word and every allotment is the pace's regular share (with the two equal, rounding
/// makes them alternate, and the windows vary more: `two_busy_envoys_use_most_of_a_per_minute_
/// limit_in_every_window` in `src/quota/tests.rs` measures both).
pub const PACE_SLACK_MS: u64 = 2_000;

/// The pace of a limit's allotments: a GCRA item on a key of its own (the limit's key and
/// [`PACE_KEY_SUFFIX`]) refilled at about the rate the limit sustains when every allotment
/// counts `HOLD_MS + window` (`limit` per `window + HOLD_MS + PACE_SLACK_MS`), with a burst of
/// one assignment's `cap`. Reserved with every allotment, it spreads the allotments evenly over time: without
/// it, reports taking `cap` each fill a window in its first seconds and wait until those
/// allotments leave it, and the admitted requests come in bursts a window apart, so that a
/// window holds from three quarters of the limit to all of it. Paced, every window holds about
/// `window / (window + HOLD_MS)` of it, and Envoys reporting on one limit share it by the time
/// since the last report of another (docs/rlqs.md).
pub fn pace_item(limit: &Item, cap: u64) -> Item {
    Item {
        key: format!("{}{PACE_KEY_SUFFIX}", limit.key),
        window_ms: limit.window_ms.saturating_add(HOLD_MS + PACE_SLACK_MS),
        hold_ms: 0,
        algorithm: Algorithm::Gcra { burst: cap },
        ..limit.clone()
    }
}

#[cfg(test)]
mod tests;
