//! The engine: validates a request, resolves it against one config snapshot, asks the limiter
//! once for the whole request, and turns the limiter's outcome into a verdict per descriptor.
//!
//! Why one limiter call per request: every limited descriptor goes in ONE batch, so the request
//! is admitted all-or-nothing, and the config is read once, so a request never sees two config
//! generations. When the backend fails, the failure policy answers and the decision says so
//! ([`Decision::backend_failed`]); the engine records nothing itself.

use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use arc_swap::ArcSwap;

use crate::config::{Config, HeaderPolicy, Rule};
use crate::limiter::{
    Algorithm, AnsweredBy, BatchOutcome, Item, ItemKind, KeyOutcome, Limiter, LimiterError,
};

use super::limits::{InvalidRequest, validate_with};
use super::resolve::{Resolution, resolve};
use super::types::{
    Code, CurrentLimit, Decision, EngineOptions, FailurePolicy, Outcome, Request, StatKey, Verdict,
    wants_detailed_metric,
};

#[derive(Debug, thiserror::Error)]
pub enum DecisionError {
    #[error("invalid request: {0}")]
    Invalid(#[from] InvalidRequest),
    #[error(transparent)]
    Backend(#[from] LimiterError),
    /// The engine was started without limits (`--force-start-without-initial-config`) and no
    /// config has arrived yet: nothing is known about any domain.
    #[error("no rate-limit config loaded yet")]
    NoConfig,
}

/// Shared by every call of both faces; holds the current config generation and the limiter.
pub struct Engine {
    config: ArcSwap<Config>,
    /// False until a first config is swapped in, for an engine started awaiting it.
    configured: AtomicBool,
    limiter: Arc<dyn Limiter>,
    options: EngineOptions,
    leases: LeaseTokens,
}

/// Lease tokens: a counter per request that records leases, through a keyed hash whose key is
/// a per-process secret (std's `RandomState`, SipHash keyed from the OS's random source), into
/// 1..=2^52 - 1 (the Redis script's exact range; never 0, which is no lease).
///
/// Why not the counter itself: a token is all a refund needs to release a lease, and a counter
/// tells every caller that got one token the next ones, so anyone who reaches the gRPC port
/// could release other requests' leases by guessing. A keyed hash of the counter cannot be
/// guessed from the tokens seen, and costs one SipHash per request (no system call, unlike
/// asking the OS for random bytes each time). Two live leases of one key collide with a
/// chance of about 2^-52 per pair (they would be one lease, see `limiter::leases`); tokens of
/// two processes likewise.
struct LeaseTokens {
    next: AtomicU64,
    key: std::collections::hash_map::RandomState,
}

impl LeaseTokens {
    const RANGE: u64 = (1 << 52) - 1;

    fn new() -> Self {
        LeaseTokens {
            next: AtomicU64::new(0),
            key: std::collections::hash_map::RandomState::new(),
        }
    }

    fn next(&self) -> u64 {
        self.token(self.next.fetch_add(1, Ordering::Relaxed))
    }

    /// The `n`th token.
    fn token(&self, n: u64) -> u64 {
        self.key.hash_one(n) % Self::RANGE + 1
    }
}

impl Engine {
    pub fn new(config: Config, limiter: Arc<dyn Limiter>) -> Self {
        Self::with_options(config, limiter, EngineOptions::default())
    }

    pub fn with_options(config: Config, limiter: Arc<dyn Limiter>, options: EngineOptions) -> Self {
        Engine {
            config: ArcSwap::from_pointee(config),
            configured: AtomicBool::new(true),
            limiter,
            options,
            leases: LeaseTokens::new(),
        }
    }

    /// An engine with no limits yet (a config source that delivers them later): every request
    /// is answered [`DecisionError::NoConfig`] until the first [`Engine::replace_config`].
    pub fn awaiting_config(limiter: Arc<dyn Limiter>, options: EngineOptions) -> Self {
        let engine = Self::with_options(Config::empty(), limiter, options);
        engine.configured.store(false, Ordering::Release);
        engine
    }

    /// Whether a config has been loaded (always, unless built by [`Engine::awaiting_config`]).
    pub fn is_configured(&self) -> bool {
        self.configured.load(Ordering::Acquire)
    }

    pub fn config(&self) -> Arc<Config> {
        self.config.load_full()
    }

    /// Swaps in a new config generation atomically; in-flight requests finish on the old one.
    pub fn replace_config(&self, config: Config) {
        self.replace_config_arc(Arc::new(config));
    }

    /// [`Engine::replace_config`] for a config already shared.
    pub fn replace_config_arc(&self, config: Arc<Config>) {
        self.config.store(config);
        self.configured.store(true, Ordering::Release);
    }

    pub fn limiter(&self) -> &Arc<dyn Limiter> {
        &self.limiter
    }

    pub fn options(&self) -> &EngineOptions {
        &self.options
    }

    pub async fn decide(&self, request: &Request) -> Result<Decision, DecisionError> {
        validate_with(request, &self.options.limits)?;
        if !self.is_configured() {
            return Err(DecisionError::NoConfig);
        }
        let config = self.config.load_full();
        let known_domain = config.has_domain(&request.domain);
        let mut plans = resolve(&config, request, &self.options);
        let (batch, lease) = self.batch(&mut plans);
        let hits = batch
            .iter()
            .filter(|h| h.kind != ItemKind::Refund)
            .fold(0u64, |acc, h| acc.saturating_add(h.hits));
        let outcome = if batch.is_empty() {
            None
        } else {
            match self.limiter.decide(&batch, None).await {
                Ok(outcome) => Some(outcome),
                Err(err) if self.options.on_backend_error == FailurePolicy::Error => {
                    return Err(err.into());
                }
                Err(err) => {
                    let policy = self.options.on_backend_error;
                    tracing::debug!(error = %err, policy = policy.as_str(), "backend failed");
                    return Ok(fallback(plans, policy, hits, known_domain));
                }
            }
        };
        let admitted = outcome.as_ref().is_none_or(|o| o.admitted);
        let leased = admitted && outcome.as_ref().is_some_and(|o| holds_leases(&batch, o));
        let verdicts = self.verdicts(plans, batch, outcome.as_ref(), admitted)?;
        let overall = if self.options.shadow_mode {
            Code::Ok
        } else {
            overall_code(&verdicts)
        };
        Ok(Decision {
            overall,
            verdicts,
            hits,
            known_domain,
            backend_failed: None,
            answered_by: outcome.map_or(AnsweredBy::Backend, |o| o.answered_by),
            lease: lease.filter(|_| leased),
        })
    }

    /// The request's one batch: the items of every limited descriptor, a descriptor's limit
    /// then its stacked limits, and the lease token its `in_flight` items carry (one per
    /// request, on every key it leases). The keys move into the batch (no copy); each verdict
    /// takes its key back from it, in the same order.
    fn batch(&self, plans: &mut [Resolution<'_>]) -> (Vec<Item>, Option<u64>) {
        let quota_passes = self.options.quota_mode && a_quota_always_passes(plans);
        let mut batch: Vec<Item> = Vec::with_capacity(plans.len());
        let mut lease = None;
        for plan in plans {
            if let Resolution::Limited { hit, stacked, .. } = plan {
                for hit in std::iter::once(hit).chain(stacked.iter_mut().map(|(_, h)| h)) {
                    if hit.algorithm == Algorithm::InFlight && hit.kind != ItemKind::Refund {
                        hit.lease = *lease.get_or_insert_with(|| self.leases.next());
                    }
                    batch.push(Item {
                        key: std::mem::take(&mut hit.key),
                        kind: match hit.kind {
                            ItemKind::Quota if quota_passes => ItemKind::Shadow,
                            kind => kind,
                        },
                        ..*hit
                    });
                }
            }
        }
        (batch, lease)
    }

    /// A verdict per descriptor: the ones settled without the backend as they are, a limited
    /// one from its items' outcomes (the tightest of its stacked limits).
    fn verdicts(
        &self,
        plans: Vec<Resolution<'_>>,
        batch: Vec<Item>,
        outcome: Option<&BatchOutcome>,
        admitted: bool,
    ) -> Result<Vec<Verdict>, DecisionError> {
        let mut items = outcome.iter().flat_map(|o| o.items.iter());
        let mut keys = batch.into_iter().map(|h| h.key);
        let mut verdicts = Vec::with_capacity(plans.len());
        for p in plans {
            let verdict = match p {
                Resolution::Done(v) => v,
                Resolution::Limited {
                    rule,
                    limit,
                    hit,
                    headers,
                    stacked,
                    stat,
                } => {
                    let mut best: Option<Verdict> = None;
                    for (limit, mut hit) in std::iter::once((limit, hit)).chain(stacked) {
                        let item = items.next().ok_or_else(|| {
                            LimiterError::Protocol("fewer outcomes than batch items".into())
                        })?;
                        hit.key = keys.next().unwrap_or_default();
                        let verdict =
                            self.verdict(rule, (limit, hit), headers, item, admitted, &stat);
                        if best.as_ref().is_none_or(|b| tighter(&verdict, b)) {
                            best = Some(verdict);
                        }
                    }
                    best.ok_or_else(|| LimiterError::Protocol("empty limit stack".into()))?
                }
            };
            verdicts.push(verdict);
        }
        Ok(verdicts)
    }

    /// One limit's verdict from its item's outcome.
    fn verdict(
        &self,
        rule: Option<&Rule>,
        (limit, hit): (CurrentLimit, Item),
        headers: HeaderPolicy,
        item: &KeyOutcome,
        admitted: bool,
        stat: &StatKey,
    ) -> Verdict {
        let (code, outcome) = match (hit.kind, item.passed, admitted) {
            (ItemKind::Refund, _, true) => (Code::Ok, Outcome::Refunded),
            (ItemKind::Refund, _, false) => (Code::Ok, Outcome::NotRecorded),
            (ItemKind::Shadow, false, _) if self.options.shadow_mode => {
                (Code::OverLimit, Outcome::ShadowRejected)
            }
            (ItemKind::Shadow, false, _) => (Code::Ok, Outcome::ShadowRejected),
            // quota_mode: over its own limit, but another quota descriptor let the request in. Its
            // status says so, the request's does not (`overall_code`).
            (ItemKind::Quota, false, true) => (Code::OverLimit, Outcome::QuotaExhausted),
            (_, false, _) => (Code::OverLimit, Outcome::Rejected),
            (_, true, true) => (Code::Ok, Outcome::Admitted),
            (_, true, false) => (Code::Ok, Outcome::NotRecorded),
        };
        let remaining = hit.capacity().saturating_sub(item.count);
        Verdict {
            code,
            outcome,
            remaining: u32::try_from(remaining).unwrap_or(u32::MAX),
            reset_ms: item.reset_ms,
            rule: rule.map(|r| r.path.clone()),
            window_count: item.count,
            detailed_metric: wants_detailed_metric(rule),
            key: Some(hit.key),
            stat: Some(stat.clone()),
            limit: Some(limit),
            headers,
            metadata: rule.and_then(|r| r.metadata.clone()),
        }
    }
}

/// Whether the request holds leases: an `in_flight` item of its admitted batch recorded one.
fn holds_leases(batch: &[Item], outcome: &BatchOutcome) -> bool {
    batch.iter().zip(&outcome.items).any(|(hit, item)| {
        hit.algorithm == Algorithm::InFlight
            && hit.kind != ItemKind::Refund
            && hit.hits > 0
            && item.passed
    })
}

/// OVER_LIMIT when any verdict is, but for an exhausted quota that another quota descriptor
/// admitted.
fn overall_code(verdicts: &[Verdict]) -> Code {
    if verdicts
        .iter()
        .any(|v| v.code == Code::OverLimit && v.outcome != Outcome::QuotaExhausted)
    {
        Code::OverLimit
    } else {
        Code::Ok
    }
}

/// Global quota mode counts a descriptor without a limit as a quota descriptor that passed
/// (envoyproxy/ratelimit's answer), so with one in the request no quota item can fail it: each
/// is sent as a shadow item, which records what a quota item would and never rejects, and its
/// verdict is still a quota one (the plan keeps its kind).
fn a_quota_always_passes(plans: &[Resolution<'_>]) -> bool {
    plans
        .iter()
        .any(|p| matches!(p, Resolution::Done(v) if v.outcome == Outcome::NoRule))
}

/// Whether `a` is the tighter of two stacked limits' verdicts: over the limit first, then
/// failed in shadow mode, then fewer remaining, then the later reset.
fn tighter(a: &Verdict, b: &Verdict) -> bool {
    let rank = |v: &Verdict| {
        (
            v.code == Code::OverLimit,
            v.outcome == Outcome::ShadowRejected,
            std::cmp::Reverse(v.remaining),
            v.reset_ms,
        )
    };
    rank(a) > rank(b)
}

/// The decision the failure policy gives when the backend could not decide: limited descriptors
/// get the policy's code (shadow and refund ones stay OK: they never reject); nothing is known
/// about counts, so `remaining` is 0 and `reset_ms` 0.
fn fallback(
    plans: Vec<Resolution<'_>>,
    policy: FailurePolicy,
    hits: u64,
    known_domain: bool,
) -> Decision {
    let verdicts: Vec<Verdict> = plans
        .into_iter()
        .map(|p| match p {
            Resolution::Done(v) => v,
            Resolution::Limited {
                rule,
                limit,
                hit,
                stat,
                ..
            } => {
                let (code, outcome) = match (policy, hit.kind) {
                    (FailurePolicy::Deny, ItemKind::Consume) => {
                        (Code::OverLimit, Outcome::BackendDenied)
                    }
                    (FailurePolicy::Deny, _) => (Code::Ok, Outcome::BackendDenied),
                    _ => (Code::Ok, Outcome::BackendAllowed),
                };
                // Nothing is known of the key's window (no count, no key for the window
                // gauges), and no headers are advertised.
                Verdict {
                    code,
                    limit: Some(limit),
                    stat: Some(stat),
                    ..Verdict::unlimited_or_none(outcome, rule)
                }
            }
        })
        .collect();
    Decision {
        overall: overall_code(&verdicts),
        verdicts,
        hits,
        known_domain,
        backend_failed: Some(policy),
        answered_by: AnsweredBy::Backend,
        lease: None,
    }
}

#[cfg(test)]
mod tests;
