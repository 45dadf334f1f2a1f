//! `sluice-http-load`: an open-loop HTTP/1.1 load generator, for latency through Envoy at a
//! fixed rate (scripts/bench/envoy.sh).
//!
//! Why its own binary: wrk measures throughput in a closed loop, where a slow response delays
//! the next request and so hides its own queueing (coordinated omission); wrk2, which fixes
//! that, is not packaged by Debian, and h2load's `--rps` times each request from when it was
//! sent, not from when it was due. Here requests are due on a fixed schedule (the timerfd pacer
//! `sluice-bench` uses, [`sluice_bench::PreciseTimer`]); `--connections` keep-alive connections
//! take them in order, and latency counts from the due instant, so a request that waited for a
//! free connection carries its wait. The generator's own lateness (sent to the queue minus due)
//! is reported on its own.
//!
//! Each request carries `--header` with a value cycling over `--values` distinct values, so
//! Envoy turns it into that many rate-limit descriptors (clients). Load is bounded by
//! `--duration-secs` and `--max-requests`; the target is the one address given (loopback in
//! every script of this project).
#![forbid(unsafe_code)]
#![deny(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Parser;
use hdrhistogram::Histogram;
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use sluice_bench::{PreciseTimer, cpu_secs, new_histogram, parse_pid};
use tokio::sync::{Mutex, mpsc};

