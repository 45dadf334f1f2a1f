//! Serving: the one [`Settings`] value in, the whole process out. [`Server::build`] does
//! everything that can fail from the settings before a port is bound (the config loaded, the
//! gRPC TLS loaded, the limiter stack built, the engine made); [`Server::run`] serves it in
//! named steps until shutdown, owning every task it starts.
//!
//! Why `run` takes bound listeners and a shutdown future: tests bind port 0
//! ([`Listeners::loopback`]) and stop the server when they like, in process; `main` binds the
//! configured addresses and passes SIGTERM and SIGINT ([`Server::run_until_signalled`]: a
//! second signal cuts the drain delay short). [`run`] is both steps in one call.
//!
//! One file per step: `settings` (what is asked), `assemble` (the build), `stack` (the limiter
//! stack and its observers), `serve` (the steps of `run`), `shutdown` (its two tokens and the
//! task tracker), `probe` (backend readiness), `listeners`, `listen` (accepting within
//! limits), `http` (an HTTP/1.1 port), `tls` (the gRPC port's TLS). What each port answers is
//! the faces' ([`crate::grpc`], [`crate::http`]).

mod assemble;
mod http;
pub mod listen;
mod listeners;
mod probe;
mod serve;
mod settings;
mod shutdown;
mod stack;
pub mod tls;

use std::future::Future;
use std::sync::Arc;

use metrics_exporter_prometheus::PrometheusHandle;

use crate::decision::Engine;
use crate::reload::ReloadSettings;
use crate::xds::XdsSource;

pub use listeners::Listeners;
pub use settings::{
    BackendSettings, ConfigSource, DEFAULT_DRAIN_DELAY, DEFAULT_PROBE_INTERVAL,
    DEFAULT_WATCH_INTERVAL, MIN_DEADLINE, MIN_WATCH_INTERVAL, Settings, StartError,
};
pub use stack::{Stack, backend};

use tls::ServerTls;

/// What [`Server::run`] serves: the settings, and what was built from them.
pub struct Server {
    settings: Settings,
    /// The engine both faces decide through.
    engine: Arc<Engine>,
    stack: Stack,
    /// Where later configs come from: files polled for changes, or an xDS server (`None` with
    /// both: the start-up config serves until exit).
    updates: Option<Updates>,
    grpc_tls: Option<Arc<ServerTls>>,
    metrics: PrometheusHandle,
}

/// The source of config generations after the first.
enum Updates {
    Reload(ReloadSettings),
    Xds(XdsSource),
}

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("{0}")]
    Start(#[from] StartError),
    #[error("binding {what} address {addr}: {error}")]
    Bind {
        what: &'static str,
        addr: std::net::SocketAddr,
        error: std::io::Error,
    },
    #[error("reading the bound addresses: {0}")]
    LocalAddr(std::io::Error),
    #[error("gRPC server failed: {0}")]
    Grpc(#[from] tonic::transport::Error),
    #[error("reflection service could not be built: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    #[error("the gRPC server's task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}

/// [`Server::build`] then [`Server::run`]: serves `settings` on `listeners` until `shutdown`
/// completes. Must be called inside the Tokio runtime that serves.
pub async fn run(
    settings: Settings,
    listeners: Listeners,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServerError> {
    Server::build(settings)?.run(listeners, shutdown).await
}
