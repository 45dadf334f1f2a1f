//! What one bad key or a full Redis must not do: fail requests it has nothing to do with, or
//! write while Redis refuses writes. Every test has its own `redis-server`.
//!
//! - A key holding a value of another type (a string where the sliding log keeps a sorted set)
//!   inside a full batched call: only the requests for that key fail, each with a status that
//!   says why; the other requests of the same calls are decided and recorded as alone, and the
//!   failed ones record nothing.
//! - Redis over `maxmemory` with `noeviction`: the script is refused before it runs (it is
//!   declared the Redis 7 way, without `allow-oom`), so nothing grows, and the failure policy
//!   answers.

use crate::helpers;

use std::sync::Arc;
use std::time::Duration;

use helpers::limiter::log_item;
use helpers::{RedisServer, TestServer, descriptor, request, test_settings};
use redis::AsyncCommands;
use sluice::decision::FailurePolicy;
use sluice::limiter::redis::script::{self, CompensateCall, DecideCall};
use sluice::limiter::redis::{RedisLimiter, RedisOptions};
use sluice::limiter::{Algorithm, Item, ItemKind, Limiter, LimiterError};
use sluice::proto::envoy::service::ratelimit::v3::rate_limit_response::Code;

/// The limiter key of descriptor `k=<value>` in domain `p` under a one-minute limit.
fn key_of(value: &str) -> String {
    sluice::descriptor::limiter_key("p", &[sluice::descriptor::Entry::new("k", value)], 60_000)
}

// A sliding log's entries are the members scored with their time in ms; the member holding the
// key's total has a negative score, so `ZCOUNT key 0 +inf` counts entries only.

const CONFIG: &str =
    "domain: p\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5}\n";

/// Holds every client of `server` for `ms` (CLIENT PAUSE ALL): requests sent meanwhile queue
/// up in sluice and leave in full batched calls once it ends.
async fn pause_redis(conn: &mut redis::aio::MultiplexedConnection, ms: u64) {
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(ms)
        .arg("ALL")
        .query_async(conn)
        .await
        .expect("CLIENT PAUSE");
}

/// A limiter on one connection slot batching up to 16 requests per call, connected and with its
/// script loaded.
async fn batching_limiter(server: &RedisServer) -> Arc<RedisLimiter> {
    let limiter = Arc::new(
        RedisLimiter::open(&RedisOptions {
            pool_size: 1,
            batch_max: 16,
            ..RedisOptions::new(server.url())
        })
        .expect("open"),
    );
    limiter
        .ping()
        .await
        .expect("warm up: connect and load the script");
    limiter
}

/// 60 concurrent requests on one connection slot (batches of at most 16): every 6th is for the
/// poisoned key. The 50 others are admitted and recorded once each; the 10 poisoned ones fail
/// alone, naming WRONGTYPE, and leave the string as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_type_key_fails_only_its_own_requests_in_a_full_batch() {
    let server = RedisServer::start();
    let mut conn = server.raw().await;
    let poisoned = key_of("wt");
    let _: () = conn.set(&poisoned, "hello").await.expect("SET");
    let limiter = batching_limiter(&server).await;

    pause_redis(&mut conn, 300).await;
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..60u64 {
        let limiter = Arc::clone(&limiter);
        let key = if i % 6 == 0 {
            key_of("wt")
        } else {
            key_of(&format!("fresh{i}"))
        };
        tasks.spawn(async move {
            let out = limiter
                .decide(&[log_item(&key, 5, 60_000, 1, ItemKind::Consume)], None)
                .await;
            (i, key, out)
        });
    }
    let mut fresh_admitted = 0;
    let mut poisoned_failed = 0;
    while let Some(joined) = tasks.join_next().await {
        let (i, key, out) = joined.expect("task");
        if i % 6 == 0 {
            match out {
                Err(LimiterError::Refused(message)) => {
                    assert!(message.contains("WRONGTYPE"), "request {i}: {message}");
                    poisoned_failed += 1;
                }
                other => panic!("request {i} on the poisoned key: {other:?}"),
            }
        } else {
            let out = out.unwrap_or_else(|e| panic!("request {i} ({key}) failed: {e}"));
            assert!(out.admitted, "request {i}: {out:?}");
            assert_eq!(out.items[0].count, 1, "request {i}: {out:?}");
            fresh_admitted += 1;
        }
    }
    assert_eq!((fresh_admitted, poisoned_failed), (50, 10));

    for i in (0..60u64).filter(|i| i % 6 != 0) {
        let n: u64 = conn
            .zcount(key_of(&format!("fresh{i}")), 0, "+inf")
            .await
            .expect("ZCOUNT");
        assert_eq!(n, 1, "fresh{i} holds its one entry");
    }
    let value: String = conn.get(&poisoned).await.expect("GET");
    assert_eq!(value, "hello", "the poisoned key is left alone");
    let stats = limiter.stats().expect("stats");
    println!(
        "60 requests in {} script calls (mean batch {:.1})",
        stats.script_calls,
        stats.script_decisions as f64 / stats.script_calls as f64
    );
    assert_eq!(stats.script_decisions, 60);
    // The pause made the requests queue: most went in batched calls with the poisoned ones.
    assert!(
        stats.script_calls <= 12,
        "the requests were not batched: {} calls",
        stats.script_calls
    );
}

