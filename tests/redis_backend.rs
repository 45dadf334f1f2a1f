//! The Redis backend beyond the conformance suite: what the script leaves in the server (key
//! shapes, TTLs, encodings, members), script loading, batching of concurrent requests, and
//! failures (a stopped, paused or unreachable server). Every test has its own `redis-server`.

mod helpers;

use std::sync::Arc;
use std::time::{Duration, Instant};

use helpers::limiter::{at, c, hit, redis_limiter, with, T};
use helpers::RedisServer;
use redis::AsyncCommands;
use sluice::limiter::redis::{RedisLimiter, RedisOptions};
use sluice::limiter::{Algorithm, HitKind, Limiter, LimiterError};

/// The script prints times as integers, so a clock that is not a whole number of ms is
/// refused like a malformed one, before anything is written; a whole one is decided.
#[tokio::test]
async fn a_fractional_clock_is_refused_and_writes_nothing() {
    let server = RedisServer::start();
    let mut conn = server.raw().await;
    let script = redis::Script::new(sluice::limiter::redis::script::SCRIPT);
    let call = |now: &str| {
        let mut call = script.prepare_invoke();
        call.arg(now)
            .key("clock-key")
            .arg(&["10", "1000", "1", "c", "l", "0"]);
        call
    };
    let refused: redis::RedisResult<redis::Value> =
        call(&format!("{T}.5")).invoke_async(&mut conn).await;
    let error = refused.expect_err("a fractional clock must be refused");
    // redis-rs splits the message at its first word: `"sluice:": bad now`.
    assert!(error.to_string().contains("bad now"), "{error}");
    let exists: bool = conn.exists("clock-key").await.expect("exists");
    assert!(!exists, "a refused call wrote the key");

    let reply: redis::Value = call(&T.to_string())
        .invoke_async(&mut conn)
        .await
        .expect("a whole clock is decided");
    let outcome = sluice::limiter::redis::script::decode_reply(&reply, 1).expect("reply");
    assert!(outcome.admitted);
    let score: Option<f64> = conn.zscore("clock-key", "1000000").await.expect("zscore");
    assert_eq!(
        score,
        Some(T as f64),
        "the entry's score is the clock, printed whole"
    );
}

/// Concurrent requests share script calls, and each is still decided on its own, in some
/// order, all-or-nothing: 400 requests of two items (one of 5 keys with limit 10, and a
/// shared key with limit 30) admit exactly 30, at most 10 per key, whatever the batches.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn batched_calls_decide_each_request_on_its_own() {
    let server = RedisServer::start();
    let l = Arc::new(
        RedisLimiter::open(&RedisOptions {
            pool_size: 1,
            batch_max: 16,
            ..RedisOptions::new(server.url())
        })
        .expect("open"),
    );
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..400u64 {
        let l = Arc::clone(&l);
        tasks.spawn(async move {
            let own = format!("k{}", i % 5);
            let batch = [
                hit(&own, 10, 60_000, 1, HitKind::Consume),
                hit("shared", 30, 60_000, 1, HitKind::Consume),
            ];
            let out = l.decide(&batch, None).await.expect("decide");
            // The outcome belongs to this request: its own items, its own counts.
            assert_eq!(out.items.len(), 2);
            assert_eq!(out.admitted, out.items.iter().all(|item| item.passed));
            (i % 5, out.admitted)
        });
    }
    let mut per_key = [0u64; 5];
    while let Some(res) = tasks.join_next().await {
        let (key, admitted) = res.expect("task");
        per_key[key as usize] += u64::from(admitted);
    }
    assert_eq!(per_key.iter().sum::<u64>(), 30, "{per_key:?}");
    assert!(per_key.iter().all(|&n| n <= 10), "{per_key:?}");
    let mut conn = server.raw().await;
    let shared: u64 = conn.zcard("shared").await.expect("zcard");
    assert_eq!(shared, 30);
    for (k, &admitted) in per_key.iter().enumerate() {
        let n: u64 = conn.zcard(format!("k{k}")).await.expect("zcard");
        assert_eq!(n, admitted, "k{k}");
    }
    let stats = l.stats().expect("redis stats");
    assert_eq!(stats.script_decisions, 400);
    assert!(
        stats.script_calls < 400,
        "no call carried two requests: {} calls",
        stats.script_calls
    );
    println!(
        "400 requests in {} script calls (mean batch {:.1})",
        stats.script_calls,
        400.0 / stats.script_calls as f64
    );
}

