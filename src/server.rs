//! Wiring: the gRPC server (RLS, health, reflection), the admin HTTP server, the backend
//! readiness probe and graceful shutdown.
//!
//! Why `run` takes bound listeners and a shutdown future: tests bind port 0
//! ([`Listeners::loopback`]) and stop the server when they like, in process; `main` binds the
//! configured addresses and passes SIGTERM/ctrl-c. [`crate::app::assemble`] builds the
//! settings.

use std::future::{Future, IntoFuture};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_stream::StreamExt;
use tonic_health::server::HealthReporter;
use tonic_health::ServingStatus;

use crate::admin::{self, Readiness};
use crate::config::Config;
use crate::decision::{Engine, EngineOptions, FailurePolicy};
use crate::headers::LegacyNames;
use crate::http_api;
use crate::limiter::Limiter;
use crate::metrics::{self, MetricsSettings, ObservedLimiter, Observer};
use crate::otel::{Tracer, TracingError, TracingSettings};
use crate::proto::FILE_DESCRIPTOR_SET;
use crate::reload::{self, ReloadSettings};
use crate::rls::Handler;
use crate::service::{RateLimitServiceServer, RateLimiter, SERVICE_NAME};

/// gRPC health service name for Kubernetes liveness probes: SERVING while the process runs,
/// whatever the backend does. `""` and the RLS service name report readiness.
pub const LIVENESS_SERVICE: &str = "sluice.liveness";

pub struct ServerSettings {
    pub config: Config,
    pub limiter: Arc<dyn Limiter>,
    /// Renders `/metrics`; `None` when no recorder is installed ([`crate::app::install_metrics`]).
    pub metrics: Option<PrometheusHandle>,
    /// How often readiness re-probes the backend.
    pub probe_interval: Duration,
    pub engine: EngineOptions,
    /// Near-limit ratio and hot-key count.
    pub metrics_settings: MetricsSettings,
    /// Hot reload of the config; `None` serves the start-up config until exit.
    pub reload: Option<ReloadSettings>,
    /// What a request gets when the backend fails.
    pub on_backend_error: FailurePolicy,
    /// OpenTelemetry export of a span per decision; `None`: tracing off.
    pub tracing: Option<TracingSettings>,
    /// Names of the `legacy` response headers.
    pub legacy_names: LegacyNames,
}

/// The two bound sockets `run` serves on.
#[derive(Debug)]
pub struct Listeners {
    /// gRPC: RLS, health, reflection.
    pub grpc: TcpListener,
    /// Admin HTTP: probes, metrics, envoyproxy/ratelimit's HTTP face.
    pub admin: TcpListener,
}

