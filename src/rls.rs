//! The rate-limit call as both faces serve it: Envoy's `RateLimitRequest` in, a
//! `RateLimitResponse` or a status out, with the proto <-> domain mapping (descriptors, units,
//! codes, durations, response headers), the ONE map from errors to statuses, and the observer's
//! record of every call.
//!
//! Why one module: the gRPC service ([`crate::grpc::service`]) and envoyproxy/ratelimit's HTTP
//! face ([`crate::http::api`], which parses JSON into the same proto types) must mean the same thing
//! by a request, answer it the same way and show on the same metrics and traces. Both call
//! [`Handler::should_rate_limit`]; neither maps, decides or records on its own.

use std::sync::Arc;
use std::time::Instant;

use opentelemetry::context::FutureExt as _;

use tonic::Status;

use crate::config::Unit;
use crate::decision::{self, Code, Decision, DecisionError, Engine, InvalidRequest, LimitOverride};
use crate::descriptor::Entry;
use crate::headers::{self, LegacyNames};
use crate::limiter::LimiterError;
use crate::metrics::Observer;
use crate::otel::{Face, Tracer};
use crate::proto::envoy::config::core::v3::HeaderValue;
use crate::proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use crate::proto::envoy::service::ratelimit::v3::rate_limit_response::{
    Code as ProtoCode, DescriptorStatus, RateLimit, rate_limit::Unit as ProtoUnit,
};
use crate::proto::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use crate::proto::envoy::r#type::v3::RateLimitUnit;

/// What both faces answer a call with: the engine, the metrics observer, the tracer (off by
/// default) and the names of the `legacy` response headers.
pub struct Handler {
    engine: Arc<Engine>,
    observer: Arc<Observer>,
    tracer: Tracer,
    legacy_names: LegacyNames,
}

impl Handler {
    /// Tracing off, the default `legacy` header names.
    pub fn new(engine: Arc<Engine>, observer: Arc<Observer>) -> Self {
        Handler {
            engine,
            observer,
            tracer: Tracer::off(),
            legacy_names: LegacyNames::default(),
        }
    }

    pub fn with_tracer(mut self, tracer: Tracer) -> Self {
        self.tracer = tracer;
        self
    }

    pub fn with_legacy_names(mut self, names: LegacyNames) -> Self {
        self.legacy_names = names;
        self
    }

    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    pub fn observer(&self) -> &Arc<Observer> {
        &self.observer
    }

    /// One ShouldRateLimit call from `face`: maps the request, decides it, records it on the
    /// observer and, when tracing is on, in a span under the `traceparent` of `headers` (the
    /// call's gRPC metadata or HTTP headers), and maps the answer back.
    pub async fn should_rate_limit(
        &self,
        face: Face,
        headers: &http::HeaderMap,
        request: RateLimitRequest,
    ) -> Result<RateLimitResponse, Status> {
        let started = Instant::now();
        let span = self.tracer.start_decision(face, headers);
        let request = match to_domain(request) {
            Ok(request) => request,
            Err(invalid) => {
                self.observer.record_unmappable(started.elapsed());
                let status = invalid_argument(invalid);
                if let Some(span) = span {
                    span.end_refused(&status);
                }
                return Err(status);
            }
        };
        let result = match &span {
            None => self.engine.decide(&request).await,
            Some(span) => {
                self.engine
                    .decide(&request)
                    .with_context(span.context())
                    .await
            }
        };
        self.observer
            .record_request(&request, result.as_ref(), started.elapsed());
        let answer = result.map_err(to_status);
        if let Some(span) = span {
            let known_domain = match &answer {
                Ok(decision) => decision.known_domain,
                Err(_) => self.engine.config().has_domain(&request.domain),
            };
            span.end(known_domain, &request, answer.as_ref());
        }
        answer.map(|decision| to_proto(decision, &self.legacy_names))
    }
}

/// Every error the service can return, mapped to the code Envoy acts on: UNAVAILABLE lets
/// Envoy's `failure_mode_deny` decide, INVALID_ARGUMENT names the field. The HTTP face derives
/// its status from this code.
pub fn to_status(err: DecisionError) -> Status {
    match err {
        DecisionError::Invalid(invalid) => invalid_argument(invalid),
        DecisionError::Backend(LimiterError::Timeout(ms)) => {
            Status::unavailable(format!("rate-limit backend timed out after {ms} ms"))
        }
        DecisionError::Backend(err) => Status::unavailable(err.to_string()),
        DecisionError::NoConfig => Status::unavailable(
            "no rate-limit config loaded yet: waiting for the first one from the config source",
        ),
    }
}

