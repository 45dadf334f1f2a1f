//! sluice in the test process: the [`Server`] built from [`Settings`], served on ephemeral
//! loopback ports and stopped through its shutdown future, the way mini-redis's tests run its
//! server.
//!
//! Each [`TestServer`] runs on a runtime of its own (two worker threads, as on a small pod),
//! not on the test's: a test that floods it, or blocks a thread on a child process, measures
//! the server as a client would, and a synchronous test can start one too.
//!
//! Metrics: the Prometheus recorder is process-wide, so one is installed per test process (on
//! the first start) and every in-process server of that process renders it on `/metrics`.
//! nextest runs each test in a process of its own; a test that asserts an exact count still
//! uses label values (a domain, a rule, a policy) of its own, so it holds when `cargo test`
//! runs the tests as threads of one process.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusHandle;
use sluice::limiter::redis::RedisOptions;
use sluice::proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use sluice::server::{ConfigSource, StartError};
use sluice::{Listeners, Server, Settings};
use tokio::sync::oneshot;
use tonic::transport::Channel;

/// Backend deadline of every sluice a test starts (in process or not) unless the test sets its
/// own. The production default (10 ms) is for a quiet host; on a loaded 2-core test machine it
/// would turn scheduler hiccups into flaky failures of tests that are not about deadlines.
pub const TEST_BACKEND_TIMEOUT: Duration = Duration::from_millis(500);

/// `sluice serve`'s defaults for the config at `config`, on Redis at `redis_url` (memory
/// without), with [`TEST_BACKEND_TIMEOUT`] and no drain delay.
pub fn test_settings(config: &Path, redis_url: Option<&str>) -> Settings {
    let mut settings = test_settings_from(ConfigSource::Files(config.to_owned()));
    settings.backend.redis = redis_url.map(RedisOptions::new);
    settings
}

/// `sluice serve`'s defaults with the limits from `source`, with [`TEST_BACKEND_TIMEOUT`] and
/// no drain delay: a server a test stops has nothing routing calls to it to wait for (the
/// tests of the delay run the binary, `tests/it/drain.rs`).
pub fn test_settings_from(source: ConfigSource) -> Settings {
    let mut settings = Settings::with_source(source);
    settings.backend.deadline = TEST_BACKEND_TIMEOUT;
    settings.drain_delay = Duration::ZERO;
    settings
}

/// The test process's one metrics recorder (the one every in-process server renders).
pub fn metrics() -> PrometheusHandle {
    sluice::metrics::prometheus().expect("install the metrics recorder")
}

pub struct TestServer {
    pub grpc_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    /// What `run` returned, once it has.
    done: Option<oneshot::Receiver<Result<(), String>>>,
}

impl TestServer {
    /// [`TestServer::try_start`], panicking on a start-up error.
    pub fn start(settings: Settings) -> TestServer {
        Self::try_start(settings).unwrap_or_else(|e| panic!("sluice did not start: {e}"))
    }

    /// Builds the server (on its runtime: a tracer's exporter runs there), binds 127.0.0.1:0
    /// for both servers and serves; returns once both listeners are bound, or with what
    /// stopped the build.
    pub fn try_start(settings: Settings) -> Result<TestServer, StartError> {
        let (stop, stopped) = oneshot::channel::<()>();
        let (done_tx, done) = oneshot::channel();
        let (bound_tx, bound) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("server runtime");
            let result = runtime.block_on(async move {
                let server = match Server::build(settings) {
                    Ok(server) => server,
                    Err(err) => {
                        let _ = bound_tx.send(Err(err));
                        return Ok(());
                    }
                };
                let listeners = Listeners::loopback().await.map_err(|e| e.to_string())?;
                let addrs = (
                    listeners.grpc_addr().expect("gRPC address"),
                    listeners.admin_addr().expect("admin address"),
                );
                let _ = bound_tx.send(Ok(addrs));
                let shutdown = async {
                    // A dropped sender (the test ended) stops the server too.
                    let _ = stopped.await;
                };
                server
                    .run(listeners, shutdown)
                    .await
                    .map_err(|e| e.to_string())
            });
            // Calls still running (e.g. abandoned by the guard) end with the runtime.
            runtime.shutdown_background();
            let _ = done_tx.send(result);
        });
        let (grpc_addr, admin_addr) = bound
            .recv_timeout(Duration::from_secs(20))
            .expect("sluice bound its listeners")?;
        Ok(TestServer {
            grpc_addr,
            admin_addr,
            stop: Some(stop),
            done: Some(done),
        })
    }

    pub async fn channel(&self) -> Channel {
        super::grpc_channel(self.grpc_addr).await
    }

    pub async fn client(&self) -> RateLimitServiceClient<Channel> {
        RateLimitServiceClient::new(self.channel().await)
    }

    /// Requests shutdown and waits (10 s at most) until `run` returned: NOT_SERVING, no new
    /// connections, in-flight calls finished. Returns what `run` returned.
    pub async fn stop(mut self) -> Result<(), String> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let done = self.done.take().expect("stopped once");
        match tokio::time::timeout(Duration::from_secs(10), done).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err("the server thread ended without a result".into()),
            Err(_) => Err("sluice did not stop within 10 s".into()),
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}