impl Listeners {
    /// Binds both addresses.
    pub async fn bind(grpc: SocketAddr, admin: SocketAddr) -> Result<Self, ServerError> {
        let bind = |what: &'static str, addr: SocketAddr| async move {
            TcpListener::bind(addr)
                .await
                .map_err(|error| ServerError::Bind { what, addr, error })
        };
        Ok(Listeners {
            grpc: bind("gRPC", grpc).await?,
            admin: bind("admin", admin).await?,
        })
    }

    /// Both on ephemeral loopback ports (tests).
    pub async fn loopback() -> Result<Self, ServerError> {
        let any = SocketAddr::from(([127, 0, 0, 1], 0));
        Self::bind(any, any).await
    }

    /// The bound gRPC address (the real port when bound to port 0).
    pub fn grpc_addr(&self) -> std::io::Result<SocketAddr> {
        self.grpc.local_addr()
    }

    /// The bound admin address.
    pub fn admin_addr(&self) -> std::io::Result<SocketAddr> {
        self.admin.local_addr()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("binding {what} address {addr}: {error}")]
    Bind {
        what: &'static str,
        addr: SocketAddr,
        error: std::io::Error,
    },
    #[error("reading the bound addresses: {0}")]
    LocalAddr(std::io::Error),
    #[error("gRPC server failed: {0}")]
    Grpc(#[from] tonic::transport::Error),
    #[error("admin server failed: {0}")]
    Admin(#[source] std::io::Error),
    #[error("reflection service could not be built: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    #[error("tracing: {0}")]
    Tracing(#[from] TracingError),
}

/// Serves until `shutdown` completes, then reports NOT_SERVING, stops accepting, lets in-flight
/// calls finish and returns. Logs the bound addresses first ("listening").
pub async fn run(
    settings: ServerSettings,
    listeners: Listeners,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServerError> {
    tracing::info!(
        grpc_addr = %listeners.grpc_addr().map_err(ServerError::LocalAddr)?,
        admin_addr = %listeners.admin_addr().map_err(ServerError::LocalAddr)?,
        "listening"
    );
    let Listeners {
        grpc: grpc_listener,
        admin: admin_listener,
    } = listeners;
    let limiter = settings.limiter.clone();
    let observer = Arc::new(Observer::new(
        settings.metrics_settings,
        settings.limiter.clone(),
    ));
    let max_message_bytes = settings.engine.limits.max_message_bytes;
    // Started here, on the runtime that serves: the exporter's connections run on it.
    let tracer = match &settings.tracing {
        Some(tracing) => Tracer::start(tracing)?,
        None => Tracer::off(),
    };
    let observed: Arc<dyn Limiter> =
        Arc::new(ObservedLimiter::new(tracer.limiter(settings.limiter)));
    let engine = Arc::new(
        Engine::with_options(settings.config, observed, settings.engine)
            .with_failure_policy(settings.on_backend_error),
    );
    let readiness = Arc::new(Readiness::new());
    let (health_reporter, health_service) = tonic_health::server::health_reporter();

    // Liveness answers "is the process able to serve at all": a Redis outage must make the pod
    // unready, never restart it, so this service stays SERVING for the life of the process.
    health_reporter
        .set_service_status(LIVENESS_SERVICE, ServingStatus::Serving)
        .await;
    probe_backend(&*limiter, &readiness, &health_reporter, true).await;
    let (stop_tx, stop_rx) = watch::channel(false);
    let reloader = settings
        .reload
        .map(|r| tokio::spawn(reload::run(r, engine.clone(), stop_rx.clone())));
    let prober = tokio::spawn(probe_loop(
        limiter,
        readiness.clone(),
        health_reporter.clone(),
        settings.probe_interval,
        stop_rx.clone(),
    ));

    let reflection_v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()?;

    // Decisions are tiny request/response pairs: Nagle would only add latency.
    let incoming = TcpListenerStream::new(grpc_listener).map(|conn| {
        conn.inspect(|stream| {
            let _ = stream.set_nodelay(true);
        })
    });
    // A message over the limit is refused by the transport before it is decoded (so before
    // anything is allocated for its fields); the connection and the server carry on.
    let handler = Arc::new(
        Handler::new(engine, observer.clone())
            .with_tracer(tracer.clone())
            .with_legacy_names(settings.legacy_names),
    );
    let rls = RateLimitServiceServer::new(RateLimiter::new(handler.clone()))
        .max_decoding_message_size(max_message_bytes);
    let grpc = tonic::transport::Server::builder()
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(rls)
        .serve_with_incoming_shutdown(incoming, wait_for_stop(stop_rx.clone()));

    // Both faces record every call on the one observer (and tracer).
    let admin_app = admin::router(readiness.clone(), settings.metrics, observer)
        .merge(http_api::router(handler));
    let admin = axum::serve(admin_listener, admin_app)
        .with_graceful_shutdown(wait_for_stop(stop_rx.clone()))
        .into_future();

    let drain = async {
        shutdown.await;
        tracing::info!("shutdown requested: reporting NOT_SERVING and draining in-flight calls");
        readiness.set_draining();
        set_health(&health_reporter, ServingStatus::NotServing).await;
        let _ = stop_tx.send(true);
    };

    let (grpc_result, admin_result, ()) = tokio::join!(grpc, admin, drain);
    prober.abort();
    if let Some(reloader) = reloader {
        reloader.abort();
    }
    tracer.shutdown().await;
    grpc_result?;
    admin_result.map_err(ServerError::Admin)?;
    tracing::info!("stopped");
    Ok(())
}

async fn wait_for_stop(mut stop: watch::Receiver<bool>) {
    while !*stop.borrow_and_update() {
        if stop.changed().await.is_err() {
            return;
        }
    }
}

async fn set_health(reporter: &HealthReporter, status: ServingStatus) {
    reporter.set_service_status("", status).await;
    reporter.set_service_status(SERVICE_NAME, status).await;
}

/// Probes the backend and publishes readiness; logs only the first result and changes, so a
/// long outage is one line, not one per probe.
async fn probe_backend(
    limiter: &dyn Limiter,
    readiness: &Readiness,
    reporter: &HealthReporter,
    first: bool,
) {
    if readiness.draining() {
        return;
    }
    let result = limiter.ping().await;
    let up = result.is_ok();
    metrics::record_backend_up(up);
    if readiness.set_backend_up(up) || first {
        match &result {
            Ok(()) => tracing::info!(backend = limiter.backend(), "backend reachable: serving"),
            Err(err) => tracing::warn!(
                backend = limiter.backend(),
                error = %err,
                "backend unreachable: not serving"
            ),
        }
    }
    let status = if up {
        ServingStatus::Serving
    } else {
        ServingStatus::NotServing
    };
    set_health(reporter, status).await;
}

async fn probe_loop(
    limiter: Arc<dyn Limiter>,
    readiness: Arc<Readiness>,
    reporter: HealthReporter,
    interval: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => probe_backend(&*limiter, &readiness, &reporter, false).await,
            _ = stop.changed() => return,
        }
    }
}