fn invalid_argument(invalid: InvalidRequest) -> Status {
    Status::invalid_argument(invalid.to_string())
}

/// Proto request -> domain request, naming the first field that cannot be mapped.
pub fn to_domain(request: RateLimitRequest) -> Result<decision::Request, InvalidRequest> {
    let descriptors = request
        .descriptors
        .into_iter()
        .enumerate()
        .map(|(i, d)| descriptor_to_domain(i, d))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(decision::Request {
        domain: request.domain,
        descriptors,
        hits_addend: request.hits_addend,
    })
}

fn descriptor_to_domain(
    index: usize,
    descriptor: RateLimitDescriptor,
) -> Result<decision::Descriptor, InvalidRequest> {
    let limit_override = match descriptor.limit {
        None => None,
        Some(o) => Some(LimitOverride {
            requests_per_unit: o.requests_per_unit,
            unit: unit_from_proto(o.unit).ok_or_else(|| InvalidRequest {
                field: format!("descriptors[{index}].limit.unit"),
                reason: "must be a known unit (SECOND..YEAR)".into(),
            })?,
        }),
    };
    Ok(decision::Descriptor {
        entries: descriptor
            .entries
            .into_iter()
            .map(|e| Entry::new(e.key, e.value))
            .collect(),
        limit_override,
        hits_addend: descriptor.hits_addend,
        negative: descriptor.is_negative_hits,
    })
}

/// The unit of a descriptor's `limit` override. Envoy's `RateLimitUnit` has no WEEK (only the
/// response's unit has), so 7 is as unknown here as it is to Envoy.
fn unit_from_proto(unit: i32) -> Option<Unit> {
    Some(match RateLimitUnit::try_from(unit).ok()? {
        RateLimitUnit::Second => Unit::Second,
        RateLimitUnit::Minute => Unit::Minute,
        RateLimitUnit::Hour => Unit::Hour,
        RateLimitUnit::Day => Unit::Day,
        RateLimitUnit::Month => Unit::Month,
        RateLimitUnit::Year => Unit::Year,
        RateLimitUnit::Unknown => return None,
    })
}

fn unit_to_proto(unit: Unit) -> ProtoUnit {
    match unit {
        Unit::Second => ProtoUnit::Second,
        Unit::Minute => ProtoUnit::Minute,
        Unit::Hour => ProtoUnit::Hour,
        Unit::Day => ProtoUnit::Day,
        Unit::Week => ProtoUnit::Week,
        Unit::Month => ProtoUnit::Month,
        Unit::Year => ProtoUnit::Year,
    }
}

fn code_to_proto(code: Code) -> ProtoCode {
    match code {
        Code::Ok => ProtoCode::Ok,
        Code::OverLimit => ProtoCode::OverLimit,
    }
}

/// Whole seconds, rounded up: Envoy's headers show seconds, and a client told "0" while still
/// limited would retry at once.
fn reset_duration(reset_ms: u64) -> prost_types::Duration {
    prost_types::Duration {
        seconds: i64::try_from(reset_ms.div_ceil(1000)).unwrap_or(i64::MAX),
        nanos: 0,
    }
}

/// Domain decision -> proto response; `legacy` headers take the names in `names`.
pub fn to_proto(decision: Decision, names: &LegacyNames) -> RateLimitResponse {
    let response_headers_to_add = headers::response_headers(&decision, names)
        .into_iter()
        .map(|(key, value)| HeaderValue {
            key,
            value,
            raw_value: Vec::new(),
        })
        .collect();
    let statuses = decision
        .verdicts
        .into_iter()
        .map(|v| DescriptorStatus {
            code: code_to_proto(v.code) as i32,
            duration_until_reset: v.limit.as_ref().map(|_| reset_duration(v.reset_ms)),
            current_limit: v.limit.map(|l| RateLimit {
                name: l.name.unwrap_or_default(),
                requests_per_unit: l.requests_per_unit,
                unit: unit_to_proto(l.unit) as i32,
            }),
            limit_remaining: v.remaining,
            quota: None,
        })
        .collect();
    RateLimitResponse {
        overall_code: code_to_proto(decision.overall) as i32,
        statuses,
        response_headers_to_add,
        dynamic_metadata: decision.lease.map(lease_metadata),
        ..Default::default()
    }
}

