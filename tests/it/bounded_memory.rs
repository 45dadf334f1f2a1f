//! Bounded resources: 1,000,000 distinct keys through the memory backend (through the `Limiter`
//! trait) keep resident memory under a stated bound, because `with_max_keys` evicts.
//!
//! Why a module with a single test: resident memory (`VmHWM`, the peak RSS, from
//! /proc/self/status) is per process, so no other test may run beside it (nextest gives each
//! test a process of its own; by hand, `cargo test --test it bounded_memory::`). The figures
//! it prints are kept in docs/reliability.md; metric label sets and the local cache have their
//! own bound tests (src/metrics/tracker.rs, src/metrics/observer.rs, src/limiter/cache.rs).

use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice::descriptor::{Entry, limiter_key};
use sluice::limiter::memory::MemoryLimiter;
use sluice::limiter::{Algorithm, Item, ItemKind, Limiter, SystemClock};

const KEYS: u64 = 1_000_000;
const CAP: usize = 100_000;
/// Peak resident growth allowed while 1,000,000 keys pass through a 100,000-key cap. Measured
/// 32 MiB on the reference run (docs/reliability.md).
const BOUND_MIB: u64 = 64;

/// `VmHWM` (peak resident set) of this process in KiB.
fn peak_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/self/status")
}

/// Sends `KEYS` distinct keys (realistic limiter keys, one hit each, all within one long window,
/// so nothing expires and only the cap frees room) through `limiter`.
async fn push_keys(limiter: &dyn Limiter) {
    let start = 1_000_000u64;
    for i in 0..KEYS {
        let key = limiter_key(
            "edge",
            &[Entry::new(
                "remote_address",
                format!("10.{}.{}", i >> 16, i & 0xffff),
            )],
            3_600_000,
        );
        let batch = [Item {
            key,
            limit: 10,
            window_ms: 3_600_000,
            hits: 1,
            kind: ItemKind::Consume,
            over_limit: sluice::limiter::OverLimit::default(),
            algorithm: Algorithm::SlidingLog,
            lease: 0,
            hold_ms: 0,
        }];
        // Time moves 1 ms per key: the least recently recorded key is the one evicted.
        let outcome = limiter
            .decide(&batch, Some(start + i))
            .await
            .expect("memory backend never fails");
        assert!(outcome.admitted, "a fresh key is admitted");
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_million_keys_stay_under_the_memory_bound() {
    let before = peak_rss_kib();
    let started = Instant::now();
    let limiter = MemoryLimiter::with_max_keys(Arc::new(SystemClock), CAP);
    push_keys(&limiter).await;
    let kept = limiter.key_count();
    let growth_mib = peak_rss_kib().saturating_sub(before) / 1024;
    let elapsed = started.elapsed();
    println!(
        "memory backend, max_keys {CAP}: {KEYS} distinct keys in {:.1} s, {kept} kept, \
         peak RSS growth {growth_mib} MiB (bound {BOUND_MIB} MiB)",
        elapsed.as_secs_f64()
    );
    assert!(kept <= CAP, "{kept} keys kept, cap {CAP}");
    assert!(
        kept >= CAP * 9 / 10,
        "the cap, not something else, bounds it: {kept}"
    );
    assert!(
        growth_mib <= BOUND_MIB,
        "peak RSS grew {growth_mib} MiB, bound {BOUND_MIB} MiB"
    );
    // The most recent keys survive eviction: the last one is still counted.
    let last = limiter_key(
        "edge",
        &[Entry::new(
            "remote_address",
            format!("10.{}.{}", (KEYS - 1) >> 16, (KEYS - 1) & 0xffff),
        )],
        3_600_000,
    );
    let probe = [Item {
        key: last,
        limit: 1,
        window_ms: 3_600_000,
        hits: 1,
        kind: ItemKind::Consume,
        over_limit: sluice::limiter::OverLimit::default(),
        algorithm: Algorithm::SlidingLog,
        lease: 0,
        hold_ms: 0,
    }];
    let outcome = limiter
        .decide(&probe, Some(1_000_000 + KEYS))
        .await
        .expect("memory backend never fails");
    assert!(!outcome.admitted, "the newest key kept its hit");
    // Generous: a bounded run, not a benchmark.
    assert!(elapsed < Duration::from_secs(120), "{elapsed:?}");
}
