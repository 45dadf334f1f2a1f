//! Rollouts that drop nothing: SIGTERM to `sluice` processes (the real binary, so the signal is
//! real) behind a real Envoy whose rate-limit cluster health-checks them over gRPC health as
//! `deploy/envoy/envoy.yaml` recommends, with the filter failing closed
//! (`failure_mode_deny: true`): every call Envoy could not place would be a 500.
//!
//! - [`sigterm_to_one_of_two_replicas_fails_no_request`]: two replicas on one Redis, steady
//!   load, SIGTERM to one. It reports NOT_SERVING and keeps answering for its drain delay;
//!   Envoy takes it out within that delay; then it sends GOAWAY, finishes its calls, exits 0.
//! - [`a_rolling_restart_of_three_replicas_fails_no_request`]: three replicas, each in turn
//!   stopped by SIGTERM and replaced on its port, the next only once Envoy sees the replacement
//!   healthy.
//!
//! Both count failures at the client (any status but 200, any broken exchange) and in Envoy's
//! stats (the listener's 5xx and 2xx, the filter's errors), and print the counts and how long
//! they took (`--nocapture`). Without the delay (`--drain-delay-secs 0`) the first fails: the
//! calls Envoy still sends to the stopped replica meet a closed port.
//!
//! Then the delay itself, on the binary alone: while it runs gRPC health (`""`, the RLS
//! service, `ratelimit`) says NOT_SERVING, `/readyz` 503, `/healthcheck` 500, yet liveness is
//! SERVING and an RLS call is answered on an open connection and on a new one; after it the
//! process exits 0. A second signal skips what is left of it.
//!
//! The filter's timeout is [`TEST_FILTER_TIMEOUT`] (1 s), not the shipped 20 ms, for the reason
//! `with_test_filter_timeout` gives: what is tested is where Envoy sends calls during a
//! rollout, not a debug build's latency on a loaded 2-core machine.

use crate::helpers;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use helpers::envoy_config::{
    TEST_FILTER_TIMEOUT, bootstrap, cluster, generic_key, grpc_cluster, http_listener,
    ratelimit_filter, repo_path, route, yaml_file,
};
use helpers::{Envoy, RedisServer, Req, Sluice, Upstream, descriptor, http_get, request};
use serde_json::{Value, json};
use sluice::proto::envoy::service::ratelimit::v3::rate_limit_response::Code;
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

const LIMITS: &str = "domain: drain
descriptors:
  - key: load
    rate_limit: {unit: minute, requests_per_unit: 1000000}
";

/// The replicas' drain delay here: over twice the time the shipped health checks take to see
/// NOT_SERVING (two checks a second apart), half the default (10 s), which leaves room for a
/// Kubernetes Service or an xDS push as well. The tests assert Envoy took the replica out
/// before the delay ended.
const DRAIN_DELAY: Duration = Duration::from_secs(5);
/// After the delay: the calls in flight finish, the tasks end, the process exits.
const EXIT_WITHIN: Duration = Duration::from_secs(5);
/// Concurrent clients of the load, each sending one request at a time, a pause after each.
const WORKERS: usize = 4;
const PAUSE: Duration = Duration::from_millis(5);
/// Bounds of the load whatever happens: requests per client, and time.
const MAX_PER_WORKER: u64 = 10_000;
const MAX_LOAD_TIME: Duration = Duration::from_secs(90);
/// Longest wait for Envoy to see a (new) replica healthy.
const HEALTHY_WITHIN: Duration = Duration::from_secs(20);

fn limits_file(dir: &Path) -> PathBuf {
    let path = dir.join("drain.yaml");
    std::fs::write(&path, LIMITS).unwrap();
    path
}

/// The drain delay flag of every replica.
fn delay_flag() -> [String; 2] {
    [
        "--drain-delay-secs".into(),
        DRAIN_DELAY.as_secs().to_string(),
    ]
}

