//! The HTTP/1.1 ports (admin and the `/metrics`-only one): a router served on an acceptor, with
//! timeouts, until told to stop.
//!
//! Why not `axum::serve`: it sets no timer, so a client that sent half a request head, or a
//! `Content-Length` far above the body it sent, kept its connection forever. Here the head must
//! arrive within `--request-timeout-ms` (hyper's header read timeout, which also closes a
//! keep-alive connection that starts no new request within it), a handler, body included, must
//! finish within it (408 otherwise), and the connection limits of [`super::listen`] apply.

use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::listen::Acceptor;

/// Serves `app` on `acceptor` until `stop` is cancelled, then stops accepting, lets requests in
/// progress finish (idle connections close) and returns once every connection has ended.
pub async fn serve(
    mut acceptor: Acceptor,
    app: Router,
    request_timeout: Duration,
    stop: CancellationToken,
) {
    let app = app.layer(axum::middleware::from_fn_with_state(
        request_timeout,
        within_request_timeout,
    ));
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(request_timeout);
    let connections = TaskTracker::new();
    loop {
        let conn = tokio::select! {
            conn = acceptor.accept() => conn,
            () = stop.cancelled() => break,
        };
        let service = hyper_util::service::TowerToHyperService::new(app.clone());
        let connection = http.serve_connection(hyper_util::rt::TokioIo::new(conn), service);
        let stop = stop.clone();
        connections.spawn(async move {
            let mut connection = std::pin::pin!(connection);
            tokio::select! {
                result = connection.as_mut() => {
                    if let Err(error) = result {
                        tracing::debug!(error = %error, "admin connection ended with an error");
                    }
                    return;
                }
                () = stop.cancelled() => {}
            }
            connection.as_mut().graceful_shutdown();
            let _ = connection.await;
        });
    }
    drop(acceptor);
    connections.close();
    connections.wait().await;
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
