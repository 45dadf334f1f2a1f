//! The local cache of rejections, end to end: a flood on a key that is over its limit must cost
//! Redis O(1) script calls, not one per request. Calls are counted by Redis itself
//! (`INFO commandstats`, `cmdstat_evalsha`), so nothing in sluice can fake the figure.
//! `cargo test --test it local_cache:: -- --nocapture` prints calls per 10,000 requests.

use crate::helpers;

use std::path::PathBuf;

use helpers::redis_server::command_calls;
use helpers::{descriptor, fixture, request, test_settings, RedisServer, TestServer};
use sluice::limiter::redis::RedisOptions;
use sluice::proto::envoy::service::ratelimit::v3::rate_limit_response::Code;

fn limits() -> PathBuf {
    fixture("e2e/limits")
}

/// Script calls Redis has executed so far.
async fn evalsha_calls(redis: &RedisServer) -> u64 {
    let calls = command_calls(&redis.raw().await).await;
    calls.get("evalsha").copied().unwrap_or(0)
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
    let calls = evalsha_calls(&redis).await;
    println!("local cache on: {calls} EVALSHA calls for {N} requests on one key (limit 20)");
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
    let calls = evalsha_calls(&redis).await;
    println!("local cache off: {calls} EVALSHA calls for 400 requests");
    assert!(calls >= 400, "{calls}");
}
