//! Where the standalone backend connects: one fixed Redis, or the primary that Redis Sentinel
//! names, asked again at every reconnect.
//!
//! Why like this: after a failover the old primary is gone, or comes back as a replica that
//! answers writes with `READONLY`. The standalone backend already drops every connection when
//! one breaks or answers `READONLY` (`Shared::fail`) and re-makes them lazily, one attempt per
//! connection slot at most every `RECONNECT_BACKOFF`. So following a promotion needs only that
//! each (re)connect asks the sentinels first: `SENTINEL MASTER <name>` goes to the sentinels
//! (up to three at once, the configured order winning; [`ask`]), a primary they flag down is
//! skipped, and the node named must answer `ROLE` as a primary on the connection then made to
//! it, which is kept. A lookup is bounded by [`LOOKUP_TIMEOUT`], so a hung sentinel costs one
//! bounded attempt; callers are bounded by the decision deadline anyway.
//!
//! Sentinels are not trusted with sluice's memory: each answer is read within
//! [`MAX_REPLY_BYTES`] ([`reply`]), and a longer one fails that sentinel's part of the lookup
//! with the sentinel and the cap named. The named primary's `ROLE` goes through redis-rs: the
//! primary is the Redis sluice uses, trusted as much as every reply it sends.
//!
//! Replicas are never used: every decision writes, so only the primary can serve it.

mod ask;
mod reply;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::MultiplexedConnection;
use redis::{
    AsyncConnectionConfig, Client, ConnectionAddr, ConnectionInfo, IntoConnectionInfo, RedisError,
    RedisResult, TlsCertificates, Value,
};

pub use ask::MAX_REPLY_BYTES;
use ask::{Access, Answer, Endpoint};

use super::CONNECT_TIMEOUT;
use super::connect::{
    RedisOptions, SettingError, TlsFiles, Topology, ensure_crypto_provider, invalid,
    require_scheme, standalone_client, tcp_settings, tls_files,
};
use crate::sync::lock;

/// Longest time one master lookup may take: a sentinel's connect and reply, then the named
/// primary's connect and `ROLE` (1 s, [`CONNECT_TIMEOUT`], for each connect).
pub const LOOKUP_TIMEOUT: Duration = Duration::from_secs(2);

/// Port of a sentinel given without one.
pub const DEFAULT_SENTINEL_PORT: u16 = 26379;

/// Sentinels asked at once: the next ones are asked while a slow one is still waited on.
const CONCURRENT_LOOKUPS: usize = 3;

/// Where the standalone backend's connections go.
pub(super) enum Target {
    /// One Redis (or a proxy in front of one).
    Fixed(Client),
    /// The primary the sentinels name.
    Sentinel(Sentinel),
}

impl Target {
    /// The target `options` describe (standalone or Sentinel URL); fails on an invalid setting.
    pub(super) fn open(options: &RedisOptions) -> Result<Target, SettingError> {
        match options.topology() {
            Topology::Sentinel => Ok(Target::Sentinel(Sentinel::open(options)?)),
            Topology::Standalone | Topology::Cluster => {
                Ok(Target::Fixed(standalone_client(options)?))
            }
        }
    }

    /// A new multiplexed connection to the target (for Sentinel: to the primary named now).
    pub(super) async fn connect(
        &self,
        config: &AsyncConnectionConfig,
    ) -> RedisResult<MultiplexedConnection> {
        match self {
            Target::Fixed(client) => {
                client
                    .get_multiplexed_async_connection_with_config(config)
                    .await
            }
            Target::Sentinel(sentinel) => sentinel.connect(config).await,
        }
    }
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Fixed(client) => write!(f, "{}", client.get_connection_info().addr()),
            Target::Sentinel(sentinel) => write!(
                f,
                "sentinel master {} (primary {})",
                sentinel.master,
                lock(&sentinel.primary)
                    .as_deref()
                    .unwrap_or("not asked yet")
            ),
        }
    }
}

pub(super) struct Sentinel {
    /// The master name the sentinels know the primary by.
    master: String,
    /// In the order given: the first that names a primary wins.
    sentinels: Vec<Endpoint>,
    access: Access,
    /// The primary's credentials, database and TCP settings; its address is the sentinels'.
    primary_info: Box<ConnectionInfo>,
    /// TLS to the primary (`rediss+sentinel://`), and its certificates when any are given.
    primary_tls: Option<Option<TlsCertificates>>,
    /// Address of the primary last connected to, so that a change is logged once.
    primary: Mutex<Option<String>>,
}

