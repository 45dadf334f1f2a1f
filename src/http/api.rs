//! The HTTP/JSON face of the rate-limit service on the admin port, as envoyproxy/ratelimit's:
//! `POST /json` takes a `RateLimitRequest` in protobuf's JSON mapping and answers the
//! `RateLimitResponse` with status 200 (OK), 429 (OVER_LIMIT), 400 (bad request) or 503
//! (backend unavailable); `GET /rlconfig` lists the loaded rules as text.
//!
//! Why JSON -> proto -> [`crate::rls`]: the gRPC face goes through the same proto types and the
//! same call ([`Handler::should_rate_limit`]: proto <-> domain mapping, validation, the engine, the
//! observer and tracer, the one error -> status map), so a request means the same thing on both
//! faces and shows on the same metrics and traces. This file only speaks JSON: both lowerCamelCase and the proto's
//! snake_case field names are accepted, and 64-bit numbers as JSON numbers or strings, as
//! protobuf's JSON mapping allows; the HTTP status follows the gRPC code.

use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::{Deserialize, Deserializer};
use serde_json::{Value, json};

use crate::otel::Face;
use crate::proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use crate::proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use crate::proto::envoy::service::ratelimit::v3::rate_limit_response::Code;
use crate::proto::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use crate::proto::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use crate::proto::envoy::r#type::v3::RateLimitUnit;
use crate::rls::Handler;

/// Bodies above this are refused before parsing; a RateLimitRequest is tiny.
const MAX_BODY_BYTES: usize = 1 << 20;

/// `/json` answers through `handler`, as gRPC does; `/rlconfig` lists its engine's rules.
pub fn router(handler: Arc<Handler>) -> Router {
    Router::new()
        .route("/json", post(json_decision))
        .route("/rlconfig", get(rlconfig))
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(handler)
}

async fn rlconfig(State(handler): State<Arc<Handler>>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        handler.engine().config().describe(),
    )
}

async fn json_decision(
    State(handler): State<Arc<Handler>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let started = Instant::now();
    let request = parse(&body).and_then(JsonRequest::into_proto);
    let request = match request {
        Ok(request) => request,
        Err(message) => {
            handler.observer().record_unmappable(started.elapsed());
            return error(StatusCode::BAD_REQUEST, &message);
        }
    };
    match handler
        .should_rate_limit(Face::Json, &headers, request)
        .await
    {
        Ok(response) => {
            let status = if response.overall_code == Code::OverLimit as i32 {
                StatusCode::TOO_MANY_REQUESTS
            } else {
                StatusCode::OK
            };
            (status, axum::Json(response_json(&response))).into_response()
        }
        Err(status) => error(http_status(status.code()), status.message()),
    }
}

/// The body as a request, or what is wrong with it, naming the field (`descriptors[0].entries[1]
/// .value: invalid unicode code point at line 1 column 80`).
fn parse(body: &[u8]) -> Result<JsonRequest, String> {
    let mut json = serde_json::Deserializer::from_slice(body);
    let request: JsonRequest = serde_path_to_error::deserialize(&mut json).map_err(|err| {
        let path = err.path().to_string();
        match path.as_str() {
            "." => format!("invalid JSON body: {}", err.inner()),
            _ => format!("invalid JSON body: {path}: {}", err.inner()),
        }
    })?;
    json.end()
        .map_err(|err| format!("invalid JSON body: {err}"))?;
    Ok(request)
}

/// The HTTP status of a gRPC error code, as envoyproxy/ratelimit's `/json` answers: 400 for a
/// bad request, 503 when the backend could not decide.
fn http_status(code: tonic::Code) -> StatusCode {
    match code {
        tonic::Code::InvalidArgument => StatusCode::BAD_REQUEST,
        _ => StatusCode::SERVICE_UNAVAILABLE,
    }
}

fn error(status: StatusCode, message: &str) -> Response {
    (status, axum::Json(json!({ "error": message }))).into_response()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonRequest {
    #[serde(default)]
    domain: String,
    #[serde(default)]
    descriptors: Vec<JsonDescriptor>,
    #[serde(
        default,
        alias = "hits_addend",
        rename = "hitsAddend",
        deserialize_with = "number"
    )]
    hits_addend: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonDescriptor {
    #[serde(default)]
    entries: Vec<JsonEntry>,
    #[serde(default)]
    limit: Option<JsonOverride>,
    #[serde(
        default,
        alias = "hits_addend",
        rename = "hitsAddend",
        deserialize_with = "number"
    )]
    hits_addend: Option<u64>,
    #[serde(default, alias = "is_negative_hits", rename = "isNegativeHits")]
    is_negative_hits: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonEntry {
    #[serde(default)]
    key: String,
    #[serde(default)]
    value: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonOverride {
    #[serde(
        default,
        alias = "requests_per_unit",
        rename = "requestsPerUnit",
        deserialize_with = "number"
    )]
    requests_per_unit: Option<u64>,
    #[serde(default)]
    unit: Option<Value>,
}

