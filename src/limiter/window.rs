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
use super::{BatchOutcome, Hit, HitKind, KeyOutcome};

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

/// Decides `batch` at `now` over `states`, mutating them only as the decision requires.
///
/// `slots[i]` is the index in `states` of item `i`'s key; items with the same key must share a
/// slot (that is how "the same key twice in one batch" is cumulative). A state that does not
/// belong to its item's algorithm is started afresh. Steps:
/// 1. for each item in order: settle its key at `now` (evict, rotate, decay; see
///    [`State::settle`]); `Refund` passes; `Consume`/`Shadow` pass by [`check`] against the
///    item's capacity with the hits that earlier items on the key would record (`Consume` always
///    counts, since an admitted batch records all of them; `Shadow` only if it passed);
/// 2. admitted iff every `Consume` passed; only then, in batch order, `Consume` and passed
///    `Shadow` items record their hits and `Refund` items give hits back;
/// 3. every item reports its key's count and reset after the decision.
///
/// What is kept: a log keeps its evictions (the Redis script evicts in its first phase too);
/// any other state is written back only when an item wrote to it, so a rejected batch changes
/// nothing observable, not even after a later call with an earlier clock.
pub fn decide_batch(
    batch: &[Hit],
    slots: &[usize],
    states: &mut [State],
    now: u64,
) -> BatchOutcome {
    let mut work: Vec<State> = states.to_vec();
    let mut dirty = vec![false; states.len()];
    let mut earlier = vec![0u64; states.len()];
    let mut passed = Vec::with_capacity(batch.len());
    let mut admitted = true;
    let (mut any_quota, mut quota_passed) = (false, false);

    for (hit, &slot) in batch.iter().zip(slots) {
        let state = &mut work[slot];
        if !state.fits(hit.algorithm) {
            *state = State::fresh(hit.algorithm);
            dirty[slot] = true;
        }
        state.settle(hit, now);
        let ok = match hit.kind {
            HitKind::Refund => true,
            HitKind::Consume | HitKind::Shadow | HitKind::Quota => check(
                state.count(hit, now),
                earlier[slot],
                hit.hits,
                hit.capacity(),
            ),
        };
        let records = match hit.kind {
            HitKind::Consume => {
                admitted &= ok;
                true
            }
            HitKind::Shadow => ok,
            HitKind::Quota => {
                any_quota = true;
                quota_passed |= ok;
                ok
            }
            HitKind::Refund => false,
        };
        if records {
            earlier[slot] = earlier[slot].saturating_add(hit.hits);
        }
        passed.push(ok);
    }

    // quota_mode: an over-limit quota item fails the batch only when every quota item is over.
    admitted &= !any_quota || quota_passed;

    if admitted {
        for ((hit, &slot), &ok) in batch.iter().zip(slots).zip(&passed) {
            let state = &mut work[slot];
            match hit.kind {
                HitKind::Consume | HitKind::Shadow | HitKind::Quota
                    if hit.hits > 0 && (ok || hit.kind == HitKind::Consume) =>
                {
                    state.record(hit, now, hit.hits);
                    dirty[slot] = true;
                }
                HitKind::Refund if hit.hits > 0 => {
                    state.refund(hit, now, hit.hits);
                    dirty[slot] = true;
                }
                _ => {}
            }
        }
    }

    let items = batch
        .iter()
        .zip(slots)
        .zip(passed)
        .map(|((hit, &slot), passed)| KeyOutcome {
            passed,
            count: work[slot].count(hit, now),
            reset_ms: work[slot].reset_ms(hit, now),
        })
        .collect();
    for (slot, state) in work.into_iter().enumerate() {
        if dirty[slot] || matches!(state, State::Log(_)) {
            states[slot] = state;
        }
    }
    BatchOutcome::from_backend(admitted, items)
}

