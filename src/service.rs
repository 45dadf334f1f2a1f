//! The tonic adapter for `envoy.service.ratelimit.v3.RateLimitService`: the gRPC face.
//!
//! Why so thin: mapping, deciding and recording a call live in [`crate::rls`], shared with the
//! HTTP `/json` face, and everything that decides lives in [`crate::decision`]; keeping tonic
//! out of them lets the same engine serve both faces and be tested without a network.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use crate::decision::Engine;
use crate::metrics::Observer;
use crate::proto::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use crate::proto::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use crate::rls;

pub use crate::proto::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;

/// Fully qualified gRPC service name, as health checks and reflection name it.
pub const SERVICE_NAME: &str = "envoy.service.ratelimit.v3.RateLimitService";

pub struct RateLimiter {
    engine: Arc<Engine>,
    observer: Arc<Observer>,
}

impl RateLimiter {
    pub fn new(engine: Arc<Engine>, observer: Arc<Observer>) -> Self {
        RateLimiter { engine, observer }
    }
}

#[tonic::async_trait]
impl RateLimitService for RateLimiter {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        rls::should_rate_limit(&self.engine, &self.observer, request.into_inner())
            .await
            .map(Response::new)
    }
}