impl From<JsonEntry> for Entry {
    fn from(entry: JsonEntry) -> Self {
        Entry {
            key: entry.key,
            value: entry.value,
        }
    }
}

/// A protobuf JSON integer: a number or a decimal string.
fn number<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<u64>, D::Error> {
    match Option::<Value>::deserialize(deserializer)? {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => n
            .as_u64()
            .map(Some)
            .ok_or_else(|| serde::de::Error::custom(format!("{n} is not a non-negative integer"))),
        Some(Value::String(s)) => s
            .parse()
            .map(Some)
            .map_err(|_| serde::de::Error::custom(format!("`{s}` is not a non-negative integer"))),
        Some(other) => Err(serde::de::Error::custom(format!(
            "{other} is not an integer"
        ))),
    }
}

impl JsonRequest {
    fn into_proto(self) -> Result<RateLimitRequest, String> {
        let hits_addend = match self.hits_addend {
            None => 0,
            Some(h) => u32::try_from(h).map_err(|_| "hitsAddend: exceeds 2^32-1".to_owned())?,
        };
        let descriptors = self
            .descriptors
            .into_iter()
            .enumerate()
            .map(|(i, d)| d.into_proto(i))
            .collect::<Result<_, _>>()?;
        Ok(RateLimitRequest {
            domain: self.domain,
            descriptors,
            hits_addend,
        })
    }
}

impl JsonDescriptor {
    fn into_proto(self, index: usize) -> Result<RateLimitDescriptor, String> {
        let limit = match self.limit {
            None => None,
            Some(o) => {
                let requests_per_unit =
                    u32::try_from(o.requests_per_unit.unwrap_or(0)).map_err(|_| {
                        format!("descriptors[{index}].limit.requestsPerUnit: exceeds 2^32-1")
                    })?;
                let unit = match &o.unit {
                    None => 0,
                    Some(Value::String(name)) => RateLimitUnit::from_str_name(name)
                        .map(|u| u as i32)
                        .ok_or_else(|| {
                            format!("descriptors[{index}].limit.unit: unknown unit `{name}`")
                        })?,
                    Some(Value::Number(n)) => n
                        .as_i64()
                        .and_then(|n| i32::try_from(n).ok())
                        .ok_or_else(|| {
                            format!("descriptors[{index}].limit.unit: {n} is not a unit")
                        })?,
                    Some(other) => {
                        return Err(format!(
                            "descriptors[{index}].limit.unit: {other} is not a unit"
                        ));
                    }
                };
                Some(RateLimitOverride {
                    requests_per_unit,
                    unit,
                })
            }
        };
        Ok(RateLimitDescriptor {
            entries: self.entries.into_iter().map(Entry::from).collect(),
            limit,
            hits_addend: self.hits_addend,
            is_negative_hits: self.is_negative_hits,
        })
    }
}

fn code_name(code: i32) -> &'static str {
    Code::try_from(code).map_or("UNKNOWN", |c| c.as_str_name())
}

