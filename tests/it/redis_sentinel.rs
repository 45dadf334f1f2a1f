//! Redis Sentinel with a real failover: a primary, its replicas and three sentinels
//! (`tests/it/helpers/sentinel.rs`), sluice in process on a `redis+sentinel://` URL, the primary
//! killed (SIGKILL) under load.
//!
//! What must hold (docs/redis.md, "Sentinel"): sluice follows the promotion without a restart;
//! every call is answered within the decision deadline (plus gRPC slack) while there is no
//! primary, by the failure policy; decisions resume once a replica is promoted. Measured and
//! printed (`cargo test --test it redis_sentinel:: -- --nocapture`): the calls answered by policy,
//! the seconds from the kill until decisions resume, and the over-admission: what the load
//! got admitted in the one window spanning the failover, against the limit. Replication is
//! asynchronous: what the promoted replica had not received is lost, and admitted again.
//! `--redis-wait-replicas` closes that gap; replicas cut off from the primary for a moment
//! before the kill (as by a partition or a slow link) make the loss large enough to see, with
//! and without it.
//!
//! Tolerances (a loaded 2-core machine): p99 latency while there is no primary within the
//! deadline + 250 ms, every call within the deadline + 1 s, decisions resuming within 15 s of
//! the kill (Sentinel needs `down-after-milliseconds` 500 plus an election: 1-3 s here).

use crate::helpers;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use helpers::sentinel::SentinelSet;
use helpers::{TestServer, descriptor, fixture, percentile, request, test_settings};
use sluice::proto::envoy::service::ratelimit::v3::rate_limit_response::Code;

/// The budget's limit per minute (tests/fixtures/sentinel/limits.yaml); every run fits in
/// the minute, so all its admissions share one window.
const LIMIT: usize = 1000;
const DEADLINE: Duration = Duration::from_millis(100);
/// Concurrent clients, each sending one call per [`PERIOD`]: 400 calls/s.
const CLIENTS: usize = 4;
const PERIOD: Duration = Duration::from_millis(10);
/// Load before the kill (about 600 admissions, well under the limit).
const BEFORE_KILL: Duration = Duration::from_millis(1500);
/// How long the replicas are cut off before the kill, in the lagging scenarios.
const LAG: Duration = Duration::from_millis(400);
/// Calls sent this soon after the cut may have been replicated before it.
const SETTLE: Duration = Duration::from_millis(50);

struct Call {
    /// When it was sent, since the load started.
    sent: Duration,
    latency: Duration,
    result: Result<Code, tonic::Code>,
}

impl Call {
    fn done(&self) -> Duration {
        self.sent + self.latency
    }
    fn decided(&self) -> bool {
        self.result.is_ok()
    }
}

struct Scenario {
    name: &'static str,
    replicas: usize,
    /// Cut the replicas off the primary for [`LAG`] before the kill (restored right after it).
    lagging: bool,
    wait_replicas: u32,
}

/// What a run measured.
struct Figures {
    calls: usize,
    answered_by_policy: usize,
    /// From the kill to the answer of the first decided call sent after it.
    resume: Duration,
    /// From the kill to the sentinels all naming the new primary.
    promoted: Duration,
    admitted: usize,
    /// Admitted in the 100 ms before the kill (what replication could still lose).
    admitted_just_before: usize,
    admitted_while_lagging: usize,
    p50: Duration,
    p99: Duration,
    max: Duration,
}