/// The same through the gRPC face: the poisoned requests are answered UNAVAILABLE (the failure
/// policy `error`) with a message saying what is wrong with the key; the others OK.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_type_key_is_answered_alone_over_grpc() {
    let server = RedisServer::start();
    let mut conn = server.raw().await;
    let _: () = conn.set(key_of("wt"), "hello").await.expect("SET");
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("p.yaml");
    std::fs::write(&config, CONFIG).expect("write config");
    let mut settings = test_settings(&config, Some(&server.url()));
    if let Some(redis) = settings.backend.redis.as_mut() {
        redis.pool_size = 1;
        redis.batch_max = 16;
    }
    settings.backend.local_cache_size = 0;
    settings.backend.deadline = Duration::from_secs(2);
    let sluice = TestServer::start(settings);
    let client = sluice.client().await;
    // The first call warms the connection up.
    let mut warm = client.clone();
    let first = warm
        .should_rate_limit(request("p", vec![descriptor(&[("k", "warm")])]))
        .await
        .expect("warm-up call");
    assert_eq!(first.into_inner().overall_code, Code::Ok as i32);

    pause_redis(&mut conn, 300).await;
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..60u64 {
        let mut client = client.clone();
        let value = if i % 6 == 0 {
            "wt".to_string()
        } else {
            format!("fresh{i}")
        };
        tasks.spawn(async move {
            let out = client
                .should_rate_limit(request("p", vec![descriptor(&[("k", &value)])]))
                .await;
            (i, out)
        });
    }
    while let Some(joined) = tasks.join_next().await {
        let (i, out) = joined.expect("task");
        if i % 6 == 0 {
            let status = out.expect_err("the poisoned key cannot be decided");
            assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
            assert!(status.message().contains("WRONGTYPE"), "{status:?}");
        } else {
            let reply = out.unwrap_or_else(|s| panic!("request {i}: {s:?}"));
            assert_eq!(reply.into_inner().overall_code, Code::Ok as i32, "{i}");
            let n: u64 = conn
                .zcount(key_of(&format!("fresh{i}")), 0, "+inf")
                .await
                .expect("ZCOUNT");
            assert_eq!(n, 1, "fresh{i}");
        }
    }
    sluice.stop().await.expect("stop");
}

/// A Redis that evicts nothing (`noeviction`), no `maxmemory` yet.
fn noeviction_redis() -> RedisServer {
    RedisServer::start_with(&["--maxmemory-policy".into(), "noeviction".into()])
}

/// Writes 4 MiB into `conn`'s Redis, then sets `maxmemory` to 1 MB, far below what it holds,
/// so that it stays out of memory whatever its buffers do; checks that a plain SET is refused
/// with OOM, and returns `used_memory`.
async fn exhaust(conn: &mut redis::aio::MultiplexedConnection) -> u64 {
    let filler = "x".repeat(64 * 1024);
    for i in 0..64 {
        let _: () = conn.set(format!("filler{i}"), &filler).await.expect("SET");
    }
    config_set(conn, "maxmemory", "1mb").await;
    let refused: redis::RedisResult<()> = conn.set("one-more", "x").await;
    let error = refused.expect_err("a SET past maxmemory is refused");
    assert!(error.to_string().contains("OOM"), "{error}");
    used_memory(conn).await
}

async fn config_set(conn: &mut redis::aio::MultiplexedConnection, name: &str, value: &str) {
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg(name)
        .arg(value)
        .query_async(conn)
        .await
        .expect("CONFIG SET");
}

/// [`noeviction_redis`], [`exhaust`]ed.
async fn full_redis() -> (RedisServer, redis::aio::MultiplexedConnection, u64) {
    let server = noeviction_redis();
    let mut conn = server.raw().await;
    let used = exhaust(&mut conn).await;
    (server, conn, used)
}

async fn used_memory(conn: &mut redis::aio::MultiplexedConnection) -> u64 {
    helpers::info_number(conn, "memory", "used_memory").await
}

