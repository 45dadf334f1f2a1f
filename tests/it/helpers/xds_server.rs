//! A test double of an xDS management server (Envoy Gateway's rate-limit config server): the
//! real `AggregatedDiscoveryService` from sluice's protos, served by tonic on 127.0.0.1:0,
//! plaintext or TLS 1.3 with a required client certificate and ALPN h2, as Envoy Gateway's.
//!
//! The test drives it: [`XdsServer::push`] sends a state-of-the-world response (every
//! domain's `RateLimitConfig`) on the newest stream, [`XdsServer::next_request`] returns what
//! the client sent (its subscription, then an ACK or NACK per response),
//! [`XdsServer::drop_streams`] ends every open stream (a server restart as the client sees
//! it), and [`XdsServer::handshakes`] tells how each TLS connection went.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prost::Message;
use sluice::proto::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use sluice::proto::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use sluice::proto::ratelimit::config::ratelimit::v3::RateLimitConfig;
use sluice::xds::RATE_LIMIT_CONFIG_TYPE;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::{ReceiverStream, UnboundedReceiverStream};
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
use tonic::{Request, Response, Status, Streaming};

use super::certs::Issued;

/// One request the client sent, with the stream it came on (0 for the first stream).
#[derive(Debug, Clone)]
pub struct Seen {
    pub stream: usize,
    pub request: DiscoveryRequest,
    /// Whether the stream's TLS connection carried a client certificate.
    pub client_cert: bool,
}

/// How a TLS connection attempt went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Handshake {
    Done {
        version: String,
        alpn: Option<String>,
    },
    Failed(String),
}

/// TLS of the double: its certificate and the CA its clients' certificates must chain to.
pub struct ServerTls<'a> {
    pub server: &'a Issued,
    pub client_ca_pem: &'a str,
}

type Outbound = mpsc::Sender<Result<DiscoveryResponse, Status>>;

#[derive(Default)]
struct Shared {
    streams: Mutex<Vec<Outbound>>,
    opened: AtomicUsize,
    nonces: AtomicU64,
    handshakes: Mutex<Vec<Handshake>>,
}