async fn run(scenario: Scenario) -> Figures {
    let mut set = tokio::task::block_in_place(|| SentinelSet::start(scenario.replicas));
    let mut settings = test_settings(&fixture("sentinel/limits.yaml"), Some(&set.url()));
    settings.backend.deadline = DEADLINE;
    if let Some(redis) = settings.backend.redis.as_mut() {
        redis.wait_replicas = scenario.wait_replicas;
    }
    let sluice = TestServer::start(settings);

    // Connected and warm (another key of the budget) before the measured load starts.
    let mut client = sluice.client().await;
    let warm = request("failover", vec![descriptor(&[("budget", "warm-up")])]);
    let warm_by = Instant::now() + Duration::from_secs(10);
    while client.should_rate_limit(warm.clone()).await.is_err() {
        assert!(Instant::now() < warm_by, "no decision through Sentinel");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let calls: Arc<Mutex<Vec<Call>>> = Arc::default();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let mut client = sluice.client().await;
        let (calls, stop) = (Arc::clone(&calls), Arc::clone(&stop));
        tasks.push(tokio::spawn(async move {
            let mut tick = tokio::time::interval(PERIOD);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let req = request("failover", vec![descriptor(&[("budget", "shared")])]);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                tick.tick().await;
                let sent = start.elapsed();
                let result = client
                    .should_rate_limit(req.clone())
                    .await
                    .map(|r| Code::try_from(r.into_inner().overall_code).unwrap_or(Code::Unknown))
                    .map_err(|s| s.code());
                let latency = start.elapsed() - sent;
                calls.lock().unwrap().push(Call {
                    sent,
                    latency,
                    result,
                });
            }
        }));
    }

    tokio::time::sleep(BEFORE_KILL).await;
    let old = set.primary.port();
    if scenario.lagging {
        tokio::task::block_in_place(|| set.cut_replication());
    }
    let lag_from = start.elapsed();
    if scenario.lagging {
        tokio::time::sleep(LAG).await;
    }
    set.primary.stop();
    let kill = start.elapsed();
    if scenario.lagging {
        tokio::task::block_in_place(|| set.restore_replication());
    }
    let promoted_port =
        tokio::task::block_in_place(|| set.wait_promotion(old, Duration::from_secs(20)));
    let promoted = start.elapsed() - kill;
    assert_ne!(promoted_port, old);

    // Until decisions resume, then until the budget is full and refusing (the window's whole
    // count is then known).
    let resume_by = Instant::now() + Duration::from_secs(15);
    let resumed = loop {
        let first = calls
            .lock()
            .unwrap()
            .iter()
            .filter(|c| c.sent >= kill && c.decided())
            .map(Call::done)
            .min();
        if let Some(at) = first {
            break at;
        }
        assert!(
            Instant::now() < resume_by,
            "{}: no decision within 15 s of the kill",
            scenario.name
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let full_by = Instant::now() + Duration::from_secs(10);
    loop {
        let refused = calls
            .lock()
            .unwrap()
            .iter()
            .filter(|c| c.sent > resumed && c.result == Ok(Code::OverLimit))
            .count();
        if refused >= 100 {
            break;
        }
        assert!(
            Instant::now() < full_by,
            "{}: the budget never filled after the failover",
            scenario.name
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for task in tasks {
        task.await.expect("client task");
    }

    let calls = std::mem::take(&mut *calls.lock().unwrap());
    let admitted = |c: &&Call| c.result == Ok(Code::Ok);
    let mut gap: Vec<Duration> = calls
        .iter()
        .filter(|c| c.sent >= lag_from && c.sent <= resumed)
        .map(|c| c.latency)
        .collect();
    gap.sort();
    let figures = Figures {
        calls: calls.len(),
        answered_by_policy: calls.iter().filter(|c| !c.decided()).count(),
        resume: resumed - kill,
        promoted,
        admitted: calls.iter().filter(admitted).count(),
        admitted_just_before: calls
            .iter()
            .filter(admitted)
            .filter(|c| c.done() <= kill && c.done() + Duration::from_millis(100) > kill)
            .count(),
        admitted_while_lagging: calls
            .iter()
            .filter(admitted)
            // Calls sent in the first moments may have reached Redis before the SIGSTOP.
            .filter(|c| scenario.lagging && c.sent >= lag_from + SETTLE && c.done() <= kill)
            .count(),
        p50: percentile(&gap, 0.5),
        p99: percentile(&gap, 0.99),
        max: calls.iter().map(|c| c.latency).max().unwrap_or_default(),
    };
    println!(
        "{}: {} calls; answered by policy {} ({} of them after the kill); primary promoted \
         {:.2} s and decisions resumed {:.2} s after the kill; latency from the lag/kill to the \
         resumption p50 {:.1} ms p99 {:.1} ms, max over the run {:.1} ms; admitted {} against a \
         limit of {LIMIT}: over-admission {} (admitted in the 100 ms before the kill: {}, while \
         the replicas lagged: {})",
        scenario.name,
        figures.calls,
        figures.answered_by_policy,
        calls
            .iter()
            .filter(|c| c.sent >= kill && !c.decided())
            .count(),
        figures.promoted.as_secs_f64(),
        figures.resume.as_secs_f64(),
        figures.p50.as_secs_f64() * 1e3,
        figures.p99.as_secs_f64() * 1e3,
        figures.max.as_secs_f64() * 1e3,
        figures.admitted,
        figures.admitted.saturating_sub(LIMIT),
        figures.admitted_just_before,
        figures.admitted_while_lagging,
    );
    // Every call had its answer at the deadline, however long the failover took.
    assert!(
        figures.p99 <= DEADLINE + Duration::from_millis(250),
        "{}: p99 {:?} while there was no primary",
        scenario.name,
        figures.p99
    );
    assert!(
        figures.max <= DEADLINE + Duration::from_secs(1),
        "{}: a call took {:?}",
        scenario.name,
        figures.max
    );
    assert!(
        figures.answered_by_policy > 0,
        "{}: no call failed, so nothing was killed",
        scenario.name
    );
    let _ = sluice.stop().await;
    figures
}

/// The primary killed under load, its one replica in sync: sluice follows the promotion, and
/// only what replication had not carried yet (the last moments before the kill) can be
/// admitted twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sluice_follows_a_promotion_under_load() {
    let figures = run(Scenario {
        name: "kill",
        replicas: 1,
        lagging: false,
        wait_replicas: 0,
    })
    .await;
    assert!(
        figures.admitted <= LIMIT + figures.admitted_just_before,
        "more lost than the last 100 ms before the kill held"
    );
}

/// The control for `wait_replicas_keeps_admissions_across_a_failover`: without WAIT, what the
/// primary admitted while its replica lagged is lost with it, and admitted again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_replica_loses_admissions_at_failover() {
    let figures = run(Scenario {
        name: "lagging replica, no WAIT",
        replicas: 1,
        lagging: true,
        wait_replicas: 0,
    })
    .await;
    assert!(
        figures.admitted_while_lagging > 0,
        "nothing was admitted while the replica lagged"
    );
    assert!(
        figures.admitted > LIMIT,
        "the admissions lost with the primary were not admitted again: {} of {LIMIT}",
        figures.admitted
    );
}

/// With `--redis-wait-replicas 1` a decision is answered only once a replica holds it: while
/// the replicas lag the calls fail (the failure policy answers), and nothing admitted is lost,
/// so the window never admits more than its limit. Two replicas, so that the promoted primary
/// still has one to acknowledge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_replicas_keeps_admissions_across_a_failover() {
    let figures = run(Scenario {
        name: "lagging replicas, WAIT 1",
        replicas: 2,
        lagging: true,
        wait_replicas: 1,
    })
    .await;
    assert_eq!(
        figures.admitted_while_lagging, 0,
        "admitted without a replica's acknowledgement"
    );
    assert!(
        figures.admitted <= LIMIT,
        "over-admission with WAIT: {} of {LIMIT}",
        figures.admitted
    );
}

