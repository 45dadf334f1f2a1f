//! Redis limiter backend: the sliding-window log in sorted sets, shared by every sidecar.
//!
//! Why it looks like this: every batch is one `FCALL` of the decide function of
//! [`script::LIBRARY`] with all its keys, so the decision is atomic across keys and sidecars in
//! a single round trip. When Redis does not hold the function (after a restart without
//! persistence, a failover to a node that never had it, or `FUNCTION FLUSH`), the library is
//! loaded and the call sent once more, and the loads are counted
//! ([`BackendStats::script_loads`]).
//!
//! Connections: a few shared [`MultiplexedConnection`]s used round-robin, not a pool (why, and
//! why a couple rather than one or many: docs/redis.md, "Connections"). A connection
//! that fails in a way that needs a new one is dropped and re-established lazily by the next
//! request on that slot; while Redis is unreachable, reconnects of a slot are spaced by
//! [`RECONNECT_BACKOFF`] so requests fail fast instead of queueing on connect attempts.
//! A failed decision is never retried here: the script may have run before the connection broke.
//! Where a connection goes is the [`sentinel::Target`]: the one Redis of the URL, or, for a
//! `redis+sentinel://` URL, the primary the sentinels name at that moment, which is how a
//! failover is followed. With `--redis-wait-replicas`, every script call is followed by `WAIT`
//! (the `durability` module).
//!
//! Batching (the `batch` module): concurrent decisions are coalesced into one `FCALL` per
//! connection, so Redis pays the script call and the socket round trip once for several
//! decisions.
//!
//! Cost: an item costs O(1) inside the script whatever its hits (the sliding log stores one
//! member per recording item, carrying its hits as its weight, and keeps the key's total beside
//! the members), plus the entries that left the window since the key was last touched; the
//! quantized log costs O(window / quantum). Redis memory grows with the requests in a window,
//! never with their hits (docs/algorithms.md, "Weights").

mod batch;
pub mod cluster;
pub mod connect;
mod durability;
pub mod footprint;
pub mod script;
pub mod sentinel;
mod slot;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use std::time::Duration;

use async_trait::async_trait;
use redis::aio::MultiplexedConnection;
use redis::{self, AsyncConnectionConfig, ErrorKind, RedisError, ServerErrorKind, Value};

use super::{BackendStats, BatchOutcome, Item, Limiter, LimiterError};
pub use connect::{RedisOptions, SettingError};
use script::{DecideCall, LIBRARY, decode_reply, is_function_missing};

/// Time allowed to establish one connection.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// Time allowed for one reply; the caller usually applies a tighter deadline of its own.
pub const RESPONSE_TIMEOUT: Duration = Duration::from_secs(1);
/// Time allowed for `ping`, which readiness probes call.
pub const PING_TIMEOUT: Duration = Duration::from_millis(500);
/// Minimum spacing of reconnect attempts on one slot.
pub const RECONNECT_BACKOFF: Duration = Duration::from_millis(100);

/// One round-robin slot: the current connection, if any, re-established lazily.
type Slot = slot::Slot<MultiplexedConnection>;

pub struct RedisLimiter {
    shared: Arc<Shared>,
    /// One coalescing queue per slot (see [`batch`]); empty when batching is off.
    queues: Box<[batch::Queue]>,
    next: AtomicUsize,
}

/// What the limiter and its per-slot flush tasks share.
pub(super) struct Shared {
    /// One Redis, or the primary Sentinel names.
    target: sentinel::Target,
    /// The `WAIT` after each script call, if any.
    durability: durability::Durability,
    slots: Box<[Slot]>,
    /// Script calls sent, and the decisions they carried (their ratio is the mean batch).
    script_calls: AtomicU64,
    script_decisions: AtomicU64,
    script_loads: AtomicU64,
    in_flight: AtomicU64,
    /// Every connection is open and the library loaded: done once, by the first readiness
    /// probe that reaches Redis, so the first decisions do not pay connects and a load round
    /// trip inside their deadline.
    warmed: std::sync::atomic::AtomicBool,
}

