//! Unit tests of the algorithm models: each algorithm at its edges with `now` passed in, and
//! the facts the Redis script is given (codes, parameters, capacities, key tags).

use super::*;
use crate::limiter::ItemKind;

fn hit(algorithm: Algorithm, limit: u64, window_ms: u64) -> Item {
    Item {
        key: "k".into(),
        limit,
        window_ms,
        hits: 1,
        kind: ItemKind::Consume,
        over_limit: crate::limiter::OverLimit::default(),
        algorithm,
        lease: 0,
        hold_ms: 0,
    }
}

/// Admits one hit at a time while `count < capacity`; returns the admitted count.
fn fill(state: &mut State, h: &Item, now: u64, n: u64) -> u64 {
    let mut admitted = 0;
    for _ in 0..n {
        state.settle(h, now);
        if state.count(h, now) < h.algorithm.capacity(h.limit) {
            state.record(h, now, 1);
            admitted += 1;
        }
    }
    admitted
}

#[test]
fn fixed_window_resets_at_the_boundary() {
    let h = hit(Algorithm::FixedWindow, 3, 1000);
    let mut s = State::fresh(h.algorithm);
    assert_eq!(fill(&mut s, &h, 999, 5), 3);
    assert_eq!(s.reset_ms(&h, 999), 1);
    assert_eq!(
        fill(&mut s, &h, 1000, 5),
        3,
        "a new window: the limit again"
    );
    // A lagging clock does not rewind the window.
    s.settle(&h, 500);
    assert_eq!(s.count(&h, 500), 3);
}

#[test]
fn sliding_counter_weighs_the_previous_window() {
    let h = hit(Algorithm::SlidingCounter, 10, 1000);
    let mut s = State::fresh(h.algorithm);
    assert_eq!(fill(&mut s, &h, 900, 10), 10);
    // 25% into the next window: 75% of 10 still counts, rounded up.
    s.settle(&h, 1250);
    assert_eq!(s.count(&h, 1250), 8);
    assert_eq!(fill(&mut s, &h, 1250, 10), 2);
    assert_eq!(s.reset_ms(&h, 1250), 750);
    // A refund takes from this window first, then from the previous one.
    s.refund(&h, 1250, 5);
    assert_eq!(
        s,
        State::Counter {
            start: 1000,
            cur: 0,
            prev: 7
        }
    );
    // Two windows later everything is gone.
    s.settle(&h, 3000);
    assert_eq!(s.count(&h, 3000), 0);
    assert!(s.is_empty());
}

#[test]
fn gcra_refills_at_the_rate_with_exact_retry() {
    // 10 per second, burst 5: one token every 100 ms.
    let h = hit(Algorithm::Gcra { burst: 5 }, 10, 1000);
    let mut s = State::fresh(h.algorithm);
    assert_eq!(fill(&mut s, &h, 10_000, 9), 5);
    assert_eq!(s.count(&h, 10_000), 5);
    assert_eq!(s.reset_ms(&h, 10_000), 100);
    s.settle(&h, 10_099);
    assert_eq!(s.count(&h, 10_099), 5);
    assert_eq!(s.reset_ms(&h, 10_099), 1);
    assert_eq!(fill(&mut s, &h, 10_100, 3), 1);
    s.refund(&h, 10_100, 2);
    s.settle(&h, 10_100);
    assert_eq!(s.count(&h, 10_100), 3);
    s.settle(&h, 20_000);
    assert!(s.is_empty());
    assert_eq!(s.reset_ms(&h, 20_000), 1000);
}

#[test]
fn gcra_lagging_clock_sees_more_in_use() {
    // 10 per second: 100 ms per token.
    let h = hit(Algorithm::Gcra { burst: 5 }, 10, 1000);
    let mut s = State::fresh(h.algorithm);
    assert_eq!(fill(&mut s, &h, 10_000, 2), 2);
    assert_eq!(
        s,
        State::Gcra {
            tat: 10_200,
            rem: 0
        }
    );
    // 150 ms later 0.5 token is left; a clock 100 ms behind sees 1.5, rounded up.
    assert_eq!(s.count(&h, 10_150), 1);
    assert_eq!(s.count(&h, 10_050), 2);
    // What a lagging instance records stacks onto the same arrival time.
    s.settle(&h, 10_050);
    s.record(&h, 10_050, 1);
    assert_eq!(
        s,
        State::Gcra {
            tat: 10_300,
            rem: 0
        }
    );
    // The refill rate does not need to divide the token-ms: 7 per second.
    let h7 = hit(Algorithm::Gcra { burst: 5 }, 7, 1000);
    let mut s = State::fresh(h7.algorithm);
    s.record(&h7, 0, 1);
    assert_eq!(s, State::Gcra { tat: 142, rem: 6 });
    assert_eq!(s.reset_ms(&h7, 0), 143);
    s.refund(&h7, 100, 1);
    assert!(s.is_empty());
}

