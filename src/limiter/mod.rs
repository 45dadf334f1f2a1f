//! Admission decisions over an exact sliding-window log, behind one trait with two backends.
//!
//! Why a trait: the decision engine must not care where the log lives. `memory` keeps it in
//! process (the embedded default, no Redis needed); `redis` keeps it in sorted sets and decides
//! with one atomic Lua script per request. Both implement the same semantics, and one
//! conformance suite (tests/it/conformance.rs) runs against both (and the Redis Cluster backend).
//! Two wrappers implement the trait around a shared backend: [`guard`] (per-decision deadline,
//! bounded in-flight calls) and [`cache`] (local answers for requests certain to be rejected).
//!
//! Semantics shared by every backend, for one call with a batch of [`Item`]s (described for the
//! default sliding log; each [`Algorithm`] defines its own `count` and `reset_ms`, see
//! [`algorithms`], and everything else below holds for all of them):
//! - An entry recorded at time `t` counts while `now - t < window_ms`. An entry carries a
//!   weight, the hits one item recorded: a request with `hits_addend: 2000` is one entry of
//!   weight 2000, and a key's `count` is the sum of the weights in its window. Memory and time
//!   grow with the entries (recording requests), never with the hits.
//! - Check, per item in batch order: `seen` is the key's count plus what the batch's earlier
//!   items on the same key record if the batch is admitted. A `Consume`, `Shadow` or `Quota`
//!   item passes when `seen + hits <= capacity` (the limit, or the GCRA burst). `hits == 0` is a
//!   check-only probe: it passes when `seen < capacity` and never records anything.
//! - The batch is all-or-nothing as a verdict: it is admitted when every `Consume` item passes
//!   and, if it has `Quota` items, at least one of them passes.
//! - What an item records (its take), in batch order, after the verdict:
//!   - admitted batch: a `Consume` item, and a `Shadow` or `Quota` item that passed, records
//!     its `hits`; `Refund` items remove up to `hits` of the key's newest weight (splitting an
//!     entry when they take only part of it). A `Shadow` or `Quota` item that did not pass
//!     records what its [`OverLimit`] says (below);
//!   - rejected batch: every non-refund item records what its [`OverLimit`] says, refunds
//!     nothing. With [`OverLimit::Fill`] (the default) that is: each item that did not fit
//!     fills its key to capacity, and nothing else is recorded;
//!   - [`OverLimit::Refuse`]: nothing (sluice's classic "a rejected request records nothing");
//!     [`OverLimit::Fill`]: an item that did not pass records as much of its cost as fits,
//!     `min(hits, capacity - seen')`, `seen'` counting the earlier items as this verdict records
//!     them (a 1-hit rejection records 0: its key was full); one that passed records nothing;
//!     [`OverLimit::Record`]: its whole cost, even past the limit (exact accounting, as
//!     envoyproxy/ratelimit, which records every hit);
//!   - no key ever counts more than [`MAX_COUNT`]: a take that would pass it is cut there.
//!
//!   So a charge sent after the response (Envoy's `apply_on_stream_done`, whose answer Envoy
//!   ignores) holds the budget: it is refused, but the window it overdrew is full (fill) or
//!   overdrawn (record), and the next check is refused until the window frees room. The
//!   over-consumption bound: per check admitted while the budget had room and still in flight,
//!   at most one request's cost past the limit.
//! - `Quota` items (envoyproxy/ratelimit's `quota_mode`) are checked like `Consume`; one over its
//!   limit fails the batch only when every `Quota` item of the batch is over.
//! - `Shadow` items are checked like `Consume` but never veto the batch; what they record is
//!   what an enforced item would: their hits if they passed on an admitted batch, else their
//!   [`OverLimit`]'s take, so their log is what enforcement would keep.
//! - `Refund` items never reject and ignore [`OverLimit`].
//! - [`Algorithm::InFlight`] keys hold leases, not hits: a recording item holds the lease of its
//!   [`Item::lease`] token (one lease per token and key, however many hits: an item counts at
//!   most 1, [`Algorithm::counted_hits`]), a `Refund` item releases the lease of its token and no
//!   other (token 0 releases nothing), and a lease counts for `window_ms` at most. Its items
//!   record only what is admitted: [`OverLimit`] takes are 0 for them (a refused request holds
//!   no lease, since nothing will ever release it).
//! - A held item ([`Item::hold_ms`] > 0, the sliding log only) is checked like any other; what
//!   it records is one entry dated `max(now + hold_ms, newest)` instead of `max(now, newest)`,
//!   so it counts from the decision until `hold_ms + window_ms` later. That is a reservation:
//!   tokens handed out at `now` that may be spent at any moment until `now + hold_ms` stay
//!   counted a whole window after the last moment they can be spent (the Rate Limit Quota
//!   Service's allotments, docs/algorithms.md). Entries recorded after it on the key are dated
//!   at its time or later (timestamps never decrease), and a refund takes from the newest
//!   entries whatever they are. Every backend refuses a batch that holds an item of another
//!   algorithm ([`check_holds`], [`LimiterError::Refused`]) before touching any key.
//! - The clock: Redis uses its own `TIME` (instances with skewed clocks agree); the memory backend
//!   uses the [`Clock`] it was built with. Both also accept an explicit `now` for tests.

