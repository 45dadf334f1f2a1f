//! The decision engine: one rate-limit request -> rules -> one limiter batch -> a verdict per
//! descriptor.
//!
//! Why here and not in the gRPC adapter: this is where envoyproxy/ratelimit's semantics live
//! (limit overrides, `replaces`, `unlimited`, shadow mode, hits_addend), and they must not depend
//! on tonic or on which backend keeps the log. The engine reads one config snapshot per request,
//! so a request never sees two config generations, and sends every limited descriptor of the
//! request to the limiter in ONE batch, so the request is admitted all-or-nothing.
//!
//! The engine never touches metrics: a [`Decision`] says what happened (each verdict's
//! [`Outcome`], the failure policy that answered when the backend failed), and the observer in
//! `crate::metrics` records it.
//!
//! Files, each depending only on those above it:
//! - `types`: the vocabulary: requests in, decisions out, and the options that shape them;
//! - `limits`: input limits: what one request may carry, checked before anything is recorded;
//! - `resolve`: rule resolution: descriptors -> the config's rules -> limits and limiter hits;
//! - `engine`: the [`Engine`]: validate, resolve, one limiter call, verdicts.

mod engine;
mod limits;
mod resolve;
mod types;

pub use engine::{DecisionError, Engine};
pub use limits::{InvalidRequest, validate, validate_with};
pub(crate) use limits::{at_most, invalid};
pub use resolve::{Resolution, resolve, split_lease};
pub use types::{
    Code, CurrentLimit, Decision, Descriptor, EngineOptions, FailurePolicy, InputLimits, LEASE_KEY,
    LimitOverride, Outcome, Request, StatKey, Verdict,
};

#[cfg(test)]
mod in_flight_tests;
#[cfg(test)]
mod test_support;
