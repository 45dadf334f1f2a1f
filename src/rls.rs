//! The rate-limit call as both faces serve it: Envoy's `RateLimitRequest` in, a
//! `RateLimitResponse` or a status out, with the proto <-> domain mapping (descriptors, units,
//! codes, durations, response headers), the ONE map from errors to statuses, and the observer's
//! record of every call.
//!
//! Why one module: the gRPC service ([`crate::grpc::service`]) and envoyproxy/ratelimit's HTTP
//! face ([`crate::http::api`], which parses JSON into the same proto types) must mean the same thing
//! by a request, answer it the same way and show on the same metrics and traces. Both call
//! [`Handler::should_rate_limit`]; neither maps, decides or records on its own.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use opentelemetry::context::FutureExt as _;

use tonic::Status;

use crate::config::Unit;
use crate::decision::{self, Code, Decision, DecisionError, Engine, InvalidRequest, LimitOverride};
use crate::descriptor::Entry;
use crate::headers::{self, LegacyNames};
use crate::limiter::LimiterError;
use crate::metadata;
use crate::metrics::Observer;
use crate::otel::{Face, Tracer};
use crate::proto::envoy::config::core::v3::HeaderValue;
use crate::proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use crate::proto::envoy::service::ratelimit::v3::rate_limit_response::{
    Code as ProtoCode, DescriptorStatus, RateLimit, rate_limit::Unit as ProtoUnit,
};
use crate::proto::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use crate::proto::envoy::r#type::v3::RateLimitUnit;
use prost_types::value::Kind;

/// What both faces answer a call with: the engine, the metrics observer, the tracer (off by
/// default), the names of the `legacy` response headers and whether responses describe the
/// request in their dynamic metadata (off by default).
pub struct Handler {
    engine: Arc<Engine>,
    observer: Arc<Observer>,
    tracer: Tracer,
    legacy_names: LegacyNames,
    dynamic_metadata: bool,
}