pub mod algorithms;
pub mod cache;
pub mod guard;
pub mod leases;
pub mod log;
pub mod memory;
pub mod redis;
pub mod window;

use async_trait::async_trait;

pub use algorithms::Algorithm;

/// How a batch item treats its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ItemKind {
    Consume,
    Shadow,
    Refund,
    /// `quota_mode`: the batch needs at least one of its quota items to pass.
    Quota,
}

/// What a non-refund item records when it is not recorded as admitted: on a rejected batch, or
/// a `Shadow`/`Quota` item that did not pass on an admitted one (the module doc has the rule).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum OverLimit {
    /// Nothing: right for costs known on the request path, which a refusal stops.
    Refuse,
    /// An item that did not fit fills its key up to capacity; one that fit records nothing.
    /// The default, with no sluice-specific configuration: a charge for work already done
    /// (Envoy's `apply_on_stream_done`) then holds the budget.
    #[default]
    Fill,
    /// The whole cost, even past the limit (exact accounting, envoyproxy/ratelimit-like).
    Record,
}

impl OverLimit {
    /// The config name.
    pub const fn name(self) -> &'static str {
        match self {
            OverLimit::Refuse => "refuse",
            OverLimit::Fill => "fill",
            OverLimit::Record => "record",
        }
    }
}

/// No key counts more than this (2^52): what an item records is cut so that its key's count
/// stays at or below it. The Redis script computes in doubles, exact below 2^53, and no real
/// limit comes near it; only [`OverLimit::Record`] can reach it at all.
pub const MAX_COUNT: u64 = 1 << 52;

/// One limiter key's share of a decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Item {
    /// Limiter key from [`crate::descriptor::limiter_key`].
    pub key: String,
    pub limit: u64,
    pub window_ms: u64,
    pub hits: u64,
    pub kind: ItemKind,
    /// What the item records when it is not recorded as admitted (rejected batch, or a shadow
    /// or quota item over its limit).
    pub over_limit: OverLimit,
    /// How the key counts ([`algorithms`]); one batch may mix algorithms and stays
    /// all-or-nothing. For GCRA, `limit` is the rate per window and the burst the capacity.
    pub algorithm: Algorithm,
    /// [`Algorithm::InFlight`] only: the token naming the lease this item records or, for a
    /// refund, releases (0: none; a refund of token 0 releases nothing). Ignored otherwise.
    pub lease: u64,
    /// [`Algorithm::SlidingLog`] only: what the item records is dated this many ms after
    /// `now`, so it counts from `now` until `now + hold_ms + window_ms` (a reservation of
    /// tokens that may be spent until `now + hold_ms`; see the module doc). 0 for every request.
    pub hold_ms: u64,
}

impl Item {
    /// What the key may hold: the limit, or the burst for GCRA.
    pub fn capacity(&self) -> u64 {
        self.algorithm.capacity(self.limit)
    }

    /// The hits this item counts with ([`Algorithm::counted_hits`]).
    pub fn counted_hits(&self) -> u64 {
        self.algorithm.counted_hits(self.hits)
    }
}

/// Refuses a batch with a held item ([`Item::hold_ms`]) of an algorithm other than the sliding
/// log: only a log can date an entry after `now`. Every backend calls it before deciding.
pub fn check_holds(batch: &[Item]) -> Result<(), LimiterError> {
    match batch
        .iter()
        .find(|item| item.hold_ms > 0 && item.algorithm != Algorithm::SlidingLog)
    {
        Some(item) => Err(LimiterError::Refused(format!(
            "a hold of {} ms on key {} counted by {}: only sliding_log keys take holds",
            item.hold_ms,
            item.key,
            item.algorithm.name()
        ))),
        None => Ok(()),
    }
}

/// What the backend saw for one item, in the order of the batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyOutcome {
    /// This item's own check passed (always true for `Refund`).
    pub passed: bool,
    /// What counts in the key's window after the decision (for a log, the sum of its entries'
    /// weights).
    pub count: u64,
    /// Milliseconds until the oldest entry in the window leaves it (when a slot frees);
    /// `window_ms` when the window is empty.
    pub reset_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchOutcome {
    /// Every `Consume` item passed (and, with quota items, one of them): the batch's verdict.
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
    /// The backend decided (and recorded what the verdict records).
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
    /// Loads of the Lua library since start: the first, then each one after the server
    /// answered that it did not hold the function (a restart, failover or `FUNCTION FLUSH`).
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
    /// The backend refused this request alone, for something in its own keys (a Redis key
    /// holding another type of value: `WRONGTYPE`); requests sharing its call are unaffected.
    #[error("backend refused the request: {0}")]
    Refused(String),
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
        batch: &[Item],
        now_ms: Option<u64>,
    ) -> Result<BatchOutcome, LimiterError>;

    /// Cheap reachability probe for readiness.
    async fn ping(&self) -> Result<(), LimiterError>;

    /// Short backend name for logs and metrics ("memory", "redis").
    fn name(&self) -> &'static str;

    /// Connection and script counters, for backends that have connections (`None` otherwise).
    fn stats(&self) -> Option<BackendStats> {
        None
    }
}