/// The dynamic metadata of a request that holds leases: `{sluice_lease: "<token>"}`. Envoy puts
/// it under `envoy.filters.http.ratelimit`, where the refund's `metadata` action reads it when
/// the stream is done (a request refused, or never answered, has none, so it sends no refund).
/// A string: Envoy's `metadata` action takes string values only.
fn lease_metadata(token: u64) -> prost_types::Struct {
    let value = prost_types::Value {
        kind: Some(prost_types::value::Kind::StringValue(token.to_string())),
    };
    prost_types::Struct {
        fields: [(decision::LEASE_KEY.to_owned(), value)].into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_map_to_the_codes_envoy_acts_on() {
        let timeout = to_status(DecisionError::Backend(LimiterError::Timeout(20)));
        assert_eq!(timeout.code(), tonic::Code::Unavailable);
        assert_eq!(
            timeout.message(),
            "rate-limit backend timed out after 20 ms"
        );
        let overloaded = to_status(DecisionError::Backend(LimiterError::Overloaded));
        assert_eq!(overloaded.code(), tonic::Code::Unavailable);
        let invalid = to_status(DecisionError::Invalid(InvalidRequest {
            field: "domain".into(),
            reason: "must not be empty".into(),
        }));
        assert_eq!(invalid.code(), tonic::Code::InvalidArgument);
        assert_eq!(invalid.message(), "domain: must not be empty");
    }

    #[test]
    fn reset_rounds_up_to_whole_seconds() {
        assert_eq!(reset_duration(1).seconds, 1);
        assert_eq!(reset_duration(1000).seconds, 1);
        assert_eq!(reset_duration(1001).seconds, 2);
        assert_eq!(reset_duration(0).seconds, 0);
    }

    #[test]
    fn every_proto_unit_maps_back_and_forth() {
        for (raw, unit) in [
            (1, Unit::Second),
            (2, Unit::Minute),
            (3, Unit::Hour),
            (4, Unit::Day),
            (5, Unit::Month),
            (6, Unit::Year),
        ] {
            assert_eq!(unit_from_proto(raw), Some(unit));
            assert_eq!(unit_to_proto(unit) as i32, raw);
        }
        assert_eq!(unit_from_proto(0), None);
        assert_eq!(unit_from_proto(99), None);
    }

    /// Envoy's wire: `envoy.type.v3.RateLimitUnit` (the override's unit) stops at YEAR = 6;
    /// WEEK = 7 exists only in the response's unit. A weekly limit from the config is reported
    /// as WEEK; an override cannot be in weeks.
    #[test]
    fn week_is_a_response_unit_only_as_in_envoy() {
        assert_eq!(RateLimitUnit::try_from(7).ok(), None);
        assert_eq!(RateLimitUnit::from_str_name("WEEK"), None);
        assert_eq!(RateLimitUnit::Year as i32, 6);
        assert_eq!(unit_from_proto(7), None);
        assert_eq!(unit_to_proto(Unit::Week), ProtoUnit::Week);
        assert_eq!(ProtoUnit::Week as i32, 7);
        assert_eq!(ProtoUnit::from_str_name("WEEK"), Some(ProtoUnit::Week));
    }

    /// A request holding leases carries its token as `sluice_lease`, a string (Envoy's
    /// `metadata` action reads strings only); one holding none carries no metadata.
    #[test]
    fn a_leased_decision_carries_its_token_as_dynamic_metadata() {
        let decision = |lease| Decision {
            overall: Code::Ok,
            verdicts: Vec::new(),
            hits: 1,
            known_domain: true,
            backend_failed: None,
            answered_by: crate::limiter::AnsweredBy::Backend,
            lease,
        };
        let names = LegacyNames::default();
        let response = to_proto(decision(Some(42)), &names);
        let metadata = response.dynamic_metadata.expect("metadata");
        assert_eq!(
            metadata.fields[decision::LEASE_KEY].kind,
            Some(prost_types::value::Kind::StringValue("42".into()))
        );
        assert_eq!(to_proto(decision(None), &names).dynamic_metadata, None);
    }

    #[test]
    fn unknown_override_unit_names_the_field() {
        let request = RateLimitRequest {
            domain: "d".into(),
            descriptors: vec![
                RateLimitDescriptor::default(),
                RateLimitDescriptor {
                    limit: Some(
                        crate::proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride {
                            requests_per_unit: 1,
                            unit: 0,
                        },
                    ),
                    ..Default::default()
                },
            ],
            hits_addend: 0,
        };
        let err = to_domain(request).unwrap_err();
        assert_eq!(err.field, "descriptors[1].limit.unit");
    }
}