/// A remainder left by a faster rate (the limit lowered by a config reload) outlasts its
/// arrival time: it drains at the new rate from there, never all at once.
#[test]
fn gcra_remainder_past_its_arrival_time_drains_at_the_rate() {
    // Recorded at 100 per second (rem < 100), read at 10 per second: 10 token-ms per ms.
    assert_eq!(gcra_in_use(1_000, 99, 10, 1_000), 99);
    assert_eq!(gcra_in_use(1_000, 99, 10, 1_001), 89);
    assert_eq!(gcra_in_use(1_000, 99, 10, 1_009), 9);
    assert_eq!(gcra_in_use(1_000, 99, 10, 1_010), 0);
    // Before its arrival time the remainder stacks on the tokens still owed.
    assert_eq!(gcra_in_use(1_002, 99, 10, 1_000), 119);
}

#[test]
fn quantized_log_counts_each_hit_at_least_a_window() {
    let h = hit(Algorithm::QuantizedLog { quantum_ms: 100 }, 4, 1000);
    let mut s = State::fresh(h.algorithm);
    assert_eq!(fill(&mut s, &h, 1050, 2), 2);
    assert_eq!(fill(&mut s, &h, 1199, 2), 2);
    // Bucket 1000 counts until 1000 + 100 + 1000; a real hit at 1050 would leave at 2050.
    s.settle(&h, 2099);
    assert_eq!(s.count(&h, 2099), 4);
    assert_eq!(s.reset_ms(&h, 2099), 1);
    s.settle(&h, 2100);
    assert_eq!(s.count(&h, 2100), 2);
    let State::Log(log) = &s else { panic!() };
    assert_eq!(log.newest(), Some(1100));
}

#[test]
fn in_flight_leases_end_by_their_own_token_or_their_lease() {
    let mut h = hit(Algorithm::InFlight, 2, 1000);
    let mut s = State::fresh(h.algorithm);
    for (now, token) in [(0, 1), (400, 2)] {
        h.lease = token;
        s.settle(&h, now);
        s.record(&h, now, 1);
    }
    assert_eq!((s.count(&h, 500), s.reset_ms(&h, 500)), (2, 500));
    // The refund of request 2 releases lease 2, not the older lease 1, which runs out at
    // 1000 on its own; token 0 and an unknown token release nothing.
    for token in [0, 9, 2] {
        h.lease = token;
        s.refund(&h, 600, 1);
    }
    assert_eq!(s.count(&h, 600), 1);
    s.settle(&h, 999);
    assert_eq!(s.count(&h, 999), 1);
    s.settle(&h, 1000);
    assert!(s.is_empty());
    assert_eq!(s.reset_ms(&h, 1000), 1000);
    assert_eq!(Algorithm::InFlight.counted_hits(5), 1);
    assert_eq!(Algorithm::InFlight.counted_hits(0), 0);
    assert!(!Algorithm::InFlight.rejection_is_stable());
}

/// A key's state answers only for its own algorithm (the quantized log shares the sliding
/// log's); a key found with another one's state is started afresh.
#[test]
fn a_state_fits_only_its_own_algorithm() {
    let all = [
        Algorithm::SlidingLog,
        Algorithm::QuantizedLog { quantum_ms: 100 },
        Algorithm::SlidingCounter,
        Algorithm::Gcra { burst: 3 },
        Algorithm::FixedWindow,
        Algorithm::InFlight,
    ];
    for state_of in all {
        let state = State::fresh(state_of);
        for algorithm in all {
            let same = state_of == algorithm
                || matches!(
                    (state_of, algorithm),
                    (
                        Algorithm::SlidingLog | Algorithm::QuantizedLog { .. },
                        Algorithm::SlidingLog | Algorithm::QuantizedLog { .. }
                    )
                );
            assert_eq!(state.fits(algorithm), same, "{state:?} for {algorithm:?}");
        }
    }
}

#[test]
fn capacity_and_tags() {
    assert_eq!(Algorithm::Gcra { burst: 7 }.capacity(3), 7);
    assert_eq!(Algorithm::Gcra { burst: 7 }.capacity(0), 0);
    assert_eq!(Algorithm::FixedWindow.capacity(3), 3);
    assert_eq!(Algorithm::SlidingLog.key_tag(), "");
    let tags = [
        Algorithm::QuantizedLog { quantum_ms: 1000 },
        Algorithm::SlidingCounter,
        Algorithm::Gcra { burst: 1 },
        Algorithm::FixedWindow,
        Algorithm::InFlight,
    ]
    .map(|a| a.key_tag());
    for t in &tags {
        assert!(t.starts_with(|c: char| c.is_ascii_lowercase()));
        assert!(!t.contains(['=', '|', '{', '}']));
    }
}