impl Sentinel {
    fn open(options: &RedisOptions) -> Result<Sentinel, SettingError> {
        let url = options.url.as_str();
        require_scheme(url)?;
        ensure_crypto_provider();
        let parts = SentinelUrl::parse(url)?;
        let scheme = if parts.tls { "rediss" } else { "redis" };
        let db = parts.db.as_deref().unwrap_or("0");
        // redis-rs parses each sentinel as a one-node URL: host forms, ports, percent-encoded
        // credentials and the database are read exactly as for `redis://`.
        let infos = parts
            .sentinels
            .iter()
            .map(|host| format!("{scheme}://{}{host}/{db}", parts.userinfo).into_connection_info())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| invalid(url, e))?;
        let sentinels = infos
            .iter()
            .map(|info| match info.addr() {
                ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => {
                    Ok(Endpoint {
                        host: host
                            .trim_start_matches('[')
                            .trim_end_matches(']')
                            .to_owned(),
                        port: *port,
                    })
                }
                other => Err(invalid(url, format!("{other} is not a sentinel's address"))),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let first = infos
            .first()
            .ok_or_else(|| invalid(url, "no sentinel given"))?;
        let mut settings = first.redis_settings().clone();
        if let Some(password) = &options.password {
            settings = settings.set_password(password);
        }
        let primary_info = first
            .clone()
            .set_redis_settings(settings)
            .set_tcp_settings(tcp_settings());
        let files = tls_files(options)?;
        let tls = match parts.tls {
            true => Some(Arc::new(sentinel_tls(files.as_ref())?)),
            false => None,
        };
        Ok(Sentinel {
            master: parts.master,
            sentinels,
            access: Access {
                tls,
                user: options.sentinel_user.clone(),
                password: options.sentinel_password.clone(),
                connect_timeout: CONNECT_TIMEOUT,
            },
            primary_info: Box::new(primary_info),
            primary_tls: parts
                .tls
                .then(|| files.as_ref().map(TlsFiles::certificates)),
            primary: Mutex::new(None),
        })
    }

    async fn connect(&self, config: &AsyncConnectionConfig) -> RedisResult<MultiplexedConnection> {
        tokio::time::timeout(LOOKUP_TIMEOUT, self.lookup(config))
            .await
            .map_err(|_| {
                RedisError::from(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!(
                        "asking the sentinels for master {} took over {} ms",
                        self.master,
                        LOOKUP_TIMEOUT.as_millis()
                    ),
                ))
            })?
    }

    /// Asks the sentinels, in order, and connects to the first primary named that is one.
    /// Failing that, the error is one met on a primary named (the one an operator can act
    /// on), else the no-primary error if a sentinel answered, else what each sentinel did.
    async fn lookup(&self, config: &AsyncConnectionConfig) -> RedisResult<MultiplexedConnection> {
        // Collected before the stream is built: with the closure inside the stream, rustc
        // cannot prove the future `Send`. The futures are lazy: at most CONCURRENT_LOOKUPS run.
        let asks: Vec<_> = (self.sentinels.iter())
            .map(|sentinel| async move {
                (
                    sentinel,
                    ask::ask(sentinel, &self.access, &self.master).await,
                )
            })
            .collect();
        let mut answers = futures_util::stream::iter(asks).buffered(CONCURRENT_LOOKUPS);
        let mut primary_error = None;
        let mut answered = false;
        let mut failures = Vec::new();
        let mut checked = Vec::new();
        while let Some((sentinel, answer)) = answers.next().await {
            match answer {
                Ok(Answer::Primary { host, port }) => {
                    answered = true;
                    if checked.contains(&(host.clone(), port)) {
                        continue;
                    }
                    checked.push((host.clone(), port));
                    match self.connect_primary(host, port, config).await {
                        Ok(Some((addr, conn))) => {
                            self.note_primary(addr);
                            return Ok(conn);
                        }
                        Ok(None) => {}
                        Err(e) => primary_error = Some(e),
                    }
                }
                Ok(Answer::NoPrimary) => answered = true,
                Err(why) => failures.push(format!("sentinel {sentinel}: {why}")),
            }
        }
        Err(match primary_error {
            Some(e) => e,
            None if answered => no_primary(&self.master, &failures),
            None => RedisError::from(std::io::Error::other(format!(
                "asking the sentinels for master {}: {}",
                self.master,
                failures.join("; ")
            ))),
        })
    }

