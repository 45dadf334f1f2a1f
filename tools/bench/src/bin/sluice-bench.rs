//! `sluice-bench`: a load generator that speaks Envoy RLS v3 over gRPC.
//!
//! Why its own binary: performance claims must come from figures measured in one run on one
//! machine. Every report first measures the generator's own ceiling against a built-in no-op
//! RLS server (same process, same connections, same load shape), then the target, and prints both
//! with their ratio. Load is bounded by duration and an optional request cap, and targets only the
//! address given (loopback in every script of this project).
#![forbid(unsafe_code)]
#![deny(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use hdrhistogram::Histogram;
use sluice::proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use sluice::proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use sluice::proto::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use sluice::proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use sluice::proto::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use sluice::proto::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use sluice_bench::{PreciseTimer, cpu_secs, new_histogram, parse_pid};
use tonic::transport::Channel;

#[derive(Parser, Debug, Clone)]
#[command(
    name = "sluice-bench",
    about = "Envoy RLS v3 load generator with a no-op ceiling"
)]
struct Args {
    /// gRPC address of the server under test (host:port). Without it only the no-op ceiling runs.
    /// Several (comma-separated or repeated) spread the connections over them round-robin, so
    /// one generator drives several instances at once (the no-op phase then uses as many
    /// connections, all to the one no-op server).
    #[arg(long, value_delimiter = ',')]
    target: Vec<String>,
    /// Concurrent callers (closed loop) or the cap on requests in flight (open loop).
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// HTTP/2 connections shared by the callers.
    #[arg(long, default_value_t = 4)]
    connections: usize,
    /// Seconds of load per phase.
    #[arg(long, default_value_t = 5.0)]
    duration_secs: f64,
    /// Stop a phase after this many requests even if time remains.
    #[arg(long)]
    max_requests: Option<u64>,
    /// Distinct values per descriptor key.
    #[arg(long, default_value_t = 10_000)]
    keys: u64,
    /// Descriptor values are this prefix and a number below `--keys` (a fresh prefix gives
    /// fresh limiter keys, e.g. for an exactness check after other runs).
    #[arg(long, default_value = "v")]
    value_prefix: String,
    /// Take the values in order (0, 1, ... below `--keys`, shared by every caller) instead of at
    /// random: with `--max-requests` equal to `--keys`, each key is sent exactly once (the
    /// scale benchmark puts its keys over their limit that way).
    #[arg(long)]
    sequential: bool,
    /// Seed of the random values: runs with the same seed send the same values in the same
    /// order (per caller), so phases meant to draw keys independently take different seeds.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Descriptor keys, one descriptor per key per request (e.g. `endpoint,user`).
    #[arg(long, value_delimiter = ',', default_value = "user")]
    descriptor_keys: Vec<String>,
    /// hits_addend of each request (0 means 1 for the server).
    #[arg(long, default_value_t = 0)]
    hits: u32,
    /// Open-loop target rate in requests per second; 0 runs closed loop.
    #[arg(long, default_value_t = 0.0)]
    rate: f64,
    /// Open loop: shortest time between two wake-ups of the pacer, in µs. Requests due
    /// meanwhile leave together, so this bounds the generator's schedule lag (plus the timer's
    /// own lateness, ~50-100 µs) and the pacer's CPU (one wake-up costs tens of µs of CPU on a
    /// small VM).
    #[arg(long, default_value_t = 100)]
    pace_us: u64,
    /// Domain sent in every request.
    #[arg(long, default_value = "bench")]
    domain: String,
    /// Processes whose CPU seconds to report, as NAME=PID (repeatable).
    #[arg(long = "pid", value_parser = parse_pid)]
    pids: Vec<(String, u32)>,
    /// Skip the no-op ceiling phase.
    #[arg(long)]
    no_ceiling: bool,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// Measure the ceiling against this external no-op server (started with `--serve-noop`)
    /// instead of the in-process one, so that generator and server run in separate processes
    /// exactly as against sluice.
    #[arg(long)]
    ceiling: Option<String>,
    /// Only serve the no-op RLS server on this address until killed (for `--ceiling`).
    #[arg(long)]
    serve_noop: Option<SocketAddr>,
    /// Print the Lua library sluice's Redis backend runs (for `FUNCTION LOAD`, then
    /// `redis-benchmark FCALL`) and exit.
    #[arg(long)]
    print_lua_script: bool,
}

#[derive(Debug, Default)]
struct Phase {
    name: String,
    requests: u64,
    ok: u64,
    over_limit: u64,
    errors: u64,
    elapsed: Duration,
    latency_us: Option<Histogram<u64>>,
    /// Open loop only: when each request was handed to the client, after its scheduled instant.
    schedule_lag_us: Option<Histogram<u64>>,
    cpu_secs: BTreeMap<String, f64>,
}