impl Handler {
    /// Tracing off, the default `legacy` header names.
    pub fn new(engine: Arc<Engine>, observer: Arc<Observer>) -> Self {
        Handler {
            engine,
            observer,
            tracer: Tracer::off(),
            legacy_names: LegacyNames::default(),
            dynamic_metadata: false,
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

    /// Responses carry envoyproxy/ratelimit's dynamic metadata ([`request_metadata`]).
    pub fn with_dynamic_metadata(mut self, on: bool) -> Self {
        self.dynamic_metadata = on;
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
        let described = self.dynamic_metadata.then_some(&request);
        answer.map(|decision| to_proto(decision, &self.legacy_names, described))
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

/// [`unit_from_proto`] back (an override is never in weeks: no such unit there).
fn unit_to_override_proto(unit: Unit) -> RateLimitUnit {
    match unit {
        Unit::Second => RateLimitUnit::Second,
        Unit::Minute => RateLimitUnit::Minute,
        Unit::Hour => RateLimitUnit::Hour,
        Unit::Day => RateLimitUnit::Day,
        Unit::Week => RateLimitUnit::Unknown,
        Unit::Month => RateLimitUnit::Month,
        Unit::Year => RateLimitUnit::Year,
    }
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

/// Domain decision -> proto response; `legacy` headers take the names in `names`. With
/// `described`, the request it answers, the dynamic metadata describes it as
/// envoyproxy/ratelimit's `RESPONSE_DYNAMIC_METADATA` does ([`request_metadata`]).
pub fn to_proto(
    decision: Decision,
    names: &LegacyNames,
    described: Option<&decision::Request>,
) -> RateLimitResponse {
    let mut dynamic_metadata = described.map(|request| request_metadata(request, &decision));
    if let Some(token) = decision.lease {
        lease_metadata(dynamic_metadata.get_or_insert_default(), token);
    }
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
        dynamic_metadata,
        ..Default::default()
    }
}

/// The dynamic metadata of a request that holds leases: `sluice_lease: "<token>"`. Envoy puts
/// it under `envoy.filters.http.ratelimit`, where the refund's `metadata` action reads it when
/// the stream is done (a request refused, or never answered, has none, so it sends no refund).
/// A string: Envoy's `metadata` action takes string values only.
fn lease_metadata(metadata: &mut prost_types::Struct, token: u64) {
    metadata.fields.insert(
        decision::LEASE_KEY.to_owned(),
        string_value(token.to_string()),
    );
}

fn string_value(s: String) -> prost_types::Value {
    prost_types::Value {
        kind: Some(Kind::StringValue(s)),
    }
}

fn number_value(n: f64) -> prost_types::Value {
    prost_types::Value {
        kind: Some(Kind::NumberValue(n)),
    }
}

/// envoyproxy/ratelimit's dynamic metadata (`RESPONSE_DYNAMIC_METADATA`), field for field:
/// `domain`; `descriptors`, each with its `entries` as `key=value` strings, its `limit` override
/// in protobuf text (`requests_per_unit:10 unit:SECOND`) and its `hitsAddend` when set; the
/// request's `hitsAddend` when not 0; and `metadata`, the config `metadata` of every descriptor
/// that passed its own limit (an OK status from a configured limit, not an override),
/// merged in request order (the first value of a key wins), when there is any.
pub fn request_metadata(request: &decision::Request, decision: &Decision) -> prost_types::Struct {
    let descriptors = request
        .descriptors
        .iter()
        .map(|d| {
            let entries = d
                .entries
                .iter()
                .map(|e| string_value(format!("{}={}", e.key, e.value)))
                .collect();
            let mut fields = BTreeMap::from([(
                "entries".to_owned(),
                prost_types::Value {
                    kind: Some(Kind::ListValue(prost_types::ListValue { values: entries })),
                },
            )]);
            if let Some(o) = &d.limit_override {
                fields.insert("limit".into(), string_value(override_text(o)));
            }
            if let Some(hits) = d.hits_addend {
                // A double, as every number in a Struct; hits are bounded by --max-hits-addend.
                #[allow(clippy::cast_precision_loss)]
                fields.insert("hitsAddend".into(), number_value(hits as f64));
            }
            prost_types::Value {
                kind: Some(Kind::StructValue(prost_types::Struct { fields })),
            }
        })
        .collect();
    let mut fields = BTreeMap::from([
        ("domain".to_owned(), string_value(request.domain.clone())),
        (
            "descriptors".to_owned(),
            prost_types::Value {
                kind: Some(Kind::ListValue(prost_types::ListValue {
                    values: descriptors,
                })),
            },
        ),
    ]);
    if request.hits_addend != 0 {
        fields.insert(
            "hitsAddend".into(),
            number_value(f64::from(request.hits_addend)),
        );
    }
    let mut passed = prost_types::Struct::default();
    for (verdict, descriptor) in decision.verdicts.iter().zip(&request.descriptors) {
        if let Some(m) = &verdict.metadata
            && verdict.code == Code::Ok
            && descriptor.limit_override.is_none()
        {
            metadata::merge(&mut passed, &m.0);
        }
    }
    if !passed.fields.is_empty() {
        fields.insert(
            "metadata".into(),
            prost_types::Value {
                kind: Some(Kind::StructValue(passed)),
            },
        );
    }
    prost_types::Struct { fields }
}

/// A `limit` override as Go's protobuf text prints it (fields at their zero value omitted).
fn override_text(o: &LimitOverride) -> String {
    let unit = unit_to_override_proto(o.unit).as_str_name();
    if o.requests_per_unit == 0 {
        format!("unit:{unit}")
    } else {
        format!("requests_per_unit:{} unit:{unit}", o.requests_per_unit)
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
        let response = to_proto(decision(Some(42)), &names, None);
        let metadata = response.dynamic_metadata.expect("metadata");
        assert_eq!(
            metadata.fields[decision::LEASE_KEY].kind,
            Some(prost_types::value::Kind::StringValue("42".into()))
        );
        assert_eq!(
            to_proto(decision(None), &names, None).dynamic_metadata,
            None
        );
    }

    fn verdict(code: Code, metadata: Option<serde_json::Value>) -> crate::decision::Verdict {
        crate::decision::Verdict {
            code,
            outcome: crate::decision::Outcome::Admitted,
            limit: None,
            remaining: 0,
            reset_ms: 0,
            rule: None,
            window_count: 0,
            detailed_metric: false,
            key: None,
            stat: None,
            headers: crate::config::HeaderPolicy::default(),
            metadata: metadata.and_then(|m| match m {
                serde_json::Value::Object(map) => metadata::Metadata::from_json(map),
                _ => None,
            }),
        }
    }

    /// envoyproxy/ratelimit's `RESPONSE_DYNAMIC_METADATA`: the request, and the merged config
    /// metadata of the descriptors that passed (not over, not an override's); with a lease,
    /// sluice's token beside them.
    #[test]
    fn dynamic_metadata_describes_the_request_and_what_passed() {
        use serde_json::json;
        let mut request = decision::Request {
            domain: "quota-domain".into(),
            descriptors: vec![
                decision::Descriptor::new(vec![Entry::new("regular", "limit")]),
                decision::Descriptor::new(vec![Entry::new("quota", "limit")]),
                decision::Descriptor::new(vec![Entry::new("k", "v"), Entry::new("k2", "")]),
                decision::Descriptor::new(vec![Entry::new("other", "x")]),
            ],
            hits_addend: 3,
        };
        request.descriptors[1].hits_addend = Some(0);
        request.descriptors[2].limit_override = Some(LimitOverride {
            requests_per_unit: 10,
            unit: Unit::Second,
        });
        let decision = Decision {
            overall: Code::Ok,
            verdicts: vec![
                verdict(Code::Ok, Some(json!({"name": "service_1", "n": {"a": 1}}))),
                verdict(Code::OverLimit, Some(json!({"over": true}))),
                verdict(Code::Ok, Some(json!({"override": true}))),
                verdict(Code::Ok, Some(json!({"name": "service_2", "n": {"b": 2}}))),
            ],
            hits: 3,
            known_domain: true,
            backend_failed: None,
            answered_by: crate::limiter::AnsweredBy::Backend,
            lease: Some(7),
        };
        let response = to_proto(decision, &LegacyNames::default(), Some(&request));
        let shown = metadata::struct_to_json(&response.dynamic_metadata.expect("metadata"));
        assert_eq!(
            serde_json::Value::Object(shown),
            json!({
                "domain": "quota-domain",
                "hitsAddend": 3,
                "descriptors": [
                    {"entries": ["regular=limit"]},
                    {"entries": ["quota=limit"], "hitsAddend": 0},
                    {"entries": ["k=v", "k2="], "limit": "requests_per_unit:10 unit:SECOND"},
                    {"entries": ["other=x"]}
                ],
                "metadata": {"name": "service_1", "n": {"a": 1, "b": 2}},
                "sluice_lease": "7"
            })
        );
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
