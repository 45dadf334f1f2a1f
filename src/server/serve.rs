//! [`Server::run`], in named steps: the faces, the config updates, the readiness probe, the
//! servers, then the drain (NOT_SERVING, the drain delay, stop serving). Every task a step
//! starts goes on the [`Lifecycle`]'s tracker and ends at one of its two tokens; `run` returns
//! once all have ended.

use std::future::Future;
use std::sync::Arc;

use futures_util::future::Either;
use futures_util::{Stream, stream};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tonic::service::Routes;

use crate::grpc::{self, Health};
use crate::http;
use crate::metrics::upstream::GrpcCallsLayer;
use crate::readiness::Readiness;
use crate::rlqs::QuotaHandler;
use crate::rls::Handler;
use crate::{reload, xds};

use super::listen::Acceptor;
use super::shutdown::Lifecycle;
use super::{Listeners, Server, ServerError, Updates, probe, tls};

impl Server {
    /// Serves until `shutdown` completes, then reports NOT_SERVING for the drain delay, stops
    /// accepting, lets in-flight calls finish, waits for every task it started and returns.
    /// Logs the bound addresses first ("listening").
    pub async fn run(
        self,
        listeners: Listeners,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), ServerError> {
        self.run_until_signalled(listeners, stream::once(shutdown))
            .await
    }

    /// [`Server::run`] on a stream of signals: the first (or the stream's end) requests
    /// shutdown, the next skips what is left of the drain delay (`main`: SIGTERM, SIGINT).
    pub async fn run_until_signalled(
        self,
        listeners: Listeners,
        signals: impl Stream<Item = ()> + Send,
    ) -> Result<(), ServerError> {
        listeners.log(self.tls_mode())?;
        let life = Lifecycle::default();
        let readiness = Arc::new(Readiness::new());
        let handler = self.handler();
        let quota = grpc::QuotaStreams {
            handler: Arc::new(QuotaHandler::new(self.engine.clone())),
            stop: life.stop.clone(),
            tasks: life.tasks.clone(),
        };
        let grpc::Face { routes, health } = grpc::routes(
            handler.clone(),
            quota,
            self.settings.ports.max_message_bytes,
        )?;
        health.set_live().await;
        let gate = self.start_updates(&life, &readiness);
        self.start_probe(&life, &readiness, &health).await;
        let grpc = self.start_grpc(listeners.grpc, routes, gate, &life);
        self.start_http(
            listeners.admin,
            listeners.metrics,
            &readiness,
            handler,
            &life,
        );

        life.drain(signals, self.settings.drain_delay, &readiness, &health)
            .await;
        life.wait().await;
        self.stack.tracer.shutdown().await;
        grpc.await??;
        tracing::info!("stopped");
        Ok(())
    }

