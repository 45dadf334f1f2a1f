//! The decision engine: one rate-limit request -> rules -> one limiter batch -> a verdict per
//! descriptor.
//!
//! Why here and not in the gRPC adapter: this is where envoyproxy/ratelimit's semantics live
//! (limit overrides, `replaces`, `unlimited`, shadow mode, hits_addend), and they must not depend
//! on tonic or on which backend keeps the log. The engine reads one config snapshot per request,
//! so a request never sees two config generations, and sends every limited descriptor of the
//! request to the limiter in ONE batch, so the request is admitted all-or-nothing.

use std::borrow::Cow;
use std::collections::HashSet;
use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::config::{Config, HeaderPolicy, LimitAlgorithm, LimitSpec, Lookup, Rule, Unit};
use crate::descriptor::{limiter_key_tagged, Entry, KEY_PREFIX};
use crate::limiter::{Algorithm, Hit, HitKind, KeyOutcome, Limiter, LimiterError};

/// A limit Envoy sends inside a descriptor; it wins over the configured one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitOverride {
    pub requests_per_unit: u32,
    pub unit: Unit,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Descriptor {
    pub entries: Vec<Entry>,
    pub limit_override: Option<LimitOverride>,
    /// Descriptor-level hits; `Some(0)` is a check-only probe that records nothing.
    pub hits_addend: Option<u64>,
    /// Give hits back instead of spending them.
    pub negative: bool,
}

impl Descriptor {
    pub fn new(entries: Vec<Entry>) -> Self {
        Descriptor {
            entries,
            limit_override: None,
            hits_addend: None,
            negative: false,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub domain: String,
    pub descriptors: Vec<Descriptor>,
    /// Request-level hits; 0 means 1.
    pub hits_addend: u32,
}

/// A request that cannot be decided as sent. `field` names the offending field the way the
/// proto spells it, so the caller can find it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct InvalidRequest {
    pub field: String,
    pub reason: Cow<'static, str>,
}

/// Bounds on what one request may carry, so that a hostile or broken client costs a bounded
/// amount of work and memory and gets INVALID_ARGUMENT naming the limit, never a slow answer.
///
/// Why in the engine: both faces (gRPC and HTTP `/json`) decide through [`Engine::decide`], so
/// both enforce the same limits, and a request over a limit is refused before anything is
/// recorded. Each limit is a `serve` flag (and `SLUICE_*` variable); the message names the flag,
/// as [`InputLimits::FLAGS`] spells it, so an operator knows which knob to turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InputLimits {
    /// Bytes in `domain`.
    pub max_domain_bytes: usize,
    /// Descriptors in one request.
    pub max_descriptors: usize,
    /// Entries in one descriptor.
    pub max_entries: usize,
    /// Bytes in an entry's `key`.
    pub max_key_bytes: usize,
    /// Bytes in an entry's `value`.
    pub max_value_bytes: usize,
    /// `hits_addend` of the request or of a descriptor. The Redis backend records one member
    /// per admitted hit, so this also bounds the work one admitted item can cost Redis.
    pub max_hits_addend: u64,
    /// Bytes of one encoded gRPC message (tonic's decoding limit: larger messages are refused
    /// before they are decoded, with the transport's own status).
    pub max_message_bytes: usize,
}

impl InputLimits {
    /// Flag names, as `sluice serve` spells them, in field order.
    pub const FLAGS: [&'static str; 7] = [
        "--max-domain-bytes",
        "--max-descriptors",
        "--max-entries",
        "--max-key-bytes",
        "--max-value-bytes",
        "--max-hits-addend",
        "--max-message-bytes",
    ];
    pub const DEFAULT_MAX_DOMAIN_BYTES: usize = 256;
    pub const DEFAULT_MAX_DESCRIPTORS: usize = 64;
    pub const DEFAULT_MAX_ENTRIES: usize = 32;
    pub const DEFAULT_MAX_KEY_BYTES: usize = 256;
    pub const DEFAULT_MAX_VALUE_BYTES: usize = 1024;
    pub const DEFAULT_MAX_HITS_ADDEND: u64 = 100_000;
    pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 256 * 1024;
}

