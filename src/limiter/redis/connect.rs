//! Turning the Redis setting into redis-rs clients: standalone, cluster or Sentinel, TLS,
//! credentials.
//!
//! Why one place: the URL forms, the certificates and where the password comes from are the same
//! for every topology, and getting TLS or a secret wrong must not depend on which one is used.
//!
//! Forms of the setting:
//! - `redis://[user[:password]@]host:port[/db]`, `rediss://...` for TLS: one Redis.
//! - `redis+cluster://[user[:password]@]host1:port1,host2:port2,...` (`rediss+cluster://` for
//!   TLS): a Redis Cluster, given by any of its nodes (seeds); the rest is discovered.
//! - `redis+sentinel://[user[:password]@]host1:port1,host2:port2,.../master-name[/db]`
//!   (`rediss+sentinel://` for TLS to the sentinels and the primary): the primary that the
//!   sentinels name `master-name`, asked again at every reconnect ([`super::sentinel`]). The
//!   credentials in the URL are the primary's; the sentinels' own are
//!   [`RedisOptions::sentinel_user`] and [`RedisOptions::sentinel_password`].
//!
//! Secrets: a password in the URL works, but puts the secret on a command line or in a
//! manifest; [`RedisOptions::password`] (from `--redis-password-file` or `SLUICE_REDIS_PASSWORD`,
//! read by [`crate::app::redis_password`]) overrides it. The user name (not a secret) stays in
//! the URL.
//! TLS: `rediss` verifies the server against the system roots, or only against the PEM
//! certificates of [`RedisOptions::ca_file`] when given; [`RedisOptions::client_cert`] presents
//! a client certificate (mutual TLS). Every file is read, and its PEM checked, when the backend
//! is built: a missing or malformed one stops start-up instead of failing each connect.

use std::path::PathBuf;
use std::time::Duration;

use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::io::tcp::TcpSettings;
use redis::{Client, ClientTlsConfig, ConnectionInfo, IntoConnectionInfo, TlsCertificates};

use super::{DEFAULT_BATCH_MAX, DEFAULT_POOL_SIZE};
use crate::limiter::LimiterError;
use crate::pem::{self, PemError, PemFile};

/// Everything that says how to reach Redis and how to use it: the one argument of every Redis
/// backend constructor ([`super::RedisLimiter::open`], [`super::cluster::ClusterLimiter::open`]
/// and their `connect` forms).
#[derive(Clone)]
pub struct RedisOptions {
    /// One of the forms in this module's documentation; the scheme says the topology.
    pub url: String,
    /// PEM file of the CA(s) that sign the server certificate (`rediss` only).
    pub ca_file: Option<PathBuf>,
    /// Client certificate presented to Redis, for servers that verify clients (`rediss` only).
    pub client_cert: Option<ClientCert>,
    /// Overrides the URL's password.
    pub password: Option<String>,
    /// ACL user the sentinels are asked as (`+sentinel` only; none: the default user).
    pub sentinel_user: Option<String>,
    /// Password of the sentinels themselves (`+sentinel` only; none: no `AUTH` to them).
    pub sentinel_password: Option<String>,
    /// Connections kept open, multiplexed and used round-robin (at least 1). Standalone only:
    /// the cluster connection keeps one per node itself.
    pub pool_size: usize,
    /// Concurrent decisions sent in one script call at most; 0 or 1 sends each in a call of its
    /// own, from the caller's task. Standalone only.
    pub batch_max: usize,
    /// Replicas that must acknowledge a script call's writes (`WAIT`) before its decisions are
    /// answered; 0 sends no `WAIT`. Standalone and Sentinel only (see `super::durability`).
    pub wait_replicas: u32,
    /// `WAIT`'s own timeout; sluice sets it to the decision deadline.
    pub wait_timeout: Duration,
}

/// A client certificate chain and its private key, both PEM files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientCert {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// The deployment a Redis setting names, by its scheme.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Topology {
    Standalone,
    Cluster,
    Sentinel,
}

impl RedisOptions {
    /// `url` with no CA file and no password override, [`DEFAULT_POOL_SIZE`] connections and
    /// batches of up to [`DEFAULT_BATCH_MAX`].
    pub fn new(url: impl Into<String>) -> Self {
        RedisOptions {
            url: url.into(),
            ca_file: None,
            client_cert: None,
            password: None,
            sentinel_user: None,
            sentinel_password: None,
            pool_size: DEFAULT_POOL_SIZE,
            batch_max: DEFAULT_BATCH_MAX,
            wait_replicas: 0,
            wait_timeout: DEFAULT_WAIT_TIMEOUT,
        }
    }

    /// Whether the URL names a Redis Cluster (`redis+cluster://`, `rediss+cluster://`).
    pub fn is_cluster(&self) -> bool {
        self.topology() == Topology::Cluster
    }