/// Counts a call in a gauge for as long as the guard lives, however the call ends.
pub(super) struct Gauge<'a>(&'a AtomicU64);

impl<'a> Gauge<'a> {
    pub(super) fn enter(counter: &'a AtomicU64) -> Self {
        counter.fetch_add(1, Ordering::Relaxed);
        Gauge(counter)
    }
}

impl Drop for Gauge<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl std::fmt::Debug for RedisLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisLimiter")
            .field("target", &self.shared.target)
            .field("connections", &self.shared.slots.len())
            .field("batching", &!self.queues.is_empty())
            .finish_non_exhaustive()
    }
}

/// Requests coalesced into one script call at most, by default: enough to amortize the call
/// (measured: docs/performance.md), small enough that one call stays short inside Redis.
pub const DEFAULT_BATCH_MAX: usize = 16;

/// Connections kept open by default: concurrent decisions share script calls per connection,
/// and fewer connections make fuller calls (docs/performance.md, "Connections").
pub const DEFAULT_POOL_SIZE: usize = 2;

impl RedisLimiter {
    /// Builds the limiter; it connects on first use, so a sidecar can start (and report
    /// not-ready) while Redis is still down. Fails only on an invalid setting.
    pub fn open(options: &RedisOptions) -> Result<Self, SettingError> {
        let target = sentinel::Target::open(options)?;
        let slots: Box<[Slot]> = (0..options.pool_size.max(1))
            .map(|_| Slot::default())
            .collect();
        let batch_max = options.batch_max;
        let queues = if batch_max > 1 {
            (0..slots.len())
                .map(|slot| batch::Queue::new(slot, batch_max))
                .collect()
        } else {
            Box::default()
        };
        Ok(RedisLimiter {
            shared: Arc::new(Shared {
                target,
                durability: durability::Durability::new(options),
                slots,
                script_calls: AtomicU64::new(0),
                script_decisions: AtomicU64::new(0),
                script_loads: AtomicU64::new(0),
                warmed: std::sync::atomic::AtomicBool::new(false),
                in_flight: AtomicU64::new(0),
            }),
            queues,
            next: AtomicUsize::new(0),
        })
    }

    /// Like [`RedisLimiter::open`], then opens every connection: fails if Redis is unreachable.
    pub async fn connect(options: &RedisOptions) -> Result<Self, LimiterError> {
        let limiter = Self::open(options)?;
        for slot in limiter.shared.slots.iter() {
            limiter.shared.connection(slot).await?;
        }
        Ok(limiter)
    }

    fn next_slot(&self) -> usize {
        self.next.fetch_add(1, Ordering::Relaxed) % self.shared.slots.len()
    }

    async fn run(&self, batch: &[Item], now: Option<u64>) -> Result<BatchOutcome, LimiterError> {
        if batch.is_empty() {
            return Ok(BatchOutcome::from_backend(true, Vec::new()));
        }
        let slot = self.next_slot();
        match self.queues.get(slot) {
            Some(queue) => queue.submit(&self.shared, batch, now).await,
            None => self.shared.call_one(slot, batch, now).await,
        }
    }
}

impl Shared {
    /// Sends `batch` in a script call of its own on slot `slot`, from the caller's task.
    pub(super) async fn call_one(
        &self,
        slot: usize,
        batch: &[Item],
        now: Option<u64>,
    ) -> Result<BatchOutcome, LimiterError> {
        let mut fcall = self.fcall(1);
        DecideCall::single(batch, now).write(&mut fcall);
        let reply = self.call(slot, &mut fcall).await?;
        decode_reply(&reply, batch.len())
    }