    /// A connection to the node at `host:port`, with its address, if it answers `ROLE` as a
    /// primary; `None` when it is a replica.
    async fn connect_primary(
        &self,
        host: String,
        port: u16,
        config: &AsyncConnectionConfig,
    ) -> RedisResult<Option<(String, MultiplexedConnection)>> {
        let node = Endpoint { host, port };
        let info = ConnectionInfo::clone(&self.primary_info);
        let client = match &self.primary_tls {
            None => Client::open(info.set_addr(ConnectionAddr::Tcp(node.host.clone(), port)))?,
            Some(certificates) => {
                let info = info.set_addr(ConnectionAddr::TcpTls {
                    host: node.host.clone(),
                    port,
                    insecure: false,
                    tls_params: None,
                });
                match certificates {
                    Some(certificates) => Client::build_with_tls(info, certificates.clone())?,
                    None => Client::open(info)?,
                }
            }
        };
        let mut conn = client
            .get_multiplexed_async_connection_with_config(config)
            .await?;
        let role: Value = redis::cmd("ROLE").query_async(&mut conn).await?;
        let is_primary = match &role {
            Value::Array(items) => match items.first() {
                Some(Value::BulkString(role)) => role == b"master",
                Some(Value::SimpleString(role)) => role == "master",
                _ => false,
            },
            _ => false,
        };
        Ok(is_primary.then(|| (node.to_string(), conn)))
    }

    /// Logs the primary the sentinels named, when it is the first or a new one.
    fn note_primary(&self, addr: String) {
        let mut primary = lock(&self.primary);
        match primary.as_deref() {
            Some(known) if known == addr => return,
            Some(known) => tracing::warn!(
                master = %self.master,
                from = %known,
                to = %addr,
                "redis sentinel: following a new primary"
            ),
            None => {
                tracing::info!(master = %self.master, primary = %addr, "redis sentinel: primary")
            }
        }
        *primary = Some(addr);
    }
}

/// The error of a lookup in which a sentinel answered but none named a usable primary: the
/// cases it covers are said, so an operator does not look for a typo only. What the other
/// sentinels did, if they failed, follows.
fn no_primary(master: &str, failures: &[String]) -> RedisError {
    let mut detail = format!(
        "master `{master}`: no sentinel knows it, each flags it down, or the node each \
         names is not a primary (ROLE answered replica)"
    );
    for failure in failures {
        detail.push_str("; ");
        detail.push_str(failure);
    }
    RedisError::from((
        redis::ErrorKind::MasterNameNotFoundBySentinel,
        "no sentinel named a primary",
        detail,
    ))
}

/// The TLS client config of the connections to the sentinels: the CA file's certificates, or
/// the system's roots; the client certificate when one is given (as redis-rs does for the
/// primary).
fn sentinel_tls(files: Option<&TlsFiles>) -> Result<rustls::ClientConfig, SettingError> {
    let tls_error = |e: &dyn std::fmt::Display| SettingError(format!("Sentinel TLS: {e}"));
    let mut roots = rustls::RootCertStore::empty();
    match files.and_then(|f| f.ca.as_ref()) {
        Some(ca) => ca.add_roots_to(&mut roots).map_err(|e| tls_error(&e))?,
        None => {
            roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
        }
    }
    let builder = rustls::ClientConfig::builder().with_root_certificates(roots);
    match files.and_then(|f| f.client.as_ref()) {
        Some((cert, key)) => {
            let chain = cert.certificates().map_err(|e| tls_error(&e))?;
            let key = key.private_key().map_err(|e| tls_error(&e))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| tls_error(&e))
        }
        None => Ok(builder.with_no_client_auth()),
    }
}

/// The parts of a `redis+sentinel://` / `rediss+sentinel://` URL.
#[derive(Debug, PartialEq, Eq)]
struct SentinelUrl {
    tls: bool,
    /// `user:password@` as written (empty when absent).
    userinfo: String,
    /// `host:port` of each sentinel ([`DEFAULT_SENTINEL_PORT`] when none is written).
    sentinels: Vec<String>,
    master: String,
    db: Option<String>,
}

