//! Accepting connections on both ports within limits: how many may be open, how long a client
//! may take to start talking, how long it may stay silent, and what happens when the process
//! runs out of file descriptors.
//!
//! Why here and not in tonic or axum: neither bounds connections, neither closes a connection
//! that never sends a byte (an HTTP/2 client that never sends its preface waits forever in the
//! handshake), and tonic's accept loop retries at once on `EMFILE`, so a process out of file
//! descriptors spun a core on a connection it could never accept. [`Acceptor`] does all three
//! for both servers; each accepted [`Conn`] carries its connection permit and its read deadlines.
//!
//! Deadlines are on what the client sends: the first `first_bytes` bytes (the HTTP/2 preface on
//! the gRPC port, a first byte on the admin port) must arrive within `first_bytes_within` of the
//! accept, and afterwards a connection on which the client sends nothing for `idle` is closed.
//! Per-request limits (HTTP/2 streams per connection, the time to send a request) are set on the
//! servers themselves (the gRPC one in `run`, the HTTP ones in `http.rs`).
//!
//! Logs: refusals and accept errors are logged at `warn` under this module's target, which the
//! log filter rate-limits like the HTTP/2 library's per-connection warnings (src/logging.rs), so
//! a flood of connections is not a flood of log lines.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};

/// How long an accept loop waits after running out of file descriptors (or memory for a
/// socket) before it tries again: the pending connection stays in the backlog meanwhile.
pub const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// The limits of one port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Connections open at once; one more is accepted and closed at once.
    pub max_connections: usize,
    /// Bytes the client must send first (24: the HTTP/2 preface; 1: any request at all).
    pub first_bytes: usize,
    /// Time from the accept to the last of those bytes.
    pub first_bytes_within: Duration,
    /// A connection on which the client sent nothing for this long is closed.
    pub idle: Duration,
}

/// The connection and request limits of both ports, as `sluice serve`'s flags set them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortLimits {
    /// Connections open at once on the gRPC port (`--grpc-max-connections`).
    pub grpc_max_connections: usize,
    /// HTTP/2 streams (calls) open at once on one gRPC connection, advertised as
    /// `SETTINGS_MAX_CONCURRENT_STREAMS` (`--grpc-max-concurrent-streams`).
    pub grpc_max_concurrent_streams: u32,
    /// Bytes of one encoded gRPC message (tonic's decoding limit: larger messages are refused
    /// before they are decoded, with the transport's own status; `--max-message-bytes`).
    pub max_message_bytes: usize,
    /// Connections open at once on the admin port (`--admin-max-connections`).
    pub admin_max_connections: usize,
    /// Time a client has to send a request: the HTTP/2 preface after connecting, and each gRPC
    /// call until answered; on the admin port the request head, then the handler with the body
    /// (`--request-timeout-ms`).
    pub request_timeout: Duration,
    /// A connection on which the client sent nothing for this long is closed (`--idle-timeout-ms`).
    pub idle_timeout: Duration,
}

impl PortLimits {
    pub const DEFAULT_GRPC_MAX_CONNECTIONS: usize = 4096;
    /// As many calls as the backend may have in flight ([`crate::limiter::guard`]): more
    /// streams on one connection could only wait.
    pub const DEFAULT_GRPC_MAX_CONCURRENT_STREAMS: u32 = 1024;
    pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 256 * 1024;
    pub const DEFAULT_ADMIN_MAX_CONNECTIONS: usize = 256;
    pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
    pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(300);

    /// The gRPC port's: the preface first.
    pub fn grpc(&self) -> ConnectionLimits {
        ConnectionLimits {
            max_connections: self.grpc_max_connections,
            first_bytes: HTTP2_PREFACE_BYTES,
            first_bytes_within: self.request_timeout,
            idle: self.idle_timeout,
        }
    }

    /// The admin port's: any first byte (hyper then times the request head).
    pub fn admin(&self) -> ConnectionLimits {
        ConnectionLimits {
            max_connections: self.admin_max_connections,
            first_bytes: 1,
            first_bytes_within: self.request_timeout,
            idle: self.idle_timeout,
        }
    }
}