/// The health checks `deploy/envoy/envoy.yaml` gives its sluice cluster.
fn shipped_health_checks() -> Value {
    let config = yaml_file(&repo_path("deploy/envoy/envoy.yaml"));
    let clusters = config["static_resources"]["clusters"].as_array().unwrap();
    let sluice = clusters.iter().find(|c| c["name"] == "sluice").unwrap();
    let checks = sluice["health_checks"].clone();
    assert!(
        checks.as_array().is_some_and(|c| !c.is_empty()),
        "deploy/envoy/envoy.yaml's sluice cluster has no health_checks"
    );
    checks
}

/// One listener (`drain`) whose every request asks the rate-limit cluster `sluice` (the
/// `replicas`, health-checked as shipped) before going to `app`; failing closed.
fn envoy_config(replicas: &[SocketAddr], app: SocketAddr) -> Value {
    let mut rls = grpc_cluster("sluice", replicas);
    rls["health_checks"] = shipped_health_checks();
    let routes = vec![route(
        "/",
        "app",
        json!([{"actions": [generic_key("load", "all")]}]),
        json!({}),
    )];
    let filter = ratelimit_filter(
        "drain",
        "sluice",
        1000,
        true,
        json!({"timeout": TEST_FILTER_TIMEOUT}),
    );
    bootstrap(
        vec![http_listener("drain", routes, vec![filter])],
        vec![cluster("app", &[app]), rls],
    )
}

/// Whether Envoy's health checks see `replica` healthy.
fn healthy(envoy: &Envoy, replica: SocketAddr) -> bool {
    envoy
        .host_health("sluice")
        .get(&replica.to_string())
        .is_some_and(|flags| flags == "healthy")
}

/// Requests `replica` has served for Envoy.
fn served(envoy: &Envoy, replica: SocketAddr) -> u64 {
    envoy
        .host_requests("sluice")
        .get(&replica.to_string())
        .copied()
        .unwrap_or(0)
}

/// Waits until Envoy sees `replica` as `up` says, within `limit`; returns how long it took.
async fn wait_health(envoy: &Envoy, replica: SocketAddr, up: bool, limit: Duration) -> Duration {
    let start = Instant::now();
    let what = format!(
        "Envoy sees {replica} {}",
        if up { "healthy" } else { "unhealthy" }
    );
    helpers::wait_until(&what, limit, || {
        let seen = healthy(envoy, replica) == up;
        async move { seen }
    })
    .await;
    start.elapsed()
}

/// What the clients saw.
#[derive(Debug, Default)]
struct Tally {
    sent: u64,
    ok: u64,
    /// The first few failures, for the message.
    failures: Vec<String>,
}

impl Tally {
    fn failed(&self) -> u64 {
        self.sent - self.ok
    }

    fn add(&mut self, other: Tally) {
        self.sent += other.sent;
        self.ok += other.ok;
        self.failures.extend(other.failures);
        self.failures.truncate(10);
    }
}

/// Steady HTTP load on Envoy's listener: [`WORKERS`] clients, one request at a time each,
/// until [`Load::finish`] (or the bounds).
struct Load {
    stop: Arc<AtomicBool>,
    workers: Vec<tokio::task::JoinHandle<Tally>>,
    started: Instant,
}

impl Load {
    fn start(front: SocketAddr) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let workers = (0..WORKERS)
            .map(|_| tokio::spawn(client(front, stop.clone())))
            .collect();
        Load {
            stop,
            workers,
            started: Instant::now(),
        }
    }

    async fn finish(self) -> (Tally, Duration) {
        self.stop.store(true, Ordering::Relaxed);
        let mut tally = Tally::default();
        for worker in self.workers {
            tally.add(worker.await.expect("load client"));
        }
        (tally, self.started.elapsed())
    }
}

async fn client(front: SocketAddr, stop: Arc<AtomicBool>) -> Tally {
    let started = Instant::now();
    let mut tally = Tally::default();
    while !stop.load(Ordering::Relaxed)
        && tally.sent < MAX_PER_WORKER
        && started.elapsed() < MAX_LOAD_TIME
    {
        tally.sent += 1;
        match Req::get("/drain").try_send(front).await {
            Ok(resp) if resp.status == 200 => tally.ok += 1,
            Ok(resp) if tally.failures.len() < 10 => tally
                .failures
                .push(format!("{} {:?}", resp.status, resp.headers)),
            Err(e) if tally.failures.len() < 10 => tally.failures.push(e.to_string()),
            _ => {}
        }
        tokio::time::sleep(PAUSE).await;
    }
    tally
}

