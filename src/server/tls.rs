//! The gRPC server's TLS: its certificate and key from PEM files, client certificates verified
//! against CA files (and, optionally, a name they must carry), all reloaded when the files
//! change on disk.
//!
//! Why a handshake of our own instead of tonic's `tls_config`: tonic's server TLS takes its
//! identity once, when the server is built, and a Kubernetes Secret rotated in place (the
//! kubelet writes a new `..TIMESTAMP` directory and swaps the `..data` symlink, as for a
//! ConfigMap; see src/watcher.rs) would then need a restart. Here each accepted connection is
//! handshaken with the rustls config current at that moment ([`incoming`]), and [`watch`] polls
//! the files with the same [`crate::watcher`] as the config's reload, building a new config
//! when any of them changed.
//! Connections already open keep the session they negotiated; only new handshakes see the new
//! certificates. The whole config is swapped, not just the certificate: a rotated Secret may
//! bring a new CA for the client certificates too.
//!
//! A change that does not load (a file missing, a key that does not match the certificate, a
//! PEM without a certificate) is logged once and the previous certificates keep serving. The
//! files are read twice per change and must be equal both times, so a load never mixes the
//! certificate of one generation with the key of the next.
//!
//! Protocol: TLS 1.2 and 1.3 (Envoy's upstream TLS stops at 1.2 unless its cluster says
//! otherwise, and Envoy Gateway's does not), ALPN `h2` offered; a client that offers no ALPN
//! (Envoy's clusters do not) still speaks HTTP/2. Client certificates, when CA files are
//! given, are required and verified for client use (an extended key usage, when present, must
//! allow it: certificates without one, like Envoy Gateway's, are accepted); the name, when
//! given, must be one of the certificate's DNS or IP subject alternative names (a wildcard in
//! the certificate matches as in server names), as envoyproxy/ratelimit's
//! `GRPC_CLIENT_TLS_SAN` checks.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use futures_util::{Stream, StreamExt};
use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ParsedCertificate, WebPkiClientVerifier};
use rustls::{
    DigitallySignedStruct, DistinguishedName, RootCertStore, ServerConfig, SignatureScheme,
};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;

use crate::pem::{PemError, PemFile};
use crate::watcher::{self, Fingerprint, Source, Watcher};

/// Where the certificates are and how they are checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsSettings {
    /// PEM certificate chain of the server, leaf first (`--grpc-tls-cert`).
    pub cert: PathBuf,
    /// PEM private key of `cert`: PKCS#8, PKCS#1 (RSA) or SEC1 (EC) (`--grpc-tls-key`).
    pub key: PathBuf,
    /// PEM files of the CAs whose client certificates are accepted; empty: no client
    /// certificate is asked for (`--grpc-client-ca`).
    pub client_ca: Vec<PathBuf>,
    /// A DNS name or IP address the client certificate must carry (`--grpc-client-san`).
    pub client_san: Option<String>,
    /// How often the files are checked for changes.
    pub reload_interval: Duration,
}

impl TlsSettings {
    /// Server TLS from `cert` and `key`, no client certificates, checked every second.
    pub fn new(cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        TlsSettings {
            cert: cert.into(),
            key: key.into(),
            client_ca: Vec::new(),
            client_san: None,
            reload_interval: Duration::from_secs(1),
        }
    }
}

/// Why the certificates cannot be loaded; each message names the flag and the file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TlsError {
    #[error(transparent)]
    Pem(#[from] PemError),
    #[error("--grpc-tls-key {key} does not go with --grpc-tls-cert {cert}: {reason}")]
    Identity {
        cert: String,
        key: String,
        reason: String,
    },
    #[error(
        "--grpc-client-san needs --grpc-client-ca: without a CA no client certificate is asked for"
    )]
    SanWithoutCa,
    #[error("--grpc-client-san `{0}` is not a DNS name or an IP address")]
    BadSan(String),
    #[error("gRPC server TLS: {0}")]
    Rustls(String),
}

/// Every file, in a fixed order.
pub struct Files {
    cert: PemFile,
    key: PemFile,
    cas: Vec<PemFile>,
}

impl Files {
    fn read(s: &TlsSettings) -> Result<Files, TlsError> {
        Ok(Files {
            cert: PemFile::read("--grpc-tls-cert", &s.cert)?,
            key: PemFile::read("--grpc-tls-key", &s.key)?,
            cas: s
                .client_ca
                .iter()
                .map(|p| PemFile::read("--grpc-client-ca", p))
                .collect::<Result<_, _>>()?,
        })
    }

    fn fingerprint(&self) -> Fingerprint {
        let mut hash = Sha256::new();
        for file in [&self.cert, &self.key].into_iter().chain(&self.cas) {
            hash.update((file.bytes().len() as u64).to_le_bytes());
            hash.update(file.bytes());
        }
        hash.finalize().into()
    }
}