impl Default for InputLimits {
    fn default() -> Self {
        InputLimits {
            max_domain_bytes: Self::DEFAULT_MAX_DOMAIN_BYTES,
            max_descriptors: Self::DEFAULT_MAX_DESCRIPTORS,
            max_entries: Self::DEFAULT_MAX_ENTRIES,
            max_key_bytes: Self::DEFAULT_MAX_KEY_BYTES,
            max_value_bytes: Self::DEFAULT_MAX_VALUE_BYTES,
            max_hits_addend: Self::DEFAULT_MAX_HITS_ADDEND,
            max_message_bytes: Self::DEFAULT_MAX_MESSAGE_BYTES,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DecisionError {
    #[error("invalid request: {0}")]
    Invalid(#[from] InvalidRequest),
    #[error(transparent)]
    Backend(#[from] LimiterError),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    Ok,
    OverLimit,
}

/// Why a descriptor got its verdict; the metrics' `outcome` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Unknown domain, no rule, a whitelisting rule, or a limit removed by `replaces`.
    NoRule,
    Unlimited,
    Admitted,
    Rejected,
    /// Within its own limit, but the request was rejected by another descriptor, so nothing
    /// was recorded.
    NotRecorded,
    /// Over its limit in shadow mode: reported OK.
    ShadowRejected,
    /// A refund (is_negative_hits) applied.
    Refunded,
    /// A `quota_mode` limit over its own limit while another quota limit of the request admitted
    /// it: reported OK, nothing recorded for this limit.
    QuotaExhausted,
    /// The backend failed and the failure policy `allow` answered OK.
    BackendAllowed,
    /// The backend failed and the failure policy `deny` answered OVER_LIMIT.
    BackendDenied,
}

impl Outcome {
    pub const fn as_str(self) -> &'static str {
        match self {
            Outcome::NoRule => "no_rule",
            Outcome::Unlimited => "unlimited",
            Outcome::Admitted => "admitted",
            Outcome::Rejected => "rejected",
            Outcome::NotRecorded => "not_recorded",
            Outcome::ShadowRejected => "shadow_rejected",
            Outcome::Refunded => "refunded",
            Outcome::QuotaExhausted => "quota_exhausted",
            Outcome::BackendAllowed => "backend_error_allowed",
            Outcome::BackendDenied => "backend_error_denied",
        }
    }
}

/// The limit reported back to Envoy as `current_limit`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CurrentLimit {
    pub requests_per_unit: u32,
    /// The unit reported to Envoy (for a custom window, the nearest one: [`Unit::nearest`]).
    pub unit: Unit,
    pub name: Option<String>,
    /// The real window length.
    pub window_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub code: Code,
    pub outcome: Outcome,
    pub limit: Option<CurrentLimit>,
    pub remaining: u32,
    /// Milliseconds until a slot frees (the oldest entry leaves the window).
    pub reset_ms: u64,
    /// Config path of the rule that matched, when one did.
    pub rule: Option<String>,
    /// Entries in the key's window after the decision (0 when no backend was asked).
    pub window_count: u64,
    /// The rule sets `detailed_metric` (or `value_to_metric`): metrics may label this verdict
    /// with the descriptor's values (bounded by the metrics layer).
    pub detailed_metric: bool,
    /// The limiter key the backend was asked about, when one was.
    pub key: Option<String>,
    /// Response headers this verdict asks for (the default, none, for shadow-mode limits,
    /// refunds and descriptors without a limit: they never reject, so they advertise nothing).
    pub headers: HeaderPolicy,
}

impl Verdict {
    fn unlimited_or_none(outcome: Outcome, rule: Option<&Rule>) -> Self {
        Verdict {
            code: Code::Ok,
            outcome,
            limit: None,
            remaining: 0,
            reset_ms: 0,
            rule: rule.map(|r| r.path.clone()),
            window_count: 0,
            detailed_metric: rule.is_some_and(|r| r.detailed_metric || r.value_to_metric),
            key: None,
            headers: HeaderPolicy::default(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub overall: Code,
    pub verdicts: Vec<Verdict>,
    /// Sum of the hits the request asked for across limited descriptors.
    pub hits: u64,
    /// The domain is in the config (metrics label it by name only then, so random domains
    /// from clients cannot grow the series count).
    pub known_domain: bool,
}

/// The rule-driven part of one descriptor, before the backend is asked: either settled without
/// the backend, or the limit and the limiter item it needs.
pub enum Resolution<'c> {
    Done(Verdict),
    Limited {
        rule: Option<&'c Rule>,
        limit: CurrentLimit,
        hit: Hit,
        headers: HeaderPolicy,
        /// Stacked limits after the first (`rate_limits`): each its own key; the descriptor is
        /// admitted only if all admit, and its verdict reports the tightest.
        stacked: Vec<(CurrentLimit, Hit)>,
    },
}

/// Process-wide switches of the engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineOptions {
    /// Global shadow mode (envoyproxy/ratelimit's `SHADOW_MODE`): every limit is evaluated and its
    /// status reported as usual, but the overall code is always OK, and each limit records the
    /// hits it would have admitted on its own.
    pub shadow_mode: bool,
    /// Prefix of every limiter key (`CACHE_KEY_PREFIX`).
    pub key_prefix: String,
    /// What one request may carry; larger requests are refused, recording nothing.
    pub limits: InputLimits,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            shadow_mode: false,
            key_prefix: KEY_PREFIX.to_owned(),
            limits: InputLimits::default(),
        }
    }
}

/// What a request gets when the backend fails (error, deadline, overload).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FailurePolicy {
    /// Return the error (gRPC UNAVAILABLE), so Envoy's `failure_mode_deny` decides.
    #[default]
    Error,
    /// Answer OK: availability over enforcement.
    Allow,
    /// Answer OVER_LIMIT for every enforced limited descriptor: enforcement over availability.
    Deny,
}