/// Maps each batch item to a slot, one slot per distinct key, in order of first appearance.
/// Quadratic on purpose: batches are a handful of descriptors, and this allocates nothing but
/// the result.
pub fn slots_for(batch: &[Hit]) -> (Vec<usize>, usize) {
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
    use crate::limiter::log::Log;

    fn hit(key: &str, limit: u64, hits: u64, kind: HitKind) -> Hit {
        Hit {
            key: key.to_string(),
            limit,
            window_ms: 1000,
            hits,
            kind,
            algorithm: crate::limiter::Algorithm::SlidingLog,
        }
    }

    /// Keeps logs by key across batches, like the memory backend does.
    fn run(
        batch: &[Hit],
        store: &mut std::collections::HashMap<String, State>,
        now: u64,
    ) -> BatchOutcome {
        let (slots, n) = slots_for(batch);
        let mut keys = vec![String::new(); n];
        for (hit, &slot) in batch.iter().zip(&slots) {
            keys[slot] = hit.key.clone();
        }
        let mut logs: Vec<State> = keys
            .iter()
            .map(|k| store.remove(k).unwrap_or(State::Log(Log::new())))
            .collect();
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
        let a = run(&[hit("k", 5, 5, HitKind::Consume)], &mut logs, 999);
        assert!(a.admitted);
        let b = run(&[hit("k", 5, 5, HitKind::Consume)], &mut logs, 1001);
        assert!(!b.admitted);
        assert_eq!(b.items[0].count, 5);
        assert_eq!(b.items[0].reset_ms, 998);
        let c = run(&[hit("k", 5, 5, HitKind::Consume)], &mut logs, 1999);
        assert!(c.admitted);
    }

    #[test]
    fn rejected_batch_records_nothing_anywhere() {
        let mut logs = std::collections::HashMap::new();
        run(&[hit("full", 1, 1, HitKind::Consume)], &mut logs, 0);
        let out = run(
            &[
                hit("free", 5, 1, HitKind::Consume),
                hit("full", 1, 1, HitKind::Consume),
                hit("full", 1, 1, HitKind::Refund),
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
        run(&[hit("k", 10, 4, HitKind::Consume)], &mut logs, 0);
        let out = run(
            &[
                hit("k", 10, 3, HitKind::Consume),
                hit("k", 10, 3, HitKind::Consume),
            ],
            &mut logs,
            1,
        );
        assert!(out.admitted);
        assert_eq!(out.items[0].count, 10);
        assert_eq!(out.items[1].count, 10);
        let out = run(
            &[
                hit("k", 12, 1, HitKind::Consume),
                hit("k", 12, 2, HitKind::Consume),
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
                hit("c", 5, 1, HitKind::Consume),
                hit("s", 1, 2, HitKind::Shadow),
            ],
            &mut logs,
            0,
        );
        assert!(out.admitted);
        assert!(!out.items[1].passed);
        assert_eq!(out.items[0].count, 1);
        assert_eq!(out.items[1].count, 0);
        let out = run(&[hit("s", 3, 2, HitKind::Shadow)], &mut logs, 1);
        assert!(out.admitted);
        assert!(out.items[0].passed);
        assert_eq!(out.items[0].count, 2);
    }

    #[test]
    fn check_only_probe_records_nothing() {
        let mut logs = std::collections::HashMap::new();
        let out = run(&[hit("k", 1, 0, HitKind::Consume)], &mut logs, 0);
        assert!(out.admitted);
        assert_eq!(out.items[0].count, 0);
        run(&[hit("k", 1, 1, HitKind::Consume)], &mut logs, 0);
        let out = run(&[hit("k", 1, 0, HitKind::Consume)], &mut logs, 1);
        assert!(!out.admitted);
        assert_eq!(out.items[0].count, 1);
    }

    #[test]
    fn huge_hits_are_cheap() {
        let mut logs = std::collections::HashMap::new();
        let out = run(&[hit("k", 10, u64::MAX, HitKind::Consume)], &mut logs, 0);
        assert!(!out.admitted);
        let out = run(
            &[hit("k", u64::MAX, u64::MAX, HitKind::Consume)],
            &mut logs,
            0,
        );
        assert!(out.admitted);
        assert_eq!(out.items[0].count, u64::MAX);
        assert!(matches!(&logs["k"], State::Log(l) if l.runs() == 1));
    }
}