/// `--redis-wait-replicas` on one Redis: with its replica connected a decision is answered as
/// usual; with none, every decision fails (and says why) instead of being admitted without
/// the durability asked for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_replicas_needs_the_replicas_it_names() {
    use sluice::limiter::redis::{RedisLimiter, RedisOptions};
    use sluice::limiter::{Algorithm, Item, ItemKind, Limiter, LimiterError, OverLimit};
    let primary = helpers::RedisServer::start();
    let options = |replicas| RedisOptions {
        wait_replicas: replicas,
        wait_timeout: DEADLINE,
        ..RedisOptions::new(primary.url())
    };
    let hit = |key: &str| Item {
        key: key.into(),
        limit: 10,
        window_ms: 60_000,
        hits: 1,
        kind: ItemKind::Consume,
        algorithm: Algorithm::SlidingLog,
        over_limit: OverLimit::default(),
        lease: 0,
        hold_ms: 0,
    };
    let alone = RedisLimiter::connect(&options(1)).await.expect("connect");
    match alone.decide(&[hit("sluice:{alone}")], None).await {
        Err(LimiterError::Unavailable(why)) => assert!(
            why.contains("too few replicas acknowledged") && why.contains("0 replica(s)"),
            "{why}"
        ),
        other => panic!("decided without a replica: {other:?}"),
    }
    let _replica = helpers::RedisServer::start_with(&[
        "--replicaof".into(),
        "127.0.0.1".into(),
        primary.port().to_string(),
    ]);
    // A fresh key per attempt: a call whose WAIT fell short did record its entry on the
    // primary (it counts against later requests, never for them).
    let synced_by = Instant::now() + Duration::from_secs(10);
    for attempt in 0.. {
        let key = format!("sluice:{{replicated-{attempt}}}");
        match alone.decide(&[hit(&key)], None).await {
            Ok(outcome) => {
                assert!(outcome.admitted);
                break;
            }
            Err(e) => assert!(Instant::now() < synced_by, "never acknowledged: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // More replicas than there are: never enough.
    let greedy = RedisLimiter::connect(&options(2)).await.expect("connect");
    assert!(
        greedy
            .decide(&[hit("sluice:{greedy}")], None)
            .await
            .is_err()
    );
}