impl Default for PortLimits {
    fn default() -> Self {
        PortLimits {
            grpc_max_connections: Self::DEFAULT_GRPC_MAX_CONNECTIONS,
            grpc_max_concurrent_streams: Self::DEFAULT_GRPC_MAX_CONCURRENT_STREAMS,
            max_message_bytes: Self::DEFAULT_MAX_MESSAGE_BYTES,
            admin_max_connections: Self::DEFAULT_ADMIN_MAX_CONNECTIONS,
            request_timeout: Self::DEFAULT_REQUEST_TIMEOUT,
            idle_timeout: Self::DEFAULT_IDLE_TIMEOUT,
        }
    }
}

/// The HTTP/2 connection preface a gRPC client sends first.
pub const HTTP2_PREFACE_BYTES: usize = 24;

/// Accepts on `listener` within `limits`; `port` names the port (and its flags) in logs.
pub struct Acceptor {
    listener: TcpListener,
    limits: ConnectionLimits,
    permits: Arc<Semaphore>,
    port: &'static str,
}

impl Acceptor {
    pub fn new(listener: TcpListener, limits: ConnectionLimits, port: &'static str) -> Self {
        Acceptor {
            listener,
            permits: Arc::new(Semaphore::new(limits.max_connections.max(1))),
            limits,
            port,
        }
    }

