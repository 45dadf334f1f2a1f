//! What the load generators of `tools/bench` share: the open-loop pacer's timer, CPU seconds
//! of a process from /proc, `--pid NAME=PID` parsing and the latency histogram's bounds.
//! `sluice-bench` drives the RLS gRPC API directly; `sluice-http-load` drives HTTP through
//! Envoy (scripts/bench/envoy.sh).
#![forbid(unsafe_code)]
#![deny(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

/// `--pid NAME=PID`: a process whose CPU seconds a report includes.
pub fn parse_pid(s: &str) -> Result<(String, u32), String> {
    let (name, pid) = s.split_once('=').ok_or("expected NAME=PID")?;
    Ok((name.to_owned(), pid.parse().map_err(|e| format!("{e}"))?))
}

/// CPU seconds (user + system) a process has used so far, from /proc.
pub fn cpu_secs(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = after.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    // USER_HZ is 100 on Linux for every architecture this project targets.
    Some((utime + stime) / 100.0)
}

/// A latency histogram in µs, 1 µs to 60 s, 3 significant digits.
pub fn new_histogram() -> anyhow::Result<Histogram<u64>> {
    Ok(Histogram::new_with_bounds(1, 60_000_000, 3)?)
}

/// A timer with sub-millisecond precision for async code: a timerfd registered with the
/// runtime's own epoll. Why: tokio's timer rounds every sleep up to its 1 ms tick, so an open
/// loop paced with `sleep_until` sent its requests in bursts at each tick, each carrying up to
/// 1 ms of the generator's own lag. A timerfd wakes the waiting worker at the instant (plus the
/// kernel's timer slack, ~50 µs) without a thread of its own: a pacer thread handing requests
/// to the runtime costs two thread wake-ups per tick, and on a loaded 2-core machine each
/// hand-over waits for the scheduler (measured in docs/performance-history.md).
pub struct PreciseTimer {
    fd: tokio::io::unix::AsyncFd<rustix::fd::OwnedFd>,
    /// The same instant on both clocks (`Instant` is CLOCK_MONOTONIC on Linux).
    origin: (Instant, Duration),
}

impl PreciseTimer {
    pub fn new() -> std::io::Result<Self> {
        use rustix::time::{TimerfdClockId, TimerfdFlags, timerfd_create};
        let fd = timerfd_create(
            TimerfdClockId::Monotonic,
            TimerfdFlags::NONBLOCK | TimerfdFlags::CLOEXEC,
        )?;
        let now = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
        let mono = Duration::new(now.tv_sec as u64, now.tv_nsec as u32);
        // `new` is deprecated because an arbitrary `AsRawFd` may close or swap its descriptor
        // while registered; an `OwnedFd` moved into the `AsyncFd` cannot, so this use is sound
        // (the replacement, `register`, is `unsafe`, which this crate does not use).
        #[allow(deprecated)]
        let fd = tokio::io::unix::AsyncFd::new(fd)?;
        Ok(PreciseTimer {
            fd,
            origin: (Instant::now(), mono),
        })
    }

    /// Waits until `at` (at once if it has passed).
    pub async fn sleep_until(&self, at: Instant) -> std::io::Result<()> {
        use rustix::time::{Itimerspec, TimerfdTimerFlags, Timespec, timerfd_settime};
        if at <= Instant::now() {
            return Ok(());
        }
        let mono = self.origin.1 + at.saturating_duration_since(self.origin.0);
        let value = Timespec {
            tv_sec: mono.as_secs() as i64,
            tv_nsec: i64::from(mono.subsec_nanos()),
        };
        let zero = Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        timerfd_settime(
            self.fd.get_ref(),
            TimerfdTimerFlags::ABSTIME,
            &Itimerspec {
                it_interval: zero,
                it_value: value,
            },
        )?;
        loop {
            let mut ready = self.fd.readable().await?;
            let mut expirations = [0u8; 8];
            match ready.try_io(|fd| Ok(rustix::io::read(fd.get_ref(), &mut expirations)?)) {
                Ok(result) => return result.map(|_| ()),
                // Readiness was stale (already read): wait again.
                Err(_would_block) => continue,
            }
        }
    }
}
