//! Pure batch planning: the all-or-nothing check and record of one batch over per-key states
//! (the sliding log itself is [`super::log::Log`]).
//!
//! Why a separate, pure module: the memory backend is a thin locking shell around these
//! functions, and the Redis Lua script (`redis/lua/decide.lua`) is a transcription of the same
//! steps. Keeping time out of here (it is always passed in as `now`) makes every edge of the
//! window testable with explicit numbers, and makes this file the reference both backends are
//! checked against.
//!
//! Conventions shared with the Lua script:
//! - an entry recorded at `t` counts while `now - t < window`, i.e. it is evicted once
//!   `t + window <= now` (Redis: `ZREMRANGEBYSCORE key -inf (now - window)`);
//! - entries are recorded at `max(now, newest)`, so a key's timestamps never decrease even if
//!   the clock steps back, and "newest" (what a refund removes) is always "last recorded";
//! - a key is assumed to be used with one window (the window is part of the limiter key).

use super::algorithms::State;
use super::{Algorithm, BatchOutcome, Item, ItemKind, KeyOutcome, MAX_COUNT, OverLimit};

/// Whether a `Consume`/`Shadow` item passes, given the key's count in the window and the hits
/// earlier items of the same batch would record on the same key. Checked arithmetic: `hits` may
/// be `u64::MAX`, and an overflow simply means "over the limit".
pub fn check(count: u64, earlier: u64, hits: u64, limit: u64) -> bool {
    let Some(seen) = count.checked_add(earlier) else {
        return false;
    };
    if hits == 0 {
        seen < limit
    } else {
        seen.checked_add(hits).is_some_and(|total| total <= limit)
    }
}

/// What an item records when it is not recorded as admitted, by its [`OverLimit`]: nothing; as
/// much of its cost as fits after `seen` if it did not pass; or its whole cost. Never past
/// [`MAX_COUNT`]. Always nothing for `in_flight`: no request would ever release such a lease.
pub fn over_limit_take(hit: &Item, passed: bool, seen: u64, capacity: u64) -> u64 {
    let hits = hit.counted_hits();
    match hit.over_limit {
        _ if hit.algorithm == Algorithm::InFlight => 0,
        OverLimit::Record => hits.min(MAX_COUNT.saturating_sub(seen)),
        OverLimit::Fill if !passed => hits.min(capacity.saturating_sub(seen)),
        OverLimit::Fill | OverLimit::Refuse => 0,
    }
}

/// One item's check, and what it records under either verdict.
#[derive(Debug, Clone, Copy, Default)]
struct Plan {
    passed: bool,
    /// Its take if the batch is admitted (a refund: what it gives back).
    if_admitted: u64,
    /// Its take if the batch is rejected (0 for a refund).
    if_rejected: u64,
}

/// Decides `batch` at `now` over `states`, mutating them only as the decision requires.
///
/// `slots[i]` is the index in `states` of item `i`'s key; items with the same key must share a
/// slot (that is how "the same key twice in one batch" is cumulative). A state that does not
/// belong to its item's algorithm is started afresh. Steps:
/// 1. for each item in order: settle its key at `now` (evict, rotate, decay; see
///    [`State::settle`]); `Refund` passes; `Consume`/`Shadow`/`Quota` pass by [`check`] against
///    the item's capacity with what earlier items on the key record if the batch is admitted
///    (`Consume` always its hits, `Shadow`/`Quota` their hits if they passed, else their
///    [`over_limit_take`]); each item's take under either verdict is fixed here, a rejected
///    verdict's against what earlier items record if it is rejected;
/// 2. the verdict: admitted iff every `Consume` passed (and some `Quota`, if any); then, in batch
///    order, every item records its take for that verdict, and on an admitted batch `Refund`
///    items give hits back;
/// 3. every item reports its key's count and reset after the decision.
///
/// What is kept: a log or a key's leases keep their evictions (the Redis script evicts in its
/// first phase too);
/// any other state is written back only when an item wrote to it, so a verdict that records
/// nothing changes nothing observable, not even after a later call with an earlier clock.
pub fn decide_batch(
    batch: &[Item],
    slots: &[usize],
    states: &mut [State],
    now: u64,
) -> BatchOutcome {
    let mut work = Work::new(states);
    let plans: Vec<Plan> = batch
        .iter()
        .zip(slots)
        .map(|(item, &slot)| work.plan(item, slot, now))
        .collect();
    let admitted = verdict(batch, &plans);
    for ((item, &slot), plan) in batch.iter().zip(slots).zip(&plans) {
        work.record(item, slot, plan, admitted, now);
    }
    let items = batch
        .iter()
        .zip(slots)
        .zip(plans)
        .map(|((item, &slot), plan)| KeyOutcome {
            passed: plan.passed,
            count: work.states[slot].count(item, now),
            reset_ms: work.states[slot].reset_ms(item, now),
        })
        .collect();
    work.write_back(states);
    BatchOutcome::from_backend(admitted, items)
}