    /// An `FCALL` of the decide function, counted as a call carrying `decisions` decisions.
    pub(super) fn fcall(&self, decisions: usize) -> redis::Cmd {
        self.script_calls.fetch_add(1, Ordering::Relaxed);
        self.script_decisions
            .fetch_add(decisions as u64, Ordering::Relaxed);
        LIBRARY.fcall()
    }

    /// Sends `cmd` on slot `slot`; when Redis does not hold the function, loads the library and
    /// sends it once more (the function did not run, so this cannot record anything twice).
    pub(super) async fn call(
        &self,
        slot: usize,
        cmd: &mut redis::Cmd,
    ) -> Result<Value, LimiterError> {
        let slot = &self.slots[slot];
        let mut conn = self.connection(slot).await?;
        let _in_flight = Gauge::enter(&self.in_flight);
        match self.durability.query(&mut conn, cmd).await {
            Ok(reply) => Ok(reply),
            Err(e) if is_function_missing(&e) => {
                self.script_loads.fetch_add(1, Ordering::Relaxed);
                LIBRARY
                    .load()
                    .query_async::<Value>(&mut conn)
                    .await
                    .map_err(|e| self.fail(slot, &e))?;
                self.durability
                    .query(&mut conn, cmd)
                    .await
                    .map_err(|e| self.fail(slot, &e))
            }
            Err(e) => Err(self.fail(slot, &e)),
        }
    }

    /// Opens every connection and loads the library (see `warmed`).
    async fn warm(&self) -> Result<(), LimiterError> {
        let mut first = None;
        for slot in self.slots.iter() {
            let conn = self.connection(slot).await?;
            first.get_or_insert((slot, conn));
        }
        if let Some((slot, mut conn)) = first {
            match LIBRARY.load().query_async::<Value>(&mut conn).await {
                Ok(_) => {
                    self.script_loads.fetch_add(1, Ordering::Relaxed);
                }
                // Redis out of memory refuses `FUNCTION LOAD` but is reachable: the probe
                // passes, and the next one tries again (decisions meanwhile are refused with
                // OOM, the function loaded or not).
                Err(e) if e.code() == Some("OOM") => return Ok(()),
                Err(e) => return Err(self.fail(slot, &e)),
            }
        }
        self.warmed.store(true, Ordering::Relaxed);
        Ok(())
    }

    async fn connection(&self, slot: &Slot) -> Result<MultiplexedConnection, LimiterError> {
        slot.connection("redis", || {
            let config = AsyncConnectionConfig::new()
                .set_connection_timeout(Some(CONNECT_TIMEOUT))
                .set_response_timeout(Some(RESPONSE_TIMEOUT));
            async move { self.target.connect(&config).await }
        })
        .await
    }

    /// Maps a request error and drops connections that cannot be used again. A dropped or
    /// broken connection almost always means the server went away (restart, failover), and then
    /// every slot's connection is dead too: they are all dropped at once, so one failed call,
    /// not one per slot, pays for the restart. `READONLY` means the node was demoted to a
    /// replica (a failover): every connection goes too, and the next ones are made to the
    /// primary (for Sentinel, the one the sentinels name then).
    fn fail(&self, slot: &Slot, e: &RedisError) -> LimiterError {
        let demoted = e.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly);
        if e.is_connection_dropped() || e.is_io_error() || demoted {
            for other in self.slots.iter() {
                other.disconnect();
            }
        } else if e.is_unrecoverable_error() {
            slot.disconnect();
        }
        map_error(e)
    }
}

pub(crate) fn map_error(e: &RedisError) -> LimiterError {
    if e.is_timeout() {
        return LimiterError::Timeout(RESPONSE_TIMEOUT.as_millis() as u64);
    }
    if let Some(code @ "WRONGTYPE") = e.code() {
        return script::refusal(code, e.detail());
    }
    // A Redis before 7.0 has no functions, and cannot compile the scripts' declaration line
    // (`#!lua`).
    if e.detail().is_some_and(|d| {
        d.contains("Error compiling script") || d.starts_with("unknown command 'FUNCTION'")
    }) {
        return LimiterError::Protocol(format!("{e} (sluice's scripts need Redis 7.0 or later)"));
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
        _ => LimiterError::Unavailable(connect::with_tls_hint(e.to_string())),
    }
}

