//! Which backend decides `serve`'s requests (Redis, or the embedded memory one without a URL),
//! how a shared one is guarded, and what a request gets when it fails.

use std::path::PathBuf;
use std::time::Duration;

use clap::ValueEnum;
use sluice::app;
use sluice::decision::FailurePolicy;
use sluice::limiter::cache;
use sluice::limiter::guard;
use sluice::limiter::redis::{DEFAULT_BATCH_MAX, DEFAULT_POOL_SIZE, RedisOptions};
use sluice::server::{self, BackendSettings, StartError};

/// The Redis backend.
#[derive(clap::Args)]
pub(crate) struct RedisArgs {
    /// Redis URL: redis://[user[:password]@]host:port[/db] (rediss:// for TLS), a cluster:
    /// redis+cluster://[user[:password]@]host1:port1,host2:port2 (rediss+cluster:// for TLS), or
    /// the primary Sentinel names: redis+sentinel://[user[:password]@]host1:port1,host2:port2/
    /// master-name (rediss+sentinel:// for TLS). Without it the embedded in-memory backend serves
    /// (one instance only), and no other --redis-* setting may be given.
    #[arg(long, env = "SLUICE_REDIS_URL")]
    pub(super) redis_url: Option<String>,
    /// PEM file of the CA that signs the Redis server certificate (rediss only; default: the
    /// system roots).
    #[arg(long, env = "SLUICE_REDIS_CA_FILE")]
    pub(super) redis_ca_file: Option<PathBuf>,
    /// File holding the Redis password (trailing newline ignored); wins over
    /// SLUICE_REDIS_PASSWORD, which wins over a password in the URL. Keeps secrets off command
    /// lines and manifests.
    #[arg(long, env = "SLUICE_REDIS_PASSWORD_FILE")]
    pub(super) redis_password_file: Option<PathBuf>,
    /// PEM file of the client certificate (chain) presented to Redis, for servers that verify
    /// clients (rediss only; with --redis-tls-key).
    #[arg(long, env = "SLUICE_REDIS_TLS_CERT")]
    pub(super) redis_tls_cert: Option<PathBuf>,
    /// PEM file of the private key of --redis-tls-cert.
    #[arg(long, env = "SLUICE_REDIS_TLS_KEY")]
    pub(super) redis_tls_key: Option<PathBuf>,
    /// ACL user the sentinels are asked as (redis+sentinel only; default: no user).
    #[arg(long, env = "SLUICE_REDIS_SENTINEL_USER")]
    pub(super) redis_sentinel_user: Option<String>,
    /// File holding the sentinels' own password (redis+sentinel only); wins over
    /// SLUICE_REDIS_SENTINEL_PASSWORD. The primary's password is --redis-password-file's.
    #[arg(long, env = "SLUICE_REDIS_SENTINEL_PASSWORD_FILE")]
    pub(super) redis_sentinel_password_file: Option<PathBuf>,
    /// Replicas that must acknowledge each script call's writes (Redis WAIT, pipelined behind
    /// it) before its decisions are answered; fewer within the backend deadline fail the call
    /// (--on-backend-error answers). Keeps a failover from losing admitted entries; costs the
    /// replicas' acknowledgement on every call (docs/redis.md, "WAIT"). 0: no WAIT.
    #[arg(long, env = "SLUICE_REDIS_WAIT_REPLICAS", default_value_t = 0)]
    pub(super) redis_wait_replicas: u32,
    /// Redis connections kept open (multiplexed, round-robin). Two by default: concurrent
    /// decisions share script calls per connection, and fewer connections make fuller calls
    /// (docs/performance.md, "Connections").
    #[arg(long, env = "SLUICE_REDIS_POOL_SIZE", default_value_t = DEFAULT_POOL_SIZE)]
    pub(super) redis_pool_size: usize,
    /// Concurrent decisions sent to Redis in one script call at most (each still decided on its
    /// own, all-or-nothing); 1 sends one call per decision. Never waits for a batch to fill.
    #[arg(long, env = "SLUICE_REDIS_BATCH_MAX", default_value_t = DEFAULT_BATCH_MAX)]
    pub(super) redis_batch_max: usize,
}

