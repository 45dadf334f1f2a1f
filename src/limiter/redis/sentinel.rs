//! Where the standalone backend connects: one fixed Redis, or the primary that Redis Sentinel
//! names, asked again at every reconnect.
//!
//! Why like this: after a failover the old primary is gone, or comes back as a replica that
//! answers writes with `READONLY`. The standalone backend already drops every connection when
//! one breaks or answers `READONLY` (`Shared::fail`) and re-makes them lazily, one attempt per
//! connection slot at most every `RECONNECT_BACKOFF`. So following a promotion needs only that
//! each (re)connect asks the sentinels first: redis-rs's `SentinelClient` sends `SENTINEL
//! MASTERS` to the sentinels (up to three at once, the configured order winning), skips a
//! primary they flag down, and checks with `ROLE` that the node named really is a primary. The
//! connection is then made to that node. A lookup is bounded by [`LOOKUP_TIMEOUT`], so a hung
//! sentinel costs one bounded attempt; callers are bounded by the decision deadline anyway.
//!
//! Replicas are never used: every decision writes, so only the primary can serve it.

use std::sync::Mutex;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{
    AsyncConnectionConfig, Client, ConnectionAddr, IntoConnectionInfo, RedisError, RedisResult,
    TlsMode,
};

use super::connect::{
    RedisOptions, SettingError, Topology, ensure_crypto_provider, invalid, require_scheme,
    standalone_client, tcp_settings, tls_certificates,
};
use crate::sync::lock;

/// Longest time one master lookup may take: a sentinel's connect and reply, then the named
/// primary's connect and `ROLE` (redis-rs allows 1 s for each connect).
pub const LOOKUP_TIMEOUT: Duration = Duration::from_secs(2);

/// Port of a sentinel given without one.
pub const DEFAULT_SENTINEL_PORT: u16 = 26379;

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
    client: tokio::sync::Mutex<SentinelClient>,
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
        let primary = infos
            .first()
            .map(|info| info.redis_settings().clone())
            .unwrap_or_default();
        let sentinels: Vec<ConnectionAddr> = infos.iter().map(|i| i.addr().clone()).collect();
        let mut builder =
            SentinelClientBuilder::new(sentinels, &parts.master, SentinelServerType::Master)
                .map_err(|e| invalid(url, e))?
                .set_client_to_redis_tcp_settings(tcp_settings())
                .set_client_to_sentinel_tcp_settings(tcp_settings());
        if let Some(user) = primary.username() {
            builder = builder.set_client_to_redis_username(user);
        }
        if let Some(password) = options.password.as_deref().or(primary.password()) {
            builder = builder.set_client_to_redis_password(password);
        }
        if primary.db() != 0 {
            builder = builder.set_client_to_redis_db(primary.db());
        }
        if let Some(user) = &options.sentinel_user {
            builder = builder.set_client_to_sentinel_username(user);
        }
        if let Some(password) = &options.sentinel_password {
            builder = builder.set_client_to_sentinel_password(password);
        }
        if parts.tls {
            builder = builder.set_client_to_redis_tls_mode(TlsMode::Secure);
        }
        if let Some(certificates) = tls_certificates(options)? {
            builder = builder
                .set_client_to_redis_certificates(certificates.clone())
                .set_client_to_sentinel_certificates(certificates);
        }
        Ok(Sentinel {
            master: parts.master,
            client: tokio::sync::Mutex::new(builder.build().map_err(|e| invalid(url, e))?),
            primary: Mutex::new(None),
        })
    }

    async fn connect(&self, config: &AsyncConnectionConfig) -> RedisResult<MultiplexedConnection> {
        let lookup = async {
            let mut sentinels = self.client.lock().await;
            sentinels.async_get_client().await
        };
        let client = tokio::time::timeout(LOOKUP_TIMEOUT, lookup)
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
            .map_err(|err| lookup_error(&self.master, err))?;
        self.note_primary(client.get_connection_info().addr().to_string());
        client
            .get_multiplexed_async_connection_with_config(config)
            .await
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

/// The error of a failed lookup, said as it happened. redis-rs answers "Master with given name
/// not found" whenever no sentinel named a usable primary, also when one named the master and
/// the node it named answered `ROLE` as a replica (a sentinel out of date, or misconfigured):
/// the message says which cases that covers, so an operator does not look for a typo only.
fn lookup_error(master: &str, err: RedisError) -> RedisError {
    if err.kind() != redis::ErrorKind::MasterNameNotFoundBySentinel {
        return err;
    }
    RedisError::from((
        redis::ErrorKind::MasterNameNotFoundBySentinel,
        "no sentinel named a primary",
        format!(
            "master `{master}`: no sentinel knows it, each flags it down, or the node each \
             names is not a primary (ROLE answered replica)"
        ),
    ))
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
    fn a_master_not_found_names_the_replica_case() {
        let not_found = RedisError::from((
            redis::ErrorKind::MasterNameNotFoundBySentinel,
            "Master with given name not found in sentinel",
        ));
        let text = lookup_error("mymaster", not_found).to_string();
        assert!(text.contains("master `mymaster`"), "{text}");
        assert!(text.contains("ROLE answered replica"), "{text}");
        assert!(!text.contains("Master with given name"), "{text}");
        let other = RedisError::from((redis::ErrorKind::Io, "connection refused"));
        let shown = other.to_string();
        assert_eq!(
            lookup_error("m", other).to_string(),
            shown,
            "other errors pass unchanged"
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
