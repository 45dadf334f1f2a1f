//! The tonic adapter for `envoy.service.ratelimit.v3.RateLimitService`: the gRPC face.
//!
//! Why so thin: mapping, deciding and recording a call live in [`crate::rls`], shared with the
//! HTTP `/json` face, and everything that decides lives in [`crate::decision`]; keeping tonic
//! out of them lets the same engine serve both faces and be tested without a network.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use crate::otel::Face;
use crate::proto::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use crate::proto::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use crate::rls::Handler;

pub use crate::proto::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;

/// Fully qualified gRPC service name, as health checks and reflection name it.
pub const SERVICE_NAME: &str = "envoy.service.ratelimit.v3.RateLimitService";

pub struct RateLimiter {
    handler: Arc<Handler>,
}

impl RateLimiter {
    pub fn new(handler: Arc<Handler>) -> Self {
        RateLimiter { handler }
    }
}

#[tonic::async_trait]
impl RateLimitService for RateLimiter {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        // The metadata carries the caller's `traceparent`; read only when tracing is on.
        let (metadata, _, request) = request.into_parts();
        self.handler
            .should_rate_limit(Face::Grpc, metadata.as_ref(), request)
            .await
            .map(Response::new)
    }
}
