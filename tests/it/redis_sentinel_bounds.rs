//! What a sentinel can make sluice do: sentinels played by the test
//! (`helpers::sentinel::FakeSentinel`, a loopback RESP server) in front of real `redis-server`s.
//!
//! A sentinel that floods its reply (200,000 entries, or one 32 MiB string) costs the built
//! binary at most [`BOUND_MIB`] of peak resident memory (`VmHWM`, read from /proc as in
//! `xds_bounds`, after against before in the same process), and the refusal names the sentinel
//! and the cap; a sentinel that answers properly again is followed at once. Figures in
//! docs/security.md ("Limits on what a sentinel sends"). And the lookup's rules with sentinels
//! that disagree: a node that answers `ROLE` as a replica and a primary flagged down are passed
//! over for the next sentinel's primary, the sentinels' own credentials are sent to each, and a
//! refused `AUTH` is said.

use crate::helpers;

use std::time::{Duration, Instant};

use helpers::sentinel::{FakeAnswer, FakeSentinel, MASTER};
use helpers::{RedisCluster, RedisServer, Sluice, descriptor, fixture, request};
use sluice::limiter::redis::sentinel::{LOOKUP_TIMEOUT, MAX_REPLY_BYTES};
use sluice::limiter::redis::{RedisLimiter, RedisOptions};
use sluice::limiter::{Limiter, LimiterError};
use sluice::proto::envoy::service::ratelimit::v3::RateLimitRequest;
use sluice::proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tonic::transport::Channel;

/// Peak resident memory a flooding sentinel may add (the sidecar overlay's limit is 128 MiB).
const BOUND_MIB: u64 = 64;
/// Lookups each flood must have answered before the peak is read.
const FLOODED_LOOKUPS: usize = 3;