impl Phase {
    fn rate(&self) -> f64 {
        self.requests as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    fn percentile_ms(&self, q: f64) -> f64 {
        self.latency_us
            .as_ref()
            .map_or(0.0, |h| h.value_at_quantile(q) as f64 / 1000.0)
    }

    /// A percentile of the generator's schedule lag, in ms (`None` in closed loop).
    fn lag_ms(&self, q: f64) -> Option<f64> {
        self.schedule_lag_us
            .as_ref()
            .map(|h| h.value_at_quantile(q) as f64 / 1000.0)
    }

    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "name": self.name,
            "requests": self.requests,
            "decisions_per_sec": self.rate(),
            "ok": self.ok,
            "over_limit": self.over_limit,
            "errors": self.errors,
            "p50_ms": self.percentile_ms(0.50),
            "p90_ms": self.percentile_ms(0.90),
            "p99_ms": self.percentile_ms(0.99),
            "p999_ms": self.percentile_ms(0.999),
            "schedule_lag_p50_ms": self.lag_ms(0.50),
            "schedule_lag_p99_ms": self.lag_ms(0.99),
            "elapsed_secs": self.elapsed.as_secs_f64(),
            "cpu_secs": self.cpu_secs,
        })
    }

    fn print(&self) {
        println!(
            "{:<8} {:>10.0}/s  p50 {:>7.3} ms  p90 {:>7.3} ms  p99 {:>7.3} ms  p99.9 {:>7.3} ms  ok {} over_limit {} errors {}",
            self.name,
            self.rate(),
            self.percentile_ms(0.50),
            self.percentile_ms(0.90),
            self.percentile_ms(0.99),
            self.percentile_ms(0.999),
            self.ok,
            self.over_limit,
            self.errors
        );
        if let (Some(p50), Some(p99)) = (self.lag_ms(0.50), self.lag_ms(0.99)) {
            // Included in the latencies above, which count from the scheduled instant.
            println!("         schedule lag (generator): p50 {p50:>7.3} ms  p99 {p99:>7.3} ms");
        }
        for (name, secs) in &self.cpu_secs {
            let per = secs * 1e6 / self.requests.max(1) as f64;
            println!("         cpu {name}: {secs:.2} s ({per:.1} µs per decision)");
        }
    }
}

/// Answers OK to everything: the generator's ceiling.
struct Noop;

#[tonic::async_trait]
impl RateLimitService for Noop {
    async fn should_rate_limit(
        &self,
        request: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        let n = request.get_ref().descriptors.len();
        Ok(tonic::Response::new(RateLimitResponse {
            overall_code: Code::Ok as i32,
            statuses: vec![
                DescriptorStatus {
                    code: Code::Ok as i32,
                    ..Default::default()
                };
                n
            ],
            ..Default::default()
        }))
    }
}

async fn start_noop(addr: SocketAddr) -> anyhow::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    // TCP_NODELAY as sluice's own server sets it: without it Nagle's algorithm holds small
    // responses back and the "ceiling" measures the stall, not the generator.
    let incoming = tokio_stream::StreamExt::map(
        tokio_stream::wrappers::TcpListenerStream::new(listener),
        |conn| {
            conn.inspect(|stream| {
                let _ = stream.set_nodelay(true);
            })
        },
    );
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(RateLimitServiceServer::new(Noop))
            .serve_with_incoming(incoming),
    );
    Ok(addr)
}

/// The random state of caller `task` (0 for the open loop's single sender) under `seed`; never
/// 0, which xorshift would keep.
fn random_state(seed: u64, task: u64) -> u64 {
    let state = 0x9E37_79B9_7F4A_7C15u64
        ^ task.wrapping_mul(0x2545_F491_4F6C_DD1D)
        ^ seed.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    if state == 0 { 1 } else { state }
}

