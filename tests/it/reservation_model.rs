//! Held items (the Rate Limit Quota Service's reservations) against a model of what is really
//! admitted, on the memory backend and on a real Redis: random traces on one sliding-log key of
//! requests (the RLS path: admitted hits spent at once) and reservations (allotments of tokens
//! that Envoy may spend at any moment until their deadline, `hold_ms` after the grant) over a
//! virtual clock.
//!
//! The backend is never told when an allotment's tokens are spent, so the model assumes the
//! worst: in every window, each allotment that can reach it spends all its tokens inside it.
//! The property the design promises (docs/algorithms.md, "Reservations"): **in every window of
//! the key's length, the hits of admitted requests plus the tokens of every allotment whose
//! spending period `[grant, deadline]` meets the window never exceed the limit**, whatever the
//! order of grants and requests. Checked at the end of every trace over every window (the most
//! any window holds is reached at a window starting at a request or at a deadline). After every
//! step, the backend's verdict and count must also be exactly those of the log the design
//! describes (entries dated `max(now + hold, newest)`, counted while `now - date < window`), so
//! the bound is not reached by refusing more than the design does.
//!
//! A hold shorter than the spending period (an entry dated at the grant, for instance) fails
//! the bound within a few steps: an allotment spent at its deadline lands in a window that no
//! longer counts it.

use crate::helpers;

use std::sync::Arc;

use helpers::limiter::{T, decide_at, flushed_per_case, log_item};
use proptest::prelude::*;
use sluice::limiter::memory::MemoryLimiter;
use sluice::limiter::{Item, ItemKind, Limiter, OverLimit, SystemClock};

const LIMIT: u64 = 12;
const WINDOW_MS: u64 = 1_000;
const KEY: &str = "reservation-model";

/// One step of a trace.
#[derive(Debug, Clone)]
enum Step {
    /// The clock moves on.
    Wait(u64),
    /// A request of `hits` on the RLS path: if admitted, spent at once.
    Request(u64),
    /// An allotment of `tokens`, spendable until `hold` ms after it is granted.
    Grant { tokens: u64, hold: u64 },
}

fn arb_step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (1u64..600).prop_map(Step::Wait),
        3 => (1u64..4).prop_map(Step::Request),
        3 => (1u64..8, 1u64..1500).prop_map(|(tokens, hold)| Step::Grant { tokens, hold }),
    ]
}

fn item(hits: u64, hold_ms: u64) -> Item {
    Item {
        hold_ms,
        over_limit: OverLimit::Refuse,
        ..log_item(KEY, LIMIT, WINDOW_MS, hits, ItemKind::Consume)
    }
}

/// What was admitted, and the log the design says the key holds.
#[derive(Default)]
struct Model {
    /// Admitted requests: (time, hits), spent at once.
    spent: Vec<(u64, u64)>,
    /// Admitted allotments: (granted, deadline, tokens), spent at any moments in between.
    allotments: Vec<(u64, u64, u64)>,
    /// The log: (date, weight), dates never decreasing.
    log: Vec<(u64, u64)>,
}

impl Model {
    fn count(&self, now: u64) -> u64 {
        self.log
            .iter()
            .filter(|&&(date, _)| date + WINDOW_MS > now)
            .map(|&(_, w)| w)
            .sum()
    }

    fn record(&mut self, at: u64, weight: u64) {
        let date = self.log.last().map_or(at, |&(newest, _)| newest.max(at));
        self.log.push((date, weight));
    }

    /// The most the worst spending puts in one window: the window `[s, s + WINDOW_MS)` holds a
    /// request spent at `t` when `s <= t < s + W`, and all of an allotment when its period
    /// `[granted, deadline]` meets it; the maximum is reached at a window starting at a
    /// request's time or at a deadline.
    fn worst_window(&self) -> (u64, u64) {
        let starts = self
            .spent
            .iter()
            .map(|&(t, _)| t)
            .chain(self.allotments.iter().map(|&(_, deadline, _)| deadline));
        starts
            .map(|s| {
                let requests: u64 = self
                    .spent
                    .iter()
                    .filter(|&&(t, _)| s <= t && t < s + WINDOW_MS)
                    .map(|&(_, h)| h)
                    .sum();
                let allotted: u64 = self
                    .allotments
                    .iter()
                    .filter(|&&(granted, deadline, _)| granted < s + WINDOW_MS && deadline >= s)
                    .map(|&(_, _, n)| n)
                    .sum();
                (requests + allotted, s)
            })
            .max()
            .unwrap_or((0, 0))
    }
}

fn follows_the_model(
    rt: &tokio::runtime::Runtime,
    backend: &Arc<dyn Limiter>,
    steps: &[Step],
) -> Result<(), TestCaseError> {
    let mut model = Model::default();
    let mut now = T;
    for step in steps {
        let (hits, hold) = match *step {
            Step::Wait(ms) => {
                now += ms;
                continue;
            }
            Step::Request(hits) => (hits, 0),
            Step::Grant { tokens, hold } => (tokens, hold),
        };
        let outcome = rt.block_on(decide_at(backend, &[item(hits, hold)], now));
        let fits = model.count(now) + hits <= LIMIT;
        prop_assert_eq!(outcome.admitted, fits, "{:?} at {}", step, now);
        if fits {
            model.record(now + hold, hits);
            if hold == 0 {
                model.spent.push((now, hits));
            } else {
                model.allotments.push((now, now + hold, hits));
            }
        }
        prop_assert_eq!(outcome.items[0].count, model.count(now), "count at {}", now);
    }
    let (most, start) = model.worst_window();
    prop_assert!(
        most <= LIMIT,
        "{} spent in the window starting at {} (limit {})",
        most,
        start,
        LIMIT
    );
    Ok(())
}

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
fn memory_never_lets_an_allotment_past_the_limit() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    run_against(
        &rt,
        || Arc::new(MemoryLimiter::new(Arc::new(SystemClock))),
        400,
    );
}

#[test]
fn redis_never_lets_an_allotment_past_the_limit() {
    let server = helpers::RedisServer::start();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let fresh = flushed_per_case(&rt, &server);
    run_against(&rt, fresh, 300);
}