impl FailurePolicy {
    pub const fn as_str(self) -> &'static str {
        match self {
            FailurePolicy::Error => "error",
            FailurePolicy::Allow => "allow",
            FailurePolicy::Deny => "deny",
        }
    }
}

/// Shared by every gRPC call; holds the current config generation and the limiter.
pub struct Engine {
    config: ArcSwap<Config>,
    limiter: Arc<dyn Limiter>,
    options: EngineOptions,
    on_backend_error: FailurePolicy,
}

impl Engine {
    pub fn new(config: Config, limiter: Arc<dyn Limiter>) -> Self {
        Self::with_options(config, limiter, EngineOptions::default())
    }

    pub fn with_options(config: Config, limiter: Arc<dyn Limiter>, options: EngineOptions) -> Self {
        Engine {
            config: ArcSwap::from_pointee(config),
            limiter,
            options,
            on_backend_error: FailurePolicy::Error,
        }
    }

    /// Sets what a request gets when the backend fails.
    pub fn with_failure_policy(mut self, policy: FailurePolicy) -> Self {
        self.on_backend_error = policy;
        self
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
    }

    pub fn limiter(&self) -> &Arc<dyn Limiter> {
        &self.limiter
    }

    pub async fn decide(&self, request: &Request) -> Result<Decision, DecisionError> {
        validate_with(request, &self.options.limits)?;
        let config = self.config.load_full();
        let known_domain = config.has_domain(&request.domain);
        let mut plans = resolve(&config, request, &self.options);

        // The keys move into the batch (no copy); each verdict takes its key back from it, in
        // the same order (a descriptor's limit, then its stacked limits).
        let mut batch: Vec<Hit> = Vec::with_capacity(plans.len());
        for plan in &mut plans {
            if let Resolution::Limited { hit, stacked, .. } = plan {
                for hit in std::iter::once(hit).chain(stacked.iter_mut().map(|(_, h)| h)) {
                    batch.push(Hit {
                        key: std::mem::take(&mut hit.key),
                        ..*hit
                    });
                }
            }
        }
        let hits = batch
            .iter()
            .filter(|h| h.kind != HitKind::Refund)
            .fold(0u64, |acc, h| acc.saturating_add(h.hits));
        let outcome = if batch.is_empty() {
            None
        } else {
            match self.limiter.decide(&batch, None).await {
                Ok(outcome) => Some(outcome),
                Err(err) => {
                    crate::metrics::record_backend_failure(self.on_backend_error.as_str());
                    if self.on_backend_error == FailurePolicy::Error {
                        return Err(err.into());
                    }
                    tracing::debug!(error = %err, policy = self.on_backend_error.as_str(), "backend failed");
                    return Ok(fallback(plans, self.on_backend_error, hits, known_domain));
                }
            }
        };

        let mut items = outcome.iter().flat_map(|o| o.items.iter());
        let mut keys = batch.into_iter().map(|h| h.key);
        let admitted = outcome.as_ref().is_none_or(|o| o.admitted);
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
                } => {
                    let mut best: Option<Verdict> = None;
                    for (limit, mut hit) in std::iter::once((limit, hit)).chain(stacked) {
                        let item = items.next().ok_or_else(|| {
                            LimiterError::Protocol("fewer outcomes than batch items".into())
                        })?;
                        hit.key = keys.next().unwrap_or_default();
                        let verdict = self.verdict(rule, limit, hit, headers, item, admitted);
                        if best.as_ref().is_none_or(|b| tighter(&verdict, b)) {
                            best = Some(verdict);
                        }
                    }
                    best.ok_or_else(|| LimiterError::Protocol("empty limit stack".into()))?
                }
            };
            verdicts.push(verdict);
        }
        let overall =
            if !self.options.shadow_mode && verdicts.iter().any(|v| v.code == Code::OverLimit) {
                Code::OverLimit
            } else {
                Code::Ok
            };
        Ok(Decision {
            overall,
            verdicts,
            hits,
            known_domain,
        })
    }
}

