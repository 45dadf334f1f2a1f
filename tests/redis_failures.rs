//! Redis failures seen from Envoy's side: sluice in process over real gRPC against a real
//! `redis-server` that the test freezes (SIGSTOP), kills and brings back.
//!
//! What must hold (docs/redis.md): every call is answered within the backend deadline (plus a little)
//! while Redis hangs or is dead, the failure policy decides the answer, and decisions resume
//! without a restart once Redis is back. The figures (p50/p99 while hung, recovery times) are
//! printed for docs/redis.md; the assertions use generous bounds so a loaded 2-core machine does
//! not make them flaky (`cargo test --test redis_failures -- --nocapture` shows the figures).

mod helpers;

use std::time::{Duration, Instant};

use helpers::{descriptor, fixture, http_get, request, test_settings, RedisServer, TestServer};
use sluice::decision::FailurePolicy;
use sluice::proto::envoy::service::ratelimit::v3::rate_limit_response::Code;
use sluice::proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tonic::transport::Channel;

/// The production deadline: these tests are about it.
const DEADLINE_MS: u64 = 10;

fn start(redis: &RedisServer, policy: FailurePolicy) -> TestServer {
    let mut settings = test_settings(&fixture("e2e/limits"), Some(&redis.url()));
    settings.backend.deadline = Duration::from_millis(DEADLINE_MS);
    settings.on_backend_error = policy;
    TestServer::start(settings)
}