    /// The next connection within the limits. Waits (never spins) while the process has no file
    /// descriptor to accept one with; refuses (closes at once) a connection over the limit.
    pub async fn accept(&mut self) -> Conn {
        loop {
            match self.listener.accept().await {
                Ok((stream, _peer)) => {
                    let Ok(permit) = Arc::clone(&self.permits).try_acquire_owned() else {
                        tracing::warn!(
                            port = self.port,
                            max_connections = self.limits.max_connections,
                            "connection refused: the port's connection limit is reached \
                             (--{}-max-connections)",
                            self.port
                        );
                        drop(stream);
                        continue;
                    };
                    // Decisions are tiny request/response pairs: Nagle would only add latency.
                    let _ = stream.set_nodelay(true);
                    return Conn::new(stream, permit, self.limits);
                }
                Err(error) if out_of_resources(&error) => {
                    tracing::warn!(
                        port = self.port,
                        error = %error,
                        backoff_ms = ACCEPT_BACKOFF.as_millis() as u64,
                        "cannot accept a connection: out of file descriptors or memory; retrying"
                    );
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
                // The peer went away before the accept (ECONNABORTED and the like).
                Err(error) => tracing::debug!(port = self.port, error = %error, "accept failed"),
            }
        }
    }

    /// The connections as a stream, for tonic's `serve_with_incoming`.
    pub fn into_stream(self) -> impl futures_util::Stream<Item = io::Result<Conn>> + Send {
        futures_util::stream::unfold(self, |mut acceptor| async move {
            let conn = acceptor.accept().await;
            Some((Ok(conn), acceptor))
        })
    }

    pub fn local_addr(&self) -> io::Result<std::net::SocketAddr> {
        self.listener.local_addr()
    }
}

/// Errors after which accepting again at once would fail the same way.
fn out_of_resources(error: &io::Error) -> bool {
    matches!(
        error.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

/// An accepted connection: the socket, its permit (released when it closes) and the deadline of
/// what the client must send next.
pub struct Conn {
    stream: TcpStream,
    _permit: OwnedSemaphorePermit,
    limits: ConnectionLimits,
    /// First bytes still expected; 0 once they came (then the idle deadline applies).
    awaiting: usize,
    accepted: Instant,
    last_read: Instant,
    /// Armed at some deadline at or before the real one; re-armed when it fires early.
    timer: Pin<Box<Sleep>>,
}

impl Conn {
    /// The client's address.
    pub fn peer_addr(&self) -> io::Result<std::net::SocketAddr> {
        self.stream.peer_addr()
    }

    fn new(stream: TcpStream, permit: OwnedSemaphorePermit, limits: ConnectionLimits) -> Self {
        let now = Instant::now();
        Conn {
            stream,
            _permit: permit,
            limits,
            awaiting: limits.first_bytes,
            accepted: now,
            last_read: now,
            timer: Box::pin(tokio::time::sleep_until(now + limits.first_bytes_within)),
        }
    }

    /// When the connection times out if the client sends nothing more.
    fn deadline(&self) -> Instant {
        if self.awaiting > 0 {
            self.accepted + self.limits.first_bytes_within
        } else {
            self.last_read + self.limits.idle
        }
    }

    /// Ready with an error once the deadline has passed; registers the waker otherwise.
    fn poll_deadline(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        loop {
            if self.timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            let deadline = self.deadline();
            if Instant::now() >= deadline {
                let what = if self.awaiting > 0 {
                    "the client did not start its request in time"
                } else {
                    "the client sent nothing for the idle timeout"
                };
                return Poll::Ready(io::Error::new(io::ErrorKind::TimedOut, what));
            }
            self.timer.as_mut().reset(deadline);
        }
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let before = buf.filled().len();
        match Pin::new(&mut this.stream).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                let read = buf.filled().len() - before;
                if read > 0 {
                    this.awaiting = this.awaiting.saturating_sub(read);
                    this.last_read = Instant::now();
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(error)) => Poll::Ready(Err(error)),
            Poll::Pending => this.poll_deadline(cx).map(Err),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

impl tonic::transport::server::Connected for Conn {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.stream.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn limits(max_connections: usize) -> ConnectionLimits {
        ConnectionLimits {
            max_connections,
            first_bytes: 3,
            first_bytes_within: Duration::from_millis(200),
            idle: Duration::from_millis(400),
        }
    }

    async fn acceptor(limits: ConnectionLimits) -> (Acceptor, std::net::SocketAddr) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        (Acceptor::new(listener, limits, "test"), addr)
    }

    #[tokio::test]
    async fn reads_time_out_before_the_first_bytes_and_when_idle() {
        let (mut acceptor, addr) = acceptor(limits(4)).await;
        let _client = TcpStream::connect(addr).await.unwrap();
        let mut conn = acceptor.accept().await;
        let started = Instant::now();
        let err = conn.read(&mut [0; 8]).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert!(started.elapsed() >= Duration::from_millis(190), "{err}");

        let mut client = TcpStream::connect(addr).await.unwrap();
        let mut conn = acceptor.accept().await;
        client.write_all(b"abc").await.unwrap();
        let mut buf = [0; 8];
        assert_eq!(conn.read(&mut buf).await.unwrap(), 3);
        // Past the first-bytes deadline, within the idle one: still open.
        tokio::time::sleep(Duration::from_millis(250)).await;
        client.write_all(b"d").await.unwrap();
        assert_eq!(conn.read(&mut buf).await.unwrap(), 1);
        let quiet = Instant::now();
        let err = conn.read(&mut buf).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert!(quiet.elapsed() >= Duration::from_millis(390), "{err}");
    }

    #[tokio::test]
    async fn a_connection_over_the_limit_is_closed_and_a_freed_permit_reused() {
        let (mut acceptor, addr) = acceptor(limits(1)).await;
        let _first = TcpStream::connect(addr).await.unwrap();
        let held = acceptor.accept().await;
        let mut second = TcpStream::connect(addr).await.unwrap();
        let accepting = tokio::spawn(async move {
            let conn = acceptor.accept().await;
            drop(conn);
        });
        // The second connection is accepted and closed at once.
        let read = tokio::time::timeout(Duration::from_secs(5), second.read(&mut [0; 1]))
            .await
            .expect("closed within 5 s");
        assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
        drop(held);
        let _third = TcpStream::connect(addr).await.unwrap();
        tokio::time::timeout(Duration::from_secs(5), accepting)
            .await
            .expect("the freed permit admits a new connection")
            .unwrap();
    }
}