/// Envoy's own count of what the load got: no 5xx, a 2xx for every request sent, no
/// rate-limit call that failed.
fn assert_envoy_saw_no_failure(envoy: &Envoy, tally: &Tally) -> (u64, u64) {
    let rq_5xx = envoy.counter("http.drain.downstream_rq_5xx");
    let rq_2xx = envoy.counter("http.drain.downstream_rq_2xx");
    let rls_errors = envoy.counter("cluster.app.ratelimit.error");
    assert_eq!(
        (rq_5xx, rls_errors),
        (0, 0),
        "Envoy counted 5xx responses / rate-limit errors"
    );
    assert_eq!(rq_2xx, tally.sent, "Envoy's 2xx against the requests sent");
    assert_eq!(
        envoy.counter("cluster.app.ratelimit.ok"),
        tally.sent,
        "every request was decided by sluice"
    );
    (rq_2xx, rq_5xx)
}

fn assert_no_failure(tally: &Tally) {
    assert!(tally.sent > 0, "no load was sent");
    assert_eq!(
        tally.failed(),
        0,
        "{} of {} requests failed; first: {:?}",
        tally.failed(),
        tally.sent,
        tally.failures
    );
}

/// Sends SIGTERM to `replica` under load and follows it out: Envoy takes it out while it still
/// answers (within the drain delay), then it exits 0 no sooner than the delay and within
/// [`EXIT_WITHIN`] after it. Returns (requests it answered after SIGTERM, Envoy's time to
/// take it out, its time to exit).
async fn terminate_under_load(envoy: &Envoy, replica: &mut Sluice) -> (u64, Duration, Duration) {
    let addr = replica.grpc_addr;
    let before = served(envoy, addr);
    replica.signal_term();
    let term = Instant::now();
    let taken_out = wait_health(envoy, addr, false, DRAIN_DELAY).await;
    helpers::wait_until(
        "the replica exits after its drain delay",
        DRAIN_DELAY + EXIT_WITHIN,
        || {
            let running = replica.is_running();
            async move { !running }
        },
    )
    .await;
    let exited = term.elapsed();
    let status = replica.wait_exit();
    assert!(status.success(), "exit status {status:?}");
    assert!(
        exited >= DRAIN_DELAY,
        "exited {exited:?} after SIGTERM, before its drain delay"
    );
    let log = replica.log_text();
    assert!(
        log.contains("shutdown requested") && log.contains("stopping") && log.contains("stopped"),
        "{log}"
    );
    (served(envoy, addr) - before, taken_out, exited)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_to_one_of_two_replicas_fails_no_request() {
    let test_start = Instant::now();
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let config = limits_file(dir.path());
    let flag = delay_flag();
    let flag: Vec<&str> = flag.iter().map(String::as_str).collect();
    let mut stopped = Sluice::start_with(&config, Some(&redis.url()), &flag);
    let staying = Sluice::start_with(&config, Some(&redis.url()), &flag);
    let upstream = Upstream::start();
    let replicas = [stopped.grpc_addr, staying.grpc_addr];
    let envoy = Envoy::start_json(&envoy_config(&replicas, upstream.addr));
    for replica in replicas {
        wait_health(&envoy, replica, true, HEALTHY_WITHIN).await;
    }

    let load = Load::start(envoy.listener("drain"));
    helpers::wait_until(
        "both replicas answer Envoy",
        Duration::from_secs(10),
        || {
            let both = replicas.iter().all(|r| served(&envoy, *r) > 0);
            async move { both }
        },
    )
    .await;
    let (after_term, taken_out, exited) = terminate_under_load(&envoy, &mut stopped).await;
    // The remaining replica alone, a second.
    let alone = served(&envoy, staying.grpc_addr);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (tally, load_time) = load.finish().await;
    assert!(
        served(&envoy, staying.grpc_addr) > alone,
        "the remaining replica served"
    );

    assert_no_failure(&tally);
    let (rq_2xx, rq_5xx) = assert_envoy_saw_no_failure(&envoy, &tally);
    // The calls Envoy placed on the stopped replica after SIGTERM, before its health checks
    // took it out: without the delay each would have met a closed port.
    assert!(
        after_term > 0,
        "Envoy sent nothing to the replica after SIGTERM: the test shows no drain"
    );
    println!(
        "SIGTERM to one of two replicas: {} requests sent over {load_time:.1?}, {} failed \
         (Envoy: {rq_2xx} 2xx, {rq_5xx} 5xx); the stopped replica answered {after_term} \
         calls after SIGTERM, Envoy took it out after {taken_out:.1?}, it exited 0 after \
         {exited:.1?}; test took {:.1?}",
        tally.sent,
        tally.failed(),
        test_start.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_of_three_replicas_fails_no_request() {
    let test_start = Instant::now();
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let config = limits_file(dir.path());
    let flag = delay_flag();
    let flag: Vec<&str> = flag.iter().map(String::as_str).collect();
    let mut replicas: Vec<Sluice> = (0..3)
        .map(|_| Sluice::start_with(&config, Some(&redis.url()), &flag))
        .collect();
    let addrs: Vec<SocketAddr> = replicas.iter().map(|r| r.grpc_addr).collect();
    let upstream = Upstream::start();
    let envoy = Envoy::start_json(&envoy_config(&addrs, upstream.addr));
    for addr in &addrs {
        wait_health(&envoy, *addr, true, HEALTHY_WITHIN).await;
    }

    let load = Load::start(envoy.listener("drain"));
    helpers::wait_until(
        "every replica answers Envoy",
        Duration::from_secs(10),
        || {
            let all = addrs.iter().all(|r| served(&envoy, *r) > 0);
            async move { all }
        },
    )
    .await;
    let mut steps = Vec::new();
    for (i, addr) in addrs.iter().enumerate() {
        let (after_term, taken_out, exited) = terminate_under_load(&envoy, &mut replicas[i]).await;
        // Its replacement, on the same port (the cluster's endpoint).
        replicas[i] = tokio::task::block_in_place(|| {
            Sluice::start_at(*addr, &config, Some(&redis.url()), &flag)
        });
        let healthy_after = wait_health(&envoy, *addr, true, HEALTHY_WITHIN).await;
        let back = served(&envoy, *addr);
        helpers::wait_until("the replacement serves", Duration::from_secs(10), || {
            let more = served(&envoy, *addr) > back;
            async move { more }
        })
        .await;
        steps.push(format!(
            "replica {i}: {after_term} calls answered after SIGTERM, out after \
             {taken_out:.1?}, exited 0 after {exited:.1?}, replacement healthy after \
             {healthy_after:.1?}"
        ));
    }
    let (tally, load_time) = load.finish().await;

    assert_no_failure(&tally);
    let (rq_2xx, rq_5xx) = assert_envoy_saw_no_failure(&envoy, &tally);
    println!(
        "rolling restart of three replicas: {} requests sent over {load_time:.1?}, {} failed \
         (Envoy: {rq_2xx} 2xx, {rq_5xx} 5xx); test took {:.1?}\n  {}",
        tally.sent,
        tally.failed(),
        test_start.elapsed(),
        steps.join("\n  ")
    );
}

/// gRPC health of `service` on `channel`; `None` for a service health does not know.
async fn health(channel: &Channel, service: &str) -> Option<ServingStatus> {
    let response = HealthClient::new(channel.clone())
        .check(HealthCheckRequest {
            service: service.into(),
        })
        .await
        .ok()?
        .into_inner();
    ServingStatus::try_from(response.status).ok()
}

/// An RLS call on `channel`: its overall code.
async fn decide(channel: &Channel) -> Code {
    let mut client =
        sluice::proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient::new(
            channel.clone(),
        );
    let response = client
        .should_rate_limit(request("drain", vec![descriptor(&[("load", "x")])]))
        .await
        .expect("an RLS call answered")
        .into_inner();
    Code::try_from(response.overall_code).expect("an overall code")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn during_the_drain_delay_health_says_not_serving_and_calls_are_answered() {
    let dir = tempfile::tempdir().unwrap();
    let config = limits_file(dir.path());
    let delay = Duration::from_secs(3);
    let mut sluice = Sluice::start_with(
        &config,
        None,
        &["--drain-delay-secs", &delay.as_secs().to_string()],
    );
    let open = sluice.channel().await;
    assert_eq!(health(&open, "").await, Some(ServingStatus::Serving));
    assert_eq!(http_get(sluice.admin_addr, "/readyz").0, 200);

    sluice.signal_term();
    let term = Instant::now();
    helpers::wait_until("NOT_SERVING after SIGTERM", Duration::from_secs(2), || {
        let open = open.clone();
        async move { health(&open, "").await == Some(ServingStatus::NotServing) }
    })
    .await;
    let rls = sluice::grpc::SERVICE_NAME;
    for (service, expected) in [
        ("", ServingStatus::NotServing),
        (rls, ServingStatus::NotServing),
        ("ratelimit", ServingStatus::NotServing),
        (sluice::grpc::LIVENESS_SERVICE, ServingStatus::Serving),
    ] {
        assert_eq!(health(&open, service).await, Some(expected), "{service:?}");
    }
    assert_eq!(
        http_get(sluice.admin_addr, "/readyz"),
        (503, "draining\n".into())
    );
    assert_eq!(http_get(sluice.admin_addr, "/healthcheck").0, 500);
    assert_eq!(http_get(sluice.admin_addr, "/healthz").0, 200);
    assert_eq!(decide(&open).await, Code::Ok, "on an open connection");
    let fresh = helpers::grpc_channel(sluice.grpc_addr).await;
    assert_eq!(decide(&fresh).await, Code::Ok, "on a new connection");
    assert_eq!(
        health(&fresh, rls).await,
        Some(ServingStatus::NotServing),
        "on a new connection"
    );
    let checked = term.elapsed();
    assert!(
        checked < delay,
        "the checks took {checked:?}, past the delay: they proved nothing"
    );
    assert!(sluice.is_running());

    drop((open, fresh));
    helpers::wait_until("exit after the delay", delay + EXIT_WITHIN, || {
        let running = sluice.is_running();
        async move { !running }
    })
    .await;
    let exited = term.elapsed();
    let status = sluice.wait_exit();
    assert!(status.success(), "exit status {status:?}");
    assert!(exited >= delay, "exited after {exited:?}, before the delay");
    println!("drain delay {delay:?}: checked within {checked:.2?}, exited 0 after {exited:.2?}");
}

/// The delay from `SLUICE_DRAIN_DELAY_SECS` (60 s), cut short by a second signal (SIGINT after
/// SIGTERM): the process exits 0 at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_signal_skips_the_rest_of_the_drain_delay() {
    let dir = tempfile::tempdir().unwrap();
    let config = limits_file(dir.path());
    let mut sluice =
        Sluice::start_with_env(&config, None, &[], &[("SLUICE_DRAIN_DELAY_SECS", "60")]);
    sluice.signal_term();
    helpers::wait_until("shutdown requested", Duration::from_secs(5), || {
        let logged = sluice.log_text().contains("drain_delay_secs=60");
        async move { logged }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(sluice.is_running(), "exited during its 60 s delay");
    assert_eq!(
        decide(&sluice.channel().await).await,
        Code::Ok,
        "answers during the delay"
    );

    sluice.signal("INT");
    let second = Instant::now();
    let status = sluice.wait_exit_within(EXIT_WITHIN);
    assert!(status.success(), "exit status {status:?}");
    let log = sluice.log_text();
    assert!(log.contains("signalled again"), "{log}");
    println!("exited 0 {:.2?} after the second signal", second.elapsed());
}
