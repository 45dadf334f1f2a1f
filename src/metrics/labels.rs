//! Typed label values: every fixed label set (`outcome`, `code`, `kind`, `policy`, `result`) is
//! an enum here or in the domain, turned into its text in one exhaustive match, never a string
//! written at the call site.
//!
//! Why: label values are a contract with dashboards (deploy/grafana/sluice.json); a typo in a
//! string would silently start a new series. The per-outcome and per-code tables of cached
//! series handles are keyed by the enums themselves, with a field per variant and exhaustive
//! matches, so a new variant does not compile until it has its slot, and no hand-kept index
//! can fall out of step.

use crate::decision::{Code, DecisionError, Outcome};
use crate::limiter::LimiterError;

/// `sluice_requests_total{code}`.
pub const fn code_label(code: Code) -> &'static str {
    match code {
        Code::Ok => "ok",
        Code::OverLimit => "over_limit",
    }
}

/// `sluice_request_errors_total{kind}`: why a call got an error instead of a decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RequestError {
    /// INVALID_ARGUMENT (HTTP 400 on `/json`): the request could not be mapped or broke an
    /// input limit.
    InvalidArgument,
    /// UNAVAILABLE (HTTP 503): the backend failed under the `error` failure policy.
    Backend,
    /// UNAVAILABLE (HTTP 503): no config has arrived yet (xDS with
    /// `--force-start-without-initial-config`).
    NoConfig,
}

impl RequestError {
    pub(super) const fn as_str(self) -> &'static str {
        match self {
            RequestError::InvalidArgument => "invalid_argument",
            RequestError::Backend => "backend",
            RequestError::NoConfig => "no_config",
        }
    }
}

impl From<&DecisionError> for RequestError {
    fn from(err: &DecisionError) -> Self {
        match err {
            DecisionError::Invalid(_) => RequestError::InvalidArgument,
            DecisionError::Backend(_) => RequestError::Backend,
            DecisionError::NoConfig => RequestError::NoConfig,
        }
    }
}

/// `sluice_backend_errors_total{kind}`.
pub const fn backend_error_label(err: &LimiterError) -> &'static str {
    match err {
        LimiterError::Unavailable(_) => "unavailable",
        LimiterError::Timeout(_) => "timeout",
        LimiterError::Protocol(_) => "protocol",
        LimiterError::Refused(_) => "refused",
        LimiterError::Overloaded => "overloaded",
    }
}

/// `sluice_config_loads_total{result}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ConfigLoad {
    Success,
    Failure,
}

impl ConfigLoad {
    pub(super) const fn as_str(self) -> &'static str {
        match self {
            ConfigLoad::Success => "success",
            ConfigLoad::Failure => "failure",
        }
    }
}

/// One `T` per overall [`Code`].
#[derive(Debug, Default)]
pub(super) struct PerCode<T> {
    ok: T,
    over_limit: T,
}

impl<T> PerCode<T> {
    pub(super) fn get(&self, code: Code) -> &T {
        match code {
            Code::Ok => &self.ok,
            Code::OverLimit => &self.over_limit,
        }
    }
}

/// One `T` per [`Outcome`] (the `outcome` label of `sluice_decisions_total`).
#[derive(Debug, Default)]
pub(super) struct PerOutcome<T> {
    no_rule: T,
    unlimited: T,
    admitted: T,
    rejected: T,
    not_recorded: T,
    shadow_rejected: T,
    refunded: T,
    quota_exhausted: T,
    backend_allowed: T,
    backend_denied: T,
}

impl<T> PerOutcome<T> {
    pub(super) fn get(&self, outcome: Outcome) -> &T {
        match outcome {
            Outcome::NoRule => &self.no_rule,
            Outcome::Unlimited => &self.unlimited,
            Outcome::Admitted => &self.admitted,
            Outcome::Rejected => &self.rejected,
            Outcome::NotRecorded => &self.not_recorded,
            Outcome::ShadowRejected => &self.shadow_rejected,
            Outcome::Refunded => &self.refunded,
            Outcome::QuotaExhausted => &self.quota_exhausted,
            Outcome::BackendAllowed => &self.backend_allowed,
            Outcome::BackendDenied => &self.backend_denied,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every outcome, each once: a [`PerOutcome`] whose slots hold their own outcome, read back
    /// through a destructuring the compiler checks for completeness.
    fn all_outcomes() -> (PerOutcome<Outcome>, Vec<Outcome>) {
        let table = PerOutcome {
            no_rule: Outcome::NoRule,
            unlimited: Outcome::Unlimited,
            admitted: Outcome::Admitted,
            rejected: Outcome::Rejected,
            not_recorded: Outcome::NotRecorded,
            shadow_rejected: Outcome::ShadowRejected,
            refunded: Outcome::Refunded,
            quota_exhausted: Outcome::QuotaExhausted,
            backend_allowed: Outcome::BackendAllowed,
            backend_denied: Outcome::BackendDenied,
        };
        // No `..`: the compiler checks that every slot is read back.
        let PerOutcome {
            no_rule: a,
            unlimited: b,
            admitted: c,
            rejected: d,
            not_recorded: e,
            shadow_rejected: f,
            refunded: g,
            quota_exhausted: h,
            backend_allowed: i,
            backend_denied: j,
        } = table;
        let all = vec![a, b, c, d, e, f, g, h, i, j];
        (table, all)
    }

    #[test]
    fn each_outcome_has_its_own_slot_and_a_documented_label() {
        let (table, all) = all_outcomes();
        let docs = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/metrics.md"),
        )
        .unwrap();
        let mut labels = std::collections::HashSet::new();
        for outcome in all {
            assert_eq!(*table.get(outcome), outcome, "slot of {outcome:?}");
            assert!(
                labels.insert(outcome.as_str()),
                "{outcome:?} label is taken"
            );
            assert!(
                docs.contains(&format!("`{}`", outcome.as_str())),
                "outcome {} missing from docs/metrics.md",
                outcome.as_str()
            );
        }
        let codes = PerCode {
            ok: Code::Ok,
            over_limit: Code::OverLimit,
        };
        for code in [Code::Ok, Code::OverLimit] {
            assert_eq!(*codes.get(code), code);
        }
    }
}