impl SentinelUrl {
    fn parse(url: &str) -> Result<SentinelUrl, SettingError> {
        let (tls, rest) = match (
            url.strip_prefix("redis+sentinel://"),
            url.strip_prefix("rediss+sentinel://"),
        ) {
            (Some(rest), _) => (false, rest),
            (_, Some(rest)) => (true, rest),
            _ => {
                return Err(invalid(
                    url,
                    "not a redis+sentinel:// or rediss+sentinel:// URL",
                ));
            }
        };
        let (userinfo, rest) = match rest.rsplit_once('@') {
            Some((user, rest)) => (format!("{user}@"), rest),
            None => (String::new(), rest),
        };
        let missing_master = || {
            invalid(
                url,
                "the master name is missing (write .../master-name after the sentinels)",
            )
        };
        let (hosts, path) = rest.split_once('/').ok_or_else(missing_master)?;
        let mut path = path.trim_end_matches('/').splitn(2, '/');
        let master = path
            .next()
            .filter(|m| !m.is_empty())
            .ok_or_else(missing_master)?;
        let db = path.next().map(str::to_owned);
        let sentinels: Vec<String> = hosts
            .split(',')
            .filter(|h| !h.is_empty())
            .map(|host| {
                // A port follows the last `:` outside an IPv6 literal's brackets.
                let after_brackets = host.rsplit(']').next().unwrap_or(host);
                if after_brackets.contains(':') {
                    host.to_owned()
                } else {
                    format!("{host}:{DEFAULT_SENTINEL_PORT}")
                }
            })
            .collect();
        if sentinels.is_empty() {
            return Err(invalid(url, "no sentinel given"));
        }
        Ok(SentinelUrl {
            tls,
            userinfo,
            sentinels,
            master: master.to_owned(),
            db,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentinel_urls_name_the_sentinels_the_master_and_the_primary_credentials() {
        assert_eq!(
            SentinelUrl::parse("redis+sentinel://h1:26380,h2,[::1]/mymaster").unwrap(),
            SentinelUrl {
                tls: false,
                userinfo: String::new(),
                sentinels: vec!["h1:26380".into(), "h2:26379".into(), "[::1]:26379".into()],
                master: "mymaster".into(),
                db: None,
            }
        );
        let parsed = SentinelUrl::parse("rediss+sentinel://app:p@ss@h1:1/m/2/").unwrap();
        assert!(parsed.tls);
        assert_eq!(parsed.userinfo, "app:p@ss@");
        assert_eq!(parsed.master, "m");
        assert_eq!(parsed.db.as_deref(), Some("2"));
        for (bad, why) in [
            ("redis+sentinel://h1:1,h2:2", "master name is missing"),
            ("redis+sentinel://h1:1/", "master name is missing"),
            ("redis+sentinel:///m", "no sentinel given"),
            ("redis://h1:1/m", "not a redis+sentinel://"),
        ] {
            let err = SentinelUrl::parse(bad).expect_err(bad).to_string();
            assert!(err.contains(why), "{bad}: {err}");
        }
    }

    #[test]
    fn a_lookup_without_a_primary_names_the_replica_case_and_the_failed_sentinels() {
        let text = no_primary("mymaster", &[]).to_string();
        assert!(text.contains("master `mymaster`"), "{text}");
        assert!(text.contains("ROLE answered replica"), "{text}");
        assert!(!text.contains("Master with given name"), "{text}");
        let failed = ["sentinel 127.0.0.1:1: Connection refused (os error 111)".to_owned()];
        let text = no_primary("m", &failed).to_string();
        assert!(
            text.ends_with(
                "(ROLE answered replica); sentinel 127.0.0.1:1: Connection refused (os error 111)"
            ),
            "{text}"
        );
    }

    #[test]
    fn a_sentinel_target_is_built_without_connecting_and_hides_its_passwords() {
        let options = RedisOptions {
            sentinel_password: Some("sentinel-secret".into()),
            ..RedisOptions::new("redis+sentinel://app:s3cret@127.0.0.1:1,127.0.0.1:2/mymaster")
        };
        let target = Target::open(&options).expect("valid setting");
        assert!(matches!(target, Target::Sentinel(_)));
        let shown = format!("{target:?} {options:?}");
        assert!(shown.contains("mymaster"), "{shown}");
        assert!(
            !shown.contains("s3cret") && !shown.contains("sentinel-secret"),
            "{shown}"
        );
        let err = Target::open(&RedisOptions::new("redis+sentinel://h:notaport/m"))
            .expect_err("bad port");
        assert!(err.to_string().contains("invalid Redis URL"), "{err}");
    }
}
