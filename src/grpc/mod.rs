//! The gRPC face: what the gRPC port serves, on one router and one TLS: Envoy's
//! `RateLimitService` ([`service`], a tonic adapter over [`crate::rls`]), its
//! `RateLimitQuotaService` ([`quota`], a stream task over [`crate::rlqs`]), gRPC health and
//! reflection (v1 and v1alpha). [`codec`] decodes every message of sluice's own services (a
//! message that does not decode is `INVALID_ARGUMENT`).
//!
//! Why the services are assembled here and served by `crate::server`: the server owns sockets,
//! TLS, limits and shutdown, and needs to know nothing of what a port answers; another gRPC
//! service on the same port is one more `add_service` in [`routes`] (and its name in
//! [`READINESS_SERVICES`] when its health follows readiness).

pub mod codec;
pub mod quota;
pub mod service;

use std::sync::Arc;

use tonic::service::Routes;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::proto::FILE_DESCRIPTOR_SET;
use crate::readiness::Readiness;
use crate::rlqs::QuotaHandler;
use crate::rls::Handler;

pub use quota::{QUOTA_SERVICE_NAME, QuotaService, RateLimitQuotaServiceServer};
pub use service::{RateLimitServiceServer, RateLimiter, SERVICE_NAME};

/// gRPC health service name for Kubernetes liveness probes: SERVING while the process runs,
/// whatever the backend does. [`READINESS_SERVICES`] report readiness.
pub const LIVENESS_SERVICE: &str = "sluice.liveness";

/// The health service names that report readiness: the server as a whole (`""`), the
/// rate-limit service and the quota service.
pub const READINESS_SERVICES: [&str; 3] = ["", SERVICE_NAME, QUOTA_SERVICE_NAME];

/// The health service name envoyproxy/ratelimit reports its health under: it answers as that
/// service's `/healthcheck` does ([`Readiness::healthcheck`]), not as readiness.
pub const RATELIMIT_HEALTH_SERVICE: &str = "ratelimit";

/// The gRPC port's services, and the reporter of their health.
pub struct Face {
    pub routes: Routes,
    pub health: Health,
}

/// What the quota service's streams need from the server: their handler, the token that ends
/// them when the server stops serving, and the tracker the server waits on.
pub struct QuotaStreams {
    pub handler: Arc<QuotaHandler>,
    pub stop: CancellationToken,
    pub tasks: TaskTracker,
}

/// Health, reflection, the rate-limit and the quota services on one router. A message over
/// `max_message_bytes` is refused by the transport before it is decoded (so before anything is
/// allocated for its fields); the connection and the server carry on.
pub fn routes(
    handler: Arc<Handler>,
    quota: QuotaStreams,
    max_message_bytes: usize,
) -> Result<Face, tonic_reflection::server::Error> {
    let (reporter, health_service) = tonic_health::server::health_reporter();
    let reflection_v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()?;
    let rls = RateLimitServiceServer::new(RateLimiter::new(handler))
        .max_decoding_message_size(max_message_bytes);
    let rlqs =
        RateLimitQuotaServiceServer::new(QuotaService::new(quota.handler, quota.stop, quota.tasks))
            .max_decoding_message_size(max_message_bytes);
    let routes = Routes::new(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(rls)
        .add_service(rlqs);
    Ok(Face {
        routes,
        health: Health { reporter },
    })
}

/// What gRPC health answers, per service name.
#[derive(Clone)]
pub struct Health {
    reporter: HealthReporter,
}

impl Health {
    /// Liveness answers "is the process able to serve at all": a Redis outage must make the pod
    /// unready, never restart it, so it is SERVING for the life of the process.
    pub async fn set_live(&self) {
        self.reporter
            .set_service_status(LIVENESS_SERVICE, ServingStatus::Serving)
            .await;
    }

    /// Reports `readiness`: readiness on every name of [`READINESS_SERVICES`],
    /// envoyproxy/ratelimit's health on [`RATELIMIT_HEALTH_SERVICE`].
    pub async fn publish(&self, readiness: &Readiness) {
        for name in READINESS_SERVICES {
            self.reporter
                .set_service_status(name, serving(readiness.is_ready()))
                .await;
        }
        let healthy = readiness.healthcheck().is_ok();
        self.reporter
            .set_service_status(RATELIMIT_HEALTH_SERVICE, serving(healthy))
            .await;
    }
}

fn serving(up: bool) -> ServingStatus {
    if up {
        ServingStatus::Serving
    } else {
        ServingStatus::NotServing
    }
}
