//! The tonic adapter for `envoy.service.rate_limit_quota.v3.RateLimitQuotaService`: one task
//! per stream, reading Envoy's usage reports one after the other and sending the assignments
//! [`crate::rlqs`] answers them with.
//!
//! Why a task per stream and a small channel: a stream lives as long as its Envoy (reports
//! every 5 s), so its state ([`crate::quota::Stream`]) belongs to one task that owns it, with
//! no lock; the channel holds a few answers, and a report is read only once the previous
//! answer is queued, so a client that does not read its answers stops being read (bounded
//! memory). The stream ends when Envoy ends it, when a report is refused (its status ends the
//! stream), or when the server stops serving (it ends with OK and Envoy opens a new one to
//! another instance), so that shutdown never waits for a stream to end by itself.

use std::sync::Arc;

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::{Code, Request, Response, Status, Streaming};

use crate::metrics::{record_quota_invalid, record_quota_stream};
use crate::proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::RateLimitQuotaService;
use crate::proto::envoy::service::rate_limit_quota::v3::{
    RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use crate::rlqs::QuotaHandler;

pub use crate::proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::RateLimitQuotaServiceServer;

/// Fully qualified gRPC service name, as health checks and reflection name it.
pub const QUOTA_SERVICE_NAME: &str = "envoy.service.rate_limit_quota.v3.RateLimitQuotaService";

/// Answers queued per stream before its reports stop being read.
const QUEUED_ANSWERS: usize = 4;

pub struct QuotaService {
    handler: Arc<QuotaHandler>,
    /// Cancelled when the server stops serving: every stream ends.
    stop: CancellationToken,
    /// Where the streams' tasks run, so that the server waits for them.
    tasks: TaskTracker,
}

impl QuotaService {
    pub fn new(handler: Arc<QuotaHandler>, stop: CancellationToken, tasks: TaskTracker) -> Self {
        QuotaService {
            handler,
            stop,
            tasks,
        }
    }
}

#[tonic::async_trait]
impl RateLimitQuotaService for QuotaService {
    type StreamRateLimitQuotasStream = ReceiverStream<Result<RateLimitQuotaResponse, Status>>;

    async fn stream_rate_limit_quotas(
        &self,
        request: Request<Streaming<RateLimitQuotaUsageReports>>,
    ) -> Result<Response<Self::StreamRateLimitQuotasStream>, Status> {
        let reports = request.into_inner();
        let (answers, queued) = mpsc::channel(QUEUED_ANSWERS);
        self.tasks.spawn(serve_stream(
            self.handler.clone(),
            reports,
            answers,
            self.stop.clone(),
        ));
        Ok(Response::new(ReceiverStream::new(queued)))
    }
}

/// One stream: each report answered in turn, until the stream or the server ends.
async fn serve_stream(
    handler: Arc<QuotaHandler>,
    mut reports: Streaming<RateLimitQuotaUsageReports>,
    answers: mpsc::Sender<Result<RateLimitQuotaResponse, Status>>,
    stop: CancellationToken,
) {
    record_quota_stream(true);
    let mut stream = handler.stream();
    loop {
        let message = tokio::select! {
            () = stop.cancelled() => break,
            () = answers.closed() => break,
            message = reports.message() => message,
        };
        let answer = match message {
            Ok(Some(report)) => handler.report(&mut stream, report).await,
            // Envoy ended its side, or the connection broke: nobody to answer.
            Ok(None) => break,
            Err(status) if status.code() == Code::InvalidArgument => {
                // A report that does not decode (the strict codec's status).
                record_quota_invalid();
                Err(status)
            }
            Err(_) => break,
        };
        match answer {
            Ok(None) => {}
            Ok(Some(assignments)) => {
                if answers.send(Ok(assignments)).await.is_err() {
                    break;
                }
            }
            Err(status) => {
                let _ = answers.send(Err(status)).await;
                break;
            }
        }
    }
    record_quota_stream(false);
}
