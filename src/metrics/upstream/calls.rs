//! envoyproxy/ratelimit's server interceptor, as a layer around the gRPC server: each unary
//! call of a method it counts ([`GrpcMethod`]: `ShouldRateLimit` and the health `Check`) adds
//! to `ratelimit_server.<method>.total_requests` and `.response_time` when its handler has
//! answered. Streaming calls (health `Watch`, reflection) are not counted, as the interceptor
//! is a unary one; neither are `/json` calls on the admin port, which never pass it.
//!
//! Why a layer: the health service is tonic-health's, so only the server around it sees its
//! calls; the layer reads the request path and the clock, nothing else.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use super::{GrpcMethod, UpstreamStats};

/// Counts the calls of the services it wraps into `stats` (nothing when `None`).
#[derive(Clone)]
pub struct GrpcCallsLayer {
    stats: Option<Arc<UpstreamStats>>,
}

impl GrpcCallsLayer {
    pub fn new(stats: Option<Arc<UpstreamStats>>) -> GrpcCallsLayer {
        GrpcCallsLayer { stats }
    }
}

impl<S> tower_layer::Layer<S> for GrpcCallsLayer {
    type Service = GrpcCalls<S>;

    fn layer(&self, inner: S) -> GrpcCalls<S> {
        GrpcCalls {
            inner,
            stats: self.stats.clone(),
        }
    }
}

#[derive(Clone)]
pub struct GrpcCalls<S> {
    inner: S,
    stats: Option<Arc<UpstreamStats>>,
}

impl<S, B> tower_service::Service<http::Request<B>> for GrpcCalls<S>
where
    S: tower_service::Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = CallFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let counted = self.stats.as_ref().and_then(|stats| {
            GrpcMethod::of_path(request.uri().path())
                .map(|method| (Arc::clone(stats), method, Instant::now()))
        });
        CallFuture {
            inner: self.inner.call(request),
            counted,
        }
    }
}

pin_project_lite::pin_project! {
    /// The wrapped call; counts it when it completes.
    pub struct CallFuture<F> {
        #[pin]
        inner: F,
        counted: Option<(Arc<UpstreamStats>, GrpcMethod, Instant)>,
    }
}

impl<F: Future> Future for CallFuture<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let output = std::task::ready!(this.inner.poll(cx));
        if let Some((stats, method, started)) = this.counted.take() {
            stats.record_grpc_call(method, started.elapsed());
        }
        Poll::Ready(output)
    }
}