/// The response in protobuf's JSON mapping (lowerCamelCase, enums by name, zero values omitted,
/// durations as `"<seconds>s"`).
fn response_json(response: &RateLimitResponse) -> Value {
    let statuses: Vec<Value> = response
        .statuses
        .iter()
        .map(|s| {
            let mut status = serde_json::Map::new();
            status.insert("code".into(), json!(code_name(s.code)));
            if let Some(limit) = &s.current_limit {
                let mut l = serde_json::Map::new();
                if !limit.name.is_empty() {
                    l.insert("name".into(), json!(limit.name));
                }
                l.insert("requestsPerUnit".into(), json!(limit.requests_per_unit));
                l.insert(
                    "unit".into(),
                    json!(Unit::try_from(limit.unit).map_or("UNKNOWN", |u| u.as_str_name())),
                );
                status.insert("currentLimit".into(), Value::Object(l));
            }
            if s.limit_remaining != 0 {
                status.insert("limitRemaining".into(), json!(s.limit_remaining));
            }
            if let Some(d) = &s.duration_until_reset {
                status.insert(
                    "durationUntilReset".into(),
                    json!(format!("{}s", d.seconds)),
                );
            }
            Value::Object(status)
        })
        .collect();
    let mut out = serde_json::Map::new();
    out.insert(
        "overallCode".into(),
        json!(code_name(response.overall_code)),
    );
    out.insert("statuses".into(), Value::Array(statuses));
    if !response.response_headers_to_add.is_empty() {
        let headers: Vec<Value> = response
            .response_headers_to_add
            .iter()
            .map(|h| json!({"key": h.key, "value": h.value}))
            .collect();
        out.insert("responseHeadersToAdd".into(), Value::Array(headers));
    }
    if let Some(metadata) = &response.dynamic_metadata {
        out.insert(
            "dynamicMetadata".into(),
            Value::Object(crate::metadata::struct_to_json(metadata)),
        );
    }
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lease token of an admitted `in_flight` request, in protobuf's JSON mapping.
    #[test]
    fn dynamic_metadata_is_shown() {
        let value = prost_types::Value {
            kind: Some(prost_types::value::Kind::StringValue("42".into())),
        };
        let response = RateLimitResponse {
            overall_code: Code::Ok as i32,
            dynamic_metadata: Some(prost_types::Struct {
                fields: [("sluice_lease".to_owned(), value)].into(),
            }),
            ..Default::default()
        };
        let json = response_json(&response);
        assert_eq!(json["dynamicMetadata"], json!({"sluice_lease": "42"}));
        assert!(
            response_json(&RateLimitResponse::default())
                .get("dynamicMetadata")
                .is_none()
        );
    }

    #[test]
    fn accepts_both_field_spellings_and_string_numbers() {
        let camel: JsonRequest = serde_json::from_str(
            r#"{"domain":"d","hitsAddend":2,"descriptors":[{"entries":[{"key":"k","value":"v"}],
                "hitsAddend":"5","isNegativeHits":true,"limit":{"requestsPerUnit":3,"unit":"HOUR"}}]}"#,
        )
        .unwrap();
        let snake: JsonRequest = serde_json::from_str(
            r#"{"domain":"d","hits_addend":2,"descriptors":[{"entries":[{"key":"k","value":"v"}],
                "hits_addend":5,"is_negative_hits":true,"limit":{"requests_per_unit":"3","unit":3}}]}"#,
        )
        .unwrap();
        let (a, b) = (camel.into_proto().unwrap(), snake.into_proto().unwrap());
        assert_eq!(a, b);
        assert_eq!(a.hits_addend, 2);
        assert_eq!(a.descriptors[0].hits_addend, Some(5));
        assert!(a.descriptors[0].is_negative_hits);
        let limit = a.descriptors[0].limit.unwrap();
        assert_eq!(
            (limit.requests_per_unit, limit.unit),
            (3, RateLimitUnit::Hour as i32)
        );
    }

    #[test]
    fn rlconfig_calls_only_leaves_without_a_limit_whitelists() {
        let yaml = "
domain: d
descriptors:
  - key: user
    value: healthcheck
  - key: tier
    value: premium
    descriptors:
      - key: user
        rate_limit: {unit: minute, requests_per_unit: 5}
";
        let config =
            crate::config::Config::from_yaml_str(std::path::Path::new("t.yaml"), yaml).unwrap();
        let text = config.describe();
        assert!(
            text.contains("d.user_healthcheck: no limit (whitelist)\n"),
            "{text}"
        );
        assert!(
            text.contains("d.tier_premium: no limit (nested descriptors only)\n"),
            "{text}"
        );
        assert!(
            text.contains("d.tier_premium.user: unit=MINUTE requests_per_unit=5\n"),
            "{text}"
        );
    }

    #[test]
    fn errors_keep_the_grpc_code_as_an_http_status() {
        assert_eq!(
            http_status(tonic::Code::InvalidArgument),
            StatusCode::BAD_REQUEST
        );
        assert_eq!(
            http_status(tonic::Code::Unavailable),
            StatusCode::SERVICE_UNAVAILABLE
        );
    }

    #[test]
    fn undecodable_strings_are_named() {
        let mut body =
            br#"{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"x"#.to_vec();
        body.extend_from_slice(&[0xff, 0xfe]);
        body.extend_from_slice(br#""}]}]}"#);
        let err = parse(&body).err().unwrap();
        assert!(
            err.starts_with("invalid JSON body: descriptors[0].entries[0].value: "),
            "{err}"
        );
        let surrogate = br#"{"domain":"\ud800"}"#;
        let err = parse(surrogate).err().unwrap();
        assert!(err.starts_with("invalid JSON body: domain: "), "{err}");
        let err = parse(br#"{"domain":"d"} trailing"#).err().unwrap();
        assert!(err.starts_with("invalid JSON body: trailing"), "{err}");
    }

    #[test]
    fn bad_fields_are_named() {
        let err = serde_json::from_str::<JsonRequest>(r#"{"domain":"d","bogus":1}"#)
            .err()
            .unwrap();
        assert!(err.to_string().contains("bogus"));
        let req: JsonRequest = serde_json::from_str(
            r#"{"domain":"d","descriptors":[{"entries":[]},{"limit":{"unit":"FORTNIGHT"}}]}"#,
        )
        .unwrap();
        assert_eq!(
            req.into_proto().unwrap_err(),
            "descriptors[1].limit.unit: unknown unit `FORTNIGHT`"
        );
        // An override's unit is Envoy's RateLimitUnit, which has no WEEK.
        let req: JsonRequest =
            serde_json::from_str(r#"{"domain":"d","descriptors":[{"limit":{"unit":"WEEK"}}]}"#)
                .unwrap();
        assert_eq!(
            req.into_proto().unwrap_err(),
            "descriptors[0].limit.unit: unknown unit `WEEK`"
        );
    }
}