/// Step 2's verdict: every `Consume` item passed and, in `quota_mode`, some `Quota` item did
/// (an over-limit quota item fails the batch only when every quota item is over).
fn verdict(batch: &[Item], plans: &[Plan]) -> bool {
    let mut quota = None;
    let mut admitted = true;
    for (item, plan) in batch.iter().zip(plans) {
        match item.kind {
            ItemKind::Consume => admitted &= plan.passed,
            ItemKind::Quota => *quota.get_or_insert(false) |= plan.passed,
            ItemKind::Shadow | ItemKind::Refund => {}
        }
    }
    admitted && quota.unwrap_or(true)
}

/// The states one decision works on, and per key what earlier items of the batch record under
/// either verdict.
struct Work {
    /// A log or a key's leases is moved out (its evictions are kept anyway), any other state is
    /// copied (a few words), so that one written to by no item stays as it was. Nothing here
    /// copies a log: a decision costs what it evicts, records and refunds, not the entries its
    /// keys hold.
    states: Vec<State>,
    /// Written to by an item: the state is kept.
    dirty: Vec<bool>,
    /// What earlier items record on the key if the batch is admitted.
    if_admitted: Vec<u64>,
    /// ... and if it is rejected.
    if_rejected: Vec<u64>,
}

impl Work {
    fn new(states: &mut [State]) -> Self {
        Work {
            states: states.iter_mut().map(take_or_copy).collect(),
            dirty: vec![false; states.len()],
            if_admitted: vec![0; states.len()],
            if_rejected: vec![0; states.len()],
        }
    }

    /// Step 1 for one item: settle its key at `now`, check it, fix its take under either
    /// verdict.
    fn plan(&mut self, item: &Item, slot: usize, now: u64) -> Plan {
        let state = &mut self.states[slot];
        if !state.fits(item.algorithm) {
            *state = State::fresh(item.algorithm);
            self.dirty[slot] = true;
        }
        state.settle(item, now);
        let hits = item.counted_hits();
        if item.kind == ItemKind::Refund {
            return Plan {
                passed: true,
                if_admitted: hits,
                if_rejected: 0,
            };
        }
        let count = state.count(item, now);
        let capacity = item.capacity();
        let passed = check(count, self.if_admitted[slot], hits, capacity);
        let admitted_take = if passed || item.kind == ItemKind::Consume {
            hits
        } else {
            let seen = count.saturating_add(self.if_admitted[slot]);
            over_limit_take(item, false, seen, capacity)
        };
        let seen = count.saturating_add(self.if_rejected[slot]);
        let rejected_take = over_limit_take(item, passed, seen, capacity);
        self.if_admitted[slot] = self.if_admitted[slot].saturating_add(admitted_take);
        self.if_rejected[slot] = self.if_rejected[slot].saturating_add(rejected_take);
        Plan {
            passed,
            if_admitted: admitted_take,
            if_rejected: rejected_take,
        }
    }

    /// Step 2 for one item: record its take for the verdict, or give a refund back.
    fn record(&mut self, item: &Item, slot: usize, plan: &Plan, admitted: bool, now: u64) {
        let state = &mut self.states[slot];
        if item.kind == ItemKind::Refund {
            if admitted && plan.if_admitted > 0 {
                state.refund(item, now, plan.if_admitted);
                self.dirty[slot] = true;
            }
            return;
        }
        let take = if admitted {
            plan.if_admitted
        } else {
            plan.if_rejected
        };
        if take > 0 {
            state.record(item, now, take);
            self.dirty[slot] = true;
        }
    }

    /// Writes back every log and leases (moved out) and every other state an item wrote to.
    fn write_back(self, states: &mut [State]) {
        for (slot, state) in self.states.into_iter().enumerate() {
            if self.dirty[slot] || matches!(state, State::Log(_) | State::Leases(_)) {
                states[slot] = state;
            }
        }
    }
}

/// A log or leases moved out of `state` (an empty placeholder left behind, which the decision
/// always writes back over), or a copy of any other (small) state.
fn take_or_copy(state: &mut State) -> State {
    match state {
        State::Log(_) | State::Leases(_) => {
            std::mem::replace(state, State::Fixed { start: 0, count: 0 })
        }
        small => small.clone(),
    }
}