impl RedisArgs {
    /// The Redis options these flags describe, `None` without a URL; reads the password files
    /// (or `SLUICE_REDIS_PASSWORD`, `SLUICE_REDIS_SENTINEL_PASSWORD` through `variable`).
    /// `redis_given` names the Redis-only settings given, refused without a URL.
    pub(super) fn options(
        &self,
        redis_given: &[String],
        variable: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Option<RedisOptions>, StartError> {
        let Some(url) = &self.redis_url else {
            if redis_given.is_empty() {
                return Ok(None);
            }
            return Err(StartError::RedisSettingWithoutUrl(redis_given.join(", ")));
        };
        Ok(Some(RedisOptions {
            ca_file: self.redis_ca_file.clone(),
            client_cert: app::client_cert(self.redis_tls_cert.clone(), self.redis_tls_key.clone())?,
            password: app::redis_password(
                self.redis_password_file.as_deref(),
                variable("SLUICE_REDIS_PASSWORD"),
            )?,
            sentinel_user: self.redis_sentinel_user.clone(),
            sentinel_password: app::sentinel_password(
                self.redis_sentinel_password_file.as_deref(),
                variable("SLUICE_REDIS_SENTINEL_PASSWORD"),
            )?,
            pool_size: self.redis_pool_size,
            batch_max: self.redis_batch_max,
            wait_replicas: self.redis_wait_replicas,
            ..RedisOptions::new(url)
        }))
    }
}

/// Any backend: its guard, its cache of rejections, its probe, its failure policy.
#[derive(clap::Args)]
pub(crate) struct BackendArgs {
    /// Per-decision backend deadline in milliseconds (Envoy's filter gives up at 20 ms).
    #[arg(long, env = "SLUICE_BACKEND_TIMEOUT_MS", default_value_t = guard::DEFAULT_DEADLINE.as_millis() as u64)]
    pub(super) backend_timeout_ms: u64,
    /// Backend calls allowed in flight (abandoned ones included); beyond it calls fail fast.
    #[arg(long, env = "SLUICE_BACKEND_MAX_IN_FLIGHT", default_value_t = guard::DEFAULT_MAX_IN_FLIGHT)]
    pub(super) backend_max_in_flight: usize,
    /// Answer when the backend fails or misses the deadline: error (UNAVAILABLE), allow (OK) or
    /// deny (OVER_LIMIT).
    #[arg(
        long,
        env = "SLUICE_ON_BACKEND_ERROR",
        value_enum,
        default_value = "error"
    )]
    pub(super) on_backend_error: OnBackendError,
    /// Keys kept in the local cache of keys known to be over their limit; 0 disables it.
    #[arg(long, env = "SLUICE_LOCAL_CACHE_SIZE", default_value_t = cache::DEFAULT_CAPACITY)]
    pub(super) local_cache_size: usize,
    /// Seconds between backend readiness probes.
    #[arg(long, env = "SLUICE_PROBE_INTERVAL_SECS", default_value_t = server::DEFAULT_PROBE_INTERVAL.as_secs())]
    pub(super) probe_interval_secs: u64,
}

impl BackendArgs {
    /// The backend settings, with `redis` (none: the memory backend).
    pub(super) fn settings(&self, redis: Option<RedisOptions>) -> BackendSettings {
        BackendSettings {
            redis,
            deadline: Duration::from_millis(self.backend_timeout_ms),
            max_in_flight: self.backend_max_in_flight,
            local_cache_size: self.local_cache_size,
        }
    }
}

#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum OnBackendError {
    Error,
    Allow,
    Deny,
}

impl From<OnBackendError> for FailurePolicy {
    fn from(p: OnBackendError) -> Self {
        match p {
            OnBackendError::Error => FailurePolicy::Error,
            OnBackendError::Allow => FailurePolicy::Allow,
            OnBackendError::Deny => FailurePolicy::Deny,
        }
    }
}
