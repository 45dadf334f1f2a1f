//! gRPC clients of a sluice under test, and the requests they send: RLS calls, and Rate Limit
//! Quota Service streams ([`QuotaStream`]).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use sluice::proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use sluice::proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use sluice::proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use sluice::proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use sluice::proto::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use sluice::proto::envoy::service::ratelimit::v3::RateLimitRequest;
use tonic::transport::Channel;

/// A channel to the gRPC server at `addr`, retried for up to 10 s while it starts.
pub async fn grpc_channel(addr: SocketAddr) -> Channel {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match Channel::from_shared(format!("http://{addr}"))
            .expect("uri")
            .connect()
            .await
        {
            Ok(channel) => return channel,
            Err(err) if Instant::now() > deadline => panic!("cannot connect to sluice: {err}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// A descriptor from `key=value` pairs.
pub fn descriptor(pairs: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: pairs
            .iter()
            .map(|(k, v)| Entry {
                key: (*k).into(),
                value: (*v).into(),
            })
            .collect(),
        ..Default::default()
    }
}

pub fn request(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors,
        hits_addend: 0,
    }
}

/// A Rate Limit Quota Service stream of a test: reports sent one at a time, each answer read
/// within a bound.
pub struct QuotaStream {
    reports: tokio::sync::mpsc::Sender<RateLimitQuotaUsageReports>,
    answers: tonic::Streaming<RateLimitQuotaResponse>,
}

/// How long a test waits for an answer (or the end) of a quota stream.
pub const QUOTA_ANSWER_WAIT: Duration = Duration::from_secs(10);

impl QuotaStream {
    /// Opens a stream on `channel`.
    pub async fn open(channel: Channel) -> QuotaStream {
        let (reports, queued) = tokio::sync::mpsc::channel(8);
        let answers = RateLimitQuotaServiceClient::new(channel)
            .stream_rate_limit_quotas(tokio_stream::wrappers::ReceiverStream::new(queued))
            .await
            .expect("open a quota stream")
            .into_inner();
        QuotaStream { reports, answers }
    }

    /// Sends one report of `domain` with `lines`.
    pub async fn send(&self, domain: &str, lines: Vec<BucketQuotaUsage>) {
        self.reports
            .send(RateLimitQuotaUsageReports {
                domain: domain.into(),
                bucket_quota_usages: lines,
            })
            .await
            .expect("the stream takes a report");
    }

    /// The next message: an answer, the status that ended the stream, or `None` at its end.
    pub async fn next(&mut self) -> Option<Result<RateLimitQuotaResponse, tonic::Status>> {
        match tokio::time::timeout(QUOTA_ANSWER_WAIT, self.answers.message()).await {
            Ok(Ok(Some(answer))) => Some(Ok(answer)),
            Ok(Ok(None)) => None,
            Ok(Err(status)) => Some(Err(status)),
            Err(_) => panic!("no answer nor end within {QUOTA_ANSWER_WAIT:?}"),
        }
    }

    /// [`QuotaStream::send`], then the answer to it.
    pub async fn report(
        &mut self,
        domain: &str,
        lines: Vec<BucketQuotaUsage>,
    ) -> Result<RateLimitQuotaResponse, tonic::Status> {
        self.send(domain, lines).await;
        self.next()
            .await
            .expect("an answer, not the end of the stream")
    }
}

/// One bucket's line of a usage report: its entries, the requests Envoy allowed and denied, the
/// whole seconds since its last report.
pub fn quota_line(
    entries: &[(&str, &str)],
    allowed: u64,
    denied: u64,
    elapsed_s: i64,
) -> BucketQuotaUsage {
    BucketQuotaUsage {
        bucket_id: Some(BucketId {
            bucket: entries
                .iter()
                .map(|&(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
        }),
        time_elapsed: Some(prost_types::Duration {
            seconds: elapsed_s,
            nanos: 0,
        }),
        num_requests_allowed: allowed,
        num_requests_denied: denied,
        last_report: None,
    }
}

/// What an answer says, action by action: `deny`, `allow`, `abandon` or `tokens:MAX`, each with
/// its bucket's entries (`client=a`).
pub fn quota_actions(answer: &RateLimitQuotaResponse) -> Vec<String> {
    use sluice::proto::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
    use sluice::proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::BucketAction as Action;
    answer
        .bucket_action
        .iter()
        .map(|action| {
            let bucket = action
                .bucket_id
                .as_ref()
                .map(|id| {
                    id.bucket
                        .iter()
                        .map(|(k, v)| format!("{k}={v}"))
                        .collect::<Vec<_>>()
                        .join(",")
                })
                .unwrap_or_default();
            let what = match &action.bucket_action {
                Some(Action::AbandonAction(_)) => "abandon".to_owned(),
                Some(Action::QuotaAssignmentAction(q)) => {
                    match q
                        .rate_limit_strategy
                        .as_ref()
                        .and_then(|s| s.strategy.as_ref())
                    {
                        Some(Strategy::BlanketRule(r)) if *r == BlanketRule::DenyAll as i32 => {
                            "deny".to_owned()
                        }
                        Some(Strategy::BlanketRule(_)) => "allow".to_owned(),
                        Some(Strategy::TokenBucket(t)) => format!("tokens:{}", t.max_tokens),
                        other => format!("{other:?}"),
                    }
                }
                None => "none".to_owned(),
            };
            format!("{bucket} {what}")
        })
        .collect()
}