struct Service {
    shared: Arc<Shared>,
    seen: mpsc::UnboundedSender<Seen>,
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for Service {
    type StreamAggregatedResourcesStream = ReceiverStream<Result<DiscoveryResponse, Status>>;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        let client_cert = request
            .extensions()
            .get::<TlsConnectInfo<TcpConnectInfo>>()
            .and_then(|info| info.peer_certs())
            .is_some_and(|certs| !certs.is_empty());
        let stream = self.shared.opened.fetch_add(1, Ordering::SeqCst);
        let (tx, rx) = mpsc::channel(16);
        self.shared.streams.lock().unwrap().push(tx);
        let mut inbound = request.into_inner();
        let seen = self.seen.clone();
        tokio::spawn(async move {
            while let Ok(Some(request)) = inbound.message().await {
                let _ = seen.send(Seen {
                    stream,
                    request,
                    client_cert,
                });
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

pub struct XdsServer {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    seen: tokio::sync::Mutex<mpsc::UnboundedReceiver<Seen>>,
    task: tokio::task::JoinHandle<()>,
}

impl XdsServer {
    /// Plaintext (an `http://` URL).
    pub async fn start() -> XdsServer {
        Self::start_with(None).await
    }

    /// TLS 1.3 only, ALPN h2, a client certificate signed by `tls.client_ca_pem` required.
    pub async fn start_tls(tls: ServerTls<'_>) -> XdsServer {
        Self::start_with(Some(tls)).await
    }

    async fn start_with(tls: Option<ServerTls<'_>>) -> XdsServer {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind xDS double");
        let addr = listener.local_addr().expect("xDS double address");
        let shared = Arc::new(Shared::default());
        let (seen_tx, seen_rx) = mpsc::unbounded_channel();
        let service = AggregatedDiscoveryServiceServer::new(Service {
            shared: shared.clone(),
            seen: seen_tx,
        });
        let router = tonic::transport::Server::builder().add_service(service);
        let task = match tls {
            None => tokio::spawn(async move {
                let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
                let _ = router.serve_with_incoming(incoming).await;
            }),
            Some(tls) => {
                let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server_config(&tls)));
                let (conns, incoming) = mpsc::unbounded_channel();
                let handshakes = shared.clone();
                tokio::spawn(async move {
                    let incoming =
                        UnboundedReceiverStream::new(incoming).map(Ok::<_, std::io::Error>);
                    let _ = router.serve_with_incoming(incoming).await;
                });
                tokio::spawn(accept_tls(listener, acceptor, conns, handshakes))
            }
        };
        XdsServer {
            addr,
            shared,
            seen: tokio::sync::Mutex::new(seen_rx),
            task,
        }
    }

    /// `http://127.0.0.1:PORT` or `https://...` for `--config-xds`.
    pub fn url(&self, tls: bool) -> String {
        format!("{}://{}", if tls { "https" } else { "http" }, self.addr)
    }

    /// Streams opened so far.
    pub fn streams_opened(&self) -> usize {
        self.shared.opened.load(Ordering::SeqCst)
    }

    /// Sends every domain's limits at `version` on the newest stream; returns the nonce.
    pub async fn push(&self, version: &str, configs: &[RateLimitConfig]) -> String {
        let resources = configs
            .iter()
            .map(|c| prost_types::Any {
                type_url: RATE_LIMIT_CONFIG_TYPE.into(),
                value: c.encode_to_vec(),
            })
            .collect();
        self.push_raw(version, resources).await
    }

    /// [`XdsServer::push`] with resources as given (other types, undecodable bytes).
    pub async fn push_raw(&self, version: &str, resources: Vec<prost_types::Any>) -> String {
        let nonce = format!(
            "nonce-{}",
            self.shared.nonces.fetch_add(1, Ordering::SeqCst)
        );
        let response = DiscoveryResponse {
            version_info: version.into(),
            resources,
            type_url: RATE_LIMIT_CONFIG_TYPE.into(),
            nonce: nonce.clone(),
            ..DiscoveryResponse::default()
        };
        let stream = self.shared.streams.lock().unwrap().last().cloned();
        stream
            .expect("no stream open to push on")
            .send(Ok(response))
            .await
            .expect("the stream to the client is open");
        nonce
    }

    /// Ends every open stream (the client sees the server close it).
    pub fn drop_streams(&self) {
        self.shared.streams.lock().unwrap().clear();
    }

    /// The next request the client sent (10 s at most).
    pub async fn next_request(&self) -> Seen {
        let mut seen = self.seen.lock().await;
        tokio::time::timeout(Duration::from_secs(10), seen.recv())
            .await
            .expect("a request from sluice within 10 s")
            .expect("the double is running")
    }

    /// Whether a request arrives within `wait`.
    pub async fn request_within(&self, wait: Duration) -> Option<Seen> {
        let mut seen = self.seen.lock().await;
        tokio::time::timeout(wait, seen.recv()).await.ok().flatten()
    }

    /// Every TLS connection attempt so far.
    pub fn handshakes(&self) -> Vec<Handshake> {
        self.shared.handshakes.lock().unwrap().clone()
    }
}

impl Drop for XdsServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Envoy Gateway's xDS server TLS: TLS 1.3 only, ALPN h2, client certificates required.
fn server_config(tls: &ServerTls<'_>) -> rustls::ServerConfig {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pemfile_certs(tls.client_ca_pem) {
        roots.add(cert).expect("client CA");
    }
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .build()
    .expect("client verifier");
    let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(tls.server.key_pem.as_bytes())
        .expect("server key");
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("TLS 1.3")
        .with_client_cert_verifier(verifier)
        .with_single_cert(rustls_pemfile_certs(&tls.server.cert_pem), key)
        .expect("server certificate");
    config.alpn_protocols = vec![b"h2".to_vec()];
    config
}

fn rustls_pemfile_certs(pem: &str) -> Vec<rustls::pki_types::CertificateDer<'static>> {
    rustls::pki_types::CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<_, _>>()
        .expect("PEM certificates")
}

/// Accepts TCP connections, completes each TLS handshake (recording how it went) and hands
/// the established streams to the gRPC server.
async fn accept_tls(
    listener: TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    conns: mpsc::UnboundedSender<tokio_rustls::server::TlsStream<tokio::net::TcpStream>>,
    shared: Arc<Shared>,
) {
    while let Ok((tcp, _)) = listener.accept().await {
        let acceptor = acceptor.clone();
        let conns = conns.clone();
        let shared = shared.clone();
        tokio::spawn(async move {
            let outcome = tokio::time::timeout(Duration::from_secs(5), acceptor.accept(tcp)).await;
            let record = |h| shared.handshakes.lock().unwrap().push(h);
            match outcome {
                Ok(Ok(stream)) => {
                    let (_, session) = stream.get_ref();
                    record(Handshake::Done {
                        version: session
                            .protocol_version()
                            .map_or_else(|| "none".into(), |v| format!("{v:?}")),
                        alpn: session
                            .alpn_protocol()
                            .map(|p| String::from_utf8_lossy(p).into_owned()),
                    });
                    let _ = conns.send(stream);
                }
                Ok(Err(err)) => record(Handshake::Failed(err.to_string())),
                Err(_) => record(Handshake::Failed("handshake timed out".into())),
            }
        });
    }
}