/// The rustls server config `files` describe.
fn build(s: &TlsSettings, files: &Files) -> Result<Arc<ServerConfig>, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain = files.cert.certificates()?;
    let key = files.key.private_key()?;
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Rustls(e.to_string()))?;
    let builder = if s.client_ca.is_empty() {
        builder.with_no_client_auth()
    } else {
        let mut roots = RootCertStore::empty();
        for ca in &files.cas {
            ca.add_roots_to(&mut roots)?;
        }
        let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
            .build()
            .map_err(|e| TlsError::Rustls(e.to_string()))?;
        let verifier: Arc<dyn ClientCertVerifier> = match &s.client_san {
            Some(name) => Arc::new(NameCheck {
                inner: verifier,
                name: server_name(name)?,
            }),
            None => verifier,
        };
        builder.with_client_cert_verifier(verifier)
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|e| TlsError::Identity {
            cert: s.cert.display().to_string(),
            key: s.key.display().to_string(),
            reason: e.to_string(),
        })?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

fn server_name(name: &str) -> Result<ServerName<'static>, TlsError> {
    ServerName::try_from(name.to_owned()).map_err(|_| TlsError::BadSan(name.to_owned()))
}

/// The CA verifier, then the name: the client certificate must be valid for `name` the way a
/// server certificate is for the name dialled.
#[derive(Debug)]
struct NameCheck {
    inner: Arc<dyn ClientCertVerifier>,
    name: ServerName<'static>,
}

