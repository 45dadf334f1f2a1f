//! Redis limiter backend: the sliding-window log in sorted sets, shared by every sidecar.
//!
//! Why it looks like this: every batch is one `EVALSHA` of [`script::SCRIPT`] with all its keys,
//! so the decision is atomic across keys and sidecars in a single round trip; redis-rs's
//! `Script` falls back to loading the script on `NOSCRIPT` (after a restart or `SCRIPT FLUSH`).
//!
//! Connections: a few shared [`MultiplexedConnection`]s used round-robin, not a pool. A
//! multiplexed connection already carries any number of concurrent requests, so a pool adds
//! nothing but its checkout, and deadpool-redis 0.23 makes that checkout cost a round trip: its
//! `recycle` always sends `UNWATCH` + `PING` and has no fast recycling method to turn that off.
//! Several connections (rather than one) spread the encoding/decoding work over several driver
//! tasks. A connection that fails in a way that needs a new one is dropped and re-established
//! lazily by the next request on that slot; while Redis is unreachable, reconnects of a slot are
//! spaced by [`RECONNECT_BACKOFF`] so requests fail fast instead of queueing on connect attempts.
//! A failed decision is never retried here: the script may have run before the connection broke.
//!
//! Cost: recording stores one member per hit, so an admitted item costs O(hits) inside the
//! script (Redis is blocked meanwhile). Limits, which bound the hits an item can record, must
//! therefore stay reasonable (config validation's job); the memory backend has no such cost.

pub mod cluster;
pub mod connect;
pub mod script;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use redis::aio::MultiplexedConnection;
use redis::{
    self, AsyncConnectionConfig, Client, ErrorKind, RedisError, Script, ServerErrorKind, Value,
};

use super::{BatchOutcome, Hit, HitKind, Limiter, LimiterError};
pub use connect::RedisOptions;
use script::{decode_reply, KIND_CONSUME, KIND_REFUND, KIND_SHADOW, MAX_EXACT, SCRIPT};

/// Time allowed to establish one connection.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// Time allowed for one reply; the caller usually applies a tighter deadline of its own.
pub const RESPONSE_TIMEOUT: Duration = Duration::from_secs(1);
/// Time allowed for `ping`, which readiness probes call.
pub const PING_TIMEOUT: Duration = Duration::from_millis(500);
/// Minimum spacing of reconnect attempts on one slot.
pub const RECONNECT_BACKOFF: Duration = Duration::from_millis(100);

/// One round-robin slot: the current connection, if any, and when connecting last failed.
#[derive(Default)]
struct Slot {
    conn: Mutex<Option<MultiplexedConnection>>,
    failed_at: Mutex<Option<Instant>>,
    /// Serializes reconnects of this slot so a burst of requests makes one attempt, not many.
    connecting: tokio::sync::Mutex<()>,
}

/// The std mutexes here guard plain values and are never held across an await; a poisoned one
/// still holds a valid value.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

pub struct RedisLimiter {
    client: Client,
    slots: Box<[Slot]>,
    next: AtomicUsize,
    script: Script,
}

impl std::fmt::Debug for RedisLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisLimiter")
            .field("addr", &self.client.get_connection_info().addr())
            .field("connections", &self.slots.len())
            .finish_non_exhaustive()
    }
}

impl RedisLimiter {
    /// Opens `pool_size` (at least 1) connections to `url` and fails if Redis is unreachable.
    pub async fn connect(url: &str, pool_size: usize) -> Result<Self, LimiterError> {
        Self::connect_with(url, &RedisOptions::default(), pool_size).await
    }

    /// [`RedisLimiter::connect`] with TLS and credential options.
    pub async fn connect_with(
        url: &str,
        options: &RedisOptions,
        pool_size: usize,
    ) -> Result<Self, LimiterError> {
        let limiter = Self::open_with(url, options, pool_size)?;
        for slot in limiter.slots.iter() {
            limiter.connection(slot).await?;
        }
        Ok(limiter)
    }

    /// Like [`RedisLimiter::connect`] but connects on first use, so a sidecar can start (and
    /// report not-ready) while Redis is still down. Fails only on an invalid URL.
    pub fn open(url: &str, pool_size: usize) -> Result<Self, LimiterError> {
        Self::open_with(url, &RedisOptions::default(), pool_size)
    }

    /// [`RedisLimiter::open`] with TLS and credential options.
    pub fn open_with(
        url: &str,
        options: &RedisOptions,
        pool_size: usize,
    ) -> Result<Self, LimiterError> {
        let client = connect::standalone_client(url, options)?;
        let slots = (0..pool_size.max(1)).map(|_| Slot::default()).collect();
        Ok(RedisLimiter {
            client,
            slots,
            next: AtomicUsize::new(0),
            script: Script::new(SCRIPT),
        })
    }

    fn slot(&self) -> &Slot {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.slots.len();
        &self.slots[i]
    }