/// A small xorshift: per-task, deterministic, no shared state on the hot path.
fn next_random(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// The next value of `--sequential`, shared by every caller of the process.
static NEXT_VALUE: AtomicU64 = AtomicU64::new(0);

fn build_request(args: &Args, rng: &mut u64) -> RateLimitRequest {
    let mut value = || {
        let n = if args.sequential {
            NEXT_VALUE.fetch_add(1, Ordering::Relaxed)
        } else {
            next_random(rng)
        };
        n % args.keys.max(1)
    };
    RateLimitRequest {
        domain: args.domain.clone(),
        descriptors: args
            .descriptor_keys
            .iter()
            .map(|key| RateLimitDescriptor {
                entries: vec![Entry {
                    key: key.clone(),
                    value: format!("{}{}", args.value_prefix, value()),
                }],
                ..Default::default()
            })
            .collect(),
        hits_addend: args.hits,
    }
}

#[derive(Default)]
struct Counters {
    requests: AtomicU64,
    ok: AtomicU64,
    over_limit: AtomicU64,
    errors: AtomicU64,
}

impl Counters {
    fn record(&self, result: &Result<tonic::Response<RateLimitResponse>, tonic::Status>) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        let counter = match result {
            Ok(r) if r.get_ref().overall_code == Code::OverLimit as i32 => &self.over_limit,
            Ok(_) => &self.ok,
            Err(_) => &self.errors,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// Takes one request from the phase's budget (`--max-requests`).
fn take(budget: &AtomicU64) -> bool {
    budget
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| b.checked_sub(1))
        .is_ok()
}

/// Open loop: requests leave on a fixed schedule whatever the server does, and latency counts
/// from the scheduled instant, so a stalled server cannot hide its queueing (no coordinated
/// omission). Returns the latency and the schedule lag histograms (µs).
///
/// The schedule is kept by a [`PreciseTimer`] (not tokio's 1 ms timer), waking at most every
/// `--pace-us`; requests due by then leave together. It waits instead of spinning, since
/// generator, server and Redis share the machine's cores. Each request also reports its schedule
/// lag (handed to the client minus scheduled), so a reader can tell the generator's own lag from
/// the server's latency.
async fn open_loop(
    clients: &[RateLimitServiceClient<Channel>],
    args: &Args,
    counters: &Arc<Counters>,
    budget: Arc<AtomicU64>,
    deadline: Instant,
) -> anyhow::Result<(Histogram<u64>, Histogram<u64>)> {
    let in_flight = Arc::new(tokio::sync::Semaphore::new(args.concurrency.max(1)));
    let interval = Duration::from_secs_f64(1.0 / args.rate);
    let pace = Duration::from_micros(args.pace_us);
    let timer = PreciseTimer::new()?;
    // (latency from the scheduled instant, schedule lag), both in µs, per completed request.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(u64, u64)>();
    let mut latency = new_histogram()?;
    let mut lag = new_histogram()?;
    let mut rng = random_state(args.seed, 0);
    let mut i = 0usize;
    let mut scheduled = Instant::now();
    let mut woke: Option<Instant> = None;
    let mut done = false;
    while !done {
        timer
            .sleep_until(woke.map_or(scheduled, |w| scheduled.max(w + pace)))
            .await?;
        let now = Instant::now();
        woke = Some(now);
        while scheduled <= now {
            if scheduled >= deadline || !take(&budget) {
                done = true;
                break;
            }
            let at = scheduled;
            scheduled += interval;
            let Ok(permit) = in_flight.clone().try_acquire_owned() else {
                // Over the in-flight cap: counted as an error instead of queueing unboundedly.
                counters.requests.fetch_add(1, Ordering::Relaxed);
                counters.errors.fetch_add(1, Ordering::Relaxed);
                continue;
            };
            let mut client = clients[i % clients.len()].clone();
            i += 1;
            let request = build_request(args, &mut rng);
            let counters = counters.clone();
            let tx = tx.clone();
            tokio::spawn(async move {
                let lag = at.elapsed();
                let result = client.should_rate_limit(request).await;
                let latency = at.elapsed();
                counters.record(&result);
                let _ = tx.send((latency.as_micros() as u64, lag.as_micros() as u64));
                drop(permit);
            });
        }
        while let Ok((latency_us, lag_us)) = rx.try_recv() {
            let _ = latency.record(latency_us.max(1));
            let _ = lag.record(lag_us.max(1));
        }
    }
    drop(tx);
    while let Some((latency_us, lag_us)) = rx.recv().await {
        let _ = latency.record(latency_us.max(1));
        let _ = lag.record(lag_us.max(1));
    }
    Ok((latency, lag))
}

async fn run_phase(name: &str, addrs: &[String], args: &Args) -> anyhow::Result<Phase> {
    let mut clients = Vec::new();
    for i in 0..args.connections.max(addrs.len()).max(1) {
        let addr = &addrs[i % addrs.len()];
        let channel = Channel::from_shared(format!("http://{addr}"))?
            .tcp_nodelay(true)
            .connect()
            .await?;
        clients.push(RateLimitServiceClient::new(channel));
    }
    let counters = Arc::new(Counters::default());
    let stop = Arc::new(AtomicBool::new(false));
    let budget = Arc::new(AtomicU64::new(args.max_requests.unwrap_or(u64::MAX)));
    let cpu_before: Vec<(String, Option<f64>)> = args
        .pids
        .iter()
        .map(|(n, p)| (n.clone(), cpu_secs(*p)))
        .collect();
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(args.duration_secs);

    if args.rate > 0.0 {
        let (latency, lag) = open_loop(&clients, args, &counters, budget, deadline).await?;
        let mut phase = finish(name, started, counters, Some(latency), &cpu_before, args)?;
        phase.schedule_lag_us = Some(lag);
        return Ok(phase);
    }

    let mut tasks = Vec::new();
    for task in 0..args.concurrency.max(1) {
        let mut client = clients[task % clients.len()].clone();
        let args = args.clone();
        let counters = counters.clone();
        let stop = stop.clone();
        let budget = budget.clone();
        tasks.push(tokio::spawn(async move {
            let mut histogram = new_histogram()?;
            let mut rng = random_state(args.seed, task as u64 + 1);
            while !stop.load(Ordering::Relaxed) && Instant::now() < deadline && take(&budget) {
                let request = build_request(&args, &mut rng);
                let sent = Instant::now();
                let result = client.should_rate_limit(request).await;
                let _ = histogram.record((sent.elapsed().as_micros() as u64).max(1));
                counters.record(&result);
            }
            anyhow::Ok(histogram)
        }));
    }
    let mut merged = new_histogram()?;
    for task in tasks {
        let histogram = task.await??;
        merged.add(&histogram)?;
    }
    stop.store(true, Ordering::Relaxed);
    finish(name, started, counters, Some(merged), &cpu_before, args)
}

fn finish(
    name: &str,
    started: Instant,
    counters: Arc<Counters>,
    histogram: Option<Histogram<u64>>,
    cpu_before: &[(String, Option<f64>)],
    args: &Args,
) -> anyhow::Result<Phase> {
    let elapsed = started.elapsed();
    let mut cpu = BTreeMap::new();
    for ((name, before), (_, pid)) in cpu_before.iter().zip(&args.pids) {
        if let (Some(before), Some(after)) = (before, cpu_secs(*pid)) {
            cpu.insert(name.clone(), after - before);
        }
    }
    Ok(Phase {
        name: name.to_owned(),
        requests: counters.requests.load(Ordering::Relaxed),
        ok: counters.ok.load(Ordering::Relaxed),
        over_limit: counters.over_limit.load(Ordering::Relaxed),
        errors: counters.errors.load(Ordering::Relaxed),
        elapsed,
        latency_us: histogram,
        schedule_lag_us: None,
        cpu_secs: cpu,
    })
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = Args::parse();
    if args.print_lua_script {
        print!("{}", sluice::limiter::redis::script::LIBRARY.source);
        return Ok(());
    }
    if let Some(addr) = args.serve_noop {
        let bound = start_noop(addr).await?;
        eprintln!("no-op RLS server on {bound}");
        return std::future::pending().await;
    }
    anyhow::ensure!(args.duration_secs > 0.0, "--duration-secs must be positive");
    anyhow::ensure!(
        !args.descriptor_keys.is_empty(),
        "--descriptor-keys is empty"
    );
    let bench_pid = std::process::id();
    args.pids.push(("sluice-bench".into(), bench_pid));

    let mut phases = Vec::new();
    if !args.no_ceiling {
        let noop = match &args.ceiling {
            Some(external) => external.clone(),
            None => start_noop(SocketAddr::from(([127, 0, 0, 1], 0)))
                .await?
                .to_string(),
        };
        // As many connections as the target phase opens, all to the one no-op server.
        let noops = vec![noop; args.target.len().max(1)];
        phases.push(run_phase("noop", &noops, &args).await?);
    }
    if !args.target.is_empty() {
        phases.push(run_phase("target", &args.target.clone(), &args).await?);
    }
    anyhow::ensure!(
        !phases.is_empty(),
        "nothing to run: give --target or drop --no-ceiling"
    );

    let ratio = match (phases.first(), phases.get(1)) {
        (Some(noop), Some(target)) if noop.name == "noop" => Some(target.rate() / noop.rate()),
        _ => None,
    };
    if args.json {
        let report = serde_json::json!({
            "targets": args.target,
            "ceiling": args.ceiling.as_deref().unwrap_or("in-process"),
            "concurrency": args.concurrency,
            "connections": args.connections,
            "duration_secs": args.duration_secs,
            "keys": args.keys,
            "seed": args.seed,
            "descriptor_keys": args.descriptor_keys,
            "hits": args.hits,
            "rate": args.rate,
            "phases": phases.iter().map(Phase::json).collect::<Vec<_>>(),
            "target_to_noop_ratio": ratio,
        });
        println!("{report}");
    } else {
        println!(
            "concurrency {} connections {} duration {}s keys {} descriptors {:?} hits {} {}",
            args.concurrency,
            args.connections,
            args.duration_secs,
            args.keys,
            args.descriptor_keys,
            args.hits,
            if args.rate > 0.0 {
                format!("open loop at {}/s", args.rate)
            } else {
                "closed loop".into()
            }
        );
        for phase in &phases {
            phase.print();
        }
        if let Some(ratio) = ratio {
            println!("target / noop: {ratio:.2}");
        }
    }
    Ok(())
}
