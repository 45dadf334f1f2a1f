//! The engine's vocabulary: a request in (domain, descriptors, hits), a decision out (a verdict
//! per descriptor and why), and the options that shape both.
//!
//! Why a file of its own: every other part of the engine (input limits, rule resolution, the
//! engine itself), both faces (gRPC, `/json`), the response headers and the metrics observer
//! speak these types; keeping them apart from the logic lets each of those depend on the types
//! without depending on one another. Plain data: no I/O, no metrics, no tonic.

use crate::config::{HeaderPolicy, Rule, StatPath, Unit};
use crate::descriptor::{Entry, KEY_PREFIX};
use crate::limiter::AnsweredBy;
use crate::metadata::Metadata;

/// The name of a request's lease, both ways (`in_flight` limits): the key of the dynamic
/// metadata an admitted request's response carries (its value the lease token, a decimal
/// string), and the key of the descriptor entry a refund names it with (Envoy's `metadata`
/// rate-limit action reads that metadata when the stream is done). Never part of a limiter key:
/// a descriptor's last entry of this key is taken off before its rule is looked up.
pub const LEASE_KEY: &str = "sluice_lease";

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

/// Bounds on what one request may carry, so that a hostile or broken client costs a bounded
/// amount of work and memory and gets INVALID_ARGUMENT naming the limit, never a slow answer.
///
/// Why in the engine: both faces (gRPC and HTTP `/json`) decide through
/// [`Engine::decide`](super::Engine::decide), so both enforce the same limits, and a request
/// over a limit is refused before anything is recorded (the checks: [`super::validate_with`]).
/// Each limit is a `serve` flag (and `SLUICE_*` variable); the message names the flag, as
/// [`InputLimits::FLAGS`] spells it, so an operator knows which knob to turn.
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
    /// `hits_addend` of the request or of a descriptor. A request's hits are one log entry
    /// carrying them as its weight on every backend, so this bounds a claim on a limit, not the
    /// work a decision costs.
    pub max_hits_addend: u64,
    /// Buckets one Rate Limit Quota Service stream may hold (and one usage report list): a
    /// stream tracks each bucket's state, so this bounds its memory.
    pub max_quota_buckets: usize,
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
        "--rlqs-max-buckets",
    ];
    pub const DEFAULT_MAX_DOMAIN_BYTES: usize = 1024;
    pub const DEFAULT_MAX_DESCRIPTORS: usize = 64;
    pub const DEFAULT_MAX_ENTRIES: usize = 32;
    pub const DEFAULT_MAX_KEY_BYTES: usize = 1024;
    pub const DEFAULT_MAX_VALUE_BYTES: usize = 1024;
    pub const DEFAULT_MAX_HITS_ADDEND: u64 = 100_000;
    pub const DEFAULT_MAX_QUOTA_BUCKETS: usize = 1_000;
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
            max_quota_buckets: Self::DEFAULT_MAX_QUOTA_BUCKETS,
        }
    }
}

/// Process-wide switches of the engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineOptions {
    /// What a request gets when the backend fails (`--on-backend-error`).
    pub on_backend_error: FailurePolicy,
    /// Global shadow mode (envoyproxy/ratelimit's `SHADOW_MODE`): every limit is evaluated and its
    /// status reported as usual, but the overall code is always OK, and each limit records the
    /// hits it would have admitted on its own.
    pub shadow_mode: bool,
    /// Global quota mode (envoyproxy/ratelimit's `QUOTA_MODE`): every descriptor that is not
    /// `unlimited` is a quota descriptor, so a request is over the limit only when all of them
    /// are (one without a limit never is); shadow mode wins over it.
    pub quota_mode: bool,
    /// Prefix of every limiter key (`CACHE_KEY_PREFIX`).
    pub key_prefix: String,
    /// What one request may carry; larger requests are refused, recording nothing.
    pub limits: InputLimits,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            on_backend_error: FailurePolicy::default(),
            shadow_mode: false,
            quota_mode: false,
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
    /// The policy's name, as the `--on-backend-error` flag and the metrics' `policy` label spell it.
    pub const fn as_str(self) -> &'static str {
        match self {
            FailurePolicy::Error => "error",
            FailurePolicy::Allow => "allow",
            FailurePolicy::Deny => "deny",
        }
    }
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
    /// it: its status is OVER_LIMIT, the request's OK (envoyproxy/ratelimit's answer); it records
    /// what its `over_limit` says.
    QuotaExhausted,
    /// The backend failed and the failure policy `allow` answered OK.
    BackendAllowed,
    /// The backend failed and the failure policy `deny` answered OVER_LIMIT.
    BackendDenied,
}

impl Outcome {
    /// The outcome's name, as the metrics' `outcome` label spells it (docs/metrics.md).
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

/// What names a verdict's stats under envoyproxy/ratelimit's names
/// (`ratelimit.service.rate_limit.<domain>.<key>.<stat>`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StatKey {
    /// The matched rule's stat path, rendered with the request's entries where it takes them.
    Rule(StatPath),
    /// A `limit` the request carried: named after the request's own entries (`key_value`, or
    /// `key` for an empty value), whatever the config says.
    Override,
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
    /// Hits the limit still admits; `u32::MAX` for an `unlimited` rule, 0 without a limit.
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
    /// What names the verdict's envoyproxy/ratelimit stats, for a descriptor counted against a
    /// limit (`None` otherwise: no rule, `unlimited`, a whitelist).
    pub stat: Option<StatKey>,
    /// Response headers this verdict asks for (the default, none, for shadow-mode limits,
    /// refunds and descriptors without a limit: they never reject, so they advertise nothing).
    pub headers: HeaderPolicy,
    /// The matched rule's `metadata`, when the descriptor was decided against the rule's limits.
    pub metadata: Option<Metadata>,
}

impl Verdict {
    /// The verdict of a descriptor settled without the backend: OK, no limit, `outcome`.
    /// An `unlimited` rule reports `u32::MAX` remaining (envoyproxy/ratelimit's answer, which
    /// clients of either service may read); no rule reports 0, as there.
    pub(super) fn unlimited_or_none(outcome: Outcome, rule: Option<&Rule>) -> Self {
        Verdict {
            code: Code::Ok,
            outcome,
            limit: None,
            remaining: if outcome == Outcome::Unlimited {
                u32::MAX
            } else {
                0
            },
            reset_ms: 0,
            rule: rule.map(|r| r.path.clone()),
            window_count: 0,
            detailed_metric: wants_detailed_metric(rule),
            key: None,
            stat: None,
            headers: HeaderPolicy::default(),
            metadata: None,
        }
    }
}

/// Whether metrics may label a verdict of `rule` with the request's values.
pub(super) fn wants_detailed_metric(rule: Option<&Rule>) -> bool {
    rule.is_some_and(|r| r.detailed_metric || r.value_to_metric)
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
    /// `Some(policy)` when the backend could not decide and the failure policy answered
    /// (`allow` or `deny`; under `error` the engine returns the error instead).
    pub backend_failed: Option<FailurePolicy>,
    /// Who answered the limiter call: the backend, or the local rejection cache without
    /// calling it (also the backend when there was no call).
    pub answered_by: AnsweredBy,
    /// The token of the leases this request holds on its `in_flight` limits, when it holds any
    /// (an admitted request with an `in_flight` item that recorded): what its refunds name.
    pub lease: Option<u64>,
}