impl ClientCertVerifier for NameCheck {
    fn offer_client_auth(&self) -> bool {
        self.inner.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.inner.client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self
            .inner
            .verify_client_cert(end_entity, intermediates, now)?;
        let parsed = ParsedCertificate::try_from(end_entity)?;
        rustls::client::verify_server_name(&parsed, &self.name)?;
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// What one check of the files did.
pub type Poll = watcher::Poll<Arc<ServerConfig>, TlsError>;

/// The gRPC server's current TLS config and what it was built from.
#[derive(Debug)]
pub struct ServerTls {
    settings: TlsSettings,
    current: ArcSwap<ServerConfig>,
    /// The fingerprint of the files `current` was built from at start-up.
    loaded: Fingerprint,
}

impl ServerTls {
    /// Checks the settings and loads the files: any problem stops the start-up.
    pub fn load(settings: TlsSettings) -> Result<Arc<ServerTls>, TlsError> {
        match &settings.client_san {
            Some(_) if settings.client_ca.is_empty() => return Err(TlsError::SanWithoutCa),
            Some(name) => {
                server_name(name)?;
            }
            None => {}
        }
        let files = Files::read(&settings)?;
        let config = build(&settings, &files)?;
        Ok(Arc::new(ServerTls {
            current: ArcSwap::new(config),
            loaded: files.fingerprint(),
            settings,
        }))
    }

    pub fn settings(&self) -> &TlsSettings {
        &self.settings
    }

    /// The config new handshakes use.
    pub fn config(&self) -> Arc<ServerConfig> {
        self.current.load_full()
    }

    /// Whether client certificates are required.
    pub fn verifies_clients(&self) -> bool {
        !self.settings.client_ca.is_empty()
    }

    /// A watcher of the files, which swaps a new config in when they changed and load.
    pub fn watcher(self: &Arc<Self>) -> Watcher<CertificateFiles> {
        Watcher::new(CertificateFiles(self.clone()), Some(self.loaded))
    }
}

/// The certificate, key and CA files as the [`crate::watcher`] polls them. A change is read
/// twice and must be equal both times ([`Source::settled`]), so a load never mixes the
/// certificate of one generation with the key of the next.
pub struct CertificateFiles(Arc<ServerTls>);

impl Source for CertificateFiles {
    type Files = Files;
    type Loaded = Arc<ServerConfig>;
    type Error = TlsError;

    fn read(&mut self) -> Result<(Fingerprint, Files), TlsError> {
        let files = Files::read(&self.0.settings)?;
        Ok((files.fingerprint(), files))
    }

    fn load(&mut self, files: &Files) -> Result<Arc<ServerConfig>, TlsError> {
        build(&self.0.settings, files)
    }

    fn settled(&mut self, _: &Files, print: Fingerprint) -> bool {
        Files::read(&self.0.settings).is_ok_and(|again| again.fingerprint() == print)
    }

    fn apply(&mut self, config: &Arc<ServerConfig>) {
        self.0.current.store(config.clone());
    }

    fn report(&self, poll: Poll) {
        match poll {
            Poll::Unchanged | Poll::Unsettled => {}
            Poll::Reloaded(_) => tracing::info!(
                cert = %self.0.settings.cert.display(),
                "gRPC TLS certificates reloaded: new connections use them"
            ),
            Poll::Rejected(error) => tracing::warn!(
                error = %error,
                "gRPC TLS certificates changed but do not load; the previous ones keep serving"
            ),
        }
    }
}

/// Polls the files every `reload_interval` until `stop` is cancelled, logging each reload and
/// each rejected change ([`watcher::run`]: on a thread of its own, never holding up shutdown).
pub async fn watch(tls: Arc<ServerTls>, stop: CancellationToken) {
    let interval = tls.settings.reload_interval;
    if let Err(error) = watcher::run("tls", tls.watcher(), interval, stop).await {
        tracing::error!(
            error = %error,
            "cannot start the gRPC TLS watcher; certificates are not reloaded"
        );
    }
}

/// Why a handshake did not complete.
enum Refused {
    /// The client closed before its hello: a TCP probe, nothing to report.
    Silent,
    Error(String),
}

/// The TLS connections of `conns`: each handshaken (concurrently, within `timeout`: the
/// server's `--request-timeout-ms`, the time a plaintext client has for its HTTP/2 preface)
/// with the config current when it was accepted. A failed handshake is logged (a client that
/// closes before saying anything only at debug level; the others rate-limited, see
/// [`HANDSHAKE_TARGET`]) and dropped; the stream goes on. Errors of `conns` pass through; the stream ends with `conns`, and dropping
/// it abandons the handshakes under way.
pub fn incoming<S, IO, E>(
    conns: S,
    tls: Arc<ServerTls>,
    peer: fn(&IO) -> Option<SocketAddr>,
    timeout: Duration,
) -> impl Stream<Item = Result<TlsStream<IO>, E>> + Send
where
    S: Stream<Item = Result<IO, E>> + Send + 'static,
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    E: Send + 'static,
{
    type Done<IO> = (Option<SocketAddr>, Result<TlsStream<IO>, Refused>);
    let state = (Box::pin(conns), JoinSet::<Done<IO>>::new());
    futures_util::stream::unfold(state, move |(mut conns, mut handshakes)| {
        let tls = tls.clone();
        async move {
            loop {
                tokio::select! {
                    conn = conns.next() => match conn {
                        Some(Ok(io)) => {
                            let from = peer(&io);
                            let acceptor = TlsAcceptor::from(tls.config());
                            handshakes.spawn(async move { (from, handshake(acceptor, io, timeout).await) });
                        }
                        Some(Err(e)) => return Some((Err(e), (conns, handshakes))),
                        None => return None,
                    },
                    Some(done) = handshakes.join_next(), if !handshakes.is_empty() => match done {
                        Ok((_, Ok(stream))) => return Some((Ok(stream), (conns, handshakes))),
                        Ok((from, Err(error))) => log_refused(from, &error),
                        Err(error) => tracing::warn!(error = %error, "gRPC TLS handshake task failed"),
                    },
                }
            }
        }
    })
}

async fn handshake<IO>(
    acceptor: TlsAcceptor,
    io: IO,
    timeout: Duration,
) -> Result<TlsStream<IO>, Refused>
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    match tokio::time::timeout(timeout, acceptor.accept(io)).await {
        Ok(Ok(stream)) => Ok(stream),
        Ok(Err(error)) if error.kind() == std::io::ErrorKind::UnexpectedEof => Err(Refused::Silent),
        Ok(Err(error)) => Err(Refused::Error(error.to_string())),
        Err(_) => Err(Refused::Error(format!(
            "no handshake within {} ms",
            timeout.as_millis()
        ))),
    }
}

/// The log target of refused handshakes, one of the rate-limited ones (`crate::logging`): a
/// client connecting in a loop with the wrong certificate, or speaking plain HTTP to the TLS
/// port, would otherwise write a line per connection.
pub const HANDSHAKE_TARGET: &str = "sluice::tls::handshake";

/// A refused client is worth a warning (a certificate of the wrong CA is a misconfiguration
/// an operator must see); one that closed before its hello (a TCP probe) is not.
fn log_refused(from: Option<SocketAddr>, refused: &Refused) {
    let peer = from.map_or_else(|| "unknown".to_owned(), |a| a.to_string());
    match refused {
        Refused::Silent => tracing::debug!(
            target: HANDSHAKE_TARGET,
            %peer,
            "gRPC TLS: connection closed before the handshake"
        ),
        Refused::Error(error) => tracing::warn!(
            target: HANDSHAKE_TARGET,
            %peer,
            %error,
            "gRPC TLS handshake refused"
        ),
    }
}

#[cfg(test)]
mod tests;