    /// The topology the URL's scheme names (a URL without a `+` scheme is one Redis).
    pub fn topology(&self) -> Topology {
        let scheme = self.url.split_once("://").map_or("", |(scheme, _)| scheme);
        match scheme {
            "redis+cluster" | "rediss+cluster" => Topology::Cluster,
            "redis+sentinel" | "rediss+sentinel" => Topology::Sentinel,
            _ => Topology::Standalone,
        }
    }

    /// Whether the URL asks for TLS (`rediss`, `rediss+...`).
    pub fn is_tls(&self) -> bool {
        self.url.starts_with("rediss")
    }
}

/// `WAIT`'s timeout when none is set: the default decision deadline.
pub const DEFAULT_WAIT_TIMEOUT: Duration = crate::limiter::guard::DEFAULT_DEADLINE;

impl std::fmt::Debug for RedisOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisOptions")
            .field("url", &redact_url(&self.url))
            .field("ca_file", &self.ca_file)
            .field("client_cert", &self.client_cert)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("sentinel_user", &self.sentinel_user)
            .field(
                "sentinel_password",
                &self.sentinel_password.as_ref().map(|_| "***"),
            )
            .field("pool_size", &self.pool_size)
            .field("batch_max", &self.batch_max)
            .field("wait_replicas", &self.wait_replicas)
            .field("wait_timeout", &self.wait_timeout)
            .finish()
    }
}

/// A Redis setting that cannot work whatever the server does: a malformed URL, an unreadable
/// CA file. Found when the backend is built, before any connection is tried.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct SettingError(pub(super) String);

impl From<SettingError> for LimiterError {
    fn from(e: SettingError) -> Self {
        LimiterError::Unavailable(e.0)
    }
}

/// The URL forms accepted, as error messages show them.
pub const URL_FORMS: &str = "redis://[user[:password]@]host:port[/db], rediss://... (TLS), \
     redis+cluster://[user[:password]@]host1:port1,host2:port2 or rediss+cluster://... (TLS), \
     redis+sentinel://[user[:password]@]host1:port1,host2:port2/master-name or \
     rediss+sentinel://... (TLS)";

/// Attempts redis-rs makes for one cluster command (redirects and reconnects included).
pub const CLUSTER_RETRIES: u32 = 8;

const CLUSTER_SCHEMES: [(&str, &str); 2] = [
    ("redis+cluster://", "redis://"),
    ("rediss+cluster://", "rediss://"),
];

/// The node URLs of a cluster setting, or `None` for a standalone URL.
pub fn cluster_nodes(url: &str) -> Option<Vec<String>> {
    let (scheme, rest) = CLUSTER_SCHEMES
        .iter()
        .find_map(|(cluster, plain)| url.strip_prefix(cluster).map(|rest| (*plain, rest)))?;
    let (userinfo, hosts) = match rest.rsplit_once('@') {
        Some((u, h)) => (format!("{u}@"), h),
        None => (String::new(), rest),
    };
    let hosts = hosts.trim_end_matches('/');
    Some(
        hosts
            .split(',')
            .filter(|h| !h.is_empty())
            .map(|h| format!("{scheme}{userinfo}{h}"))
            .collect(),
    )
}

/// Hides the password of any accepted Redis setting: logs and errors never carry secrets.
/// A URL without a scheme (refused, but shown in the error) is redacted too.
pub fn redact_url(url: &str) -> String {
    let (scheme, rest) = match url.split_once("://") {
        Some((scheme, rest)) => (&url[..scheme.len() + 3], rest),
        None => ("", url),
    };
    match rest.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split_once(':').map_or(userinfo, |(u, _)| u);
            format!("{scheme}{user}:***@{host}")
        }
        None => url.to_owned(),
    }
}

pub(super) fn invalid(url: &str, e: impl std::fmt::Display) -> SettingError {
    SettingError(format!(
        "invalid Redis URL {}: {e}; accepted forms: {URL_FORMS}",
        redact_url(url)
    ))
}

/// Refuses a URL without a scheme (`localhost:6379`) with a message that says so: redis-rs
/// would only say that it did not parse.
pub(super) fn require_scheme(url: &str) -> Result<(), SettingError> {
    if url.contains("://") {
        return Ok(());
    }
    Err(invalid(
        url,
        "the scheme is missing (write redis://host:port, not host:port)",
    ))
}

/// rustls needs a process-wide crypto provider before any TLS config is built; installing it
/// twice is harmless (the second attempt is refused and ignored).
pub(super) fn ensure_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// The PEM files of the TLS connections `options` ask for, read and checked now.
pub(super) struct TlsFiles {
    /// `--redis-ca-file`: the only roots trusted when given.
    pub(super) ca: Option<PemFile>,
    /// `--redis-tls-cert` and `--redis-tls-key`.
    pub(super) client: Option<(PemFile, PemFile)>,
}

