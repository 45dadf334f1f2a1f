//! One Rate Limit Quota Service stream as the gRPC face serves it: Envoy's usage reports in,
//! assignments out, with the proto <-> domain mapping, the report's checks, and the record of
//! every report on the metrics.
//!
//! Why apart from the tonic adapter (`crate::grpc::quota`): the adapter owns the stream (its
//! task, its end at shutdown); what a report means and what it is answered lives here and in
//! [`crate::quota`], which know no tonic, and is tested without a network. Errors become
//! statuses through the RLS path's one map ([`crate::rls::to_status`]).

use std::sync::Arc;

use prost_types::Duration as ProtoDuration;
use tonic::Status;

use crate::decision::{DecisionError, Engine, InvalidRequest};
use crate::metrics::{record_quota_invalid, record_quota_report};
use crate::proto::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use crate::proto::envoy::r#type::v3::{RateLimitStrategy, TokenBucket as ProtoTokenBucket};
use crate::proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use crate::proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::{
    AbandonAction, BucketAction as Action, QuotaAssignmentAction,
};
use crate::proto::envoy::service::rate_limit_quota::v3::{
    BucketId as ProtoBucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use crate::quota::{self, ASSIGNMENT_TTL_S, Allotment, Assignment, Report, Stream, Usage};

/// What every stream answers its reports with: the engine (its config, reloads included, its
/// limiter, its input limits and failure policy).
pub struct QuotaHandler {
    engine: Arc<Engine>,
}

impl QuotaHandler {
    pub fn new(engine: Arc<Engine>) -> Self {
        QuotaHandler { engine }
    }

    /// A new stream's state, bounded by `--rlqs-max-buckets`.
    pub fn stream(&self) -> Stream {
        Stream::new(self.engine.options().limits.max_quota_buckets)
    }

    /// Answers one usage report of `stream`: the assignments to send (`None` when there is
    /// nothing to send), or the status that ends the stream (INVALID_ARGUMENT naming the field;
    /// nothing was reserved).
    pub async fn report(
        &self,
        stream: &mut Stream,
        message: RateLimitQuotaUsageReports,
    ) -> Result<Option<RateLimitQuotaResponse>, Status> {
        let report = to_domain(message)
            .and_then(|report| {
                let limits = &self.engine.options().limits;
                quota::validate(&report, stream.domain(), limits).map(|()| report)
            })
            .map_err(|invalid| {
                record_quota_invalid();
                crate::rls::to_status(DecisionError::Invalid(invalid))
            })?;
        if stream.domain().is_none() {
            stream.set_domain(report.domain);
        }
        let allotments = quota::allot(&self.engine, stream, &report.usages).await;
        record_quota_report(
            &self.engine.config(),
            stream.domain().unwrap_or_default(),
            &report.usages,
            &allotments,
        );
        Ok(to_proto(allotments))
    }
}

fn invalid(field: String, reason: &'static str) -> InvalidRequest {
    InvalidRequest {
        field,
        reason: reason.into(),
    }
}

/// Proto report -> domain report, naming the first field that cannot be mapped. Envoy sends
/// `time_elapsed` in whole seconds (0 in a bucket's first report); a fraction is dropped.
pub fn to_domain(message: RateLimitQuotaUsageReports) -> Result<Report, InvalidRequest> {
    let usages = message
        .bucket_quota_usages
        .into_iter()
        .enumerate()
        .map(|(i, usage)| {
            let field = |name: &str| format!("bucket_quota_usages[{i}].{name}");
            let bucket = usage
                .bucket_id
                .ok_or_else(|| invalid(field("bucket_id"), "required"))?
                .bucket;
            let elapsed = usage
                .time_elapsed
                .ok_or_else(|| invalid(field("time_elapsed"), "required"))?;
            let elapsed_s = u64::try_from(elapsed.seconds)
                .ok()
                .filter(|_| elapsed.nanos >= 0)
                .ok_or_else(|| invalid(field("time_elapsed"), "must not be negative"))?;
            Ok(Usage {
                bucket,
                allowed: usage.num_requests_allowed,
                denied: usage.num_requests_denied,
                elapsed_s,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Report {
        domain: message.domain,
        usages,
    })
}

/// The assignments of a report's answers, in report order, each living [`ASSIGNMENT_TTL_S`]
/// (whole seconds: Envoy reads no nanos); `None` when no bucket gets one.
///
/// A token bucket goes right after a `DENY_ALL` for the same bucket, in the same response:
/// Envoy applies a response's actions in order and shows its workers only the result, and it
/// starts a token bucket that replaces another at the old one's fill ratio (an exhausted bucket's
/// successor starts empty), but one that replaces a blanket rule full. So every allotment is
/// spendable whole, whatever the previous one left.
pub fn to_proto(allotments: Vec<Allotment>) -> Option<RateLimitQuotaResponse> {
    let mut bucket_action = Vec::with_capacity(allotments.len());
    for allotment in allotments {
        let Some(assignment) = allotment.assignment else {
            continue;
        };
        let mut push = |action: Action| {
            bucket_action.push(BucketAction {
                bucket_id: Some(ProtoBucketId {
                    bucket: allotment.bucket.clone(),
                }),
                bucket_action: Some(action),
            });
        };
        match assignment {
            Assignment::Abandon => push(Action::AbandonAction(AbandonAction {})),
            Assignment::AllowAll => {
                push(assign(Strategy::BlanketRule(BlanketRule::AllowAll as i32)))
            }
            Assignment::DenyAll => push(assign(Strategy::BlanketRule(BlanketRule::DenyAll as i32))),
            Assignment::Tokens(tokens) => {
                push(assign(Strategy::BlanketRule(BlanketRule::DenyAll as i32)));
                push(assign(Strategy::TokenBucket(ProtoTokenBucket {
                    max_tokens: tokens.max_tokens,
                    tokens_per_fill: Some(tokens.tokens_per_fill),
                    fill_interval: Some(seconds(tokens.fill_interval_s)),
                    name: String::new(),
                })));
            }
        }
    }
    (!bucket_action.is_empty()).then_some(RateLimitQuotaResponse { bucket_action })
}

fn assign(strategy: Strategy) -> Action {
    Action::QuotaAssignmentAction(QuotaAssignmentAction {
        assignment_time_to_live: Some(seconds(ASSIGNMENT_TTL_S)),
        rate_limit_strategy: Some(RateLimitStrategy {
            strategy: Some(strategy),
        }),
    })
}

fn seconds(s: u64) -> ProtoDuration {
    ProtoDuration {
        seconds: i64::try_from(s).unwrap_or(i64::MAX),
        nanos: 0,
    }
}

#[cfg(test)]
mod tests;
