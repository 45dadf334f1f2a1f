//! The decision span: opened by a face before the engine runs, ended with what the call
//! answered. Its attributes name configuration (the domain when the config knows it, the rules'
//! config paths) and outcomes, never a descriptor's values:
//!
//! | attribute | value |
//! | --- | --- |
//! | `rpc.system`, `rpc.service`, `rpc.method` | `grpc`, the RLS service, `ShouldRateLimit` (gRPC face) |
//! | `http.request.method`, `http.route` | `POST`, `/json` (HTTP face) |
//! | `rpc.grpc.status_code` | the call's gRPC status code (the HTTP face derives its status from it) |
//! | `sluice.domain` | the request's domain, `_unknown` when the config has no such domain |
//! | `sluice.descriptors` | how many descriptors the request had |
//! | `sluice.rules` | per descriptor, the config path of the rule that governed it (`""`: none) |
//! | `sluice.outcomes` | per descriptor, its outcome (`admitted`, `rejected`, `no_rule`, ...) |
//! | `sluice.code` | `ok` or `over_limit` |
//! | `sluice.hits` | hits the request asked for |
//! | `sluice.failure_policy` | `allow` or `deny` when the backend failed and the policy answered |
//!
//! A call answered with an error has the error status, the message the caller got (it names
//! fields and sizes, never values) and `error.type`.

use opentelemetry::trace::{Status as SpanStatus, TraceContextExt as _};
use opentelemetry::{Array, Context, KeyValue, StringValue, Value};

use crate::decision::{Decision, Request};
use crate::metrics::{UNKNOWN_DOMAIN, code_label};

/// Which face the call came through: names the span and its protocol attributes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Face {
    Grpc,
    Json,
}

impl Face {
    pub(super) const fn span_name(self) -> &'static str {
        match self {
            Face::Grpc => "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
            Face::Json => "POST /json",
        }
    }

    pub(super) fn attributes(self) -> Vec<KeyValue> {
        match self {
            Face::Grpc => vec![
                KeyValue::new("rpc.system", "grpc"),
                KeyValue::new("rpc.service", "envoy.service.ratelimit.v3.RateLimitService"),
                KeyValue::new("rpc.method", "ShouldRateLimit"),
            ],
            Face::Json => vec![
                KeyValue::new("http.request.method", "POST"),
                KeyValue::new("http.route", "/json"),
            ],
        }
    }
}

/// One decision's span, in the context the engine runs in (so the backend span is its child).
pub struct DecisionSpan {
    cx: Context,
}

impl DecisionSpan {
    pub(super) fn new(cx: Context) -> Self {
        DecisionSpan { cx }
    }

    /// The context to run the engine in: the caller's trace with this span active.
    pub fn context(&self) -> Context {
        self.cx.clone()
    }

    /// Ends the span of a call the engine answered. `known_domain`: whether the config has the
    /// request's domain (else it is exported as `_unknown`).
    pub fn end(
        self,
        known_domain: bool,
        request: &Request,
        answer: Result<&Decision, &tonic::Status>,
    ) {
        let span = self.cx.span();
        let domain = if known_domain {
            request.domain.clone()
        } else {
            UNKNOWN_DOMAIN.to_owned()
        };
        span.set_attribute(KeyValue::new("sluice.domain", domain));
        span.set_attribute(KeyValue::new(
            "sluice.descriptors",
            i64::try_from(request.descriptors.len()).unwrap_or(i64::MAX),
        ));
        match answer {
            Ok(decision) => {
                let rules = decision
                    .verdicts
                    .iter()
                    .map(|v| StringValue::from(v.rule.clone().unwrap_or_default()));
                let outcomes = decision
                    .verdicts
                    .iter()
                    .map(|v| StringValue::from(v.outcome.as_str()));
                span.set_attributes([
                    KeyValue::new("rpc.grpc.status_code", 0_i64),
                    KeyValue::new("sluice.rules", Value::Array(Array::String(rules.collect()))),
                    KeyValue::new(
                        "sluice.outcomes",
                        Value::Array(Array::String(outcomes.collect())),
                    ),
                    KeyValue::new("sluice.code", code_label(decision.overall)),
                    KeyValue::new(
                        "sluice.hits",
                        i64::try_from(decision.hits).unwrap_or(i64::MAX),
                    ),
                ]);
                if let Some(policy) = decision.backend_failed {
                    span.set_attribute(KeyValue::new("sluice.failure_policy", policy.as_str()));
                }
            }
            Err(status) => set_error(&self.cx, status),
        }
        span.end();
    }

    /// Ends the span of a call refused before it reached the engine (its fields could not be
    /// mapped to a request).
    pub fn end_refused(self, status: &tonic::Status) {
        set_error(&self.cx, status);
        self.cx.span().end();
    }
}

fn set_error(cx: &Context, status: &tonic::Status) {
    let span = cx.span();
    span.set_attributes([
        KeyValue::new("rpc.grpc.status_code", i64::from(i32::from(status.code()))),
        KeyValue::new("error.type", format!("{:?}", status.code())),
    ]);
    span.set_status(SpanStatus::error(status.message().to_owned()));
}
