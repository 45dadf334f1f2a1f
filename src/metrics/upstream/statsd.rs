//! The statsd sink: envoyproxy/ratelimit's stats sent to a statsd daemon as its gostats TCP
//! sink sends them (`STATSD_HOST:STATSD_PORT`, TCP unless `STATSD_PROTOCOL=udp`).
//!
//! What goes out, as gostats writes it: each `--stats-flush-interval-ms` (envoyproxy/
//! ratelimit's `STATS_FLUSH_INTERVAL`, 10 s) one `name:increase|c` line per counter that rose
//! since the last flush; every second one `name:millis|ms` line per response time observed
//! (gostats sends a timer at once and flushes its buffer each second). Lines end in `\n`, in
//! buffers of at most 64 KiB (TCP) or 1,432 bytes, one datagram each (UDP).
//!
//! Why it never costs a request anything: calls only add to the store's counters; this task
//! alone formats and sends. While the daemon is away, buffers wait in a queue of at most
//! [`QUEUE_BYTES_MAX`] (gostats' bound) and the connection is retried every 3 s (1.5 s to
//! connect, 1 s to write, gostats' timings); what does not fit is dropped and counted
//! (`sluice_statsd_dropped_lines_total`), as gostats drops it.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpStream, UdpSocket};
use tokio::time::{Instant, MissedTickBehavior, interval, timeout};

use super::store::Store;
use crate::metrics::names::STATSD_DROPPED_LINES_TOTAL;

/// Bytes of buffers waiting for the daemon (gostats: about 4 MiB).
pub const QUEUE_BYTES_MAX: usize = 1 << 22;
const TCP_BUFFER_BYTES: usize = 1 << 16;
const UDP_DATAGRAM_BYTES: usize = 1432;
const DIAL_TIMEOUT: Duration = Duration::from_millis(1500);
const WRITE_TIMEOUT: Duration = Duration::from_secs(1);
const RETRY_INTERVAL: Duration = Duration::from_secs(3);
/// How often response times go out (gostats' sink flush).
const TIMER_INTERVAL: Duration = Duration::from_secs(1);

/// The transport to the daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Protocol {
    #[default]
    Tcp,
    Udp,
}

impl Protocol {
    pub fn parse(text: &str) -> Option<Protocol> {
        match text.trim().to_ascii_lowercase().as_str() {
            "tcp" | "tcp4" | "tcp6" => Some(Protocol::Tcp),
            "udp" | "udp4" | "udp6" => Some(Protocol::Udp),
            _ => None,
        }
    }

    fn buffer_bytes(self) -> usize {
        match self {
            Protocol::Tcp => TCP_BUFFER_BYTES,
            Protocol::Udp => UDP_DATAGRAM_BYTES,
        }
    }
}

/// Where and how often the sink sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatsdSettings {
    /// `host:port`, resolved at each connection.
    pub addr: String,
    pub protocol: Protocol,
    /// Counters' flush interval.
    pub flush_interval: Duration,
}

/// Lines cut into buffers of at most `max` bytes (whole lines only).
pub(super) struct Buffers {
    max: usize,
    done: Vec<(Vec<u8>, u64)>,
    current: Vec<u8>,
    lines: u64,
}

impl Buffers {
    pub(super) fn new(max: usize) -> Buffers {
        Buffers {
            max,
            done: Vec::new(),
            current: Vec::new(),
            lines: 0,
        }
    }

    fn line(&mut self, name: &str, value: u64, suffix: &str) {
        let line = format!("{name}:{value}|{suffix}\n");
        if !self.current.is_empty() && self.current.len() + line.len() > self.max {
            self.done.push((
                std::mem::take(&mut self.current),
                std::mem::take(&mut self.lines),
            ));
        }
        self.current.extend_from_slice(line.as_bytes());
        self.lines += 1;
    }

    pub(super) fn finish(mut self) -> Vec<(Vec<u8>, u64)> {
        if !self.current.is_empty() {
            self.done.push((self.current, self.lines));
        }
        self.done
    }
}

/// The counters' increases since the last flush, as lines.
pub(super) fn counter_lines(store: &Store, buffers: &mut Buffers) {
    store.for_each_counter(|c| {
        let increase = c.latch();
        if increase != 0 {
            buffers.line(&c.name, increase, "c");
        }
    });
}

/// The response times observed since the last call, one line each.
pub(super) fn timer_lines(store: &Store, buffers: &mut Buffers) {
    for (name, values) in store.take_pending_times() {
        for (millis, count) in values {
            for _ in 0..count {
                buffers.line(&name, millis, "ms");
            }
        }
    }
}

/// The connection to the daemon, made when needed.
enum Conn {
    Tcp(TcpStream),
    Udp(UdpSocket),
}

struct Sink {
    settings: StatsdSettings,
    queue: VecDeque<(Vec<u8>, u64)>,
    queued_bytes: usize,
    conn: Option<Conn>,
    /// When the last connection attempt failed.
    failed_at: Option<Instant>,
}