/// One call with a fresh user (never over its limit); its latency and gRPC result.
async fn one(
    client: &mut RateLimitServiceClient<Channel>,
    user: u64,
) -> (Duration, Result<i32, tonic::Code>) {
    let req = request("edge", vec![descriptor(&[("user", &format!("u{user}"))])]);
    let started = Instant::now();
    let result = client.should_rate_limit(req).await;
    (
        started.elapsed(),
        result
            .map(|r| r.into_inner().overall_code)
            .map_err(|s| s.code()),
    )
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// `calls` calls from 4 concurrent clients; returns sorted latencies, asserting each result.
async fn burst(
    sluice: &TestServer,
    calls: u64,
    expect: fn(&Result<i32, tonic::Code>) -> bool,
) -> Vec<Duration> {
    let mut tasks = Vec::new();
    for t in 0..4u64 {
        let mut client = sluice.client().await;
        tasks.push(tokio::spawn(async move {
            let mut seen = Vec::new();
            for i in 0..calls / 4 {
                seen.push(one(&mut client, 1_000_000 + t * calls + i).await);
            }
            seen
        }));
    }
    let mut latencies = Vec::new();
    for task in tasks {
        for (latency, result) in task.await.expect("client task") {
            assert!(expect(&result), "unexpected result {result:?}");
            latencies.push(latency);
        }
    }
    latencies.sort();
    latencies
}

/// Polls until a call is decided by Redis again (OK); returns how long that took.
async fn recovery(client: &mut RateLimitServiceClient<Channel>) -> Duration {
    let started = Instant::now();
    let mut user = 5_000_000;
    loop {
        user += 1;
        if let (_, Ok(code)) = one(client, user).await {
            if code == Code::Ok as i32 {
                return started.elapsed();
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "decisions did not resume within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn report(what: &str, latencies: &[Duration]) {
    println!(
        "{what}: {} calls, p50 {:?}, p99 {:?}, max {:?} (deadline {DEADLINE_MS} ms)",
        latencies.len(),
        percentile(latencies, 0.5),
        percentile(latencies, 0.99),
        latencies[latencies.len() - 1]
    );
}

/// With Redis healthy a call is decided OK; on a loaded 2-core test host a scheduler hiccup can
/// still push one past the 10 ms deadline, which the failure policy then answers. Callers
/// follow a healthy burst with [`recovery`], which insists on a real decision.
fn healthy(result: &Result<i32, tonic::Code>) -> bool {
    *result == Ok(Code::Ok as i32) || *result == Err(tonic::Code::Unavailable)
}

/// What the assertions allow: the figures that matter (p99 against deadline + 5 ms) are printed
/// for docs/redis.md; asserting them on a shared, loaded 2-core host would only measure the host.
fn generous_bound() -> Duration {
    Duration::from_millis(DEADLINE_MS + 250)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hung_redis_is_answered_within_the_deadline_and_decisions_resume() {
    let redis = RedisServer::start();
    let sluice = start(&redis, FailurePolicy::Error);
    let mut client = sluice.client().await;
    let warm = burst(&sluice, 40, healthy).await;
    report("redis healthy", &warm);
    recovery(&mut client).await;

    redis.pause();
    let hung = burst(&sluice, 400, |r| *r == Err(tonic::Code::Unavailable)).await;
    report("redis SIGSTOPped, policy error", &hung);
    assert!(
        percentile(&hung, 0.99) < generous_bound(),
        "p99 {:?} while Redis hangs",
        percentile(&hung, 0.99)
    );

    redis.resume();
    let took = recovery(&mut client).await;
    println!("recovery after SIGCONT: {took:?}");
    assert!(took < Duration::from_secs(1), "recovery took {took:?}");
    burst(&sluice, 40, healthy).await;
    recovery(&mut client).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_redis_is_answered_within_the_deadline_and_decisions_resume() {
    let mut redis = RedisServer::start();
    let sluice = start(&redis, FailurePolicy::Error);
    let mut client = sluice.client().await;
    burst(&sluice, 20, healthy).await;
    recovery(&mut client).await;

    redis.stop();
    let dead = burst(&sluice, 400, |r| *r == Err(tonic::Code::Unavailable)).await;
    report("redis killed, policy error", &dead);
    assert!(percentile(&dead, 0.99) < generous_bound());

    redis.start_again();
    let took = recovery(&mut client).await;
    println!("recovery after restart: {took:?}");
    assert!(took < Duration::from_secs(1), "recovery took {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failure_policy_decides_the_answer_and_is_counted() {
    let redis = RedisServer::start();
    let allow = start(&redis, FailurePolicy::Allow);
    let deny = start(&redis, FailurePolicy::Deny);
    let mut allow_client = allow.client().await;
    let mut deny_client = deny.client().await;
    assert_eq!(one(&mut allow_client, 1).await.1, Ok(Code::Ok as i32));
    // Warm the deny instance's connection too, so the hung calls below measure the deadline,
    // not a first connect.
    recovery(&mut deny_client).await;

    redis.pause();
    for user in 10..20 {
        let (latency, result) = one(&mut allow_client, user).await;
        assert_eq!(result, Ok(Code::Ok as i32));
        assert!(latency < generous_bound(), "allow answered in {latency:?}");
        let (latency, result) = one(&mut deny_client, user).await;
        assert_eq!(result, Ok(Code::OverLimit as i32));
        assert!(latency < generous_bound(), "deny answered in {latency:?}");
    }
    // Descriptors without a limit never reach Redis: OK even under `deny`.
    let free = request("edge", vec![descriptor(&[("bot", "x")])]);
    let resp = deny_client.should_rate_limit(free).await.expect("call");
    assert_eq!(resp.into_inner().overall_code, Code::Ok as i32);
    redis.resume();

    // At least the 10 hung calls (a warm-up call may also miss the 10 ms deadline on a loaded
    // machine, and is then counted too). Both servers render this test binary's one recorder;
    // each policy's series counts that server's failures alone (no other test here allows or
    // denies).
    for (sluice, policy) in [(&allow, "allow"), (&deny, "deny")] {
        let metrics = http_get(sluice.admin_addr, "/metrics").1;
        let series = format!("sluice_backend_failures_total{{policy=\"{policy}\"}} ");
        let count: u64 = metrics
            .lines()
            .find_map(|l| l.strip_prefix(series.as_str()))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {series} in {metrics}"));
        assert!(count >= 10, "{series}{count}");
    }
}
