//! The log subscriber of `sluice serve`: text or JSON lines on stderr, the level from
//! `SLUICE_LOG` (default `info`), and per-connection warnings rate-limited.
//!
//! Why a rate limit: the HTTP/2 stack logs some connection errors at `warn` once per connection
//! (h2's "remotely-reset pending-accept streams reached limit" when a client floods resets), so
//! a client opening connections in a loop wrote log lines at its own pace. Events of the
//! connection-handling targets (h2, hyper, tonic's transport, [`crate::server::listen`],
//! refused TLS handshakes) pass at most once per [`WINDOW`] per call site; the rest are
//! counted, and one line per window says how many were dropped. Every other event passes untouched.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tracing::Metadata;
use tracing::callsite::Identifier;
use tracing::subscriber::Interest;
use tracing_subscriber::layer::{Context, Filter, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// One event per call site of a rate-limited target passes per window.
pub const WINDOW: Duration = Duration::from_secs(10);

/// Targets whose events are rate-limited: the per-connection ones.
const LIMITED_TARGETS: &[&str] = &[
    "h2",
    "hyper",
    "tonic::transport",
    "sluice::server::listen",
    crate::server::tls::HANDSHAKE_TARGET,
];

fn limited(target: &str) -> bool {
    LIMITED_TARGETS.iter().any(|prefix| {
        target
            .strip_prefix(prefix)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with("::"))
    })
}

/// The filter: passes the first event of each limited call site per [`WINDOW`], counts the
/// others in `dropped`.
#[derive(Clone, Default)]
pub struct RateLimit {
    windows: Arc<Mutex<HashMap<Identifier, Instant>>>,
    dropped: Arc<AtomicU64>,
}

impl RateLimit {
    /// Events dropped since the last call.
    pub fn take_dropped(&self) -> u64 {
        self.dropped.swap(0, Ordering::Relaxed)
    }

    fn admit(&self, meta: &Metadata<'_>) -> bool {
        let now = Instant::now();
        let mut windows = crate::sync::lock(&self.windows);
        let open = windows
            .get(&meta.callsite())
            .is_some_and(|opened| now.duration_since(*opened) < WINDOW);
        if !open {
            windows.insert(meta.callsite(), now);
            return true;
        }
        drop(windows);
        self.dropped.fetch_add(1, Ordering::Relaxed);
        false
    }
}

impl<S> Filter<S> for RateLimit {
    fn enabled(&self, meta: &Metadata<'_>, _cx: &Context<'_, S>) -> bool {
        if meta.is_event() && limited(meta.target()) {
            return self.admit(meta);
        }
        true
    }

    fn callsite_enabled(&self, meta: &'static Metadata<'static>) -> Interest {
        if meta.is_event() && limited(meta.target()) {
            // Decided per event.
            Interest::sometimes()
        } else {
            Interest::always()
        }
    }
}

/// Installs the subscriber (`json`: JSON lines; `level`: the `SLUICE_LOG` directives, `info`
/// when unset or invalid) and starts the thread that reports dropped events once per
/// [`WINDOW`].
pub fn init(json: bool, level: Option<&str>) {
    let filter = level
        .and_then(|l| EnvFilter::try_new(l).ok())
        .unwrap_or_else(|| EnvFilter::new("info"));
    let rate_limit = RateLimit::default();
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let layer = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    let layer = if json {
        layer.json().boxed()
    } else {
        layer.boxed()
    };
    let filtered = layer.with_filter(tracing_subscriber::filter::FilterExt::and(
        filter,
        rate_limit.clone(),
    ));
    tracing_subscriber::registry().with(filtered).init();
    let reporter = std::thread::Builder::new()
        .name("sluice-log".into())
        .spawn(move || {
            loop {
                std::thread::sleep(WINDOW);
                report(&rate_limit);
            }
        });
    if let Err(error) = reporter {
        tracing::warn!(error = %error, "cannot start the log reporter; dropped lines go uncounted");
    }
}

fn report(rate_limit: &RateLimit) {
    let dropped = rate_limit.take_dropped();
    if dropped > 0 {
        tracing::warn!(
            dropped,
            window_secs = WINDOW.as_secs(),
            "connection log lines dropped (each message is logged at most once per window)"
        );
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A `tracing` writer into a shared buffer, to read what was logged.
    #[derive(Clone, Default)]
    pub(crate) struct Captured(pub(crate) Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn limited_targets_pass_once_per_window_and_the_rest_is_counted() {
        assert!(limited("h2::proto::streams::recv"));
        assert!(limited("hyper"));
        assert!(limited("sluice::server::listen"));
        assert!(!limited("h2o"));
        assert!(!limited("sluice::server"));

        let captured = Captured::default();
        let writer = captured.clone();
        let rate_limit = RateLimit::default();
        let subscriber = tracing_subscriber::registry().with(
            tracing_subscriber::fmt::layer()
                .with_writer(move || writer.clone())
                .with_ansi(false)
                .with_filter(rate_limit.clone()),
        );
        tracing::subscriber::with_default(subscriber, || {
            for _ in 0..50 {
                tracing::warn!(target: "h2::proto", "reset flood");
                tracing::warn!(target: "sluice::server", "always");
            }
        });
        let log = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
        assert_eq!(log.matches("reset flood").count(), 1, "{log}");
        assert_eq!(log.matches("always").count(), 50, "{log}");
        assert_eq!(rate_limit.take_dropped(), 49);
        assert_eq!(rate_limit.take_dropped(), 0);
    }
}