async fn decided_within(client: &mut RateLimitServiceClient<Channel>, call: &RateLimitRequest) {
    let by = Instant::now() + Duration::from_secs(10);
    while let Err(status) = client.should_rate_limit(call.clone()).await {
        assert!(
            Instant::now() < by,
            "no decision through the sentinel: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flooding_sentinel_costs_bounded_memory_and_is_named() {
    let primary = RedisServer::start();
    let honest = FakeAnswer::Master {
        port: primary.port(),
        flags: "master",
    };
    let fake = FakeSentinel::start(honest.clone(), None);
    // A deadline past the lookup's own bound, so that a lookup is never cut short before it has
    // read what the sentinel sent (a lookup that reads it all would be caught).
    let deadline = (LOOKUP_TIMEOUT + Duration::from_secs(1))
        .as_millis()
        .to_string();
    let sluice = Sluice::start_with(
        &fixture("sentinel/limits.yaml"),
        Some(&fake.url()),
        &["--backend-timeout-ms", &deadline],
    );
    let mut client = sluice.client().await;
    let call = request("failover", vec![descriptor(&[("budget", "bounds")])]);
    decided_within(&mut client, &call).await;
    let before = sluice.peak_rss_kib();

    for (what, flood) in [
        ("200,000 entries", FakeSentinel::flood_of_entries(200_000)),
        ("a 32 MiB string", FakeSentinel::flood_of_bytes(32 << 20)),
    ] {
        fake.answer(flood);
        let asked = fake.asked();
        // Every connection to the primary dropped: the next calls ask the sentinel again.
        RedisCluster::cli(primary.port(), &["CLIENT", "KILL", "TYPE", "normal"]);
        let by = Instant::now() + Duration::from_secs(30);
        let mut refused = None;
        while fake.asked() < asked + FLOODED_LOOKUPS || refused.is_none() {
            assert!(
                Instant::now() < by,
                "{what}: {} lookups in 30 s, last refusal {refused:?}",
                fake.asked() - asked
            );
            if let Err(status) = client.should_rate_limit(call.clone()).await {
                refused = Some(status);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let peak = sluice.peak_rss_kib();
        let refused = refused.expect("a refused call");
        println!(
            "a sentinel answering {what}: peak resident {before} KiB before, {peak} KiB after {} \
             lookups (+{} KiB); refused with {:?}",
            fake.asked() - asked,
            peak.saturating_sub(before),
            refused.message()
        );
        assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
        let named = format!("sentinel 127.0.0.1:{}", fake.port());
        let cap = format!("longer than {MAX_REPLY_BYTES} bytes");
        assert!(
            refused.message().contains(&named) && refused.message().contains(&cap),
            "{what}: {refused:?}"
        );
        assert!(
            peak.saturating_sub(before) < BOUND_MIB * 1024,
            "{what}: peak resident {before} KiB before, {peak} KiB after"
        );
    }

    // An honest answer again: decisions resume, and the process serves on.
    fake.answer(honest);
    decided_within(&mut client, &call).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lookup_passes_over_replicas_and_down_primaries_and_authenticates() {
    const USER: &str = "watcher";
    const PASSWORD: &str = "sentinel-secret";
    let primary = RedisServer::start();
    let replica = RedisServer::start_with(&[
        "--replicaof".into(),
        "127.0.0.1".into(),
        primary.port().to_string(),
    ]);
    let master = |port, flags| FakeAnswer::Master { port, flags };
    let names_replica = FakeSentinel::start(master(replica.port(), "master"), Some(PASSWORD));
    let flags_down = FakeSentinel::start(master(primary.port(), "master,s_down"), Some(PASSWORD));
    let names_primary = FakeSentinel::start(master(primary.port(), "master"), Some(PASSWORD));
    let options = |sentinels: &[&FakeSentinel], password: &str| {
        let hosts: Vec<String> = sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port()))
            .collect();
        RedisOptions {
            sentinel_user: Some(USER.into()),
            sentinel_password: Some(password.into()),
            pool_size: 1,
            batch_max: 1,
            ..RedisOptions::new(format!("redis+sentinel://{}/{MASTER}", hosts.join(",")))
        }
    };

    // In the order given, the first two name nothing usable: the third one's primary is used.
    let all = [&names_replica, &flags_down, &names_primary];
    let limiter = RedisLimiter::connect(&options(&all, PASSWORD))
        .await
        .expect("a primary through the third sentinel");
    let key = "sluice:{through-the-third}";
    let outcome = limiter
        .decide(&[helpers::consume(key, 10, 60_000)], None)
        .await
        .expect("decided");
    assert!(outcome.admitted);
    assert_eq!(
        RedisCluster::cli(primary.port(), &["EXISTS", key]).trim(),
        "1",
        "not written on the primary"
    );
    for sentinel in all {
        assert_eq!(
            sentinel.auths(),
            [[USER, PASSWORD]],
            "each sentinel gets the sentinels' user and password, once per lookup"
        );
    }

    // Without the third, no primary: the error says which cases that covers.
    let unavailable = |result: Result<RedisLimiter, LimiterError>| match result {
        Err(LimiterError::Unavailable(why)) => why,
        Err(other) => panic!("not unavailable: {other}"),
        Ok(_) => panic!("connected"),
    };
    let why = unavailable(RedisLimiter::connect(&options(&all[..2], PASSWORD)).await);
    assert!(
        why.contains("no sentinel named a primary")
            && why.contains(&format!("master `{MASTER}`"))
            && why.contains("ROLE answered replica"),
        "{why}"
    );

    // A wrong password: each sentinel's refusal is said, and the password is not.
    let why = unavailable(RedisLimiter::connect(&options(&all[2..], "not-the-password")).await);
    assert!(
        why.contains(&format!("sentinel 127.0.0.1:{}", names_primary.port()))
            && why.contains("AUTH refused")
            && why.contains("WRONGPASS")
            && !why.contains("not-the-password"),
        "{why}"
    );
}
