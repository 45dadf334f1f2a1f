//! The HTTP face: what the admin port serves ([`admin`]: `/healthz`, `/readyz`,
//! `/healthcheck`, `/metrics`; [`api`]: envoyproxy/ratelimit's `POST /json` and
//! `GET /rlconfig`) and the `/metrics`-only port.
//!
//! Why routers only: the port itself (HTTP/1.1, timeouts, connection limits, shutdown) is
//! `crate::server`'s; a route, or a router for another port, is added here.

pub mod admin;
pub mod api;

use std::sync::Arc;

use axum::Router;
use metrics_exporter_prometheus::PrometheusHandle;

use crate::readiness::Readiness;
use crate::rls::Handler;

pub use admin::metrics_router;

/// The admin port: the probes and `/metrics`, and the HTTP face of the rate-limit service.
/// Both faces record every call on the handler's one observer (and tracer).
pub fn admin_router(
    readiness: Arc<Readiness>,
    metrics: Option<PrometheusHandle>,
    handler: Arc<Handler>,
) -> Router {
    admin::router(readiness, metrics, handler.observer().clone()).merge(api::router(handler))
}
