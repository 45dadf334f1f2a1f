//! The admin HTTP server: `/healthz` (the process answers), `/readyz` (config loaded, backend
//! reachable, not draining), `/healthcheck` (envoyproxy/ratelimit's probe path) and `/metrics`
//! (Prometheus text); [`metrics_router`] serves `/metrics` alone on a port of its own.
//!
//! Why `/healthcheck` ignores the backend: Envoy Gateway points its startup, readiness *and*
//! liveness probes at it, so a Redis outage that failed it would restart every rate-limit pod
//! (envoyproxy/ratelimit's `/healthcheck` ignores Redis too unless told otherwise). It answers
//! `OK` (200) once a config is served (at once from files; after the first xDS push) and until
//! draining, 500 otherwise; `/readyz` and gRPC health are the probes that follow the backend.
//!
//! Why separate from gRPC: Kubernetes probes and Prometheus scrapes speak HTTP/1.1, and an SRE
//! must be able to curl them; keeping them off the data-plane port keeps the RLS port minimal.
//!
//! [`serve`] runs the port itself (HTTP/1.1 through hyper) rather than through `axum::serve`,
//! which sets no timer: there a client that sent half a request head, or a `Content-Length` far
//! above the body it sent, kept its connection forever. Here the head must arrive within
//! `--request-timeout-ms` (hyper's header read timeout, which also closes a keep-alive
//! connection that starts no new request within it), a handler, body included, must finish
//! within it (408 otherwise), and the connection limits of [`crate::listen`] apply.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use metrics_exporter_prometheus::PrometheusHandle;

use crate::listen::Acceptor;
use crate::metrics::Observer;

/// Readiness as the admin server and gRPC health both report it.
#[derive(Debug, Default)]
pub struct Readiness {
    backend_up: AtomicBool,
    draining: AtomicBool,
    /// Why no config is served yet (a config source that delivers it later, e.g. xDS);
    /// `None` once one is.
    config_pending: Mutex<Option<String>>,
}

impl Readiness {
    pub fn new() -> Self {
        Readiness {
            backend_up: AtomicBool::new(false),
            draining: AtomicBool::new(false),
            config_pending: Mutex::new(None),
        }
    }

    /// No config served yet, and why (shown by `/readyz`); [`Readiness::set_config_loaded`]
    /// ends it.
    pub fn set_config_pending(&self, why: impl Into<String>) {
        *crate::sync::lock(&self.config_pending) = Some(why.into());
    }

    pub fn set_config_loaded(&self) {
        *crate::sync::lock(&self.config_pending) = None;
    }

    /// Why no config is served yet; `None` when one is.
    pub fn config_pending(&self) -> Option<String> {
        crate::sync::lock(&self.config_pending).clone()
    }

    /// Records the latest backend probe; returns true when the state changed.
    pub fn set_backend_up(&self, up: bool) -> bool {
        self.backend_up.swap(up, Ordering::SeqCst) != up
    }

    pub fn set_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    pub fn backend_up(&self) -> bool {
        self.backend_up.load(Ordering::SeqCst)
    }

    pub fn draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    pub fn is_ready(&self) -> bool {
        self.backend_up() && !self.draining() && self.config_pending().is_none()
    }
}

#[derive(Clone)]
struct AdminState {
    readiness: Arc<Readiness>,
    metrics: Option<PrometheusHandle>,
    observer: Arc<Observer>,
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
        })
}

/// Serves `app` on `acceptor` until `stop` completes, then stops accepting, lets requests in
/// progress finish (idle connections close) and returns.
pub async fn serve(
    mut acceptor: Acceptor,
    app: Router,
    request_timeout: Duration,
    stop: impl Future<Output = ()>,
) {
    let app = app.layer(axum::middleware::from_fn_with_state(
        request_timeout,
        within_request_timeout,
    ));
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(request_timeout);
    // Every connection task holds a receiver: `closed()` resolves once all have ended.
    let (drain, draining) = tokio::sync::watch::channel(false);
    let mut stop = std::pin::pin!(stop);
    loop {
        let conn = tokio::select! {
            conn = acceptor.accept() => conn,
            () = &mut stop => break,
        };
        let service = hyper_util::service::TowerToHyperService::new(app.clone());
        let connection = http.serve_connection(hyper_util::rt::TokioIo::new(conn), service);
        let mut draining = draining.clone();
        tokio::spawn(async move {
            let mut connection = std::pin::pin!(connection);
            tokio::select! {
                result = connection.as_mut() => {
                    if let Err(error) = result {
                        tracing::debug!(error = %error, "admin connection ended with an error");
                    }
                    return;
                }
                _ = draining.wait_for(|stopping| *stopping) => {}
            }
            connection.as_mut().graceful_shutdown();
            let _ = connection.await;
        });
    }
    drop(acceptor);
    drop(draining);
    let _ = drain.send(true);
    drain.closed().await;
}

/// Answers 408 when a request (its body included) is not handled within the timeout.
async fn within_request_timeout(
    State(timeout): State<Duration>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    match tokio::time::timeout(timeout, next.run(request)).await {
        Ok(response) => response,
        Err(_) => (
            StatusCode::REQUEST_TIMEOUT,
            [("connection", "close")],
            "request not received within --request-timeout-ms\n",
        )
            .into_response(),
    }
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

/// Only `/metrics`, for a Prometheus port of its own (envoyproxy/ratelimit's
/// `PROMETHEUS_ADDR`).
pub fn metrics_router(metrics: Option<PrometheusHandle>, observer: Arc<Observer>) -> Router {
    Router::new()
        .route("/metrics", get(render_metrics))
        .with_state(AdminState {
            readiness: Arc::new(Readiness::new()),
            metrics,
            observer,
        })
}

async fn healthcheck(State(state): State<AdminState>) -> impl IntoResponse {
    let r = &state.readiness;
    if r.draining() {
        (StatusCode::INTERNAL_SERVER_ERROR, "draining\n".into())
    } else if let Some(why) = r.config_pending() {
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("no config yet: {why}\n"),
        )
    } else {
        (StatusCode::OK, "OK".into())
    }
}

async fn render_metrics(State(state): State<AdminState>) -> impl IntoResponse {
    match &state.metrics {
        Some(handle) => {
            // Scrape-time gauges first, so the rendering below includes them.
            let hot_keys = state.observer.collect();
            let mut text = handle.render();
            text.push_str(&hot_keys);
            text.push_str(&crate::metrics::render_xds_version());
            (
                StatusCode::OK,
                [("content-type", "text/plain; version=0.0.4")],
                text,
            )
                .into_response()
        }
        None => (
            StatusCode::NOT_FOUND,
            "metrics recorder not installed in this process\n",
        )
            .into_response(),
    }
}
