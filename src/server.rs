//! Wiring: the gRPC server (RLS, health, reflection), the admin HTTP server, the backend
//! readiness probe and graceful shutdown.
//!
//! Why `run` takes bound listeners and a shutdown future: tests bind port 0
//! ([`Listeners::loopback`]) and stop the server when they like, in process; `main` binds the
//! configured addresses and passes SIGTERM/ctrl-c. [`crate::app::assemble`] builds the
//! settings.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::Either;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

use crate::admin::{self, Readiness};
use crate::config::Config;
use crate::decision::{Engine, EngineOptions, FailurePolicy};
use crate::headers::LegacyNames;
use crate::http_api;
use crate::limiter::Limiter;
use crate::listen::{Acceptor, PortLimits};
use crate::metrics::{self, MetricsSettings, ObservedLimiter, Observer};
use crate::otel::{Tracer, TracingError, TracingSettings};
use crate::proto::FILE_DESCRIPTOR_SET;
use crate::reload::{self, ReloadSettings};
use crate::rls::Handler;
use crate::service::{RateLimitServiceServer, RateLimiter, SERVICE_NAME};
use crate::tls::{self, ServerTls};
use crate::xds::{self, XdsSource};

/// gRPC health service name for Kubernetes liveness probes: SERVING while the process runs,
/// whatever the backend does. `""` and the RLS service name report readiness.
pub const LIVENESS_SERVICE: &str = "sluice.liveness";

pub struct ServerSettings {
    /// The limits served from the start (empty with `xds`, whose first push brings them).
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
    /// The limits come from an xDS management server instead of `config` (see [`crate::xds`]).
    pub xds: Option<XdsSource>,
    /// What a request gets when the backend fails.
    pub on_backend_error: FailurePolicy,
    /// Connection and request limits of both ports.
    pub ports: PortLimits,
    /// TLS of the gRPC port (reloaded when its files change); `None`: plaintext.
    pub grpc_tls: Option<Arc<ServerTls>>,
    /// OpenTelemetry export of a span per decision; `None`: tracing off.
    pub tracing: Option<TracingSettings>,
    /// Names of the `legacy` response headers.
    pub legacy_names: LegacyNames,
}

