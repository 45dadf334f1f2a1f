//! The Redis backend beyond the conformance suite: what the script leaves in the server (key
//! shapes, TTLs, encodings, members), script loading, batching of concurrent requests, and
//! failures (a stopped, paused or unreachable server). Every test has its own `redis-server`.

use crate::helpers;

use std::sync::Arc;
use std::time::{Duration, Instant};

use helpers::RedisServer;
use helpers::limiter::{T, consume_hits, decide_at, log_item, redis_limiter, with};
use redis::AsyncCommands;
use sluice::limiter::redis::script::{self, CompensateCall, DecideCall, LOG_TOTAL_MEMBER};
use sluice::limiter::redis::{RedisLimiter, RedisOptions};
use sluice::limiter::{Algorithm, ItemKind, KeyOutcome, Limiter, LimiterError};

/// The script prints times as integers, so a clock that is not a whole number of ms is
/// refused like a malformed one, before anything is written; a whole one is decided.
#[tokio::test]
async fn a_fractional_clock_is_refused_and_writes_nothing() {
    let server = RedisServer::start();
    let mut conn = server.raw().await;
    let item = [consume_hits("clock-key", 10, 1)];
    let call = |clock: &str| DecideCall::single(&item, None).with_clock_arg(clock);
    let refused = helpers::fcall(&mut conn, &call(&format!("{T}.5"))).await;
    let error = refused.expect_err("a fractional clock must be refused");
    // redis-rs splits the message at its first word: `"sluice:": bad now`.
    assert!(error.to_string().contains("bad now"), "{error}");
    let exists: bool = conn.exists("clock-key").await.expect("exists");
    assert!(!exists, "a refused call wrote the key");

    let reply = helpers::fcall(&mut conn, &call(&T.to_string()))
        .await
        .expect("a whole clock is decided");
    let outcome = script::decode_reply(&reply, 1).expect("reply");
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
                log_item(&own, 10, 60_000, 1, ItemKind::Consume),
                log_item("shared", 30, 60_000, 1, ItemKind::Consume),
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
    assert_eq!(log_of(&mut conn, "shared").await, (30, 30));
    for (k, &admitted) in per_key.iter().enumerate() {
        let (entries, total) = log_of(&mut conn, &format!("k{k}")).await;
        assert_eq!((entries, total), (admitted, admitted), "k{k}");
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

/// The first readiness probe opens every connection and loads the library, so the first
/// decisions pay neither a connect nor a load round trip inside their deadline.
#[tokio::test]
async fn first_probe_warms_every_connection_and_the_library() {
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
    let library = script::LIBRARY
        .source
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("#!lua name="));
    let loaded: redis::Value = redis::cmd("FUNCTION")
        .arg("LIST")
        .arg("LIBRARYNAME")
        .arg(library.expect("the library's name"))
        .query_async(&mut conn)
        .await
        .expect("FUNCTION LIST");
    assert!(
        matches!(&loaded, redis::Value::Array(libraries) if libraries.len() == 1),
        "{loaded:?}"
    );
    // The first decision finds the function: no reload.
    l.decide(&[consume_hits("w", 1, 1)], None)
        .await
        .expect("decide");
    assert_eq!(l.stats().expect("stats").script_loads, 1);
}

/// Redis's clock (`TIME`) in ms, which `PEXPIRETIME` counts on.
async fn redis_ms(conn: &mut redis::aio::MultiplexedConnection) -> i64 {
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query_async(conn).await.expect("TIME");
    secs * 1000 + micros / 1000
}

async fn pexpiretime(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> i64 {
    redis::cmd("PEXPIRETIME")
        .arg(key)
        .query_async(conn)
        .await
        .expect("PEXPIRETIME")
}

/// Makes an admitted single hit on `k` (limit 5, window 2 s) at virtual `now` and returns the
/// key's expiry, asserting it is `ttl` ms after Redis's clock while the call ran.
async fn admitted_expiry(
    l: &Arc<dyn Limiter>,
    conn: &mut redis::aio::MultiplexedConnection,
    now: u64,
    ttl: i64,
) -> i64 {
    let before = redis_ms(conn).await;
    assert!(
        decide_at(l, &[log_item("k", 5, 2000, 1, ItemKind::Consume)], now)
            .await
            .admitted
    );
    let after = redis_ms(conn).await;
    let expiry = pexpiretime(conn, "k").await;
    assert!(
        (before + ttl..=after + ttl).contains(&expiry),
        "expiry {expiry} after a hit at {now}: Redis's clock ran {before}..{after}, TTL {ttl}"
    );
    expiry
}

/// A written log key expires when its newest entry leaves the window: `PEXPIRETIME` (absolute,
/// so it does not drift while the test runs) is the script's TTL (newest + window - now on the
/// call's virtual clock) added to Redis's clock during the call. Calls that write nothing leave
/// it exactly as it was: each is made at a virtual time where a rewrite would give another
/// expiry (a probe or a rejected batch at T + 1000 would set newest + 2000 - 1000 = 2500 ms, not
/// the 2000 ms the admitted hit at T + 1500 set).
#[tokio::test]
async fn keys_expire_within_the_window() {
    let server = RedisServer::start();
    let l = redis_limiter(&server).await;
    let mut conn = server.raw().await;
    let item = |hits, limit| [log_item("k", limit, 2000, hits, ItemKind::Consume)];
    let mut expiry = 0;
    // The first hit, then a later one that moves the expiry to its own exit (1500 + 2000 -
    // 1500): each TTL 2000 from Redis's clock while the call ran.
    for now in [T, T + 1500] {
        expiry = admitted_expiry(&l, &mut conn, now, 2000).await;
    }
    // A probe (0 hits) and a rejected batch (limit 2, two entries in the window) write nothing.
    assert!(decide_at(&l, &item(0, 5), T + 1000).await.admitted);
    assert_eq!(
        pexpiretime(&mut conn, "k").await,
        expiry,
        "a probe rewrote the TTL"
    );
    assert!(!decide_at(&l, &item(1, 2), T + 1000).await.admitted);
    assert_eq!(
        pexpiretime(&mut conn, "k").await,
        expiry,
        "a rejected batch rewrote the TTL"
    );
    // An admitted hit at T + 1000 (a lagging clock) is recorded at the newest time, T + 1500,
    // and keeps the key until that entry leaves: 1500 + 2000 - 1000.
    admitted_expiry(&l, &mut conn, T + 1000, 2500).await;
    // Check-only batches create nothing.
    let _ = decide_at(&l, &[log_item("probe", 5, 2000, 0, ItemKind::Consume)], T).await;
    let exists: bool = conn.exists("probe").await.expect("exists");
    assert!(!exists);
}

/// A log key's entries and the total stored beside them (`LOG_TOTAL_MEMBER`'s score, negated).
async fn log_of(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> (u64, u64) {
    let members: u64 = conn.zcard(key).await.expect("zcard");
    let total: Option<i64> = conn.zscore(key, LOG_TOTAL_MEMBER).await.expect("zscore");
    match total {
        Some(total) => (members - 1, total.unsigned_abs()),
        None => (members, 0),
    }
}

#[tokio::test]
async fn members_are_short_increasing_integers() {
    let server = RedisServer::start();
    let l = redis_limiter(&server).await;
    let mut conn = server.raw().await;
    // A tiny explicit clock (tests) and the real TIME (production) give the same shape.
    assert!(
        decide_at(&l, &[consume_hits("small", 100, 1)], 5)
            .await
            .admitted
    );
    assert!(
        decide_at(&l, &[consume_hits("small", 100, 2)], 5)
            .await
            .admitted
    );
    let real = [log_item("real", 100, 60_000, 1, ItemKind::Consume)];
    assert!(l.decide(&real, None).await.expect("decide").admitted);
    let real = [log_item("real", 100, 60_000, 2, ItemKind::Consume)];
    assert!(l.decide(&real, None).await.expect("decide").admitted);
    for key in ["small", "real"] {
        let members: Vec<String> = conn.zrange(key, 0, -1).await.expect("zrange");
        // The total first (it sorts below every entry), then one entry per item: a new key
        // starts at the bottom of the 24-bit range, then +1 per entry; a weight above 1 follows
        // the number.
        assert_eq!(members, ["t", "1000000", "10000012"], "{key}");
        assert_eq!(log_of(&mut conn, key).await, (2, 3), "{key}");
        assert_eq!(encoding(&mut conn, key).await, "listpack");
    }
}

/// An item's hits are one member whatever their number: `hits_addend` 100,000 costs what 1
/// costs (both a member and the total's score), and the total follows expiry and refunds.
#[tokio::test]
async fn an_entry_is_one_member_carrying_its_weight() {
    let server = RedisServer::start();
    let l = redis_limiter(&server).await;
    let mut conn = server.raw().await;
    let item = |key: &str, hits, kind| log_item(key, 1_000_000, 1000, hits, kind);
    let bytes = |conn: &mut redis::aio::MultiplexedConnection, key: &'static str| {
        let mut conn = conn.clone();
        async move { memory_usage(&mut conn, key).await }
    };
    assert!(
        decide_at(&l, &[item("one", 1, ItemKind::Consume)], T)
            .await
            .admitted
    );
    assert!(
        decide_at(&l, &[item("many", 100_000, ItemKind::Consume)], T)
            .await
            .admitted
    );
    assert_eq!(log_of(&mut conn, "one").await, (1, 1));
    assert_eq!(log_of(&mut conn, "many").await, (1, 100_000));
    let members: Vec<String> = conn.zrange("many", 0, -1).await.expect("zrange");
    assert_eq!(members, ["t", "1000000100000"]);
    let (one, many) = (
        bytes(&mut conn, "one").await,
        bytes(&mut conn, "many").await,
    );
    // A 64-bit listpack integer instead of a 24-bit one: 5 bytes more, which may cross one
    // allocator size class (16 bytes).
    assert!(
        many <= one + 16,
        "100,000 hits take {many} bytes, 1 hit {one}"
    );
    // A later entry, then a refund that splits it: 100,000 + 5 - 3.
    assert!(
        decide_at(&l, &[item("many", 5, ItemKind::Consume)], T + 500)
            .await
            .admitted
    );
    let out = decide_at(&l, &[item("many", 3, ItemKind::Refund)], T + 600).await;
    assert_eq!(out.items[0].count, 100_002);
    let members: Vec<String> = conn.zrange("many", 0, -1).await.expect("zrange");
    assert_eq!(members, ["t", "1000000100000", "10000012"]);
    // The first entry expires: its weight leaves the total, even on a probe.
    let out = decide_at(&l, &[item("many", 0, ItemKind::Consume)], T + 1000).await;
    assert_eq!(out.items[0].count, 2);
    assert_eq!(log_of(&mut conn, "many").await, (1, 2));
    // Everything expired: the probe deletes the key (total and all).
    decide_at(&l, &[item("many", 0, ItemKind::Consume)], T + 1500).await;
    let exists: bool = conn.exists("many").await.expect("exists");
    assert!(!exists);
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
        assert!(
            decide_at(&l, &[with(alg, consume_hits(key, 5, 2))], T + 250)
                .await
                .admitted
        );
        let v: String = conn.get(key).await.expect("get");
        assert_eq!(v, value, "{key}");
        assert_eq!(encoding(&mut conn, key).await, "int", "{key}");
    }
}

/// One sliding-log item of window 1000 straight through the script: the item's outcome and
/// undo token, or the error text.
async fn eval_log(
    conn: &mut redis::aio::MultiplexedConnection,
    key: &str,
    now: u64,
    hits: u64,
    kind: ItemKind,
) -> Result<(KeyOutcome, u64), String> {
    let item = [log_item(key, 1000, 1000, hits, kind)];
    let reply = helpers::fcall(conn, &DecideCall::single(&item, Some(now)))
        .await
        .map_err(|e| e.to_string())?;
    let (outcome, undo) = script::decode_reply_with_undo(&reply, 1).map_err(|e| e.to_string())?;
    Ok((outcome.items[0], undo[0]))
}

/// The compensation of one log item of `hits` that got undo token `token`, on the clock of `T`.
async fn undo_log(
    conn: &mut redis::aio::MultiplexedConnection,
    key: &str,
    token: u64,
    hits: u64,
) -> i64 {
    let item = log_item(key, 1000, 1000, hits, ItemKind::Consume);
    CompensateCall::new(Some(T))
        .undo(&item, token)
        .invocation(&redis::Script::new(script::COMPENSATE))
        .invoke_async(conn)
        .await
        .expect("compensate")
}

/// A log key's entries with their scores, the total's member left out.
async fn entries(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> Vec<(String, u64)> {
    let all: Vec<(String, i64)> = conn.zrange_withscores(key, 0, -1).await.expect("zrange");
    all.into_iter()
        .filter(|(member, _)| member != LOG_TOTAL_MEMBER)
        .map(|(member, score)| (member, score.unsigned_abs()))
        .collect()
}

/// Writes a log key by hand: its entries and their total.
async fn write_log(
    conn: &mut redis::aio::MultiplexedConnection,
    key: &str,
    log: &[(u64, &str, u64)],
) {
    let total: u64 = log.iter().map(|&(_, _, weight)| weight).sum();
    let mut items: Vec<(i64, String)> = log
        .iter()
        .map(|&(score, member, _)| (score as i64, member.to_string()))
        .collect();
    items.push((-(total as i64), LOG_TOTAL_MEMBER.to_string()));
    let _: () = conn.zadd_multiple(key, &items).await.expect("zadd");
}

fn e(member: &str, score: u64) -> (String, u64) {
    (member.to_string(), score)
}

/// Member numbers wrap from 8388607 to 1000000 one ms later (so the newest stays on top),
/// cluster compensation spares entries that reused removed numbers at a later ms and entries
/// heavier than what it takes back, and a key whose numbers would reach a live one fails
/// before writing.
#[tokio::test]
async fn log_members_wrap_and_undo_checks_scores() {
    let server = RedisServer::start();
    let mut conn = server.raw().await;

    let first = eval_log(&mut conn, "k", T, 2, ItemKind::Consume)
        .await
        .expect("add");
    assert_eq!(entries(&mut conn, "k").await, [e("10000002", T)]);
    assert!(
        eval_log(&mut conn, "k", T, 2, ItemKind::Refund)
            .await
            .is_ok()
    );
    let second = eval_log(&mut conn, "k", T + 5, 2, ItemKind::Consume)
        .await
        .expect("add");
    assert_eq!(entries(&mut conn, "k").await, [e("10000002", T + 5)]);
    assert_eq!(undo_log(&mut conn, "k", first.1, 2).await, 0, "not ours");
    assert_eq!(undo_log(&mut conn, "k", second.1, 2).await, 2);
    assert!(entries(&mut conn, "k").await.is_empty());
    let exists: bool = conn.exists("k").await.expect("exists");
    assert!(!exists, "the total goes with the last entry");

    write_log(&mut conn, "w", &[(T - 5, "8388606", 1)]).await;
    let added = eval_log(&mut conn, "w", T, 3, ItemKind::Consume)
        .await
        .expect("add");
    let wrapped = eval_log(&mut conn, "w", T, 1, ItemKind::Consume)
        .await
        .expect("add");
    assert_eq!(
        entries(&mut conn, "w").await,
        [e("8388606", T - 5), e("83886073", T), e("1000000", T + 1)]
    );
    assert!(
        eval_log(&mut conn, "w", T, 1, ItemKind::Refund)
            .await
            .is_ok()
    );
    let next = eval_log(&mut conn, "w", T + 2, 1, ItemKind::Consume)
        .await
        .expect("add");
    assert_eq!(entries(&mut conn, "w").await[2], e("1000000", T + 2));
    // The wrapped entry was refunded; its number, reused 1 ms later, is not its own.
    assert_eq!(undo_log(&mut conn, "w", wrapped.1, 1).await, 0);
    assert_eq!(undo_log(&mut conn, "w", next.1, 1).await, 1);
    // A refund took part of the first item's entry: the rest goes.
    let out = eval_log(&mut conn, "w", T + 3, 1, ItemKind::Refund)
        .await
        .expect("refund");
    assert_eq!(out.0.count, 3, "1 + 3 - 1");
    assert_eq!(entries(&mut conn, "w").await[1], e("83886072", T));
    assert_eq!(
        undo_log(&mut conn, "w", added.1, 1).await,
        0,
        "heavier than 1: not ours"
    );
    assert_eq!(undo_log(&mut conn, "w", added.1, 3).await, 2);
    assert_eq!(entries(&mut conn, "w").await, [e("8388606", T - 5)]);
    assert_eq!(log_of(&mut conn, "w").await, (1, 1));

    // Top number 8388607 at the same ms as the new entry: the wrapped one goes 1 ms later.
    write_log(&mut conn, "e", &[(T, "8388607", 1)]).await;
    assert!(
        eval_log(&mut conn, "e", T, 1, ItemKind::Consume)
            .await
            .is_ok()
    );
    assert_eq!(
        entries(&mut conn, "e").await,
        [e("8388607", T), e("1000000", T + 1)]
    );

    // Live numbers spanning every number: the next one would collide.
    write_log(&mut conn, "full", &[(T, "1000000", 1), (T, "8388607", 1)]).await;
    let err = eval_log(&mut conn, "full", T, 1, ItemKind::Consume)
        .await
        .expect_err("full");
    assert!(err.contains("sluice:"), "{err}");
    assert_eq!(entries(&mut conn, "full").await.len(), 2);
}

#[tokio::test]
async fn library_survives_function_flush_and_flushall() {
    let server = RedisServer::start();
    let l = redis_limiter(&server).await;
    let mut conn = server.raw().await;
    assert!(decide_at(&l, &[consume_hits("k", 3, 1)], T).await.admitted);
    // A fresh server has no function yet: the first call loaded the library.
    let loads = |l: &Arc<dyn Limiter>| l.stats().expect("redis stats").script_loads;
    assert_eq!(loads(&l), 1);
    assert!(decide_at(&l, &[consume_hits("k", 3, 1)], T).await.admitted);
    assert_eq!(loads(&l), 1, "a loaded library is not loaded again");
    // FLUSHALL empties the keys but keeps the functions.
    let _: () = redis::cmd("FLUSHALL")
        .query_async(&mut conn)
        .await
        .expect("flushall");
    let out = decide_at(&l, &[consume_hits("k", 3, 1)], T + 1).await;
    assert_eq!((out.admitted, out.items[0].count), (true, 1));
    assert_eq!(loads(&l), 1, "FLUSHALL keeps the library");
    let _: () = redis::cmd("FUNCTION")
        .arg("FLUSH")
        .query_async(&mut conn)
        .await
        .expect("function flush");
    let out = decide_at(&l, &[consume_hits("k", 3, 1)], T + 2).await;
    assert!(out.admitted);
    assert_eq!(out.items[0].count, 2);
    assert_eq!(loads(&l), 2, "reloads of a missing function are counted");
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
    match l.decide(&[consume_hits("k", 1, 1)], None).await {
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
    let out = decide_at(&l, &[consume_hits("k", 1, 1)], T).await;
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

/// `MEMORY USAGE key SAMPLES 0`: the key's bytes as Redis counts them (value, name, keyspace
/// entry).
async fn memory_usage(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> u64 {
    redis::cmd("MEMORY")
        .arg("USAGE")
        .arg(key)
        .arg("SAMPLES")
        .arg(0)
        .query_async(conn)
        .await
        .expect("MEMORY USAGE")
}

/// `MEMORY STATS`' database 0 figure `name` (0 for an empty database, which the reply leaves out).
async fn db0_stat(conn: &mut redis::aio::MultiplexedConnection, name: &str) -> u64 {
    fn find<'a>(pairs: &'a [redis::Value], name: &str) -> Option<&'a redis::Value> {
        pairs
            .chunks(2)
            .find(|p| matches!(&p[0], redis::Value::BulkString(b) if b == name.as_bytes()))
            .map(|p| &p[1])
    }
    let stats: redis::Value = redis::cmd("MEMORY")
        .arg("STATS")
        .query_async(conn)
        .await
        .expect("MEMORY STATS");
    let redis::Value::Array(stats) = stats else {
        panic!("MEMORY STATS: {stats:?}");
    };
    match find(&stats, "db.0") {
        None => 0,
        Some(redis::Value::Array(db)) => match find(db, name) {
            Some(redis::Value::Int(n)) => u64::try_from(*n).expect("a size"),
            other => panic!("MEMORY STATS db.0 {name}: {other:?}"),
        },
        Some(other) => panic!("MEMORY STATS db.0: {other:?}"),
    }
}

/// The `sluice_redis_memory_estimate_bytes` figures (`footprint::key_bytes`) against what Redis
/// itself reports for sliding-log keys the script wrote: `KEYS` keys of `n` single-hit entries
/// each (key names shaped like the engine's, TTLs set), on both sides of the listpack/skiplist
/// switch. Redis's figure per key: `MEMORY USAGE key SAMPLES 0` (the value, the name, its entry
/// in the keyspace) plus its share of the expire table (`MEMORY STATS`'
/// `overhead.hashtable.expires` over the keys). The estimate is a capacity-planning figure: it
/// must be within 25 % of that. `-- --nocapture` prints the figures (docs/metrics.md).
#[tokio::test]
async fn the_memory_estimate_follows_what_redis_reports() {
    use sluice::descriptor::{Entry, limiter_key};
    use sluice::limiter::redis::footprint;
    const KEYS: u64 = 16;
    let server = RedisServer::start();
    let l = redis_limiter(&server).await;
    let mut conn = server.raw().await;
    for n in [1u64, 5, 10, 100, 127, 128, 129, 1000] {
        let _: () = redis::cmd("FLUSHALL")
            .query_async(&mut conn)
            .await
            .expect("FLUSHALL");
        let keys: Vec<String> = (0..KEYS)
            .map(|k| {
                let user = Entry::new("user", format!("alice-{k:04}"));
                limiter_key("edge", &[user], 60_000)
            })
            .collect();
        let batch: Vec<_> = keys
            .iter()
            .map(|key| log_item(key, 1_000_000, 60_000, 1, ItemKind::Consume))
            .collect();
        for i in 0..n {
            assert!(decide_at(&l, &batch, T + i).await.admitted);
        }
        let mut usage = 0;
        for key in &keys {
            usage += memory_usage(&mut conn, key).await;
        }
        let expires = db0_stat(&mut conn, "overhead.hashtable.expires").await;
        let redis = (usage + expires) as f64 / KEYS as f64;
        let estimate = footprint::key_bytes(n) as f64;
        println!(
            "{n:>5} entries: Redis {redis:>8.0} bytes per key, estimate {estimate:>8.0} ({:+.0} %)",
            (estimate / redis - 1.0) * 100.0
        );
        assert!(
            (estimate - redis).abs() <= 0.25 * redis,
            "{n} entries: estimate {estimate}, Redis {redis}"
        );
    }
}