#[async_trait]
impl Limiter for RedisLimiter {
    async fn decide(
        &self,
        batch: &[Item],
        now_ms: Option<u64>,
    ) -> Result<BatchOutcome, LimiterError> {
        crate::limiter::check_holds(batch)?;
        self.run(batch, now_ms).await
    }

    async fn ping(&self) -> Result<(), LimiterError> {
        slot::probe_within_timeout(async {
            let shared = &self.shared;
            let slot = &shared.slots[self.next_slot()];
            let mut conn = shared.connection(slot).await?;
            let first: Result<String, _> = redis::cmd("PING").query_async(&mut conn).await;
            let reply: String = match first {
                Ok(reply) => reply,
                Err(e) => {
                    // After a Redis restart every slot still holds its dead connection; a probe
                    // that found one (now dropped) tries a fresh one at once, so readiness
                    // follows Redis instead of the round-robin.
                    shared.fail(slot, &e);
                    let mut conn = shared.connection(slot).await?;
                    redis::cmd("PING")
                        .query_async(&mut conn)
                        .await
                        .map_err(|e| shared.fail(slot, &e))?
                }
            };
            if reply != "PONG" {
                return Err(LimiterError::Protocol(format!("PING answered {reply:?}")));
            }
            if !shared.warmed.load(Ordering::Relaxed) {
                shared.warm().await?;
            }
            Ok(())
        })
        .await
    }

    fn name(&self) -> &'static str {
        "redis"
    }

    fn stats(&self) -> Option<BackendStats> {
        let shared = &self.shared;
        let connected = shared.slots.iter().filter(|s| s.is_connected()).count();
        Some(BackendStats {
            script_loads: shared.script_loads.load(Ordering::Relaxed),
            connections: shared.slots.len() as u64,
            connected: connected as u64,
            in_flight: shared.in_flight.load(Ordering::Relaxed),
            waiting: shared.slots.iter().map(Slot::waiting).sum(),
            script_calls: shared.script_calls.load(Ordering::Relaxed),
            script_decisions: shared.script_decisions.load(Ordering::Relaxed),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server_error(reply: &[u8]) -> RedisError {
        match redis::parse_redis_value(reply).expect("an error reply parses") {
            Value::ServerError(e) => e.into(),
            other => panic!("not an error: {other:?}"),
        }
    }

    #[test]
    fn script_errors_say_whose_fault_they_are() {
        let wrong_type =
            server_error(b"-WRONGTYPE Operation against a key holding the wrong kind of value\r\n");
        assert!(
            matches!(map_error(&wrong_type), LimiterError::Refused(m) if m.starts_with("WRONGTYPE"))
        );
        let oom = server_error(b"-OOM command not allowed when used memory > 'maxmemory'.\r\n");
        assert!(matches!(map_error(&oom), LimiterError::Unavailable(_)));
        // What Redis 6 answers to SCRIPT LOAD of a declared script, and to FUNCTION LOAD.
        let old = server_error(
            b"-ERR Error compiling script (new function): user_script:1: unexpected symbol near '#'\r\n",
        );
        assert!(
            matches!(map_error(&old), LimiterError::Protocol(m) if m.contains("Redis 7.0 or later"))
        );
        let old = server_error(
            b"-ERR unknown command 'FUNCTION', with args beginning with: 'LOAD' 'REPLACE' \r\n",
        );
        assert!(
            matches!(map_error(&old), LimiterError::Protocol(m) if m.contains("Redis 7.0 or later"))
        );
        let missing = server_error(b"-ERR Function not found\r\n");
        assert!(script::is_function_missing(&missing));
        assert!(!script::is_function_missing(&old));
    }
}
