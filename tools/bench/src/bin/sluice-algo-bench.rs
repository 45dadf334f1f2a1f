//! `sluice-algo-bench`: measures each limiting algorithm in Redis, for docs/algorithms.md.
//!
//! Why a program and not an estimate: docs/algorithms.md states bytes per key and decisions per
//! second as measured figures, and each must come from a run anyone can repeat. It starts its
//! own `redis-server` on a free loopback port (nothing persisted), then
//! 1. fills one key per algorithm at full use (`limit` hits spread evenly over a 60 s window,
//!    one script call each, on an explicit clock) for limits 10, 100, 1,000 and 10,000, and
//!    prints `MEMORY USAGE` per key (and per entry for the logs);
//! 2. drives the decision script directly (no sidecar, no gRPC) for each algorithm over 1,000
//!    keys on Redis `TIME`, sequentially (one call per round trip) and pipelined (100 calls per
//!    round trip), and prints decisions per second.
//!
//! Run: `bash scripts/bench/algo-bench.sh` (a release build). Needs `redis-server` on the PATH.
#![forbid(unsafe_code)]
#![deny(clippy::unwrap_used, clippy::expect_used)]

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sluice::descriptor::{Entry, limiter_key_tagged};
use sluice::limiter::redis::script::{DecideCall, LIBRARY};
use sluice::limiter::{Algorithm, Item, ItemKind, OverLimit};

const WINDOW_MS: u64 = 60_000;
/// Aligned on the window, so the fixed and sliding counters fill one window.
const T0: u64 = 1_700_000_040_000;

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_redis() -> anyhow::Result<(Server, u16)> {
    let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let server = Server(child);
    let deadline = Instant::now() + Duration::from_secs(10);
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}"))?;
    loop {
        if let Ok(mut conn) = client.get_connection()
            && redis::cmd("PING").query::<String>(&mut conn).is_ok()
        {
            return Ok((server, port));
        }
        if Instant::now() > deadline {
            anyhow::bail!("redis-server did not start on port {port}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

const ALGORITHMS: [Algorithm; 5] = [
    Algorithm::SlidingLog,
    Algorithm::QuantizedLog { quantum_ms: 1_000 },
    Algorithm::SlidingCounter,
    Algorithm::Gcra { burst: 0 },
    Algorithm::FixedWindow,
];

/// The algorithm as configured for `limit` (GCRA's burst = the limit, its default).
fn configured(algorithm: Algorithm, limit: u64) -> Algorithm {
    match algorithm {
        Algorithm::Gcra { .. } => Algorithm::Gcra { burst: limit },
        other => other,
    }
}

fn key(user: &str, algorithm: Algorithm) -> String {
    limiter_key_tagged(
        "sluice:",
        "edge",
        &[Entry::new("user", user)],
        WINDOW_MS,
        &algorithm.key_tag(),
    )
}

/// One single-item FCALL of one consume hit, on the clock `now` (`None`: Redis TIME).
fn call(key: &str, now: Option<u64>, limit: u64, algorithm: Algorithm) -> redis::Cmd {
    let hit = Item {
        key: key.to_string(),
        limit,
        window_ms: WINDOW_MS,
        hits: 1,
        kind: ItemKind::Consume,
        over_limit: OverLimit::default(),
        algorithm,
        lease: 0,
        hold_ms: 0,
    };
    DecideCall::single(&[hit], now).fcall()
}

fn main() -> anyhow::Result<()> {
    let (_server, port) = start_redis()?;
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}"))?;
    let mut conn = client.get_connection()?;
    let _: redis::Value = LIBRARY.load().query(&mut conn)?;

    println!("## Memory per key at full use (60 s window, limit hits spread evenly over it)\n");
    println!("| algorithm | limit | key bytes (name) | MEMORY USAGE bytes | bytes per entry |");
    println!("|---|---:|---:|---:|---:|");
    for algorithm in ALGORITHMS {
        for limit in [10u64, 100, 1_000, 10_000] {
            let algorithm = configured(algorithm, limit);
            let k = key(&format!("u{limit}"), algorithm);
            for i in 0..limit {
                let now = Some(T0 + i * WINDOW_MS / limit);
                let reply: redis::Value = call(&k, now, limit, algorithm).query(&mut conn)?;
                let redis::Value::Array(items) = &reply else {
                    anyhow::bail!("unexpected reply {reply:?}");
                };
                if items.first() != Some(&redis::Value::Int(1)) {
                    anyhow::bail!("{} rejected hit {i} of {limit}", algorithm.name());
                }
            }
            let bytes: u64 = redis::cmd("MEMORY")
                .arg("USAGE")
                .arg(&k)
                .arg("SAMPLES")
                .arg(0)
                .query(&mut conn)?;
            let per_entry = match algorithm {
                Algorithm::SlidingLog => format!("{:.1}", bytes as f64 / limit as f64),
                Algorithm::QuantizedLog { quantum_ms } => {
                    let buckets: u64 = redis::cmd("HLEN").arg(&k).query(&mut conn)?;
                    format!(
                        "{:.1} per bucket ({buckets} buckets of {quantum_ms} ms)",
                        bytes as f64 / buckets.max(1) as f64
                    )
                }
                _ => "O(1)".to_string(),
            };
            println!(
                "| {} | {limit} | {} | {bytes} | {per_entry} |",
                algorithm.name(),
                k.len()
            );
        }
    }

    println!("\n## Decisions per second, one script per decision, straight to Redis\n");
    println!(
        "1,000 keys round-robin, limit 1,000,000 per 60 s (every decision admitted), Redis TIME.\n"
    );
    println!(
        "| algorithm | sequential (1 call per round trip) | pipelined (100 calls per round trip) |"
    );
    println!("|---|---:|---:|");
    let keys: Vec<String> = (0..1000).map(|i| format!("bench{i}")).collect();
    for algorithm in ALGORITHMS {
        let algorithm = configured(algorithm, 1_000_000);
        let _: () = redis::cmd("FLUSHALL").query(&mut conn)?;
        let keys: Vec<String> = keys.iter().map(|u| key(u, algorithm)).collect();
        let n = 10_000usize;
        let started = Instant::now();
        for i in 0..n {
            let _: redis::Value =
                call(&keys[i % keys.len()], None, 1_000_000, algorithm).query(&mut conn)?;
        }
        let sequential = n as f64 / started.elapsed().as_secs_f64();
        let n = 50_000usize;
        let started = Instant::now();
        for chunk in 0..n / 100 {
            let mut pipe = redis::pipe();
            for j in 0..100 {
                let i = chunk * 100 + j;
                pipe.add_command(call(&keys[i % keys.len()], None, 1_000_000, algorithm));
            }
            let _: Vec<redis::Value> = pipe.query(&mut conn)?;
        }
        let pipelined = n as f64 / started.elapsed().as_secs_f64();
        println!(
            "| {} | {sequential:.0} | {pipelined:.0} |",
            algorithm.name()
        );
    }
    Ok(())
}