/// Maps each batch item to a slot, one slot per distinct key, in order of first appearance.
/// Quadratic on purpose: batches are a handful of descriptors, and this allocates nothing but
/// the result.
pub fn slots_for(batch: &[Item]) -> (Vec<usize>, usize) {
    let mut slots = Vec::with_capacity(batch.len());
    let mut distinct = 0;
    for (i, hit) in batch.iter().enumerate() {
        let same = batch[..i].iter().position(|h| h.key == hit.key);
        match same {
            Some(j) => slots.push(slots[j]),
            None => {
                slots.push(distinct);
                distinct += 1;
            }
        }
    }
    (slots, distinct)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hit(key: &str, limit: u64, hits: u64, kind: ItemKind) -> Item {
        Item {
            key: key.to_string(),
            limit,
            window_ms: 1000,
            hits,
            kind,
            over_limit: OverLimit::Refuse,
            algorithm: crate::limiter::Algorithm::SlidingLog,
            lease: 0,
            hold_ms: 0,
        }
    }

    fn with(over_limit: OverLimit, h: Item) -> Item {
        Item { over_limit, ..h }
    }

    /// Keeps logs by key across batches, like the memory backend does.
    fn run(
        batch: &[Item],
        store: &mut std::collections::HashMap<String, State>,
        now: u64,
    ) -> BatchOutcome {
        let (slots, n) = slots_for(batch);
        let mut keys = vec![(String::new(), crate::limiter::Algorithm::SlidingLog); n];
        for (hit, &slot) in batch.iter().zip(&slots) {
            keys[slot] = (hit.key.clone(), hit.algorithm);
        }
        let mut logs: Vec<State> = keys
            .iter()
            .map(|(k, algorithm)| store.remove(k).unwrap_or(State::fresh(*algorithm)))
            .collect();
        let keys = keys.into_iter().map(|(k, _)| k);
        let out = decide_batch(batch, &slots, &mut logs, now);
        store.extend(keys.into_iter().zip(logs));
        out
    }

    #[test]
    fn check_edges() {
        assert!(check(0, 0, 10, 10));
        assert!(!check(0, 0, 11, 10));
        assert!(!check(0, 0, u64::MAX, 10));
        assert!(!check(u64::MAX, 1, 1, u64::MAX));
        assert!(check(9, 0, 0, 10));
        assert!(!check(10, 0, 0, 10));
        assert!(!check(0, 0, 0, 0));
        assert!(check(4, 3, 3, 10));
        assert!(!check(4, 3, 4, 10));
    }

    #[test]
    fn sliding_not_fixed_window() {
        let mut logs = std::collections::HashMap::new();
        let a = run(&[hit("k", 5, 5, ItemKind::Consume)], &mut logs, 999);
        assert!(a.admitted);
        let b = run(&[hit("k", 5, 5, ItemKind::Consume)], &mut logs, 1001);
        assert!(!b.admitted);
        assert_eq!(b.items[0].count, 5);
        assert_eq!(b.items[0].reset_ms, 998);
        let c = run(&[hit("k", 5, 5, ItemKind::Consume)], &mut logs, 1999);
        assert!(c.admitted);
    }

    #[test]
    fn rejected_batch_records_nothing_anywhere() {
        let mut logs = std::collections::HashMap::new();
        run(&[hit("full", 1, 1, ItemKind::Consume)], &mut logs, 0);
        let out = run(
            &[
                hit("free", 5, 1, ItemKind::Consume),
                hit("full", 1, 1, ItemKind::Consume),
                hit("full", 1, 1, ItemKind::Refund),
            ],
            &mut logs,
            10,
        );
        assert!(!out.admitted);
        assert!(out.items[0].passed);
        assert_eq!(out.items[0].count, 0);
        assert_eq!(out.items[0].reset_ms, 1000);
        assert!(!out.items[1].passed);
        assert_eq!(out.items[1].count, 1);
        assert_eq!(out.items[1].reset_ms, 990);
        assert!(out.items[2].passed);
    }

    #[test]
    fn same_key_twice_is_cumulative() {
        let mut logs = std::collections::HashMap::new();
        run(&[hit("k", 10, 4, ItemKind::Consume)], &mut logs, 0);
        let out = run(
            &[
                hit("k", 10, 3, ItemKind::Consume),
                hit("k", 10, 3, ItemKind::Consume),
            ],
            &mut logs,
            1,
        );
        assert!(out.admitted);
        assert_eq!(out.items[0].count, 10);
        assert_eq!(out.items[1].count, 10);
        let out = run(
            &[
                hit("k", 12, 1, ItemKind::Consume),
                hit("k", 12, 2, ItemKind::Consume),
            ],
            &mut logs,
            2,
        );
        assert!(!out.admitted);
        assert!(out.items[0].passed);
        assert!(!out.items[1].passed);
        assert!(matches!(&logs["k"], State::Log(l) if l.count() == 10));
    }

    #[test]
    fn shadow_never_vetoes_and_records_only_if_passed() {
        let mut logs = std::collections::HashMap::new();
        let out = run(
            &[
                hit("c", 5, 1, ItemKind::Consume),
                hit("s", 1, 2, ItemKind::Shadow),
            ],
            &mut logs,
            0,
        );
        assert!(out.admitted);
        assert!(!out.items[1].passed);
        assert_eq!(out.items[0].count, 1);
        assert_eq!(out.items[1].count, 0);
        let out = run(&[hit("s", 3, 2, ItemKind::Shadow)], &mut logs, 1);
        assert!(out.admitted);
        assert!(out.items[0].passed);
        assert_eq!(out.items[0].count, 2);
    }

    #[test]
    fn check_only_probe_records_nothing() {
        let mut logs = std::collections::HashMap::new();
        let out = run(&[hit("k", 1, 0, ItemKind::Consume)], &mut logs, 0);
        assert!(out.admitted);
        assert_eq!(out.items[0].count, 0);
        run(&[hit("k", 1, 1, ItemKind::Consume)], &mut logs, 0);
        let out = run(&[hit("k", 1, 0, ItemKind::Consume)], &mut logs, 1);
        assert!(!out.admitted);
        assert_eq!(out.items[0].count, 1);
    }

    /// quota_mode: an over-limit quota item fails the batch only when every quota item is over.
    #[test]
    fn quota_items_need_one_that_passes() {
        let mut logs = std::collections::HashMap::new();
        let batch = [
            hit("qa", 1, 1, ItemKind::Quota),
            hit("qb", 2, 1, ItemKind::Quota),
            hit("qc", 10, 1, ItemKind::Consume),
        ];
        let counts = |out: &BatchOutcome| out.items.iter().map(|i| i.count).collect::<Vec<_>>();
        let passed = |out: &BatchOutcome| out.items.iter().map(|i| i.passed).collect::<Vec<_>>();
        let out = run(&batch, &mut logs, 0);
        assert!(out.admitted);
        assert_eq!(counts(&out), [1, 1, 1]);
        // `qa` is over, `qb` still has room: admitted, and `qa` records nothing.
        let out = run(&batch, &mut logs, 1);
        assert!(out.admitted);
        assert_eq!(passed(&out), [false, true, true]);
        assert_eq!(counts(&out), [1, 2, 2]);
        // Both over: rejected, and the consume item records nothing either.
        let out = run(&batch, &mut logs, 2);
        assert!(!out.admitted);
        assert_eq!(passed(&out), [false, false, true]);
        let out = run(&[hit("qc", 10, 0, ItemKind::Consume)], &mut logs, 3);
        assert_eq!(out.items[0].count, 2);
        // A lone quota item over its limit rejects; one with room admits.
        assert!(!run(&[hit("qa", 1, 1, ItemKind::Quota)], &mut logs, 4).admitted);
        assert!(run(&[hit("qd", 1, 1, ItemKind::Quota)], &mut logs, 4).admitted);
    }

    /// A batch stores only the keys it wrote: a probe or an empty refund brings nothing to its
    /// `now`, so a call at an earlier `now` (another instance's lagging clock) still finds the
    /// fixed window where the last write left it.
    #[test]
    fn items_that_write_nothing_store_nothing() {
        let mut logs = std::collections::HashMap::new();
        let fixed = |hits, kind| Item {
            algorithm: crate::limiter::Algorithm::FixedWindow,
            ..hit("f", 5, hits, kind)
        };
        assert!(run(&[fixed(2, ItemKind::Consume)], &mut logs, 100).admitted);
        // The next window: a probe and a refund of nothing, on an admitted batch.
        let out = run(
            &[fixed(0, ItemKind::Consume), fixed(0, ItemKind::Refund)],
            &mut logs,
            1500,
        );
        assert!(out.admitted);
        assert_eq!(out.items[0].count, 0);
        // Back in the first window: its count is still there.
        let out = run(&[fixed(0, ItemKind::Consume)], &mut logs, 900);
        assert_eq!(out.items[0].count, 2);
    }

    #[test]
    fn huge_hits_are_cheap() {
        let mut logs = std::collections::HashMap::new();
        let out = run(&[hit("k", 10, u64::MAX, ItemKind::Consume)], &mut logs, 0);
        assert!(!out.admitted);
        let out = run(
            &[hit("k", u64::MAX, u64::MAX, ItemKind::Consume)],
            &mut logs,
            0,
        );
        assert!(out.admitted);
        assert_eq!(out.items[0].count, u64::MAX);
        assert!(matches!(&logs["k"], State::Log(l) if l.entries() == 1));
    }

    #[test]
    fn fill_fills_what_did_not_fit_and_nothing_else() {
        let mut logs = std::collections::HashMap::new();
        let fill = |key: &str, limit, hits| {
            with(OverLimit::Fill, hit(key, limit, hits, ItemKind::Consume))
        };
        run(&[fill("k", 10, 8)], &mut logs, 0);
        // 8 + 4 > 10: rejected, the key filled to 10; the other key fitted and records nothing.
        let out = run(&[fill("other", 10, 1), fill("k", 10, 4)], &mut logs, 1);
        assert!(!out.admitted);
        assert_eq!(out.items[0].count, 0);
        assert_eq!(out.items[1].count, 10);
        // A full key: a 1-hit rejection and a probe record nothing.
        let out = run(&[fill("k", 10, 1), fill("k", 10, 0)], &mut logs, 2);
        assert!(!out.admitted);
        assert_eq!(out.items[1].count, 10);
        assert!(matches!(&logs["k"], State::Log(l) if l.entries() == 2));
        // Same key twice: the first fits and is dropped with the verdict, so the second's whole
        // cost fits.
        let out = run(&[fill("j", 12, 1), fill("j", 12, 12)], &mut logs, 3);
        assert!(!out.admitted);
        assert_eq!(out.items[1].count, 12);
    }

    #[test]
    fn record_records_the_whole_cost_past_the_limit() {
        let mut logs = std::collections::HashMap::new();
        let record = |key: &str, limit, hits| {
            with(OverLimit::Record, hit(key, limit, hits, ItemKind::Consume))
        };
        run(&[record("k", 10, 8)], &mut logs, 0);
        let out = run(&[record("other", 10, 1), record("k", 10, 4)], &mut logs, 1);
        assert!(!out.admitted);
        assert_eq!((out.items[0].count, out.items[1].count), (1, 12));
        // Even a huge cost is one entry, cut at MAX_COUNT.
        let out = run(&[record("k", 10, u64::MAX)], &mut logs, 2);
        assert_eq!(out.items[0].count, crate::limiter::MAX_COUNT);
        assert!(matches!(&logs["k"], State::Log(l) if l.entries() == 3));
    }

    /// A refused `in_flight` item holds no lease whatever its `over_limit`, and counts one
    /// request whatever its hits.
    #[test]
    fn in_flight_records_leases_of_admitted_requests_only() {
        let lease = |token, kind, over_limit| Item {
            algorithm: crate::limiter::Algorithm::InFlight,
            lease: token,
            ..with(over_limit, hit("i", 2, 7, kind))
        };
        let mut keys = std::collections::HashMap::new();
        let out = run(
            &[lease(1, ItemKind::Consume, OverLimit::Record)],
            &mut keys,
            0,
        );
        assert_eq!((out.admitted, out.items[0].count), (true, 1));
        let out = run(&[lease(2, ItemKind::Shadow, OverLimit::Fill)], &mut keys, 1);
        assert_eq!(out.items[0].count, 2);
        for over_limit in [OverLimit::Fill, OverLimit::Record] {
            let out = run(
                &[
                    lease(3, ItemKind::Consume, over_limit),
                    lease(4, ItemKind::Shadow, over_limit),
                ],
                &mut keys,
                2,
            );
            assert!(!out.admitted);
            assert_eq!(out.items[1].count, 2, "{over_limit:?}");
        }
        let out = run(&[lease(1, ItemKind::Refund, OverLimit::Fill)], &mut keys, 3);
        assert_eq!(out.items[0].count, 1);
    }

    #[test]
    fn shadow_over_its_limit_on_an_admitted_batch_follows_its_setting() {
        for (over_limit, expected) in [
            (OverLimit::Refuse, 4),
            (OverLimit::Fill, 5),
            (OverLimit::Record, 7),
        ] {
            let mut logs = std::collections::HashMap::new();
            run(&[hit("s", 5, 4, ItemKind::Shadow)], &mut logs, 0);
            let out = run(
                &[
                    hit("c", 5, 1, ItemKind::Consume),
                    with(over_limit, hit("s", 5, 3, ItemKind::Shadow)),
                ],
                &mut logs,
                1,
            );
            assert!(out.admitted);
            assert!(!out.items[1].passed);
            assert_eq!(out.items[1].count, expected, "{over_limit:?}");
        }
    }
}