impl Engine {
    /// One limit's verdict from its item's outcome.
    fn verdict(
        &self,
        rule: Option<&Rule>,
        limit: CurrentLimit,
        hit: Hit,
        headers: HeaderPolicy,
        item: &KeyOutcome,
        admitted: bool,
    ) -> Verdict {
        let (code, outcome) = match (hit.kind, item.passed, admitted) {
            (HitKind::Refund, _, true) => (Code::Ok, Outcome::Refunded),
            (HitKind::Refund, _, false) => (Code::Ok, Outcome::NotRecorded),
            (HitKind::Shadow, false, _) if self.options.shadow_mode => {
                (Code::OverLimit, Outcome::ShadowRejected)
            }
            (HitKind::Shadow, false, _) => (Code::Ok, Outcome::ShadowRejected),
            // quota_mode: over its own limit, but another quota descriptor let the request in.
            (HitKind::Quota, false, true) => (Code::Ok, Outcome::QuotaExhausted),
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
            detailed_metric: rule.is_some_and(|r| r.detailed_metric || r.value_to_metric),
            key: Some(hit.key),
            limit: Some(limit),
            headers,
        }
    }
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

/// The limiter's algorithm for a configured one.
fn algorithm_of(spec: LimitAlgorithm) -> Algorithm {
    match spec {
        LimitAlgorithm::SlidingLog => Algorithm::SlidingLog,
        LimitAlgorithm::QuantizedLog { quantum_ms } => Algorithm::QuantizedLog { quantum_ms },
        LimitAlgorithm::SlidingCounter => Algorithm::SlidingCounter,
        LimitAlgorithm::Gcra { burst } => Algorithm::Gcra {
            burst: u64::from(burst),
        },
        LimitAlgorithm::FixedWindow => Algorithm::FixedWindow,
    }
}

/// The limiter key of a limited descriptor: its own entries, except that values matched by a
/// `share_threshold` wildcard are replaced by the wildcard, so all of them share one counter.
/// `tag` keeps algorithms and stacked limits apart (empty for a lone sliding-log limit, whose
/// key is what it always was).
fn key_for(
    options: &EngineOptions,
    domain: &str,
    descriptor: &Descriptor,
    rule: Option<&Rule>,
    window_ms: u64,
    tag: &str,
) -> String {
    let shared = rule.map_or(&[][..], |r| r.shared_values.as_slice());
    if shared.is_empty() {
        return limiter_key_tagged(
            &options.key_prefix,
            domain,
            &descriptor.entries,
            window_ms,
            tag,
        );
    }
    let mut entries = descriptor.entries.clone();
    for (depth, pattern) in shared {
        if let Some(entry) = entries.get_mut(*depth) {
            entry.value.clone_from(pattern);
        }
    }
    limiter_key_tagged(&options.key_prefix, domain, &entries, window_ms, tag)
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
                headers: _,
                stacked: _,
            } => {
                let (code, outcome) = match (policy, hit.kind) {
                    (FailurePolicy::Deny, HitKind::Consume) => {
                        (Code::OverLimit, Outcome::BackendDenied)
                    }
                    (FailurePolicy::Deny, _) => (Code::Ok, Outcome::BackendDenied),
                    _ => (Code::Ok, Outcome::BackendAllowed),
                };
                Verdict {
                    code,
                    outcome,
                    limit: Some(limit),
                    remaining: 0,
                    reset_ms: 0,
                    rule: rule.map(|r| r.path.clone()),
                    window_count: 0,
                    detailed_metric: rule.is_some_and(|r| r.detailed_metric || r.value_to_metric),
                    // Nothing is known of the key's window: keep it out of the window gauges.
                    key: None,
                    headers: HeaderPolicy::default(),
                }
            }
        })
        .collect();
    let overall = if verdicts.iter().any(|v| v.code == Code::OverLimit) {
        Code::OverLimit
    } else {
        Code::Ok
    };
    Decision {
        overall,
        verdicts,
        hits,
        known_domain,
    }
}

/// Rejects requests Envoy would never send and that cannot be decided: nothing is recorded.
/// Checks the default [`InputLimits`]; [`Engine::decide`] checks its configured ones.
pub fn validate(request: &Request) -> Result<(), InvalidRequest> {
    validate_with(request, &InputLimits::default())
}

fn invalid(field: impl Into<String>, reason: impl Into<Cow<'static, str>>) -> InvalidRequest {
    InvalidRequest {
        field: field.into(),
        reason: reason.into(),
    }
}

/// `N bytes exceeds --flag LIMIT`, or the count form for lists.
fn too_long(len: usize, unit: &str, flag: &str, limit: impl std::fmt::Display) -> String {
    format!("{len} {unit} exceeds {flag} {limit}")
}

