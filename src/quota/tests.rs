//! The quota service without the wire: what each bucket's rule gives ([`plan`]) and what each
//! report gets ([`allot`]) on the memory backend at a clock the test moves.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;

use super::*;
use crate::decision::{Engine, FailurePolicy};
use crate::limiter::memory::MemoryLimiter;
use crate::limiter::{BatchOutcome, Clock, Limiter, LimiterError};

const YAML: &str = "
domain: edge
descriptors:
  - key: client
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: tenant
    value: acme
    descriptors:
      - key: client
        rate_limits:
          - {unit: minute, requests_per_unit: 20}
          - {unit: hour, requests_per_unit: 1000}
  - key: bot
    rate_limit: {unlimited: true}
  - key: health
  - key: trial
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: smooth
    rate_limit: {unit: minute, requests_per_unit: 10, algorithm: gcra}
";

const T0: u64 = 1_700_000_000_000;

struct TestClock(AtomicU64);

impl Clock for TestClock {
    fn now_ms(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

fn config() -> Config {
    Config::from_yaml_str(Path::new("edge.yaml"), YAML).unwrap()
}

fn bucket(entries: &[(&str, &str)]) -> BucketId {
    entries
        .iter()
        .map(|&(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

fn plan_of(entries: &[(&str, &str)]) -> PlanKind {
    plan(
        &config(),
        "edge",
        &bucket(entries),
        &EngineOptions::default(),
    )
    .kind
}

#[test]
fn a_bucket_reserves_on_the_keys_of_the_rls_path() {
    let PlanKind::Reserve {
        rule,
        items,
        pace,
        cap,
    } = plan_of(&[("client", "c1")])
    else {
        panic!("a limit");
    };
    // Paced at the rate the limit sustains, a burst of one assignment.
    assert_eq!(pace.len(), 1);
    assert_eq!(pace[0].key, "sluice:{edge|client=c1|60000}|pace");
    assert_eq!(
        (
            pace[0].limit,
            pace[0].window_ms,
            pace[0].algorithm,
            pace[0].hold_ms
        ),
        (
            100,
            60_000 + HOLD_MS + PACE_SLACK_MS,
            Algorithm::Gcra { burst: cap },
            0
        )
    );
    assert_eq!(rule, "client");
    assert_eq!(cap, super::cap(100, 60_000));
    assert_eq!(items.len(), 1);
    assert_eq!(items[0].key, "sluice:{edge|client=c1|60000}");
    assert_eq!(
        (items[0].hold_ms, items[0].over_limit, items[0].kind),
        (HOLD_MS, OverLimit::Refuse, ItemKind::Consume)
    );
    // Stacked limits: every one, and the tighter cap.
    let PlanKind::Reserve { items, cap, .. } = plan_of(&[("client", "c1"), ("tenant", "acme")])
    else {
        panic!("a limit");
    };
    assert_eq!(
        items.iter().map(|i| i.key.as_str()).collect::<Vec<_>>(),
        [
            "sluice:{edge|tenant=acme|client=c1|60000}",
            "sluice:{edge|tenant=acme|client=c1|3600000|s1}"
        ]
    );
    assert_eq!(cap, super::cap(20, 60_000).min(super::cap(1000, 3_600_000)));
}

#[test]
fn buckets_without_a_limit_get_a_blanket_answer() {
    for (entries, answer) in [
        (&[("bot", "b")][..], Answer::Unlimited),
        (&[("health", "h")][..], Answer::Whitelisted),
        (&[("trial", "t")][..], Answer::Shadow),
        (&[("smooth", "s")][..], Answer::Unsupported),
        (&[("color", "red")][..], Answer::NoRule),
        (&[("client", "c"), ("color", "red")][..], Answer::NoRule),
    ] {
        assert_eq!(plan_of(entries), PlanKind::Blanket(answer), "{entries:?}");
    }
    let other = plan(
        &config(),
        "other",
        &bucket(&[("client", "c")]),
        &EngineOptions::default(),
    );
    assert_eq!(other.kind, PlanKind::Blanket(Answer::UnknownDomain));
    let shadow = EngineOptions {
        shadow_mode: true,
        ..EngineOptions::default()
    };
    let global = plan(&config(), "edge", &bucket(&[("client", "c")]), &shadow);
    assert_eq!(global.kind, PlanKind::Blanket(Answer::Shadow));
    // Every blanket answer is ALLOW_ALL or DENY_ALL, never a silent nothing.
    assert_eq!(Answer::NoRule.blanket(), Some(Assignment::DenyAll));
    assert_eq!(Answer::Unlimited.blanket(), Some(Assignment::AllowAll));
}

/// An engine on the memory backend at a clock the test moves.
fn engine_at(policy: FailurePolicy) -> (Arc<Engine>, Arc<TestClock>) {
    let clock = Arc::new(TestClock(AtomicU64::new(T0)));
    let limiter = Arc::new(MemoryLimiter::new(clock.clone()));
    let options = EngineOptions {
        on_backend_error: policy,
        ..EngineOptions::default()
    };
    let engine = Engine::with_options(config(), limiter, options);
    (Arc::new(engine), clock)
}

fn stream() -> Stream {
    let mut stream = Stream::new(4);
    stream.set_domain("edge".into());
    stream
}

fn usage(entries: &[(&str, &str)], allowed: u64, denied: u64, elapsed_s: u64) -> Usage {
    Usage {
        bucket: bucket(entries),
        allowed,
        denied,
        elapsed_s,
    }
}

/// What `key`'s window holds at the engine's clock.
async fn held(engine: &Engine, key: &str, window_ms: u64) -> u64 {
    let probe = Item {
        key: key.into(),
        limit: u64::MAX,
        window_ms,
        hits: 0,
        kind: ItemKind::Consume,
        over_limit: OverLimit::Refuse,
        algorithm: Algorithm::SlidingLog,
        lease: 0,
        hold_ms: 0,
    };
    engine.limiter().decide(&[probe], None).await.unwrap().items[0].count
}

#[tokio::test]
async fn a_first_report_gets_the_cap_and_later_ones_their_demand() {
    let (engine, clock) = engine_at(FailurePolicy::Error);
    let mut stream = stream();
    let c1 = [("client", "c1")];
    let first = allot(&engine, &mut stream, &[usage(&c1, 1, 0, 0)]).await;
    let cap = super::cap(100, 60_000);
    assert_eq!(first[0].answer, Answer::Granted);
    assert_eq!(first[0].tokens, cap);
    assert_eq!(first[0].rule.as_deref(), Some("client"));
    let Some(Assignment::Tokens(bucket)) = first[0].assignment else {
        panic!("{first:?}");
    };
    assert_eq!(bucket, token_bucket_for(cap, None).unwrap());
    assert_eq!(
        held(&engine, "sluice:{edge|client=c1|60000}", 60_000).await,
        cap
    );
    // 5 s later: 1 request per second asks for 6 × 1.25 = 7.5, 8 tokens; the pace (100 per
    // 69 s, its burst spent by the first) has refilled 7.25 of them: 7.
    clock.0.fetch_add(5_000, Ordering::Relaxed);
    let next = allot(&engine, &mut stream, &[usage(&c1, 4, 1, 5)]).await;
    assert_eq!((next[0].answer, next[0].tokens), (Answer::Squeezed, 7));
    // 10 s later, a demand of 0.8 per second asks for 6: refilled, it gets them all.
    clock.0.fetch_add(10_000, Ordering::Relaxed);
    let next = allot(&engine, &mut stream, &[usage(&c1, 8, 0, 10)]).await;
    assert_eq!((next[0].answer, next[0].tokens), (Answer::Granted, 6));
    assert_eq!(
        held(&engine, "sluice:{edge|client=c1|60000}", 60_000).await,
        cap + 7 + 6
    );
    // The reservations count until a window after their last use: the last one, made at
    // T0 + 15 s, until T0 + 15 s + HOLD + 60 s.
    clock.store_at(T0 + 15_000 + HOLD_MS + 60_000 - 1);
    assert_eq!(
        held(&engine, "sluice:{edge|client=c1|60000}", 60_000).await,
        6
    );
    clock.store_at(T0 + 15_000 + HOLD_MS + 60_000);
    assert_eq!(
        held(&engine, "sluice:{edge|client=c1|60000}", 60_000).await,
        0
    );
}

trait StoreAt {
    fn store_at(&self, t: u64);
}

impl StoreAt for Arc<TestClock> {
    fn store_at(&self, t: u64) {
        self.0.store(t, Ordering::Relaxed);
    }
}

/// Two streams on one rule never reserve more than the limit between them: they take what
/// fits, then get DENY_ALL until the window frees room.
#[tokio::test]
async fn allotments_share_the_limit_and_stop_at_it() {
    let (engine, clock) = engine_at(FailurePolicy::Error);
    let (mut a, mut b) = (stream(), stream());
    let key = [("client", "shared")];
    let cap = super::cap(100, 60_000);
    let mut total = 0;
    let mut answers = Vec::new();
    // 14 rounds of 5 s: the first reservation leaves the window at T0 + 67 s, after them.
    for round in 0..14 {
        clock.store_at(T0 + round * 5_000);
        for stream in [&mut a, &mut b] {
            // Far more demand than the limit.
            let got = allot(&engine, stream, &[usage(&key, 50, 950, 5)]).await;
            assert!(got[0].tokens <= cap, "{got:?}");
            total += got[0].tokens;
            answers.push(got[0].answer);
        }
    }
    // Far more asked for than fits: exactly the limit reserved.
    assert_eq!(total, 100);
    assert!(answers.contains(&Answer::Squeezed), "{answers:?}");
    assert_eq!(answers.last(), Some(&Answer::Exhausted));
    let got = allot(&engine, &mut a, &[usage(&key, 0, 10, 5)]).await;
    assert_eq!(got[0].assignment, Some(Assignment::DenyAll));
    // A window and a hold after the first grant, it frees room again.
    clock.store_at(T0 + 60_000 + HOLD_MS);
    let got = allot(&engine, &mut b, &[usage(&key, 0, 10, 5)]).await;
    assert!(got[0].tokens > 0, "{got:?}");
}

#[tokio::test]
async fn idle_buckets_give_their_share_back_then_are_abandoned() {
    let (engine, clock) = engine_at(FailurePolicy::Error);
    let mut stream = stream();
    let c = [("client", "idle")];
    allot(&engine, &mut stream, &[usage(&c, 1, 0, 0)]).await;
    for i in 1..IDLE_REPORTS_BEFORE_ABANDON {
        clock.store_at(T0 + u64::from(i) * 5_000);
        let got = allot(&engine, &mut stream, &[usage(&c, 0, 0, 5)]).await;
        assert_eq!(
            (got[0].answer, got[0].assignment, got[0].tokens),
            (Answer::Idle, Some(Assignment::DenyAll), 0)
        );
    }
    let got = allot(&engine, &mut stream, &[usage(&c, 0, 0, 5)]).await;
    assert_eq!(got[0].assignment, Some(Assignment::Abandon));
    assert!(stream.is_empty());
}

#[tokio::test]
async fn consecutive_assignments_of_a_bucket_differ() {
    let (engine, clock) = engine_at(FailurePolicy::Error);
    let mut stream = stream();
    let c = [("client", "steady")];
    allot(&engine, &mut stream, &[usage(&c, 1, 0, 0)]).await;
    let mut sent = Vec::new();
    for i in 1..4 {
        clock.store_at(T0 + i * 5_000);
        let got = allot(&engine, &mut stream, &[usage(&c, 5, 0, 5)]).await;
        sent.push(got[0].assignment);
    }
    assert_eq!(sent[0], sent[2]);
    assert_ne!(sent[0], sent[1]);
}

#[tokio::test]
async fn a_stream_tracks_a_bounded_number_of_buckets() {
    let (engine, _) = engine_at(FailurePolicy::Error);
    let mut stream = stream();
    let usages: Vec<Usage> = (0..6)
        .map(|i| usage(&[("client", &format!("c{i}"))], 1, 0, 0))
        .collect();
    let got = allot(&engine, &mut stream, &usages).await;
    let answers: Vec<Answer> = got.iter().map(|a| a.answer).collect();
    assert_eq!(answers[..4], [Answer::Granted; 4]);
    assert_eq!(answers[4..], [Answer::TooManyBuckets; 2]);
    assert_eq!(got[5].assignment, Some(Assignment::DenyAll));
    assert_eq!(stream.len(), 4);
}

struct Failing;

#[async_trait]
impl Limiter for Failing {
    async fn decide(&self, _: &[Item], _: Option<u64>) -> Result<BatchOutcome, LimiterError> {
        Err(LimiterError::Unavailable("down".into()))
    }
    async fn ping(&self) -> Result<(), LimiterError> {
        Ok(())
    }
    fn name(&self) -> &'static str {
        "failing"
    }
}

#[tokio::test]
async fn a_failed_backend_is_answered_by_the_failure_policy() {
    for (policy, answer, assignment) in [
        (FailurePolicy::Error, Answer::BackendFailed, None),
        (
            FailurePolicy::Allow,
            Answer::BackendAllowed,
            Some(Assignment::AllowAll),
        ),
        (
            FailurePolicy::Deny,
            Answer::BackendDenied,
            Some(Assignment::DenyAll),
        ),
    ] {
        let options = EngineOptions {
            on_backend_error: policy,
            ..EngineOptions::default()
        };
        let engine = Engine::with_options(config(), Arc::new(Failing), options);
        let got = allot(
            &engine,
            &mut stream(),
            &[usage(&[("client", "c")], 1, 0, 0)],
        )
        .await;
        assert_eq!((got[0].answer, got[0].assignment), (answer, assignment));
        assert_eq!(got[0].tokens, 0);
    }
}

#[tokio::test]
async fn without_a_config_nothing_is_sent_and_a_reload_applies_at_the_next_report() {
    let clock = Arc::new(TestClock(AtomicU64::new(T0)));
    let limiter: Arc<dyn Limiter> = Arc::new(MemoryLimiter::new(clock));
    let engine = Engine::awaiting_config(limiter, EngineOptions::default());
    let mut stream = stream();
    let c = [("client", "c")];
    let got = allot(&engine, &mut stream, &[usage(&c, 1, 0, 0)]).await;
    assert_eq!((got[0].answer, got[0].assignment), (Answer::NoConfig, None));
    engine.replace_config(config());
    let got = allot(&engine, &mut stream, &[usage(&c, 1, 0, 0)]).await;
    assert_eq!(got[0].answer, Answer::Granted);
    let unlimited =
        "domain: edge\ndescriptors:\n  - key: client\n    rate_limit: {unlimited: true}\n";
    engine.replace_config(Config::from_yaml_str(Path::new("edge.yaml"), unlimited).unwrap());
    let got = allot(&engine, &mut stream, &[usage(&c, 1, 0, 5)]).await;
    assert_eq!(
        (got[0].answer, got[0].assignment),
        (Answer::Unlimited, Some(Assignment::AllowAll))
    );
}

/// The share of a per-minute limit two Envoys at steady load get, on a virtual clock: both
/// report every 5 s (2.5 s apart) far more demand than the limit, and spend every token the
/// moment they get it (the coarsest spending there is). Every minute-long window must hold at
/// most the limit, and, once the first allotments have left the window, at least 85 % of it;
/// the figures are printed (docs/rlqs.md quotes them).
#[tokio::test]
async fn two_busy_envoys_use_most_of_a_per_minute_limit_in_every_window() {
    const LIMIT: u64 = 600;
    let yaml = format!(
        "domain: edge\ndescriptors:\n  - key: client\n    rate_limit: {{unit: minute, requests_per_unit: {LIMIT}}}\n"
    );
    let clock = Arc::new(TestClock(AtomicU64::new(T0)));
    let limiter = Arc::new(MemoryLimiter::new(clock.clone()));
    let engine = Engine::new(
        Config::from_yaml_str(Path::new("e.yaml"), &yaml).unwrap(),
        limiter,
    );
    let (mut a, mut b) = (stream(), stream());
    let c = [("client", "busy")];
    let mut spent: Vec<(u64, u64)> = Vec::new();
    let mut first = [true, true];
    // 20 minutes: a report every 2.5 s, the two streams in turn.
    for step in 0..480u64 {
        let now = T0 + step * 2_500;
        clock.store_at(now);
        let (stream, which) = if step % 2 == 0 {
            (&mut a, 0)
        } else {
            (&mut b, 1)
        };
        let elapsed = if first[which] { 0 } else { 5 };
        first[which] = false;
        let got = allot(&engine, stream, &[usage(&c, 200, 2_000, elapsed)]).await;
        if let Some(Assignment::Tokens(bucket)) = got[0].assignment {
            // All of it at once: its max_tokens and, at most, what it refills.
            assert!(
                spendable(
                    u64::from(bucket.max_tokens),
                    u64::from(bucket.tokens_per_fill)
                ) <= got[0].tokens
            );
            spent.push((now, got[0].tokens));
        }
    }
    let in_window = |start: u64| -> u64 {
        spent
            .iter()
            .filter(|&&(t, _)| t >= start && t < start + 60_000)
            .map(|&(_, n)| n)
            .sum()
    };
    let end = T0 + 480 * 2_500 - 60_000;
    let all: Vec<u64> = (T0..end).step_by(100).map(in_window).collect();
    let steady: Vec<u64> = (T0 + 2 * (60_000 + HOLD_MS)..end)
        .step_by(100)
        .map(in_window)
        .collect();
    let most = *all.iter().max().unwrap();
    let least = *steady.iter().min().unwrap();
    let mean = steady.iter().sum::<u64>() as f64 / steady.len() as f64;
    println!(
        "rlqs share: limit {LIMIT} per minute, most in any window {most} ({:.1} %), steady windows \
         least {least} ({:.1} %), mean {mean:.1} ({:.1} %)",
        most as f64 * 100.0 / LIMIT as f64,
        least as f64 * 100.0 / LIMIT as f64,
        mean * 100.0 / LIMIT as f64
    );
    assert!(most <= LIMIT, "{most} in one window");
    assert!(least * 100 >= LIMIT * 85, "{least} in a steady window");
}
