//! The bound sockets [`run`](super::run) serves on.
//!
//! Why `run` takes them bound: tests bind port 0 ([`Listeners::loopback`]) and read the real
//! ports before serving; `main` binds the configured addresses. Another port is one more field
//! here and one more server in `run`.

use std::net::SocketAddr;

use tokio::net::TcpListener;

use super::ServerError;

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

impl Listeners {
    /// Logs the bound addresses ("listening") and the gRPC port's TLS (`off`, `server` or
    /// `mutual`).
    pub(super) fn log(&self, grpc_tls: &str) -> Result<(), ServerError> {
        let grpc_addr = self.grpc_addr().map_err(ServerError::LocalAddr)?;
        let admin_addr = self.admin_addr().map_err(ServerError::LocalAddr)?;
        match &self.metrics {
            None => tracing::info!(%grpc_addr, %admin_addr, grpc_tls, "listening"),
            Some(metrics) => {
                let metrics_addr = metrics.local_addr().map_err(ServerError::LocalAddr)?;
                tracing::info!(%grpc_addr, %admin_addr, %metrics_addr, grpc_tls, "listening")
            }
        }
        Ok(())
    }
}