/// [`validate`] under explicit limits. Every check is O(1) per field (lengths are known), so a
/// hostile request costs no more than reading it; the first violation in field order is named.
pub fn validate_with(request: &Request, limits: &InputLimits) -> Result<(), InvalidRequest> {
    let [domain_flag, descriptors_flag, entries_flag, key_flag, value_flag, hits_flag, _] =
        InputLimits::FLAGS;
    if request.domain.is_empty() {
        return Err(invalid("domain", "must not be empty"));
    }
    if request.domain.len() > limits.max_domain_bytes {
        return Err(invalid(
            "domain",
            too_long(
                request.domain.len(),
                "bytes",
                domain_flag,
                limits.max_domain_bytes,
            ),
        ));
    }
    if request.descriptors.is_empty() {
        return Err(invalid("descriptors", "must hold at least one descriptor"));
    }
    if request.descriptors.len() > limits.max_descriptors {
        return Err(invalid(
            "descriptors",
            too_long(
                request.descriptors.len(),
                "descriptors",
                descriptors_flag,
                limits.max_descriptors,
            ),
        ));
    }
    if u64::from(request.hits_addend) > limits.max_hits_addend {
        return Err(invalid(
            "hits_addend",
            format!(
                "{} exceeds {hits_flag} {}",
                request.hits_addend, limits.max_hits_addend
            ),
        ));
    }
    for (i, descriptor) in request.descriptors.iter().enumerate() {
        if descriptor.entries.is_empty() {
            return Err(invalid(
                format!("descriptors[{i}].entries"),
                "must hold at least one entry",
            ));
        }
        if descriptor.entries.len() > limits.max_entries {
            return Err(invalid(
                format!("descriptors[{i}].entries"),
                too_long(
                    descriptor.entries.len(),
                    "entries",
                    entries_flag,
                    limits.max_entries,
                ),
            ));
        }
        for (j, entry) in descriptor.entries.iter().enumerate() {
            if entry.key.is_empty() {
                return Err(invalid(
                    format!("descriptors[{i}].entries[{j}].key"),
                    "must not be empty",
                ));
            }
            if entry.key.len() > limits.max_key_bytes {
                return Err(invalid(
                    format!("descriptors[{i}].entries[{j}].key"),
                    too_long(entry.key.len(), "bytes", key_flag, limits.max_key_bytes),
                ));
            }
            if entry.value.len() > limits.max_value_bytes {
                return Err(invalid(
                    format!("descriptors[{i}].entries[{j}].value"),
                    too_long(
                        entry.value.len(),
                        "bytes",
                        value_flag,
                        limits.max_value_bytes,
                    ),
                ));
            }
        }
        if let Some(hits) = descriptor.hits_addend {
            if hits > limits.max_hits_addend {
                return Err(invalid(
                    format!("descriptors[{i}].hits_addend"),
                    format!("{hits} exceeds {hits_flag} {}", limits.max_hits_addend),
                ));
            }
        }
    }
    Ok(())
}