impl TlsFiles {
    /// The same files as redis-rs takes them.
    pub(super) fn certificates(&self) -> TlsCertificates {
        TlsCertificates {
            client_tls: self.client.as_ref().map(|(cert, key)| ClientTlsConfig {
                client_cert: cert.bytes().to_vec(),
                client_key: key.bytes().to_vec(),
            }),
            root_cert: self.ca.as_ref().map(|ca| ca.bytes().to_vec()),
        }
    }
}

/// The CA file and the client certificate of `options`, read and checked now; `None` when
/// neither is given (system roots, no client certificate). Refused for a URL without TLS,
/// where they would be ignored.
pub(super) fn tls_files(options: &RedisOptions) -> Result<Option<TlsFiles>, SettingError> {
    if options.ca_file.is_none() && options.client_cert.is_none() {
        return Ok(None);
    }
    if !options.is_tls() {
        let what = if options.ca_file.is_some() {
            "--redis-ca-file"
        } else {
            "--redis-tls-cert"
        };
        return Err(SettingError(format!(
            "{what} is given but the Redis URL {} does not use TLS (write rediss://, \
             rediss+cluster:// or rediss+sentinel://)",
            redact_url(&options.url)
        )));
    }
    let pem_error = |e: PemError| SettingError(e.to_string());
    let ca = options
        .ca_file
        .as_deref()
        .map(|path| pem::read_ca_bundle("--redis-ca-file", path))
        .transpose()
        .map_err(pem_error)?;
    let client = options
        .client_cert
        .as_ref()
        .map(|ClientCert { cert, key }| {
            pem::read_identity(("--redis-tls-cert", cert), ("--redis-tls-key", key))
        })
        .transpose()
        .map_err(pem_error)?;
    Ok(Some(TlsFiles { ca, client }))
}

/// [`tls_files`] as redis-rs takes them.
pub(super) fn tls_certificates(
    options: &RedisOptions,
) -> Result<Option<TlsCertificates>, SettingError> {
    Ok(tls_files(options)?.map(|files| files.certificates()))
}

fn with_password(info: ConnectionInfo, options: &RedisOptions) -> ConnectionInfo {
    match &options.password {
        Some(password) => {
            let settings = info.redis_settings().clone().set_password(password);
            info.set_redis_settings(settings)
        }
        None => info,
    }
}

/// `message` (of a failed connect or call), with what to check when it is a TLS handshake
/// failure: rustls names the TLS alert or the verification error, not the setting behind it.
pub(super) fn with_tls_hint(message: String) -> String {
    let hint = if message.contains("received fatal alert: CertificateRequired") {
        "Redis requires a client certificate: give --redis-tls-cert and --redis-tls-key"
    } else if message.contains("received fatal alert") {
        "Redis refused the TLS handshake: check that --redis-tls-cert is signed by a CA that Redis \
         trusts (its tls-ca-cert-file)"
    } else if message.contains("invalid peer certificate") {
        "the Redis server certificate is not trusted or does not name the host: check \
         --redis-ca-file and the URL's host"
    } else {
        return message;
    };
    format!("{message} ({hint})")
}

/// TCP settings of every connection to Redis: `TCP_NODELAY` on. redis-rs leaves Nagle's
/// algorithm on by default, and Nagle holds a small write back while an earlier small one on
/// the same connection is unacknowledged: where several calls share a connection at once (the
/// cluster connection pipelines them), a call would wait up to a network round trip for the
/// previous call's ACK. Every call is one complete command written at once, so there is nothing
/// for Nagle to coalesce.
pub(super) fn tcp_settings() -> TcpSettings {
    TcpSettings::default().set_nodelay(true)
}

/// Refuses the sentinels' credentials for a URL that names no sentinel: they would be ignored.
fn refuse_sentinel_settings(options: &RedisOptions) -> Result<(), SettingError> {
    if options.sentinel_user.is_none() && options.sentinel_password.is_none() {
        return Ok(());
    }
    Err(SettingError(format!(
        "a sentinel user or password is given but the Redis URL {} names no sentinels \
         (write redis+sentinel://host1:port1,host2:port2/master-name)",
        redact_url(&options.url)
    )))
}

/// A standalone client for `options.url` (not a cluster setting).
pub fn standalone_client(options: &RedisOptions) -> Result<Client, SettingError> {
    let url = options.url.as_str();
    require_scheme(url)?;
    refuse_sentinel_settings(options)?;
    ensure_crypto_provider();
    let info = with_password(
        url.into_connection_info().map_err(|e| invalid(url, e))?,
        options,
    )
    .set_tcp_settings(tcp_settings());
    match tls_certificates(options)? {
        Some(certificates) => Client::build_with_tls(info, certificates),
        None => Client::open(info),
    }
    .map_err(|e| invalid(url, e))
}