impl Sink {
    fn enqueue(&mut self, buffers: Vec<(Vec<u8>, u64)>) {
        for (bytes, lines) in buffers {
            if self.queued_bytes + bytes.len() > QUEUE_BYTES_MAX {
                metrics::counter!(STATSD_DROPPED_LINES_TOTAL).increment(lines);
                continue;
            }
            self.queued_bytes += bytes.len();
            self.queue.push_back((bytes, lines));
        }
    }

    async fn connect(&mut self) -> bool {
        if self.conn.is_some() {
            return true;
        }
        if self
            .failed_at
            .is_some_and(|at| at.elapsed() < RETRY_INTERVAL)
        {
            return false;
        }
        let addr = self.settings.addr.clone();
        let made = match self.settings.protocol {
            Protocol::Tcp => timeout(DIAL_TIMEOUT, TcpStream::connect(&addr))
                .await
                .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))
                .and_then(|r| r)
                .map(Conn::Tcp),
            Protocol::Udp => {
                async {
                    let local = if addr.starts_with('[') {
                        "[::]:0"
                    } else {
                        "0.0.0.0:0"
                    };
                    let socket = UdpSocket::bind(local).await?;
                    socket.connect(&addr).await?;
                    Ok(Conn::Udp(socket))
                }
                .await
            }
        };
        match made {
            Ok(conn) => {
                if self.failed_at.take().is_some() {
                    tracing::info!(addr = %self.settings.addr, "statsd: connected");
                }
                self.conn = Some(conn);
                true
            }
            Err(error) => {
                if self.failed_at.is_none() {
                    tracing::warn!(
                        addr = %self.settings.addr, %error,
                        "statsd: cannot reach the daemon; stats wait (bounded) and are retried"
                    );
                }
                self.failed_at = Some(Instant::now());
                false
            }
        }
    }

    /// Sends what is queued, while the daemon takes it.
    async fn send(&mut self) {
        while !self.queue.is_empty() && self.connect().await {
            let Some((bytes, lines)) = self.queue.front() else {
                break;
            };
            let sent = match self.conn.as_mut() {
                Some(Conn::Tcp(stream)) => timeout(WRITE_TIMEOUT, stream.write_all(bytes))
                    .await
                    .is_ok_and(|r| r.is_ok()),
                Some(Conn::Udp(socket)) => {
                    // A datagram the network refuses is lost, as gostats loses it.
                    if socket.send(bytes).await.is_err() {
                        metrics::counter!(STATSD_DROPPED_LINES_TOTAL).increment(*lines);
                    }
                    true
                }
                None => false,
            };
            if sent {
                if let Some((bytes, _)) = self.queue.pop_front() {
                    self.queued_bytes -= bytes.len();
                }
            } else {
                // Retried whole on the next connection (gostats' retry buffer).
                self.conn = None;
                self.failed_at = Some(Instant::now());
                tracing::warn!(addr = %self.settings.addr, "statsd: write failed; reconnecting");
            }
        }
    }
}

/// Flushes `store` to the daemon until `shutdown`, then once more (as gostats' store does when
/// its context ends).
pub(super) async fn run(
    store: Arc<Store>,
    settings: StatsdSettings,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let buffer_bytes = settings.protocol.buffer_bytes();
    let mut counters = interval(settings.flush_interval.max(Duration::from_millis(1)));
    let mut timers = interval(TIMER_INTERVAL);
    counters.set_missed_tick_behavior(MissedTickBehavior::Delay);
    timers.set_missed_tick_behavior(MissedTickBehavior::Delay);
    // The first ticks are immediate: nothing has happened yet.
    counters.tick().await;
    timers.tick().await;
    let mut sink = Sink {
        settings,
        queue: VecDeque::new(),
        queued_bytes: 0,
        conn: None,
        failed_at: None,
    };
    tokio::pin!(shutdown);
    loop {
        let mut buffers = Buffers::new(buffer_bytes);
        tokio::select! {
            _ = counters.tick() => counter_lines(&store, &mut buffers),
            _ = timers.tick() => timer_lines(&store, &mut buffers),
            () = &mut shutdown => {
                timer_lines(&store, &mut buffers);
                counter_lines(&store, &mut buffers);
                sink.enqueue(buffers.finish());
                let _ = timeout(WRITE_TIMEOUT, sink.send()).await;
                return;
            }
        }
        sink.enqueue(buffers.finish());
        sink.send().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_hold_whole_lines_within_their_size() {
        let mut b = Buffers::new(40);
        for i in 0..5 {
            b.line("ratelimit.service.config_load_success", i, "c");
        }
        let done = b.finish();
        assert_eq!(done.len(), 5, "one 39-byte line per 40-byte buffer");
        assert_eq!(
            String::from_utf8(done[0].0.clone()).unwrap(),
            "ratelimit.service.config_load_success:0|c\n"[..].to_owned()
        );
        assert_eq!(done.iter().map(|(_, n)| n).sum::<u64>(), 5);
    }
}