/// Resolves every descriptor against one config snapshot: overrides, `unlimited`, whitelists and
/// `replaces` are settled here, so only real limits reach the backend.
pub fn resolve<'c>(
    config: &'c Config,
    request: &Request,
    options: &EngineOptions,
) -> Vec<Resolution<'c>> {
    let request_hits = if request.hits_addend == 0 {
        1
    } else {
        u64::from(request.hits_addend)
    };
    let known_domain = config.has_domain(&request.domain);

    let mut plans: Vec<Resolution<'c>> = request
        .descriptors
        .iter()
        .map(|descriptor| {
            if !known_domain {
                return Resolution::Done(Verdict::unlimited_or_none(Outcome::NoRule, None));
            }
            let rule = match config.lookup(&request.domain, &descriptor.entries) {
                Lookup::Rule { rule, .. } => Some(rule),
                Lookup::NoRule | Lookup::UnknownDomain => None,
            };
            let limits: Vec<(CurrentLimit, Algorithm)> = match (descriptor.limit_override, rule) {
                // An override names a count and a unit only: it counts with the sliding log.
                (Some(o), _) => vec![(
                    CurrentLimit {
                        requests_per_unit: o.requests_per_unit,
                        unit: o.unit,
                        name: None,
                        window_ms: o.unit.window_ms(),
                    },
                    Algorithm::SlidingLog,
                )],
                (None, Some(r)) => match r.limit {
                    Some(LimitSpec::PerUnit {
                        requests_per_unit,
                        unit,
                    }) if r.limits.is_empty() => vec![(
                        CurrentLimit {
                            requests_per_unit,
                            unit,
                            name: r.name.clone(),
                            window_ms: unit.window_ms(),
                        },
                        Algorithm::SlidingLog,
                    )],
                    Some(LimitSpec::PerUnit { .. }) => r
                        .limits
                        .iter()
                        .map(|l| {
                            (
                                CurrentLimit {
                                    requests_per_unit: l.requests_per_unit,
                                    unit: l.unit,
                                    name: l.name.clone(),
                                    window_ms: l.window_ms,
                                },
                                algorithm_of(l.algorithm),
                            )
                        })
                        .collect(),
                    Some(LimitSpec::Unlimited) => {
                        return Resolution::Done(Verdict::unlimited_or_none(
                            Outcome::Unlimited,
                            rule,
                        ))
                    }
                    None => {
                        return Resolution::Done(Verdict::unlimited_or_none(Outcome::NoRule, rule))
                    }
                },
                (None, None) => {
                    return Resolution::Done(Verdict::unlimited_or_none(Outcome::NoRule, None))
                }
            };
            let kind = if descriptor.negative {
                HitKind::Refund
            } else if options.shadow_mode || rule.is_some_and(|r| r.shadow_mode) {
                HitKind::Shadow
            } else if rule.is_some_and(|r| r.quota_mode) {
                HitKind::Quota
            } else {
                HitKind::Consume
            };
            let headers = match kind {
                HitKind::Consume | HitKind::Quota => {
                    rule.map_or_else(|| config.domain_headers(&request.domain), |r| r.headers)
                }
                HitKind::Shadow | HitKind::Refund => HeaderPolicy::default(),
            };
            let hits = descriptor.hits_addend.unwrap_or(request_hits);
            let mut parts = limits
                .into_iter()
                .enumerate()
                .map(|(i, (limit, algorithm))| {
                    let mut tag = algorithm.key_tag();
                    if i > 0 {
                        tag.push_str(&format!("s{i}"));
                    }
                    let hit = Hit {
                        key: key_for(
                            options,
                            &request.domain,
                            descriptor,
                            rule,
                            limit.window_ms,
                            &tag,
                        ),
                        limit: u64::from(limit.requests_per_unit),
                        window_ms: limit.window_ms,
                        hits,
                        kind,
                        algorithm,
                    };
                    (limit, hit)
                });
            let Some((limit, hit)) = parts.next() else {
                return Resolution::Done(Verdict::unlimited_or_none(Outcome::NoRule, rule));
            };
            Resolution::Limited {
                rule,
                headers,
                limit,
                hit,
                stacked: parts.collect(),
            }
        })
        .collect();

    // `replaces`: a limit named by another matched rule of this request is dropped.
    let replaced: HashSet<&str> = plans
        .iter()
        .filter_map(|p| match p {
            Resolution::Limited {
                rule: Some(rule), ..
            } => Some(rule.replaces.iter().map(String::as_str)),
            _ => None,
        })
        .flatten()
        .collect();
    if !replaced.is_empty() {
        for p in plans.iter_mut() {
            if let Resolution::Limited {
                rule: Some(rule),
                limit,
                ..
            } = p
            {
                if limit.name.as_deref().is_some_and(|n| replaced.contains(n)) {
                    let rule = *rule;
                    *p = Resolution::Done(Verdict::unlimited_or_none(Outcome::NoRule, Some(rule)));
                }
            }
        }
    }
    plans
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::memory::MemoryLimiter;
    use crate::limiter::{BatchOutcome, Clock};
    use async_trait::async_trait;
    use std::path::Path;
    use std::sync::Mutex;

    struct FixedClock(u64);
    impl Clock for FixedClock {
        fn now_ms(&self) -> u64 {
            self.0
        }
    }

    /// The memory backend, with every batch it receives kept for inspection.
    struct Recording {
        inner: MemoryLimiter,
        batches: Mutex<Vec<Vec<Hit>>>,
    }

    #[async_trait]
    impl Limiter for Recording {
        async fn decide(
            &self,
            batch: &[Hit],
            now: Option<u64>,
        ) -> Result<BatchOutcome, LimiterError> {
            self.batches.lock().unwrap().push(batch.to_vec());
            self.inner.decide(batch, now).await
        }
        async fn ping(&self) -> Result<(), LimiterError> {
            Ok(())
        }
        fn backend(&self) -> &'static str {
            "recording"
        }
    }

    const YAML: &str = "