#[derive(Parser, Debug, Clone)]
#[command(
    name = "sluice-http-load",
    about = "Open-loop HTTP/1.1 load generator (latency from each request's due instant)"
)]
struct Args {
    /// HTTP address to load (host:port).
    #[arg(long)]
    target: String,
    /// Path of every request.
    #[arg(long, default_value = "/")]
    path: String,
    /// Header whose value spreads the requests over clients.
    #[arg(long, default_value = "x-client")]
    header: String,
    /// Distinct values of that header, used in turn (`PREFIX0`, `PREFIX1`, ...).
    #[arg(long, default_value_t = 1000)]
    values: u64,
    /// Prefix of the header's values.
    #[arg(long, default_value = "c")]
    value_prefix: String,
    /// Requests per second, due on a fixed schedule.
    #[arg(long)]
    rate: f64,
    /// Seconds of load.
    #[arg(long, default_value_t = 5.0)]
    duration_secs: f64,
    /// Stop after this many requests even if time remains.
    #[arg(long)]
    max_requests: Option<u64>,
    /// Keep-alive connections (one request in flight on each).
    #[arg(long, default_value_t = 32)]
    connections: usize,
    /// Shortest time between two wake-ups of the pacer, in µs (as `sluice-bench --pace-us`).
    #[arg(long, default_value_t = 100)]
    pace_us: u64,
    /// Processes whose CPU seconds to report, as NAME=PID (repeatable).
    #[arg(long = "pid", value_parser = parse_pid)]
    pids: Vec<(String, u32)>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// One request due at `due`, with the header value number `value`.
struct Due {
    due: Instant,
    value: u64,
}

/// What one connection saw.
struct Tally {
    latency_us: Histogram<u64>,
    statuses: BTreeMap<u16, u64>,
    errors: u64,
}

async fn connect(target: &str) -> anyhow::Result<SendRequest<Empty<Bytes>>> {
    let stream = tokio::net::TcpStream::connect(target).await?;
    stream.set_nodelay(true)?;
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(connection);
    Ok(sender)
}

async fn request(
    sender: &mut SendRequest<Empty<Bytes>>,
    args: &Args,
    value: u64,
) -> anyhow::Result<u16> {
    sender.ready().await?;
    let request = hyper::Request::get(args.path.as_str())
        .header(hyper::header::HOST, args.target.as_str())
        .header(
            args.header.as_str(),
            format!("{}{value}", args.value_prefix),
        )
        .body(Empty::<Bytes>::new())?;
    let response = sender.send_request(request).await?;
    let status = response.status().as_u16();
    // Read the whole body: the connection takes its next request only after it.
    response.into_body().collect().await?;
    Ok(status)
}

/// One connection: takes due requests in order until the queue closes. A request that fails
/// (the connection broke) counts as an error, and the next one reconnects.
async fn worker(
    args: Arc<Args>,
    queue: Arc<Mutex<mpsc::UnboundedReceiver<Due>>>,
) -> anyhow::Result<Tally> {
    let mut tally = Tally {
        latency_us: new_histogram()?,
        statuses: BTreeMap::new(),
        errors: 0,
    };
    let mut sender = Some(connect(&args.target).await?);
    loop {
        let Some(job) = queue.lock().await.recv().await else {
            return Ok(tally);
        };
        let result = match sender.as_mut() {
            Some(s) => request(s, &args, job.value).await,
            None => match connect(&args.target).await {
                Ok(s) => request(sender.insert(s), &args, job.value).await,
                Err(e) => Err(e),
            },
        };
        let _ = tally
            .latency_us
            .record((job.due.elapsed().as_micros() as u64).max(1));
        match result {
            Ok(status) => *tally.statuses.entry(status).or_default() += 1,
            Err(_) => {
                tally.errors += 1;
                sender = None;
            }
        }
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Arc::new(Args::parse());
    anyhow::ensure!(args.rate > 0.0, "--rate must be positive");
    anyhow::ensure!(args.duration_secs > 0.0, "--duration-secs must be positive");
    anyhow::ensure!(args.values > 0, "--values must be positive");
    let mut pids = args.pids.clone();
    pids.push(("sluice-http-load".into(), std::process::id()));

    let (tx, rx) = mpsc::unbounded_channel::<Due>();
    let queue = Arc::new(Mutex::new(rx));
    let mut workers = Vec::new();
    for _ in 0..args.connections.max(1) {
        workers.push(tokio::spawn(worker(args.clone(), queue.clone())));
    }
    // Every connection is open before the clock starts.
    tokio::time::sleep(Duration::from_millis(100)).await;

    let cpu_before: Vec<Option<f64>> = pids.iter().map(|(_, p)| cpu_secs(*p)).collect();
    let timer = PreciseTimer::new()?;
    let interval = Duration::from_secs_f64(1.0 / args.rate);
    let pace = Duration::from_micros(args.pace_us);
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(args.duration_secs);
    let budget = args.max_requests.unwrap_or(u64::MAX);
    let mut lag_us = new_histogram()?;
    let mut due = started;
    let mut sent = 0u64;
    let mut woke: Option<Instant> = None;
    'schedule: loop {
        timer
            .sleep_until(woke.map_or(due, |w| due.max(w + pace)))
            .await?;
        let now = Instant::now();
        woke = Some(now);
        while due <= now {
            if due >= deadline || sent >= budget {
                break 'schedule;
            }
            let _ = lag_us.record((now.duration_since(due).as_micros() as u64).max(1));
            tx.send(Due {
                due,
                value: sent % args.values,
            })?;
            sent += 1;
            due += interval;
        }
    }
    drop(tx);
    let mut latency_us = new_histogram()?;
    let mut statuses: BTreeMap<u16, u64> = BTreeMap::new();
    let mut errors = 0;
    for worker in workers {
        let tally = worker.await??;
        latency_us.add(&tally.latency_us)?;
        for (status, n) in tally.statuses {
            *statuses.entry(status).or_default() += n;
        }
        errors += tally.errors;
    }
    let elapsed = started.elapsed();
    let mut cpu = BTreeMap::new();
    for ((name, pid), before) in pids.iter().zip(cpu_before) {
        if let (Some(before), Some(after)) = (before, cpu_secs(*pid)) {
            cpu.insert(name.clone(), after - before);
        }
    }

    let ms = |h: &Histogram<u64>, q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    if args.json {
        let report = serde_json::json!({
            "target": args.target,
            "rate": args.rate,
            "connections": args.connections,
            "values": args.values,
            "requests": sent,
            "requests_per_sec": sent as f64 / elapsed.as_secs_f64().max(1e-9),
            "statuses": statuses.iter().map(|(s, n)| (s.to_string(), *n)).collect::<BTreeMap<_, _>>(),
            "errors": errors,
            "p50_ms": ms(&latency_us, 0.50),
            "p90_ms": ms(&latency_us, 0.90),
            "p99_ms": ms(&latency_us, 0.99),
            "p999_ms": ms(&latency_us, 0.999),
            "schedule_lag_p50_ms": ms(&lag_us, 0.50),
            "schedule_lag_p99_ms": ms(&lag_us, 0.99),
            "elapsed_secs": elapsed.as_secs_f64(),
            "cpu_secs": cpu,
        });
        println!("{report}");
    } else {
        println!(
            "{sent} requests at {}/s over {} connections: p50 {:.3} ms  p90 {:.3} ms  p99 {:.3} ms  p99.9 {:.3} ms",
            args.rate,
            args.connections,
            ms(&latency_us, 0.50),
            ms(&latency_us, 0.90),
            ms(&latency_us, 0.99),
            ms(&latency_us, 0.999),
        );
        println!(
            "schedule lag (generator): p50 {:.3} ms  p99 {:.3} ms",
            ms(&lag_us, 0.50),
            ms(&lag_us, 0.99)
        );
        println!("statuses {statuses:?}, errors {errors}");
        for (name, secs) in &cpu {
            let per = secs * 1e6 / sent.max(1) as f64;
            println!("cpu {name}: {secs:.2} s ({per:.1} µs per request)");
        }
    }
    Ok(())
}
