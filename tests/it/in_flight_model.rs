//! `in_flight` against a model of the requests themselves, on the memory backend and on a real
//! Redis: random lifecycles of requests on one key (admitted or refused; done with their
//! refund, done with the refund lost, or still running past their lease; refunds that name a
//! lease already gone, or none ever held) over a virtual clock.
//!
//! The model knows what no backend is told: which request is still running. The property the
//! design promises, checked after every step on both backends: **a request in flight is counted
//! until it is done or has run for `lease`**. So at every moment the key's count is at least the
//! number of requests in flight younger than the lease, and no request is admitted while that
//! many fill the limit. Exactly: the count is the leases of admitted requests whose refund has
//! not arrived and that are younger than the lease (a lost refund holds its slot until then, a
//! late refund releases nothing), admission is `count < limit`, and the reset is the time until
//! the oldest of those leases runs out.
//!
//! Why it matters which lease a refund releases: if a refund released any lease but its own
//! (the oldest, or the newest as the sliding log's refund takes its newest entries), a long
//! request would lose its lease to a short one's refund and stop being counted while still
//! running, or a late refund would end another request's lease. docs/algorithms.md walks
//! through both; this test would catch either.

use crate::helpers;

use std::collections::BTreeMap;
use std::sync::Arc;

use helpers::limiter::{T, decide_at, flushed_per_case};
use proptest::prelude::*;
use sluice::limiter::memory::MemoryLimiter;
use sluice::limiter::{Algorithm, Item, ItemKind, Limiter, OverLimit, SystemClock};

const LIMIT: u64 = 3;
const LEASE_MS: u64 = 1_000;
const KEY: &str = "in-flight-model";

/// One step of a trace.
#[derive(Debug, Clone)]
enum Step {
    /// The clock moves on.
    Wait(u64),
    /// A request asks to be admitted.
    Start,
    /// The `n`-th running request (modulo their number) is done and its refund arrives.
    Done(usize),
    /// The `n`-th running request is done but its refund is lost (its proxy died).
    Lost(usize),
    /// A refund arrives for a request the backend never admitted (or a second time).
    Stray(u64),
}

fn arb_step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (1u64..700).prop_map(Step::Wait),
        4 => Just(Step::Start),
        3 => (0usize..8).prop_map(Step::Done),
        1 => (0usize..8).prop_map(Step::Lost),
        1 => (1u64..40).prop_map(Step::Stray),
    ]
}

fn item(kind: ItemKind, lease: u64) -> Item {
    Item {
        key: KEY.into(),
        limit: LIMIT,
        window_ms: LEASE_MS,
        hits: 1,
        kind,
        // Ignored by `in_flight`: a refused request never holds a lease.
        over_limit: OverLimit::Record,
        algorithm: Algorithm::InFlight,
        lease,
        hold_ms: 0,
    }
}

/// The requests as they really are.
#[derive(Default)]
struct Model {
    /// Leases held: token -> time admitted (until refunded or expired).
    leases: BTreeMap<u64, u64>,
    /// Requests still running: token -> time admitted.
    running: BTreeMap<u64, u64>,
    next_token: u64,
}

impl Model {
    fn expire(&mut self, now: u64) {
        self.leases.retain(|_, &mut t| now - t < LEASE_MS);
    }

    /// Running requests younger than the lease: what must be counted.
    fn young_running(&self, now: u64) -> u64 {
        self.running
            .values()
            .filter(|&&t| now - t < LEASE_MS)
            .count() as u64
    }

    fn reset_ms(&self, now: u64) -> u64 {
        self.leases
            .values()
            .min()
            .map_or(LEASE_MS, |&t| t + LEASE_MS - now)
    }

    /// The `n`-th running request, taken out of the running set.
    fn finish(&mut self, n: usize) -> Option<u64> {
        let token = *self.running.keys().nth(n % self.running.len().max(1))?;
        self.running.remove(&token);
        Some(token)
    }
}

/// Runs `steps` on `backend` (empty) and on the model.
fn follows_the_model(
    rt: &tokio::runtime::Runtime,
    backend: &Arc<dyn Limiter>,
    steps: &[Step],
) -> Result<(), TestCaseError> {
    let mut model = Model {
        next_token: 1,
        ..Model::default()
    };
    let mut now = T;
    for step in steps {
        let sent = match step {
            Step::Wait(ms) => {
                now += ms;
                None
            }
            Step::Start => {
                let token = model.next_token;
                model.next_token += 1;
                Some((item(ItemKind::Consume, token), Some(token)))
            }
            Step::Done(n) => model
                .finish(*n)
                .map(|token| (item(ItemKind::Refund, token), None)),
            Step::Lost(n) => {
                model.finish(*n);
                None
            }
            // Tokens the model never gave (it counts from 1 upwards, 1000 apart from these) or
            // gave and saw refunded: either way the refund must release nothing.
            Step::Stray(t) => Some((item(ItemKind::Refund, 1000 + t), None)),
        };
        model.expire(now);
        let Some((hit, started)) = sent else {
            continue;
        };
        let outcome = rt.block_on(decide_at(backend, std::slice::from_ref(&hit), now));
        if let Some(token) = started {
            let fits = (model.leases.len() as u64) < LIMIT;
            prop_assert_eq!(outcome.admitted, fits, "admission of {} at {}", token, now);
            if fits {
                model.leases.insert(token, now);
                model.running.insert(token, now);
            }
        } else if hit.lease < 1000 {
            // A request's own refund ends its own lease, if it still holds one.
            model.leases.remove(&hit.lease);
        }
        let reported = outcome.items[0];
        prop_assert_eq!(
            reported.count,
            model.leases.len() as u64,
            "count at {}",
            now
        );
        prop_assert_eq!(reported.reset_ms, model.reset_ms(now), "reset at {}", now);
        // The promise: every request in flight younger than its lease is counted.
        prop_assert!(
            reported.count >= model.young_running(now),
            "{} running requests younger than the lease, counted {} at {}",
            model.young_running(now),
            reported.count,
            now
        );
    }
    Ok(())
}

/// Runs random traces, each on the backend `fresh` returns (an empty one).
fn run_against(rt: &tokio::runtime::Runtime, fresh: impl Fn() -> Arc<dyn Limiter>, cases: u32) {
    let config = ProptestConfig {
        cases,
        ..ProptestConfig::default()
    };
    let steps = prop::collection::vec(arb_step(), 1..60);
    proptest!(config, |(steps in steps)| {
        follows_the_model(rt, &fresh(), &steps)?;
    });
}

#[test]
fn memory_keeps_every_running_request_counted() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    run_against(
        &rt,
        || Arc::new(MemoryLimiter::new(Arc::new(SystemClock))),
        400,
    );
}

#[test]
fn redis_keeps_every_running_request_counted() {
    let server = helpers::RedisServer::start();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let fresh = flushed_per_case(&rt, &server);
    run_against(&rt, fresh, 300);
}