/// The first readiness probe opens every connection and loads the script, so the first
/// decisions pay neither a connect nor a NOSCRIPT round trip inside their deadline.
#[tokio::test]
async fn first_probe_warms_every_connection_and_the_script() {
    let server = RedisServer::start();
    let l = RedisLimiter::open(&RedisOptions {
        pool_size: 4,
        ..RedisOptions::new(server.url())
    })
    .expect("open");
    let cold = l.stats().expect("stats");
    assert_eq!((cold.connected, cold.script_loads), (0, 0));
    l.ping().await.expect("ping");
    let warm = l.stats().expect("stats");
    assert_eq!((warm.connected, warm.script_loads), (4, 1));
    let mut conn = server.raw().await;
    let loaded: Vec<bool> = redis::cmd("SCRIPT")
        .arg("EXISTS")
        .arg(redis::Script::new(sluice::limiter::redis::script::SCRIPT).get_hash())
        .query_async(&mut conn)
        .await
        .expect("SCRIPT EXISTS");
    assert_eq!(loaded, [true]);
    // The first decision finds the script: no reload.
    l.decide(&[c("w", 1, 1)], None).await.expect("decide");
    assert_eq!(l.stats().expect("stats").script_loads, 1);
}

#[tokio::test]
async fn keys_expire_within_the_window() {
    let server = RedisServer::start();
    let l = redis_limiter(&server).await;
    let mut conn = server.raw().await;
    assert!(
        at(&l, &[hit("k", 5, 2000, 1, HitKind::Consume)], T)
            .await
            .admitted
    );
    let ttl: i64 = conn.pttl("k").await.expect("pttl");
    assert!(ttl > 0 && ttl <= 2000, "pttl {ttl}");
    // A later hit extends the TTL to the newest entry's exit: 1500 + 2000 - 1600.
    assert!(
        at(&l, &[hit("k", 5, 2000, 1, HitKind::Consume)], T + 1500)
            .await
            .admitted
    );
    let _ = at(&l, &[hit("k", 5, 2000, 0, HitKind::Consume)], T + 1600).await;
    let ttl: i64 = conn.pttl("k").await.expect("pttl");
    assert!(ttl > 1900 && ttl <= 2000, "pttl {ttl} after a later hit");
    // A rejected batch does not touch the TTL.
    assert!(
        !at(&l, &[hit("k", 2, 2000, 1, HitKind::Consume)], T + 1600)
            .await
            .admitted
    );
    let after: i64 = conn.pttl("k").await.expect("pttl");
    assert!(after <= ttl, "pttl grew from {ttl} to {after}");
    // Check-only batches create nothing.
    let _ = at(&l, &[hit("probe", 5, 2000, 0, HitKind::Consume)], T).await;
    let exists: bool = conn.exists("probe").await.expect("exists");
    assert!(!exists);
}

#[tokio::test]
async fn members_are_short_increasing_integers() {
    let server = RedisServer::start();
    let l = redis_limiter(&server).await;
    let mut conn = server.raw().await;
    // A tiny explicit clock (tests) and the real TIME (production) give the same shape.
    assert!(at(&l, &[c("small", 100, 3)], 5).await.admitted);
    assert!(at(&l, &[c("small", 100, 2)], 5).await.admitted);
    let real = [hit("real", 100, 60_000, 2, HitKind::Consume)];
    for _ in 0..2 {
        assert!(l.decide(&real, None).await.expect("decide").admitted);
    }
    for (key, expected) in [("small", 5), ("real", 4)] {
        let members: Vec<String> = conn.zrange(key, 0, -1).await.expect("zrange");
        assert_eq!(members.len(), expected, "{key}: {members:?}");
        let numbers: Vec<u64> = members
            .iter()
            .map(|m| {
                assert_eq!(m.len(), 7, "member {m}");
                m.parse().expect("integer member")
            })
            .collect();
        // A new key starts at the bottom of the 24-bit range, then +1 per hit.
        let expected_numbers: Vec<u64> = (1_000_000..).take(expected).collect();
        assert_eq!(numbers, expected_numbers, "{key}");
        let encoding: String = redis::cmd("OBJECT")
            .arg("ENCODING")
            .arg(key)
            .query_async(&mut conn)
            .await
            .expect("object encoding");
        assert_eq!(encoding, "listpack");
    }
}