    async fn connection(&self, slot: &Slot) -> Result<MultiplexedConnection, LimiterError> {
        if let Some(conn) = lock(&slot.conn).clone() {
            return Ok(conn);
        }
        let _connecting = slot.connecting.lock().await;
        if let Some(conn) = lock(&slot.conn).clone() {
            return Ok(conn);
        }
        if let Some(at) = *lock(&slot.failed_at) {
            if at.elapsed() < RECONNECT_BACKOFF {
                return Err(LimiterError::Unavailable(
                    "redis unreachable (reconnect backing off)".into(),
                ));
            }
        }
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(CONNECT_TIMEOUT))
            .set_response_timeout(Some(RESPONSE_TIMEOUT));
        match self
            .client
            .get_multiplexed_async_connection_with_config(&config)
            .await
        {
            Ok(conn) => {
                *lock(&slot.failed_at) = None;
                *lock(&slot.conn) = Some(conn.clone());
                Ok(conn)
            }
            Err(e) => {
                *lock(&slot.failed_at) = Some(Instant::now());
                Err(map_error(&e))
            }
        }
    }

    /// Maps a request error and drops the slot's connection when it cannot be used again.
    fn fail(&self, slot: &Slot, e: &RedisError) -> LimiterError {
        if e.is_unrecoverable_error() || e.is_connection_dropped() || e.is_io_error() {
            *lock(&slot.conn) = None;
        }
        map_error(e)
    }

    async fn run(&self, batch: &[Hit], now: Option<u64>) -> Result<BatchOutcome, LimiterError> {
        if batch.is_empty() {
            return Ok(BatchOutcome {
                admitted: true,
                items: Vec::new(),
            });
        }
        let invocation = invocation(&self.script, batch, now);
        let slot = self.slot();
        let mut conn = self.connection(slot).await?;
        let reply: Value = invocation
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.fail(slot, &e))?;
        decode_reply(&reply, batch.len())
    }
}

/// The `EVALSHA` of [`SCRIPT`] for `batch` (argument layout documented there).
pub(crate) fn invocation<'s>(
    script: &'s Script,
    batch: &[Hit],
    now: Option<u64>,
) -> redis::ScriptInvocation<'s> {
    let mut invocation = script.prepare_invoke();
    invocation.arg(now.map_or_else(String::new, |n| n.min(MAX_EXACT).to_string()));
    for hit in batch {
        // Lua numbers are doubles: every number is capped at 2^52 so sums stay exact.
        // Limits cap one below hits, so that a clamped huge `hits` still fails like the
        // original, and still counts as at least any limit for later items on the key.
        let limit = hit.limit.min(MAX_EXACT - 1);
        let kind = match hit.kind {
            HitKind::Consume => KIND_CONSUME,
            HitKind::Shadow => KIND_SHADOW,
            HitKind::Refund => KIND_REFUND,
        };
        let hits = hit.hits.min(MAX_EXACT);
        invocation
            .key(hit.key.as_str())
            .arg(limit)
            .arg(hit.window_ms.min(MAX_EXACT))
            .arg(hits)
            .arg(kind);
    }
    invocation
}

pub(crate) fn map_error(e: &RedisError) -> LimiterError {
    if e.is_timeout() {
        return LimiterError::Timeout(RESPONSE_TIMEOUT.as_millis() as u64);
    }
    match e.kind() {
        // The server answered, but not with what the script promises: a bug, not an outage.
        ErrorKind::Parse
        | ErrorKind::UnexpectedReturnType
        | ErrorKind::Server(ServerErrorKind::ResponseError) => {
            LimiterError::Protocol(e.to_string())
        }
        ErrorKind::Extension if !matches!(e.code(), Some("OOM" | "BUSY")) => {
            LimiterError::Protocol(e.to_string())
        }
        // I/O, loading, read-only replica, OOM, busy script, ...: Redis cannot serve us now.
        _ => LimiterError::Unavailable(e.to_string()),
    }
}

#[async_trait]
impl Limiter for RedisLimiter {
    async fn decide(&self, batch: &[Hit]) -> Result<BatchOutcome, LimiterError> {
        self.run(batch, None).await
    }

    async fn decide_at(&self, batch: &[Hit], now_ms: u64) -> Result<BatchOutcome, LimiterError> {
        self.run(batch, Some(now_ms)).await
    }

    async fn ping(&self) -> Result<(), LimiterError> {
        let attempt = async {
            let slot = self.slot();
            let mut conn = self.connection(slot).await?;
            let reply: String = redis::cmd("PING")
                .query_async(&mut conn)
                .await
                .map_err(|e| self.fail(slot, &e))?;
            if reply == "PONG" {
                Ok(())
            } else {
                Err(LimiterError::Protocol(format!("PING answered {reply:?}")))
            }
        };
        tokio::time::timeout(PING_TIMEOUT, attempt)
            .await
            .map_err(|_| LimiterError::Timeout(PING_TIMEOUT.as_millis() as u64))?
    }

    fn backend(&self) -> &'static str {
        "redis"
    }
}