/// The bound sockets `run` serves on.
#[derive(Debug)]
pub struct Listeners {
    /// gRPC: RLS, health, reflection.
    pub grpc: TcpListener,
    /// Admin HTTP: probes, metrics, envoyproxy/ratelimit's HTTP face.
    pub admin: TcpListener,
    /// `/metrics` alone, on a port of its own (envoyproxy/ratelimit's `PROMETHEUS_ADDR`).
    pub metrics: Option<TcpListener>,
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
            metrics: None,
        })
    }

    /// Also serves `/metrics` alone on `addr`.
    pub async fn with_metrics(mut self, addr: SocketAddr) -> Result<Self, ServerError> {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|error| ServerError::Bind {
                what: "metrics",
                addr,
                error,
            })?;
        self.metrics = Some(listener);
        Ok(self)
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
    let grpc_tls = match &settings.grpc_tls {
        None => "off",
        Some(tls) if tls.verifies_clients() => "mutual",
        Some(_) => "server",
    };
    let grpc_addr = listeners.grpc_addr().map_err(ServerError::LocalAddr)?;
    let admin_addr = listeners.admin_addr().map_err(ServerError::LocalAddr)?;
    match &listeners.metrics {
        None => tracing::info!(%grpc_addr, %admin_addr, grpc_tls, "listening"),
        Some(metrics) => {
            let metrics_addr = metrics.local_addr().map_err(ServerError::LocalAddr)?;
            tracing::info!(%grpc_addr, %admin_addr, %metrics_addr, grpc_tls, "listening")
        }
    }
    let Listeners {
        grpc: grpc_listener,
        admin: admin_listener,
        metrics: metrics_listener,
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
    let engine = match &settings.xds {
        None => Engine::with_options(settings.config, observed, settings.engine),
        Some(_) => Engine::awaiting_config(observed, settings.engine),
    };
    let engine = Arc::new(engine.with_failure_policy(settings.on_backend_error));
    let readiness = Arc::new(Readiness::new());
    if let Some(source) = &settings.xds {
        readiness.set_config_pending(format!(
            "waiting for the first config from the xDS server {}",
            source.settings.url
        ));
    }
    let (health_reporter, health_service) = tonic_health::server::health_reporter();

    // Liveness answers "is the process able to serve at all": a Redis outage must make the pod
    // unready, never restart it, so this service stays SERVING for the life of the process.
    health_reporter
        .set_service_status(LIVENESS_SERVICE, ServingStatus::Serving)
        .await;
    probe_backend(&*limiter, &readiness, &health_reporter, true).await;
    let (stop_tx, stop_rx) = watch::channel(false);
    if let Some(r) = settings.reload {
        reload::spawn(r, engine.clone(), stop_rx.clone());
    }
    let (applied, mut first_config) = watch::channel(settings.xds.is_none());
    let serve_before_config = match &settings.xds {
        Some(source) => source.settings.force_start,
        None => true,
    };
    let xds_client = settings.xds.map(|source| {
        if source.settings.force_start {
            tracing::warn!(
                "serving before the first xDS config: requests are answered UNAVAILABLE until \
                 it arrives"
            );
        } else {
            tracing::info!("the gRPC server starts serving once the first xDS config is applied");
        }
        let ctx = xds::Context {
            source,
            engine: engine.clone(),
            readiness: readiness.clone(),
            applied,
        };
        tokio::spawn(xds::run(ctx, stop_rx.clone()))
    });
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

    let ports = settings.ports;
    let incoming = Acceptor::new(grpc_listener, ports.grpc(), "grpc").into_stream();
    // A message over the limit is refused by the transport before it is decoded (so before
    // anything is allocated for its fields); the connection and the server carry on.
    let handler = Arc::new(
        Handler::new(engine, observer.clone())
            .with_tracer(tracer.clone())
            .with_legacy_names(settings.legacy_names),
    );
    let rls = RateLimitServiceServer::new(RateLimiter::new(handler.clone()))
        .max_decoding_message_size(max_message_bytes);
    // A call not answered within the request timeout (its message never sent) is cancelled,
    // so a held stream costs its memory for a bounded time.
    let router = tonic::transport::Server::builder()
        .max_concurrent_streams(ports.grpc_max_concurrent_streams)
        .timeout(ports.request_timeout)
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(rls);
    // Health and reflection share the port, and its TLS, with the RLS.
    let grpc_server = match settings.grpc_tls {
        None => Either::Left(
            router.serve_with_incoming_shutdown(incoming, wait_for_stop(stop_rx.clone())),
        ),
        Some(server_tls) => {
            tokio::spawn(tls::watch(server_tls.clone(), stop_rx.clone()));
            let timeout = ports.request_timeout;
            let incoming = tls::incoming(incoming, server_tls, |s| s.peer_addr().ok(), timeout);
            Either::Right(
                router.serve_with_incoming_shutdown(incoming, wait_for_stop(stop_rx.clone())),
            )
        }
    };
    // Without a config and not forced to start, connections wait in the listen backlog until
    // the first config is applied (or shutdown).
    let gate_stop = stop_rx.clone();
    let grpc = async move {
        if !serve_before_config {
            tokio::select! {
                _ = first_config.wait_for(|applied| *applied) => {}
                _ = wait_for_stop(gate_stop) => return Ok(()),
            }
            tracing::info!("first xDS config applied: the gRPC server serves");
        }
        grpc_server.await
    };

    // A port of its own for Prometheus, when asked for, within the admin port's limits.
    let metrics_server = metrics_listener.map(|listener| {
        let app = admin::metrics_router(settings.metrics.clone(), observer.clone());
        tokio::spawn(admin::serve(
            Acceptor::new(listener, ports.admin(), "metrics"),
            app,
            ports.request_timeout,
            wait_for_stop(stop_rx.clone()),
        ))
    });
    // Both faces record every call on the one observer (and tracer).
    let admin_app = admin::router(readiness.clone(), settings.metrics, observer)
        .merge(http_api::router(handler));
    let admin = admin::serve(
        Acceptor::new(admin_listener, ports.admin(), "admin"),
        admin_app,
        ports.request_timeout,
        wait_for_stop(stop_rx.clone()),
    );

    let drain = async {
        shutdown.await;
        tracing::info!("shutdown requested: reporting NOT_SERVING and draining in-flight calls");
        readiness.set_draining();
        set_health(&health_reporter, ServingStatus::NotServing).await;
        let _ = stop_tx.send(true);
    };

    let (grpc_result, (), ()) = tokio::join!(grpc, admin, drain);
    prober.abort();
    if let Some(client) = xds_client {
        client.abort();
    }
    tracer.shutdown().await;
    grpc_result?;
    if let Some(server) = metrics_server {
        // It stops with the others; a panic in it is already logged by the runtime.
        let _ = server.await;
    }
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
            Ok(()) => tracing::info!(backend = limiter.name(), "backend reachable: serving"),
            Err(err) => tracing::warn!(
                backend = limiter.name(),
                error = %err,
                "backend unreachable: not serving"
            ),
        }
    }
    // Not ready without a config either (xDS before its first push).
    let status = if readiness.is_ready() {
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
