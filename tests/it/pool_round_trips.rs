//! Measurement behind the connection design (docs/redis.md): Redis commands per decision
//! with the limiter's shared multiplexed connections versus a deadpool-redis pool, counted by
//! Redis itself (`INFO commandstats`). deadpool-redis is a dev-dependency only for this.
//! `cargo test --test it pool_round_trips:: -- --nocapture` prints the figures for docs/redis.md.

use crate::helpers;

use std::collections::BTreeMap;

use helpers::redis_server::command_calls;
use helpers::{RedisServer, consume};
use sluice::limiter::redis::script::DecideCall;
use sluice::limiter::redis::{RedisLimiter, RedisOptions};
use sluice::limiter::{Item, Limiter};

const DECISIONS: u64 = 200;

/// Commands the script runs inside Redis: not round trips, so not counted.
const SCRIPT_INTERNAL: &[&str] = &[
    "time",
    "zremrangebyscore",
    "zcard",
    "zrange",
    "zadd",
    "zpopmax",
    "pexpire",
];

/// Client commands so far, as Redis counts them (`INFO` itself and the script's own calls
/// excluded). deadpool-redis pipelines its recycle check (`UNWATCH` + `PING`), so its two extra
/// commands are one extra round trip.
async fn commandstats(server: &RedisServer) -> BTreeMap<String, u64> {
    let mut calls = command_calls(&server.raw().await).await;
    calls.retain(|name, _| name != "info" && !SCRIPT_INTERNAL.contains(&name.as_str()));
    calls
}

fn delta(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0)))
        .filter(|(_, v)| *v > 0)
        .collect()
}

fn batch(i: u64) -> Vec<Item> {
    vec![consume(&format!("sluice:{{k{i}}}"), 10, 1000)]
}

#[tokio::test]
async fn multiplexed_connections_cost_one_round_trip_per_decision_deadpool_more() {
    // The limiter: warm up (script load, CLIENT SETINFO at connect), then count.
    let server = RedisServer::start();
    let limiter = RedisLimiter::connect(&RedisOptions {
        pool_size: 4,
        ..RedisOptions::new(server.url())
    })
    .await
    .expect("connect");
    limiter.decide(&batch(0), None).await.expect("warm-up");
    let before = commandstats(&server).await;
    for i in 0..DECISIONS {
        limiter.decide(&batch(i), None).await.expect("decide");
    }
    let ours = delta(&before, &commandstats(&server).await);
    let ours_total: u64 = ours.values().sum();
    println!(
        "multiplexed: {:.2} client commands per decision {ours:?}",
        ours_total as f64 / DECISIONS as f64
    );
    assert_eq!(ours_total, DECISIONS, "{ours:?}");

    // The same script through a deadpool-redis pool: one checkout per decision.
    let server = RedisServer::start();
    let pool = deadpool_redis::Config::from_url(server.url())
        .create_pool(Some(deadpool_redis::Runtime::Tokio1))
        .expect("pool");
    let run = |i: u64| {
        let pool = pool.clone();
        async move {
            let mut conn = pool.get().await.expect("checkout");
            let _: redis::Value =
                helpers::fcall(&mut conn, &DecideCall::single(&batch(i)[..1], None))
                    .await
                    .expect("function via pool");
        }
    };
    run(0).await;
    let before = commandstats(&server).await;
    for i in 0..DECISIONS {
        run(i).await;
    }
    let pooled = delta(&before, &commandstats(&server).await);
    let pooled_total: u64 = pooled.values().sum();
    println!(
        "deadpool-redis: {:.2} client commands per decision {pooled:?}",
        pooled_total as f64 / DECISIONS as f64
    );
    // If a deadpool release stops checking on recycle, this fails: revisit docs/redis.md.
    assert!(pooled_total > DECISIONS, "{pooled:?}");
}