/// Under OOM the script is refused before it runs, single and batched: nothing is written,
/// memory does not grow, the error is an outage (UNAVAILABLE), not a protocol bug.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_out_of_memory_redis_refuses_the_script_before_it_writes() {
    let (server, mut conn, before) = full_redis().await;
    // PING works under OOM (FUNCTION LOAD does not: the probe passes all the same).
    let limiter = batching_limiter(&server).await;
    // Three large admitted items: before, each wrote 100,000 members past the limit.
    for round in 0..3 {
        let key = format!("big{round}");
        let out = limiter
            .decide(
                &[log_item(
                    &key,
                    1_000_000,
                    60_000,
                    100_000,
                    ItemKind::Consume,
                )],
                None,
            )
            .await;
        match out {
            Err(LimiterError::Unavailable(message)) => {
                assert!(message.contains("OOM"), "{message}")
            }
            other => panic!("round {round}: expected an OOM refusal, got {other:?}"),
        }
        let exists: bool = conn.exists(&key).await.expect("EXISTS");
        assert!(!exists, "round {round}: the refused script wrote {key}");
    }
    // Batched calls too: every request of the call is refused, none recorded.
    pause_redis(&mut conn, 200).await;
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..20 {
        let limiter = Arc::clone(&limiter);
        tasks.spawn(async move {
            let key = format!("batched{i}");
            let out = limiter
                .decide(
                    &[log_item(&key, 1_000_000, 60_000, 1_000, ItemKind::Consume)],
                    None,
                )
                .await;
            (key, out)
        });
    }
    while let Some(joined) = tasks.join_next().await {
        let (key, out) = joined.expect("task");
        assert!(
            matches!(&out, Err(LimiterError::Unavailable(m)) if m.contains("OOM")),
            "{key}: {out:?}"
        );
        let exists: bool = conn.exists(&key).await.expect("EXISTS");
        assert!(!exists, "the refused batched call wrote {key}");
    }
    let after = used_memory(&mut conn).await;
    println!("used_memory: {before} bytes when full, {after} after 23 refused decisions");
    // Allocator noise and the clients' buffers only: far below one recorded item (~1 MB).
    assert!(
        after < before + 256 * 1024,
        "Redis grew from {before} to {after} bytes under OOM"
    );
}

/// Through the server: the failure policy answers (here `deny`: OVER_LIMIT), nothing is
/// recorded, and once Redis has room again the same request is decided and recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_memory_is_answered_by_the_failure_policy() {
    let (server, mut conn, _) = full_redis().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("p.yaml");
    std::fs::write(&config, CONFIG).expect("write config");
    let mut settings = test_settings(&config, Some(&server.url()));
    settings.engine.on_backend_error = FailurePolicy::Deny;
    let sluice = TestServer::start(settings);
    let mut client = sluice.client().await;
    let reply = client
        .should_rate_limit(request("p", vec![descriptor(&[("k", "oom")])]))
        .await
        .expect("answered by the failure policy");
    assert_eq!(reply.into_inner().overall_code, Code::OverLimit as i32);
    let exists: bool = conn.exists(key_of("oom")).await.expect("EXISTS");
    assert!(!exists, "a refused decision wrote its key");

    config_set(&mut conn, "maxmemory", "0").await;
    let reply = client
        .should_rate_limit(request("p", vec![descriptor(&[("k", "oom")])]))
        .await
        .expect("decided");
    assert_eq!(reply.into_inner().overall_code, Code::Ok as i32);
    let n: u64 = conn.zcount(key_of("oom"), 0, "+inf").await.expect("ZCOUNT");
    assert_eq!(n, 1);
    sluice.stop().await.expect("stop");
}

/// The cluster backend's compensation only takes back what a decision recorded, so it runs
/// under OOM too (declared `allow-oom`): here it takes a GCRA item's 3 hits back from a key that
/// keeps 2 others, which needs a `SET`, the first write command of the call.
#[tokio::test]
async fn compensation_runs_on_an_out_of_memory_redis() {
    let server = noeviction_redis();
    let mut conn = server.raw().await;
    let gcra = |hits: u64| {
        let item = log_item("gcra", 10, 60_000, hits, ItemKind::Consume);
        Item {
            algorithm: Algorithm::Gcra { burst: 10 },
            ..item
        }
    };
    let (three, two) = ([gcra(3)], [gcra(2)]);
    let record = |items| DecideCall::single(items, Some(helpers::limiter::T));
    let first = helpers::fcall(&mut conn, &record(&three))
        .await
        .expect("record 3");
    let _ = helpers::fcall(&mut conn, &record(&two))
        .await
        .expect("record 2");
    let (_, undo) = script::decode_reply_with_undo(&first, 1).expect("reply");
    let before: String = conn.get("gcra").await.expect("GET");
    exhaust(&mut conn).await;

    let taken: i64 = CompensateCall::new(Some(helpers::limiter::T))
        .undo(&three[0], undo[0])
        .invocation(&redis::Script::new(script::COMPENSATE))
        .invoke_async(&mut conn)
        .await
        .expect("compensation runs under OOM");
    assert_eq!(taken, 3);
    let after: String = conn.get("gcra").await.expect("GET");
    assert_ne!(before, after, "the state holds 2 hits now, not 5");
}