/// A cluster client for a `redis+cluster://` / `rediss+cluster://` setting.
pub fn cluster_client(
    options: &RedisOptions,
    connect_timeout: Duration,
    response_timeout: Duration,
) -> Result<ClusterClient, SettingError> {
    let url = options.url.as_str();
    require_scheme(url)?;
    refuse_sentinel_settings(options)?;
    ensure_crypto_provider();
    if options.wait_replicas > 0 {
        return Err(SettingError(
            "--redis-wait-replicas applies to one Redis or a Sentinel primary, not to a cluster \
             (each primary replicates on its own)"
                .into(),
        ));
    }
    let nodes = cluster_nodes(url)
        .ok_or_else(|| invalid(url, "not a redis+cluster:// or rediss+cluster:// URL"))?;
    if nodes.is_empty() {
        return Err(invalid(url, "no cluster node given"));
    }
    let infos = nodes
        .iter()
        .map(|n| n.as_str().into_connection_info())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid(url, e))?;
    // redis-rs retries (MOVED/ASK redirects, refreshes after a node failure) with waits up to
    // minutes by default; a rate-limit decision is worth milliseconds, so retries are few and
    // short. The caller's deadline bounds the wait anyway; this bounds the work behind it.
    let mut builder = ClusterClientBuilder::new(infos)
        .connection_timeout(connect_timeout)
        .response_timeout(response_timeout)
        .retries(CLUSTER_RETRIES)
        .min_retry_wait(10)
        .max_retry_wait(100)
        .tcp_settings(tcp_settings());
    if let Some(password) = &options.password {
        builder = builder.password(password);
    }
    if let Some(certificates) = tls_certificates(options)? {
        builder = builder.certs(certificates);
    }
    builder.build().map_err(|e| invalid(url, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_urls_name_every_seed_with_the_credentials() {
        assert_eq!(
            cluster_nodes("redis+cluster://app:pw@h1:7000,h2:7001/"),
            Some(vec![
                "redis://app:pw@h1:7000".to_string(),
                "redis://app:pw@h2:7001".to_string()
            ])
        );
        assert_eq!(
            cluster_nodes("rediss+cluster://h1:7000"),
            Some(vec!["rediss://h1:7000".to_string()])
        );
        assert_eq!(cluster_nodes("redis://h1:7000"), None);
    }

    #[test]
    fn passwords_never_reach_logs() {
        assert_eq!(redact_url("redis://:s3cret@h:6379"), "redis://:***@h:6379");
        assert_eq!(
            redact_url("rediss://app:p@ss@h:6379/0"),
            "rediss://app:***@h:6379/0"
        );
        assert_eq!(
            redact_url("redis+cluster://app:pw@h1:1,h2:2"),
            "redis+cluster://app:***@h1:1,h2:2"
        );
        assert_eq!(redact_url("redis://h:6379"), "redis://h:6379");
        assert_eq!(redact_url("app:s3cret@h:6379"), "app:***@h:6379");
        let options = RedisOptions {
            password: Some("s3cret".into()),
            ..RedisOptions::new("redis://:s3cret@h:6379")
        };
        assert!(!format!("{options:?}").contains("s3cret"));
    }

    #[test]
    fn errors_never_carry_the_password() {
        let err = standalone_client(&RedisOptions::new("redis://:s3cret@h:notaport"))
            .expect_err("bad port");
        assert!(!err.to_string().contains("s3cret"), "{err}");
    }

    #[test]
    fn a_url_without_scheme_says_so_and_shows_the_accepted_forms() {
        for options in [
            RedisOptions::new("localhost:6379"),
            RedisOptions::new("app:s3cret@localhost:6379"),
        ] {
            let err = standalone_client(&options).expect_err("no scheme");
            let text = err.to_string();
            assert!(text.contains("the scheme is missing"), "{text}");
            assert!(text.contains("redis://host:port"), "{text}");
            assert!(text.contains(URL_FORMS), "{text}");
            assert!(!text.contains("s3cret"), "{text}");
            let err = cluster_client(&options, Duration::from_secs(1), Duration::from_secs(1))
                .expect_err("no scheme");
            assert!(err.to_string().contains("the scheme is missing"), "{err}");
        }
        assert!(standalone_client(&RedisOptions::new("redis://localhost:6379")).is_ok());
        assert!(!RedisOptions::new("redis://h:1").is_cluster());
        assert!(RedisOptions::new("rediss+cluster://h:1,h:2").is_cluster());
    }
}