domain: d
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2, name: per_user}
  - key: user
    value: trusted
  - key: bot
    rate_limit: {unlimited: true}
  - key: vip
    rate_limit:
      unit: hour
      requests_per_unit: 10
      replaces: [{name: per_user}]
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: path
    value: /api/*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: path
    value: /web/*
    rate_limit: {unit: minute, requests_per_unit: 2}
";

    fn engine() -> (Engine, Arc<Recording>) {
        engine_with(EngineOptions::default())
    }

    fn engine_with(options: EngineOptions) -> (Engine, Arc<Recording>) {
        let config = Config::from_yaml_str(Path::new("test.yaml"), YAML).unwrap();
        let limiter = Arc::new(Recording {
            inner: MemoryLimiter::new(Arc::new(FixedClock(1_000_000))),
            batches: Mutex::new(Vec::new()),
        });
        (
            Engine::with_options(config, limiter.clone(), options),
            limiter,
        )
    }

    #[tokio::test]
    async fn share_threshold_values_share_one_counter() {
        let (engine, backend) = engine();
        for (path, expected) in [
            ("/api/a", Code::Ok),
            ("/api/b", Code::Ok),
            ("/api/c", Code::OverLimit),
        ] {
            let d = engine.decide(&req(&[&[("path", path)]])).await.unwrap();
            assert_eq!(d.overall, expected, "{path}");
        }
        // Without share_threshold each value has its own counter.
        for path in ["/web/a", "/web/b", "/web/c"] {
            let d = engine.decide(&req(&[&[("path", path)]])).await.unwrap();
            assert_eq!(d.overall, Code::Ok, "{path}");
        }
        let batches = backend.batches.lock().unwrap();
        assert_eq!(batches[0][0].key, "sluice:{d|path=/api/*|60000}");
        assert_eq!(batches[1][0].key, batches[0][0].key);
        assert_ne!(batches[3][0].key, batches[4][0].key);
    }

    #[tokio::test]
    async fn global_shadow_mode_keeps_statuses_and_answers_ok() {
        let (engine, _) = engine_with(EngineOptions {
            shadow_mode: true,
            ..EngineOptions::default()
        });
        let one = req(&[&[("user", "a")], &[("user", "b")]]);
        for _ in 0..2 {
            assert_eq!(engine.decide(&one).await.unwrap().overall, Code::Ok);
        }
        let third = engine.decide(&one).await.unwrap();
        assert_eq!(third.overall, Code::Ok, "global shadow mode never rejects");
        assert_eq!(third.verdicts[0].code, Code::OverLimit, "statuses are kept");
        assert_eq!(third.verdicts[0].outcome, Outcome::ShadowRejected);
        assert_eq!(third.verdicts[0].remaining, 0);
    }

    #[tokio::test]
    async fn key_prefix_is_applied() {
        let (engine, backend) = engine_with(EngineOptions {
            key_prefix: "rl_".into(),
            ..EngineOptions::default()
        });
        engine.decide(&req(&[&[("user", "a")]])).await.unwrap();
        assert_eq!(
            backend.batches.lock().unwrap()[0][0].key,
            "rl_{d|user=a|60000}"
        );
    }

    #[tokio::test]
    async fn zero_requests_per_unit_is_always_over() {
        let (engine, _) = engine();
        let mut r = req(&[&[("user", "z")]]);
        r.descriptors[0].limit_override = Some(LimitOverride {
            requests_per_unit: 0,
            unit: Unit::Second,
        });
        let d = engine.decide(&r).await.unwrap();
        assert_eq!(d.overall, Code::OverLimit);
    }

    fn req(descriptors: &[&[(&str, &str)]]) -> Request {
        Request {
            domain: "d".into(),
            descriptors: descriptors
                .iter()
                .map(|pairs| {
                    Descriptor::new(pairs.iter().map(|(k, v)| Entry::new(*k, *v)).collect())
                })
                .collect(),
            hits_addend: 0,
        }
    }

    #[tokio::test]
    async fn unlimited_whitelisted_and_unknown_never_reach_the_backend() {
        let (engine, backend) = engine();
        let d = engine
            .decide(&req(&[
                &[("bot", "x")],
                &[("user", "trusted")],
                &[("nope", "x")],
            ]))
            .await
            .unwrap();
        assert_eq!(d.overall, Code::Ok);
        let outcomes: Vec<_> = d.verdicts.iter().map(|v| v.outcome).collect();
        assert_eq!(
            outcomes,
            [Outcome::Unlimited, Outcome::NoRule, Outcome::NoRule]
        );
        let mut other = req(&[&[("user", "a")]]);
        other.domain = "unknown".into();
        assert!(!engine.decide(&other).await.unwrap().known_domain);
        assert!(backend.batches.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn one_batch_per_request_with_every_limited_descriptor() {
        let (engine, backend) = engine();
        engine
            .decide(&req(&[
                &[("user", "a")],
                &[("bot", "b")],
                &[("shadow", "s")],
            ]))
            .await
            .unwrap();
        let batches = backend.batches.lock().unwrap();
        assert_eq!(batches.len(), 1);
        let kinds: Vec<_> = batches[0]
            .iter()
            .map(|h| (h.kind, h.limit, h.window_ms))
            .collect();
        assert_eq!(
            kinds,
            [(HitKind::Consume, 2, 60_000), (HitKind::Shadow, 1, 60_000)]
        );
    }

    #[tokio::test]
    async fn invalid_requests_never_reach_the_backend() {
        let (engine, backend) = engine();
        let mut bad = req(&[&[("user", "a")], &[("", "x")]]);
        let err = engine.decide(&bad).await.unwrap_err();
        assert!(
            matches!(err, DecisionError::Invalid(ref e) if e.field == "descriptors[1].entries[0].key")
        );
        bad.domain.clear();
        assert!(engine.decide(&bad).await.is_err());
        assert!(backend.batches.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn replaced_limit_is_not_sent() {
        let (engine, backend) = engine();
        let d = engine
            .decide(&req(&[&[("user", "a")], &[("vip", "v")]]))
            .await
            .unwrap();
        assert_eq!(d.verdicts[0].outcome, Outcome::NoRule);
        assert!(d.verdicts[0].limit.is_none());
        assert_eq!(d.verdicts[1].limit.as_ref().unwrap().requests_per_unit, 10);
        assert_eq!(backend.batches.lock().unwrap()[0].len(), 1);
    }

    #[tokio::test]
    async fn verdicts_report_remaining_and_rejection() {
        let (engine, _) = engine();
        let one = req(&[&[("user", "a")]]);
        let first = engine.decide(&one).await.unwrap();
        assert_eq!(
            (first.verdicts[0].remaining, first.verdicts[0].reset_ms),
            (1, 60_000)
        );
        engine.decide(&one).await.unwrap();
        let third = engine.decide(&one).await.unwrap();
        assert_eq!(third.overall, Code::OverLimit);
        assert_eq!(third.verdicts[0].outcome, Outcome::Rejected);
        assert_eq!(third.hits, 1);
    }

    #[tokio::test]
    async fn stacked_limits_admit_only_if_all_admit_and_report_the_tightest() {
        let yaml = "
domain: d
descriptors:
  - key: user
    rate_limits:
      - {unit: second, requests_per_unit: 3, name: burst}
      - {window: 90s, requests_per_unit: 4, algorithm: gcra, burst: 4, name: sustained}
";
        let config = Config::from_yaml_str(Path::new("t.yaml"), yaml).unwrap();
        let limiter = Arc::new(Recording {
            inner: MemoryLimiter::new(Arc::new(FixedClock(1_000_000))),
            batches: Mutex::new(Vec::new()),
        });
        let engine = Engine::new(config, limiter.clone());
        let one = req(&[&[("user", "a")]]);
        let first = engine.decide(&one).await.unwrap();
        let v = &first.verdicts[0];
        // Both admit; the per-second limit has 2 left, the 90 s GCRA 3: the first is tighter.
        assert_eq!(v.outcome, Outcome::Admitted);
        assert_eq!(v.limit.as_ref().unwrap().name.as_deref(), Some("burst"));
        assert_eq!(v.remaining, 2);
        {
            let batches = limiter.batches.lock().unwrap();
            let keys: Vec<&str> = batches[0].iter().map(|h| h.key.as_str()).collect();
            assert_eq!(
                keys,
                ["sluice:{d|user=a|1000}", "sluice:{d|user=a|90000|gcras1}"]
            );
            assert_eq!(batches[0][1].algorithm, Algorithm::Gcra { burst: 4 });
        }
        engine.decide(&one).await.unwrap();
        engine.decide(&one).await.unwrap();
        // The GCRA (4 per 90 s, burst 4) has one token left, the per-second limit none.
        let fourth = engine.decide(&one).await.unwrap();
        assert_eq!(fourth.overall, Code::OverLimit);
        let v = &fourth.verdicts[0];
        assert_eq!(v.outcome, Outcome::Rejected);
        let limit = v.limit.as_ref().unwrap();
        assert_eq!(limit.name.as_deref(), Some("burst"));
        // Nothing was recorded on the other limit of the rejected request.
        let probe = Hit {
            hits: 0,
            ..limiter.batches.lock().unwrap()[0][1].clone()
        };
        let out = limiter.inner.decide(&[probe], None).await.unwrap();
        assert_eq!(out.items[0].count, 3);
    }

    #[tokio::test]
    async fn custom_windows_report_the_nearest_unit_and_the_real_window() {
        let yaml = "
domain: d
descriptors:
  - key: k
    rate_limit: {window: 30s, requests_per_unit: 1}
";
        let config = Config::from_yaml_str(Path::new("t.yaml"), yaml).unwrap();
        let engine = Engine::new(
            config,
            Arc::new(MemoryLimiter::new(Arc::new(FixedClock(0)))),
        );
        let d = engine.decide(&req(&[&[("k", "v")]])).await.unwrap();
        let limit = d.verdicts[0].limit.as_ref().unwrap();
        assert_eq!((limit.unit, limit.window_ms), (Unit::Minute, 30_000));
        assert_eq!(d.verdicts[0].reset_ms, 30_000);
    }
}
