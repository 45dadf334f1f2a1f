//! The admin HTTP server: `/healthz` (the process answers), `/readyz` (config loaded, backend
//! reachable, not draining), `/healthcheck` (envoyproxy/ratelimit's probe path) and `/metrics`
//! (Prometheus text); [`metrics_router`] serves the metrics page alone on a port of its own,
//! with envoyproxy/ratelimit's stats under its names when they are on.
//!
//! Why `/healthcheck` ignores the backend: Envoy Gateway points its startup, readiness *and*
//! liveness probes at it, so a Redis outage that failed it would restart every rate-limit pod
//! (envoyproxy/ratelimit's `/healthcheck` ignores Redis too unless told otherwise). It answers
//! as that service does ([`Readiness::healthcheck`]): `OK` (200) until draining, and before the
//! first config (xDS) only when none is required (`--health-requires-config false`), 500 with
//! the reason otherwise; `/readyz` and gRPC health are the probes that follow the backend.
//!
//! Why separate from gRPC: Kubernetes probes and Prometheus scrapes speak HTTP/1.1, and an SRE
//! must be able to curl them; keeping them off the data-plane port keeps the RLS port minimal.
//!
//! The port itself (HTTP/1.1 with its timeouts and connection limits) is served by
//! `crate::server`; this module only says what each path answers.

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use metrics_exporter_prometheus::PrometheusHandle;

use crate::metrics::Observer;
use crate::readiness::Readiness;

#[derive(Clone)]
struct AdminState {
    readiness: Arc<Readiness>,
    metrics: Option<PrometheusHandle>,
    observer: Arc<Observer>,
    /// The page also carries envoyproxy/ratelimit's stats (the metrics port only).
    ratelimit_names: bool,
}

pub fn router(
    readiness: Arc<Readiness>,
    metrics: Option<PrometheusHandle>,
    observer: Arc<Observer>,
) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/healthcheck", get(healthcheck))
        .route("/metrics", get(render_metrics))
        .with_state(AdminState {
            readiness,
            metrics,
            observer,
            ratelimit_names: false,
        })
}

async fn readyz(State(state): State<AdminState>) -> impl IntoResponse {
    let r = &state.readiness;
    if r.draining() {
        (StatusCode::SERVICE_UNAVAILABLE, "draining\n".into())
    } else if let Some(why) = r.config_pending() {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("no config yet: {why}\n"),
        )
    } else if !r.backend_up() {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "backend unreachable\n".into(),
        )
    } else {
        (StatusCode::OK, "ready\n".into())
    }
}

/// Only the metrics page, on `path`, for a Prometheus port of its own (envoyproxy/ratelimit's
/// `PROMETHEUS_ADDR` and `PROMETHEUS_PATH`); with `ratelimit_names`, envoyproxy/ratelimit's
/// stats follow sluice's families on it (when the observer records them).
pub fn metrics_router(
    metrics: Option<PrometheusHandle>,
    observer: Arc<Observer>,
    path: &str,
    ratelimit_names: bool,
) -> Router {
    Router::new()
        .route(path, get(render_metrics))
        .with_state(AdminState {
            readiness: Arc::new(Readiness::new()),
            metrics,
            observer,
            ratelimit_names,
        })
}

/// envoyproxy/ratelimit's health ([`Readiness::healthcheck`]): `OK`, or 500 with the reason.
async fn healthcheck(State(state): State<AdminState>) -> impl IntoResponse {
    match state.readiness.healthcheck() {
        Ok(()) => (StatusCode::OK, "OK".to_owned()),
        Err(why) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{why}\n")),
    }
}

async fn render_metrics(State(state): State<AdminState>) -> impl IntoResponse {
    let upstream = state
        .observer
        .upstream()
        .filter(|_| state.ratelimit_names)
        .map(|stats| stats.render());
    let sluice = state.metrics.as_ref().map(|handle| {
        // Scrape-time gauges first, so the rendering below includes them.
        let hot_keys = state.observer.collect();
        let mut text = handle.render();
        text.push_str(&hot_keys);
        text.push_str(&crate::metrics::render_xds_version());
        text
    });
    if sluice.is_none() && upstream.is_none() {
        return (
            StatusCode::NOT_FOUND,
            "metrics recorder not installed in this process\n",
        )
            .into_response();
    }
    let mut text = sluice.unwrap_or_default();
    text.push_str(&upstream.unwrap_or_default());
    (
        StatusCode::OK,
        [("content-type", "text/plain; version=0.0.4")],
        text,
    )
        .into_response()
}
