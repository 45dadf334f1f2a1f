//! The one step of the quota service that waits: each bucket of a usage report gets its answer,
//! the allotments reserved through the engine's limiter (the same one, the same keys and the
//! same windows as the RLS path), on the engine's current config (a reload applies at the next
//! report).
//!
//! Why two limiter calls at most per bucket: an allotment takes what the bucket wants, capped
//! ([`super::cap`]), when that fits in every limit of its rule; when it does not, the refused
//! call (which records nothing) reports how much each window holds, and a second call takes
//! what is left. A concurrent decision may take that first; the bucket then gets nothing this
//! time (DENY_ALL until the next report) rather than a third try.

use futures_util::StreamExt as _;

use crate::decision::{Engine, FailurePolicy};
use crate::limiter::{Item, Limiter, LimiterError};

use super::sizing::{token_bucket_for, want};
use super::stream::{Observed, Stream};
use super::{Answer, Assignment, BucketId, PlanKind, TokenBucket, Usage, plan};

/// Reservations of one report in flight at once: enough that the Redis limiter's queues fill
/// batched calls (up to `--redis-batch-max` reservations each: about 10 per call through Envoy,
/// 2.7 with 16 in flight; docs/rlqs.md), few enough that a report holds a sixteenth of the
/// default bound on calls in flight (`--backend-max-in-flight`, 1,024).
const CONCURRENT_RESERVATIONS: usize = 64;

/// What one bucket of a report gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allotment {
    pub bucket: BucketId,
    pub answer: Answer,
    /// What to send; `None`: nothing, and the assignment Envoy holds runs out.
    pub assignment: Option<Assignment>,
    /// Tokens reserved for the bucket's assignment.
    pub tokens: u64,
    /// The config path of the rule the bucket reaches, if it has one.
    pub rule: Option<String>,
}

impl Allotment {
    fn blanket(bucket: BucketId, answer: Answer, rule: Option<String>) -> Self {
        Allotment {
            bucket,
            answer,
            assignment: answer.blanket(),
            tokens: 0,
            rule,
        }
    }
}

/// A bucket waiting for its reservation: the items to hold, the tokens it asks for.
struct Pending {
    index: usize,
    items: Vec<Item>,
    tokens: u64,
}

/// Answers one usage report of `stream` (its domain already set), bucket by bucket in report
/// order, and notes in the stream what each was sent.
pub async fn allot(engine: &Engine, stream: &mut Stream, usages: &[Usage]) -> Vec<Allotment> {
    if !engine.is_configured() {
        return usages
            .iter()
            .map(|u| Allotment::blanket(u.bucket.clone(), Answer::NoConfig, None))
            .collect();
    }
    let config = engine.config();
    let domain = stream.domain().unwrap_or_default().to_owned();
    let mut answers = Vec::with_capacity(usages.len());
    let mut pending = Vec::new();
    for (index, usage) in usages.iter().enumerate() {
        let bucket = usage.bucket.clone();
        let demand = match stream.observe(usage) {
            Observed::Full => {
                answers.push(Allotment::blanket(bucket, Answer::TooManyBuckets, None));
                continue;
            }
            Observed::Abandon => {
                answers.push(Allotment::blanket(bucket, Answer::Abandoned, None));
                continue;
            }
            Observed::Demand(demand) => demand,
        };
        let (rule, items, cap) = match plan(&config, &domain, &bucket, engine.options()).kind {
            PlanKind::Blanket(answer) => {
                answers.push(Allotment::blanket(bucket, answer, None));
                continue;
            }
            PlanKind::Reserve {
                rule,
                mut items,
                pace,
                cap,
            } => {
                items.extend(pace);
                (rule, items, cap)
            }
        };
        let tokens = want(demand).min(cap);
        if tokens == 0 {
            let answer = if cap == 0 {
                Answer::Exhausted
            } else {
                Answer::Idle
            };
            answers.push(Allotment::blanket(bucket, answer, Some(rule)));
            continue;
        }
        pending.push(Pending {
            index,
            items,
            tokens,
        });
        answers.push(Allotment::blanket(bucket, Answer::Granted, Some(rule)));
    }
    let limiter = engine.limiter();
    let results: Vec<(usize, u64, Result<u64, LimiterError>)> =
        futures_util::stream::iter(pending.into_iter().map(|p| async move {
            let result = reserve(limiter.as_ref(), p.items, p.tokens).await;
            (p.index, p.tokens, result)
        }))
        .buffered(CONCURRENT_RESERVATIONS)
        .collect()
        .await;
    let policy = engine.options().on_backend_error;
    for (index, wanted, result) in results {
        let answer = &mut answers[index];
        let last = stream.last(&answer.bucket);
        settle(answer, wanted, result, last, policy);
    }
    for answer in &answers {
        stream.sent(&answer.bucket, answer.assignment);
    }
    answers
}

/// A granted bucket's answer once its reservation of `wanted` tokens returned: what it got
/// (`last`: the assignment it was sent before), or what the failure policy says.
fn settle(
    answer: &mut Allotment,
    wanted: u64,
    result: Result<u64, LimiterError>,
    last: Option<TokenBucket>,
    policy: FailurePolicy,
) {
    match result {
        Ok(tokens) => {
            answer.tokens = tokens;
            answer.answer = if tokens == 0 {
                Answer::Exhausted
            } else if tokens < wanted {
                Answer::Squeezed
            } else {
                Answer::Granted
            };
            answer.assignment = match token_bucket_for(tokens, last) {
                Some(bucket) => Some(Assignment::Tokens(bucket)),
                None => Some(Assignment::DenyAll),
            };
        }
        Err(err) => {
            tracing::debug!(error = %err, policy = policy.as_str(), "quota reservation failed");
            answer.answer = match policy {
                FailurePolicy::Error => Answer::BackendFailed,
                FailurePolicy::Allow => Answer::BackendAllowed,
                FailurePolicy::Deny => Answer::BackendDenied,
            };
            answer.assignment = answer.answer.blanket();
        }
    }
}

/// Reserves `tokens` on every item's key at once (the held items: each counts from now until
/// `HOLD_MS + window` later; the pace items), or as many as still fit in all of them; the
/// tokens reserved.
async fn reserve(
    limiter: &dyn Limiter,
    items: Vec<Item>,
    tokens: u64,
) -> Result<u64, LimiterError> {
    let with = |tokens: u64| -> Vec<Item> {
        items
            .iter()
            .map(|item| Item {
                hits: tokens,
                ..item.clone()
            })
            .collect()
    };
    let batch = with(tokens);
    let outcome = limiter.decide(&batch, None).await?;
    if outcome.admitted {
        return Ok(tokens);
    }
    // Refused, nothing recorded: each item's count is what its window holds.
    let room = batch
        .iter()
        .zip(&outcome.items)
        .map(|(item, seen)| item.capacity().saturating_sub(seen.count))
        .min()
        .unwrap_or(0)
        .min(tokens);
    if room == 0 {
        return Ok(0);
    }
    let outcome = limiter.decide(&with(room), None).await?;
    Ok(if outcome.admitted { room } else { 0 })
}
