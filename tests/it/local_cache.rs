//! The local cache of rejections, end to end: a flood on a key that is over its limit must cost
//! Redis O(1) script calls, not one per request. Calls are counted by Redis itself
//! (`INFO commandstats`, `cmdstat_fcall`), so nothing in sluice can fake the figure.
//! `cargo test --test it local_cache:: -- --nocapture` prints calls per 10,000 requests.

use crate::helpers;

use std::path::PathBuf;

use helpers::redis_server::command_calls;
use helpers::{RedisCluster, RedisServer, TestServer, descriptor, fixture, request, test_settings};
use sluice::limiter::redis::RedisOptions;
use sluice::proto::envoy::service::ratelimit::v3::rate_limit_response::Code;

fn limits() -> PathBuf {
    fixture("e2e/limits")
}

/// Calls of sluice's Lua function Redis has executed so far.
async fn fcall_calls(redis: &RedisServer) -> u64 {
    let calls = command_calls(&redis.raw().await).await;
    calls.get("fcall").copied().unwrap_or(0)
}

/// Sends `n` requests on the `hammer` key (limit 20 per hour) from 4 concurrent clients;
/// returns how many were admitted.
async fn flood(sluice: &TestServer, n: u64) -> u64 {
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let mut client = sluice.client().await;
        tasks.push(tokio::spawn(async move {
            let mut admitted = 0;
            for _ in 0..n / 4 {
                let resp = client
                    .should_rate_limit(request("edge", vec![descriptor(&[("hammer", "h")])]))
                    .await
                    .expect("call")
                    .into_inner();
                if resp.overall_code == Code::Ok as i32 {
                    admitted += 1;
                }
            }
            admitted
        }));
    }
    let mut admitted = 0;
    for task in tasks {
        admitted += task.await.expect("client task");
    }
    admitted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_on_a_rejected_key_costs_redis_o1_calls() {
    const N: u64 = 10_000;
    let redis = RedisServer::start();
    let sluice = TestServer::start(test_settings(&limits(), Some(&redis.url())));
    let admitted = flood(&sluice, N).await;
    assert_eq!(admitted, 20, "limit 20 per hour");
    let calls = fcall_calls(&redis).await;
    println!("local cache on: {calls} FCALL calls for {N} requests on one key (limit 20)");
    // 20 admissions, then the key is full and known to be until its oldest entry leaves (an
    // hour): a few concurrent requests may race the first learning, nothing more.
    assert!(calls <= 20 + 8, "{calls} Redis calls for {N} requests");

    // The same flood with the cache off: one call per request, which is what the cache saves.
    // Batching off too, so that concurrent requests cannot share a call and the count of calls
    // is the count of requests that reached Redis.
    let redis = RedisServer::start();
    let mut settings = test_settings(&limits(), None);
    settings.backend.local_cache_size = 0;
    settings.backend.redis = Some(RedisOptions {
        batch_max: 1,
        ..RedisOptions::new(redis.url())
    });
    let sluice = TestServer::start(settings);
    assert_eq!(flood(&sluice, 400).await, 20);
    let calls = fcall_calls(&redis).await;
    println!("local cache off: {calls} FCALL calls for 400 requests");
    assert!(calls >= 400, "{calls}");
}

/// envoyproxy/ratelimit's two-descriptor case through the gRPC API, cache on: `key2` 20 per
/// minute and `key3` 10 per hour in one request, 15 calls in sequence. Once `key3` is full the
/// cache answers (the Redis nodes see no further script call), and every status is the one
/// Redis holds: `key2` keeps 10 remaining and a reset no later than Redis's last one.
async fn two_descriptors_stay_exact(redis_url: &str, nodes: &[&RedisServer]) {
    let sluice = TestServer::start(test_settings(
        &fixture("local_cache/limits"),
        Some(redis_url),
    ));
    let mut client = sluice.client().await;
    let calls = || async {
        let mut total = 0;
        for node in nodes {
            total += fcall_calls(node).await;
        }
        total
    };
    let reset_ms = |status: &sluice::proto::envoy::service::ratelimit::v3::rate_limit_response::DescriptorStatus| {
        let d = status.duration_until_reset.as_ref().expect("duration_until_reset");
        d.seconds * 1000 + i64::from(d.nanos) / 1_000_000
    };
    let mut key2_reset = i64::MAX;
    let mut calls_when_full = 0;
    for i in 0..15u32 {
        let resp = client
            .should_rate_limit(request(
                "basic",
                vec![descriptor(&[("key2", "k")]), descriptor(&[("key3", "k")])],
            ))
            .await
            .expect("call")
            .into_inner();
        let n = (i + 1).min(10);
        let over = i >= 10;
        let expected = if over { Code::OverLimit } else { Code::Ok };
        assert_eq!(resp.overall_code, expected as i32, "call {i}");
        let (key2, key3) = (&resp.statuses[0], &resp.statuses[1]);
        assert_eq!(key2.code, Code::Ok as i32, "call {i}");
        assert_eq!(key2.limit_remaining, 20 - n, "call {i}: {resp:?}");
        assert_eq!(key3.code, expected as i32, "call {i}");
        assert_eq!(key3.limit_remaining, 10 - n, "call {i}: {resp:?}");
        assert!(reset_ms(key2) <= key2_reset, "call {i}: {resp:?}");
        key2_reset = reset_ms(key2);
        if i == 9 {
            calls_when_full = calls().await;
        }
    }
    assert_eq!(
        calls().await,
        calls_when_full,
        "calls 11 to 15 were answered locally"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_descriptors_stay_exact_on_redis() {
    let redis = RedisServer::start();
    two_descriptors_stay_exact(&redis.url(), &[&redis]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_descriptors_stay_exact_on_a_redis_cluster() {
    let cluster = RedisCluster::start();
    let nodes: Vec<&RedisServer> = cluster.nodes.iter().collect();
    two_descriptors_stay_exact(&cluster.url(), &nodes).await;
}