    /// The gRPC port's TLS as the "listening" line names it.
    fn tls_mode(&self) -> &'static str {
        match &self.grpc_tls {
            None => "off",
            Some(tls) if tls.verifies_clients() => "mutual",
            Some(_) => "server",
        }
    }

    /// What both faces answer a call with: the engine, the observer, the tracer, what the
    /// responses carry.
    fn handler(&self) -> Arc<Handler> {
        Arc::new(
            Handler::new(self.engine.clone(), self.stack.observer.clone())
                .with_tracer(self.stack.tracer.clone())
                .with_legacy_names(self.settings.legacy_names.clone())
                .with_dynamic_metadata(self.settings.response_dynamic_metadata),
        )
    }

    /// Starts the source of later configs. Returns the gate the gRPC server waits at: with
    /// xDS, unless forced to start, it serves once the first config is applied.
    fn start_updates(
        &self,
        life: &Lifecycle,
        readiness: &Arc<Readiness>,
    ) -> Option<watch::Receiver<bool>> {
        match &self.updates {
            None => None,
            Some(Updates::Reload(settings)) => {
                let watch = reload::watch(settings.clone(), self.engine.clone(), life.stop.clone());
                life.tasks.spawn(watch);
                None
            }
            Some(Updates::Xds(source)) => {
                readiness.require_config(source.settings.health_requires_config);
                readiness.set_config_pending(format!(
                    "waiting for the first config from the xDS server {}",
                    source.settings.url
                ));
                let (applied, first_config) = watch::channel(false);
                let ctx = xds::Context {
                    source: source.clone(),
                    engine: self.engine.clone(),
                    readiness: readiness.clone(),
                    applied,
                };
                life.tasks.spawn(xds::run(ctx, life.stop.clone()));
                if source.settings.force_start {
                    tracing::warn!(
                        "serving before the first xDS config: requests are answered \
                         UNAVAILABLE until it arrives"
                    );
                    return None;
                }
                tracing::info!(
                    "the gRPC server starts serving once the first xDS config is applied"
                );
                Some(first_config)
            }
        }
    }

    /// Probes the backend once, then every probe interval until shutdown is requested.
    async fn start_probe(&self, life: &Lifecycle, readiness: &Arc<Readiness>, health: &Health) {
        let backend = self.stack.backend.clone();
        probe::probe(&*backend, readiness, health, true).await;
        life.tasks.spawn(probe::run(
            backend,
            readiness.clone(),
            health.clone(),
            self.probe_interval(),
            life.requested.clone(),
        ));
    }

    /// The gRPC server (and, with TLS, its certificates' watcher). Health and reflection share
    /// the port, and its TLS, with the RLS. Without a config and not forced to start,
    /// connections wait in the listen backlog until `gate` opens (or shutdown).
    fn start_grpc(
        &self,
        listener: TcpListener,
        routes: Routes,
        gate: Option<watch::Receiver<bool>>,
        life: &Lifecycle,
    ) -> JoinHandle<Result<(), tonic::transport::Error>> {
        let ports = self.settings.ports;
        // A call not answered within the request timeout (its message never sent) is
        // cancelled, so a held stream costs its memory for a bounded time.
        let router = tonic::transport::Server::builder()
            .max_concurrent_streams(ports.grpc_max_concurrent_streams)
            .timeout(ports.request_timeout)
            .layer(GrpcCallsLayer::new(self.stack.upstream.clone()))
            .add_routes(routes);
        let incoming = Acceptor::new(listener, ports.grpc(), "grpc").into_stream();
        let stop = life.stop.clone();
        let serving = match &self.grpc_tls {
            None => Either::Left(
                router.serve_with_incoming_shutdown(incoming, stop.clone().cancelled_owned()),
            ),
            Some(server_tls) => {
                life.tasks
                    .spawn(tls::watch(server_tls.clone(), stop.clone()));
                let timeout = ports.request_timeout;
                let incoming = tls::incoming(
                    incoming,
                    server_tls.clone(),
                    |s| s.peer_addr().ok(),
                    timeout,
                );
                Either::Right(
                    router.serve_with_incoming_shutdown(incoming, stop.clone().cancelled_owned()),
                )
            }
        };
        life.tasks.spawn(async move {
            if let Some(mut first_config) = gate {
                tokio::select! {
                    _ = first_config.wait_for(|applied| *applied) => {}
                    () = stop.cancelled() => return Ok(()),
                }
                tracing::info!("first xDS config applied: the gRPC server serves");
            }
            serving.await
        })
    }

    /// The admin port and, when asked for, a port of its own for Prometheus (within the admin
    /// port's limits).
    fn start_http(
        &self,
        admin: TcpListener,
        metrics: Option<TcpListener>,
        readiness: &Arc<Readiness>,
        handler: Arc<Handler>,
        life: &Lifecycle,
    ) {
        let ports = self.settings.ports;
        let serve = |listener, name, app| {
            let acceptor = Acceptor::new(listener, ports.admin(), name);
            super::http::serve(acceptor, app, ports.request_timeout, life.stop.clone())
        };
        let observer = handler.observer().clone();
        let prometheus = Some(self.metrics.clone());
        let admin_app = http::admin_router(readiness.clone(), prometheus.clone(), handler);
        life.tasks.spawn(serve(admin, "admin", admin_app));
        if let Some(listener) = metrics {
            let settings = &self.settings.metrics;
            let ratelimit_names = settings.upstream.prometheus.is_some();
            let metrics_app = http::metrics_router(
                prometheus,
                observer,
                &settings.metrics_path,
                ratelimit_names,
            );
            life.tasks.spawn(serve(listener, "metrics", metrics_app));
        }
        // envoyproxy/ratelimit's statsd sink: flushes until the servers stop, then once more.
        if let Some(statsd) = self
            .stack
            .upstream
            .as_ref()
            .and_then(|u| u.statsd_task(life.stop.clone().cancelled_owned()))
        {
            life.tasks.spawn(statsd);
        }
    }
}
