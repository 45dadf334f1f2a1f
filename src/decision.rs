//! The decision engine: one rate-limit request -> rules -> one limiter batch -> a verdict per
//! descriptor.
//!
//! Why here and not in the gRPC adapter: this is where envoyproxy/ratelimit's semantics live
//! (limit overrides, `replaces`, `unlimited`, shadow mode, hits_addend), and they must not depend
//! on tonic or on which backend keeps the log. The engine reads one config snapshot per request,
//! so a request never sees two config generations, and sends every limited descriptor of the
//! request to the limiter in ONE batch, so the request is admitted all-or-nothing.

use std::collections::HashSet;
use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::config::{Config, HeaderPolicy, LimitSpec, Lookup, Rule, Unit};
use crate::descriptor::{limiter_key_with_prefix, Entry, KEY_PREFIX};
use crate::limiter::{Hit, HitKind, Limiter, LimiterError};

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
    pub reason: &'static str,
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
            Outcome::BackendAllowed => "backend_error_allowed",
            Outcome::BackendDenied => "backend_error_denied",
        }
    }
}

/// The limit reported back to Envoy as `current_limit`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CurrentLimit {
    pub requests_per_unit: u32,
    pub unit: Unit,
    pub name: Option<String>,
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
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            shadow_mode: false,
            key_prefix: KEY_PREFIX.to_owned(),
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
        validate(request)?;
        let config = self.config.load_full();
        let known_domain = config.has_domain(&request.domain);
        let mut plans = resolve(&config, request, &self.options);

        // The keys move into the batch (no copy); each verdict takes its key back from it.
        let mut batch: Vec<Hit> = Vec::with_capacity(plans.len());
        for plan in &mut plans {
            if let Resolution::Limited { hit, .. } = plan {
                batch.push(Hit {
                    key: std::mem::take(&mut hit.key),
                    ..*hit
                });
            }
        }
        let hits = batch
            .iter()
            .filter(|h| h.kind != HitKind::Refund)
            .fold(0u64, |acc, h| acc.saturating_add(h.hits));
        let outcome = if batch.is_empty() {
            None
        } else {
            match self.limiter.decide(&batch).await {
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
                } => {
                    let item = items.next().ok_or_else(|| {
                        LimiterError::Protocol("fewer outcomes than batch items".into())
                    })?;
                    let (code, outcome) = match (hit.kind, item.passed, admitted) {
                        (HitKind::Refund, _, true) => (Code::Ok, Outcome::Refunded),
                        (HitKind::Refund, _, false) => (Code::Ok, Outcome::NotRecorded),
                        (HitKind::Shadow, false, _) if self.options.shadow_mode => {
                            (Code::OverLimit, Outcome::ShadowRejected)
                        }
                        (HitKind::Shadow, false, _) => (Code::Ok, Outcome::ShadowRejected),
                        (_, false, _) => (Code::OverLimit, Outcome::Rejected),
                        (_, true, true) => (Code::Ok, Outcome::Admitted),
                        (_, true, false) => (Code::Ok, Outcome::NotRecorded),
                    };
                    let remaining = hit.limit.saturating_sub(item.count);
                    Verdict {
                        code,
                        outcome,
                        remaining: u32::try_from(remaining).unwrap_or(u32::MAX),
                        reset_ms: item.reset_ms,
                        rule: rule.map(|r| r.path.clone()),
                        window_count: item.count,
                        detailed_metric: rule
                            .is_some_and(|r| r.detailed_metric || r.value_to_metric),
                        key: keys.next(),
                        limit: Some(limit),
                        headers,
                    }
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

/// The limiter key of a limited descriptor: its own entries, except that values matched by a
/// `share_threshold` wildcard are replaced by the wildcard, so all of them share one counter.
fn key_for(
    options: &EngineOptions,
    domain: &str,
    descriptor: &Descriptor,
    rule: Option<&Rule>,
    window_ms: u64,
) -> String {
    let shared = rule.map_or(&[][..], |r| r.shared_values.as_slice());
    if shared.is_empty() {
        return limiter_key_with_prefix(
            &options.key_prefix,
            domain,
            &descriptor.entries,
            window_ms,
        );
    }
    let mut entries = descriptor.entries.clone();
    for (depth, pattern) in shared {
        if let Some(entry) = entries.get_mut(*depth) {
            entry.value.clone_from(pattern);
        }
    }
    limiter_key_with_prefix(&options.key_prefix, domain, &entries, window_ms)
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
pub fn validate(request: &Request) -> Result<(), InvalidRequest> {
    if request.domain.is_empty() {
        return Err(InvalidRequest {
            field: "domain".into(),
            reason: "must not be empty",
        });
    }
    if request.descriptors.is_empty() {
        return Err(InvalidRequest {
            field: "descriptors".into(),
            reason: "must hold at least one descriptor",
        });
    }
    for (i, descriptor) in request.descriptors.iter().enumerate() {
        if descriptor.entries.is_empty() {
            return Err(InvalidRequest {
                field: format!("descriptors[{i}].entries"),
                reason: "must hold at least one entry",
            });
        }
        if let Some(j) = descriptor.entries.iter().position(|e| e.key.is_empty()) {
            return Err(InvalidRequest {
                field: format!("descriptors[{i}].entries[{j}].key"),
                reason: "must not be empty",
            });
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
            let (requests_per_unit, unit, name) = match (descriptor.limit_override, rule) {
                (Some(o), _) => (o.requests_per_unit, o.unit, None),
                (None, Some(r)) => match r.limit {
                    Some(LimitSpec::PerUnit {
                        requests_per_unit,
                        unit,
                    }) => (requests_per_unit, unit, r.name.clone()),
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
            } else {
                HitKind::Consume
            };
            let window_ms = unit.window_ms();
            let headers = match kind {
                HitKind::Consume => {
                    rule.map_or_else(|| config.domain_headers(&request.domain), |r| r.headers)
                }
                HitKind::Shadow | HitKind::Refund => HeaderPolicy::default(),
            };
            Resolution::Limited {
                rule,
                headers,
                limit: CurrentLimit {
                    requests_per_unit,
                    unit,
                    name,
                },
                hit: Hit {
                    key: key_for(options, &request.domain, descriptor, rule, window_ms),
                    limit: u64::from(requests_per_unit),
                    window_ms,
                    hits: descriptor.hits_addend.unwrap_or(request_hits),
                    kind,
                },
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
        async fn decide(&self, batch: &[Hit]) -> Result<BatchOutcome, LimiterError> {
            self.batches.lock().unwrap().push(batch.to_vec());
            self.inner.decide(batch).await
        }
        async fn decide_at(&self, batch: &[Hit], now: u64) -> Result<BatchOutcome, LimiterError> {
            self.inner.decide_at(batch, now).await
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
}
