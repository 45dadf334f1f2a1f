//! Admission decisions over an exact sliding-window log, behind one trait with two backends.
//!
//! Why a trait: the decision engine must not care where the log lives. `memory` keeps it in
//! process (the embedded default, no Redis needed); `redis` keeps it in sorted sets and decides
//! with one atomic Lua script per request. Both implement the same semantics, and one
//! conformance suite (tests/conformance.rs) runs against both (and the Redis Cluster backend).
//! Two wrappers implement the trait around a shared backend: [`guard`] (per-decision deadline,
//! bounded in-flight calls) and [`cache`] (local answers for requests certain to be rejected).
//!
//! Semantics shared by every backend, for one call with a batch of [`Hit`]s (described for the
//! default sliding log; each [`Algorithm`] defines its own `count` and `reset_ms`, see
//! [`algorithms`], and everything else below holds for all of them):
//! - An entry recorded at time `t` counts while `now - t < window_ms`.
//! - A `Consume` hit with `hits > 0` passes when `count + hits <= capacity` (the limit, or the
//!   GCRA burst; hits of earlier items of the same batch on the same key count too). `hits == 0`
//!   is a check-only probe: it passes when `count < capacity` and never records anything.
//! - The batch is all-or-nothing: it is admitted when every `Consume` item passes and, if it has
//!   `Quota` items, at least one of them passes; only then are the hits recorded (one entry per
//!   hit) and refunds applied. A rejected batch changes nothing.
//! - `Quota` items (envoyproxy/ratelimit's `quota_mode`) are checked like `Consume`; one over its
//!   limit fails the batch only when every `Quota` item of the batch is over. On an admitted batch
//!   they record their hits only if they passed themselves.
//! - `Shadow` items are checked like `Consume` but never veto the batch; on an admitted batch they
//!   record their hits only if they passed themselves, so their log is what enforcement would keep.
//! - `Refund` items never reject; on an admitted batch they remove up to `hits` of the key's newest
//!   entries.
//! - The clock: Redis uses its own `TIME` (instances with skewed clocks agree); the memory backend
//!   uses the [`Clock`] it was built with. Both also accept an explicit `now` for tests.

pub mod algorithms;
pub mod cache;
pub mod guard;
pub mod log;
pub mod memory;
pub mod redis;
pub mod window;

use async_trait::async_trait;

pub use algorithms::Algorithm;

/// How a batch item treats its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HitKind {
    Consume,
    Shadow,
    Refund,
    /// `quota_mode`: the batch needs at least one of its quota items to pass.
    Quota,
}

/// One limiter key's share of a decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hit {
    /// Limiter key from [`crate::descriptor::limiter_key`].
    pub key: String,
    pub limit: u64,
    pub window_ms: u64,
    pub hits: u64,
    pub kind: HitKind,
    /// How the key counts ([`algorithms`]); one batch may mix algorithms and stays
    /// all-or-nothing. For GCRA, `limit` is the rate per window and the burst the capacity.
    pub algorithm: Algorithm,
}

impl Hit {
    /// What the key may hold: the limit, or the burst for GCRA.
    pub fn capacity(&self) -> u64 {
        self.algorithm.capacity(self.limit)
    }
}

/// What the backend saw for one item, in the order of the batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyOutcome {
    /// This item's own check passed (always true for `Refund`).
    pub passed: bool,
    /// Entries in the key's window after the decision.
    pub count: u64,
    /// Milliseconds until the oldest entry in the window leaves it (when a slot frees);
    /// `window_ms` when the window is empty.
    pub reset_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchOutcome {
    /// Every `Consume` item passed and the batch was recorded.
    pub admitted: bool,
    pub items: Vec<KeyOutcome>,
    /// Who answered: the backend, or a wrapper in front of it without calling it. Wrappers
    /// report what they did here instead of calling a metrics library; the observer counts it.
    pub answered_by: AnsweredBy,
}

impl BatchOutcome {
    /// An outcome the backend itself decided.
    pub fn from_backend(admitted: bool, items: Vec<KeyOutcome>) -> Self {
        BatchOutcome {
            admitted,
            items,
            answered_by: AnsweredBy::Backend,
        }
    }
}

/// Who answered a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AnsweredBy {
    /// The backend decided (and recorded, when admitted).
    #[default]
    Backend,
    /// The local rejection cache ([`cache`]) knew the batch is rejected and answered without
    /// calling the backend.
    LocalCache,
}

/// A backend's own counters and gauges, read when `/metrics` is scraped. Backends return them
/// instead of calling a metrics library, so the limiter stays free of one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BackendStats {
    /// Scripts loaded again after the server answered `NOSCRIPT` (a restart, failover or
    /// `SCRIPT FLUSH`), since start.
    pub script_loads: u64,
    /// Connections the backend keeps (its pool size).
    pub connections: u64,
    /// Of those, slots holding a connection (one that broke silently counts until a call on it
    /// fails; it is then dropped and re-established by the next call on that slot).
    pub connected: u64,
    /// Calls sent and waiting for their reply.
    pub in_flight: u64,
    /// Calls waiting for a connection to be (re)established before they can be sent.
    pub waiting: u64,
    /// Script calls sent since start, and the decisions they carried: several when concurrent
    /// decisions were batched into one call.
    pub script_calls: u64,
    pub script_decisions: u64,
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum LimiterError {
    #[error("backend unavailable: {0}")]
    Unavailable(String),
    #[error("backend timed out after {0} ms")]
    Timeout(u64),
    #[error("backend replied with something unexpected: {0}")]
    Protocol(String),
    /// Too many backend calls in flight: refused without waiting, so no queue builds up.
    #[error("backend overloaded: too many calls in flight")]
    Overloaded,
}

/// A time source in milliseconds since the Unix epoch.
pub trait Clock: Send + Sync {
    fn now_ms(&self) -> u64;
}

/// The wall clock; the only place the memory backend reads time.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0)
    }
}

#[async_trait]
pub trait Limiter: Send + Sync {
    /// Decides a batch. `now_ms: None` uses the backend's own clock (Redis `TIME`, the memory
    /// backend's [`Clock`]); `Some(t)` decides as if the time were `t` ms since the Unix epoch
    /// (tests and property checks). Wrappers pass `now_ms` through unchanged.
    async fn decide(
        &self,
        batch: &[Hit],
        now_ms: Option<u64>,
    ) -> Result<BatchOutcome, LimiterError>;

    /// Cheap reachability probe for readiness.
    async fn ping(&self) -> Result<(), LimiterError>;

    /// Short backend name for logs and metrics ("memory", "redis").
    fn backend(&self) -> &'static str;

    /// Connection and script counters, for backends that have connections (`None` otherwise).
    fn stats(&self) -> Option<BackendStats> {
        None
    }
}