async fn encoding(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> String {
    redis::cmd("OBJECT")
        .arg("ENCODING")
        .arg(key)
        .query_async(conn)
        .await
        .expect("object encoding")
}

/// The O(1) algorithms store one integer (which Redis keeps without an allocation).
#[tokio::test]
async fn counters_are_integers() {
    let server = RedisServer::start();
    let l = redis_limiter(&server).await;
    let mut conn = server.raw().await;
    let gcra = Algorithm::Gcra { burst: 5 };
    // Width digit, counts padded to it, then the window index / the arrival time: GCRA holds
    // 2 × 1000 token-ms at a rate of 5 per ms, i.e. 400 ms past T + 250, remainder 0.
    for (key, alg, value) in [
        ("fw", Algorithm::FixedWindow, "121700000000"),
        ("sc", Algorithm::SlidingCounter, "1201700000000"),
        ("g", gcra, "101700000000650"),
    ] {
        assert!(at(&l, &[with(alg, c(key, 5, 2))], T + 250).await.admitted);
        let v: String = conn.get(key).await.expect("get");
        assert_eq!(v, value, "{key}");
        assert_eq!(encoding(&mut conn, key).await, "int", "{key}");
    }
}

/// One decision item straight through the script: (reply, or the error text).
async fn eval_log(
    conn: &mut redis::aio::MultiplexedConnection,
    key: &str,
    now: u64,
    hits: u64,
    kind: &str,
) -> Result<Vec<i64>, String> {
    redis::Script::new(sluice::limiter::redis::script::SCRIPT)
        .key(key)
        .arg(now)
        .arg(1000)
        .arg(1000)
        .arg(hits)
        .arg(kind)
        .arg("l")
        .arg(0)
        .invoke_async(conn)
        .await
        .map_err(|e| e.to_string())
}

async fn undo_log(
    conn: &mut redis::aio::MultiplexedConnection,
    key: &str,
    token: i64,
    hits: u64,
) -> i64 {
    redis::Script::new(sluice::limiter::redis::script::COMPENSATE)
        .key(key)
        .arg("l")
        .arg(token)
        .arg(hits)
        .arg(1000)
        .invoke_async(conn)
        .await
        .expect("compensate")
}

async fn entries(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> Vec<(u64, u64)> {
    conn.zrange_withscores(key, 0, -1).await.expect("zrange")
}

/// Members wrap from 8388607 to 1000000 one ms later (so the newest stays on top), cluster
/// compensation spares entries that reused popped members, and a key whose members would
/// reach a live one fails before writing.
#[tokio::test]
async fn log_members_wrap_and_undo_checks_scores() {
    let server = RedisServer::start();
    let mut conn = server.raw().await;

    let first = eval_log(&mut conn, "k", T, 2, "c").await.expect("add");
    assert_eq!(
        entries(&mut conn, "k").await,
        [(1_000_000, T), (1_000_001, T)]
    );
    assert!(eval_log(&mut conn, "k", T, 2, "r").await.is_ok());
    let second = eval_log(&mut conn, "k", T + 5, 2, "c").await.expect("add");
    assert_eq!(
        entries(&mut conn, "k").await,
        [(1_000_000, T + 5), (1_000_001, T + 5)]
    );
    assert_eq!(undo_log(&mut conn, "k", first[4], 2).await, 0, "not ours");
    assert_eq!(undo_log(&mut conn, "k", second[4], 2).await, 2);
    assert!(entries(&mut conn, "k").await.is_empty());

    let _: () = conn.zadd("w", 8_388_606, T - 5).await.expect("zadd");
    let added = eval_log(&mut conn, "w", T, 3, "c").await.expect("add");
    assert_eq!(
        entries(&mut conn, "w").await,
        [
            (8_388_606, T - 5),
            (8_388_607, T),
            (1_000_000, T + 1),
            (1_000_001, T + 1)
        ]
    );
    assert!(eval_log(&mut conn, "w", T, 1, "r").await.is_ok());
    let next = eval_log(&mut conn, "w", T + 2, 1, "c").await.expect("add");
    assert_eq!(entries(&mut conn, "w").await[3], (1_000_001, T + 2));
    // The first item's undo finds its members across the wrap; 1000001 is the later item's
    // now (a reuse within the same ms would be indistinguishable, see COMPENSATE).
    assert_eq!(undo_log(&mut conn, "w", added[4], 3).await, 2);
    assert_eq!(undo_log(&mut conn, "w", next[4], 1).await, 1);
    assert_eq!(entries(&mut conn, "w").await, [(8_388_606, T - 5)]);

    // Top member 8388607 at the same ms as the new hit: the wrapped one goes 1 ms later.
    let _: () = conn.zadd("e", 8_388_607, T).await.expect("zadd");
    assert!(eval_log(&mut conn, "e", T, 1, "c").await.is_ok());
    assert_eq!(
        entries(&mut conn, "e").await,
        [(8_388_607, T), (1_000_000, T + 1)]
    );

    // Live members spanning every number: the next one would collide.
    let _: () = conn
        .zadd_multiple("full", &[(T, 1_000_000), (T, 8_388_607)])
        .await
        .expect("zadd");
    let err = eval_log(&mut conn, "full", T, 1, "c")
        .await
        .expect_err("full");
    assert!(err.contains("sluice:"), "{err}");
    assert_eq!(entries(&mut conn, "full").await.len(), 2);
}

#[tokio::test]
async fn script_survives_script_flush() {
    let server = RedisServer::start();
    let l = redis_limiter(&server).await;
    let mut conn = server.raw().await;
    assert!(at(&l, &[c("k", 3, 1)], T).await.admitted);
    // A fresh server has no script yet: the first call loaded it.
    let loads = |l: &Arc<dyn Limiter>| l.stats().expect("redis stats").script_loads;
    assert_eq!(loads(&l), 1);
    assert!(at(&l, &[c("k", 3, 1)], T).await.admitted);
    assert_eq!(loads(&l), 1, "a loaded script is not loaded again");
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut conn)
        .await
        .expect("script flush");
    let out = at(&l, &[c("k", 3, 1)], T + 1).await;
    assert!(out.admitted);
    assert_eq!(out.items[0].count, 3);
    assert_eq!(loads(&l), 2, "NOSCRIPT reloads are counted");
    let stats = l.stats().unwrap();
    assert_eq!((stats.in_flight, stats.waiting), (0, 0));
    assert!(stats.connected >= 1 && stats.connected <= stats.connections);
}

#[tokio::test]
async fn ping_follows_the_server() {
    let mut server = RedisServer::start();
    let l = redis_limiter(&server).await;
    l.ping().await.expect("ping while up");
    server.stop();
    assert!(l.ping().await.is_err(), "ping while stopped");
    match l.decide(&[c("k", 1, 1)], None).await {
        Err(LimiterError::Unavailable(_)) | Err(LimiterError::Timeout(_)) => {}
        other => panic!("decide while stopped: {other:?}"),
    }
    server.start_again();
    let deadline = Instant::now() + Duration::from_secs(5);
    while l.ping().await.is_err() {
        assert!(
            Instant::now() < deadline,
            "ping did not recover after restart"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let out = at(&l, &[c("k", 1, 1)], T).await;
    assert!(out.admitted);
}

#[tokio::test]
async fn paused_server_times_out() {
    let server = RedisServer::start();
    let l = redis_limiter(&server).await;
    server.pause();
    let started = Instant::now();
    assert!(l.ping().await.is_err());
    assert!(started.elapsed() < Duration::from_secs(2));
    server.resume();
    let deadline = Instant::now() + Duration::from_secs(5);
    while l.ping().await.is_err() {
        assert!(
            Instant::now() < deadline,
            "ping did not recover after SIGCONT"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn unreachable_at_connect_is_unavailable() {
    let mut server = RedisServer::start();
    let url = server.url();
    server.stop();
    match RedisLimiter::connect(&RedisOptions::new(url.clone())).await {
        Err(LimiterError::Unavailable(_)) => {}
        other => panic!("connect to a stopped server: {other:?}"),
    }
    // The lazy constructor starts anyway and reports through ping.
    let l = RedisLimiter::open(&RedisOptions::new(url)).expect("open");
    assert!(l.ping().await.is_err());
}

/// Rough cost of one decision; not a benchmark suite, just a figure to sanity-check the design
/// (one round trip per batch, no checkout ping). Run with `--ignored --nocapture` in release.

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore]
async fn redis_decision_cost() {
    let server = RedisServer::start();
    let l = redis_limiter(&server).await;
    let batch = |i: u64| {
        vec![
            hit(
                &format!("k{}", i % 1000),
                1_000_000,
                60_000,
                1,
                HitKind::Consume,
            ),
            hit("global", 1_000_000, 60_000, 1, HitKind::Consume),
        ]
    };
    let n = 5000u64;
    let started = Instant::now();
    for i in 0..n {
        l.decide(&batch(i), None).await.expect("decide");
    }
    let sequential = started.elapsed() / n as u32;

    let tasks = 64u64;
    let started = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for t in 0..tasks {
        let l = Arc::clone(&l);
        set.spawn(async move {
            for i in 0..n / 10 {
                l.decide(&batch(t * 1000 + i), None).await.expect("decide");
            }
        });
    }
    while let Some(res) = set.join_next().await {
        res.expect("task");
    }
    let total = tasks * (n / 10);
    let rate = total as f64 / started.elapsed().as_secs_f64();
    println!(
        "redis: sequential {sequential:?}/decision (2 keys); {tasks} tasks: {rate:.0} decisions/s"
    );
}
