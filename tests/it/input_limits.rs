//! Hostile input over real gRPC (and the HTTP `/json` face), sluice in process: every input
//! limit answers INVALID_ARGUMENT naming the field and the flag, and records nothing; an
//! oversized message is refused by the transport and the server keeps serving; huge
//! `hits_addend` values are answered at once on both backends (no allocation or loop
//! proportional to them).

use crate::helpers;

use std::path::PathBuf;
use std::time::Duration;

use helpers::{RedisServer, TestServer};
use helpers::{descriptor, fixture, http_request, request, test_settings};
use sluice::Settings;
use sluice::decision::InputLimits;
use sluice::proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use sluice::proto::envoy::service::ratelimit::v3::RateLimitRequest;
use sluice::proto::envoy::service::ratelimit::v3::rate_limit_response::Code;

fn limits() -> PathBuf {
    fixture("e2e/limits")
}

/// `sluice serve`'s defaults with `limits` (and the test deadline).
fn settings(redis_url: Option<&str>, limits_of: impl FnOnce(&mut InputLimits)) -> Settings {
    let mut settings = test_settings(&limits(), redis_url);
    limits_of(&mut settings.engine.limits);
    settings
}

/// A request whose first descriptor spends user `victim`'s quota (limit 5/minute) if recorded.
fn with_victim(mut extra: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    let mut descriptors = vec![descriptor(&[("user", "victim")])];
    descriptors.append(&mut extra);
    request("edge", descriptors)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_limit_names_field_and_flag_and_records_nothing() {
    // Small limits, so that each is easy to cross.
    let sluice = TestServer::start(settings(None, |l| {
        l.max_domain_bytes = 8;
        l.max_descriptors = 3;
        l.max_entries = 2;
        l.max_key_bytes = 12;
        l.max_value_bytes = 16;
        l.max_hits_addend = 10;
    }));
    let mut client = sluice.client().await;

    let long_value = "v".repeat(5000);
    let long_key = "k".repeat(13);
    let mut hits_request = with_victim(vec![]);
    hits_request.hits_addend = 11;
    let mut hits_descriptor = descriptor(&[("user", "victim")]);
    hits_descriptor.hits_addend = Some(u64::MAX);
    let mut domain_request = with_victim(vec![]);
    domain_request.domain = "edge-long-domain".into();

    let cases: Vec<(RateLimitRequest, &str)> = vec![
        (
            domain_request,
            "domain: 16 bytes exceeds --max-domain-bytes 8",
        ),
        (
            with_victim(vec![
                descriptor(&[("user", "a")]),
                descriptor(&[("user", "b")]),
                descriptor(&[("user", "c")]),
            ]),
            "descriptors: 4 descriptors exceeds --max-descriptors 3",
        ),
        (
            with_victim(vec![descriptor(&[("a", "1"), ("b", "2"), ("c", "3")])]),
            "descriptors[1].entries: 3 entries exceeds --max-entries 2",
        ),
        (
            with_victim(vec![descriptor(&[("user", "a"), (&long_key, "x")])]),
            "descriptors[1].entries[1].key: 13 bytes exceeds --max-key-bytes 12",
        ),
        (
            with_victim(vec![
                descriptor(&[("user", "a")]),
                descriptor(&[("user", &long_value)]),
            ]),
            "descriptors[2].entries[0].value: 5000 bytes exceeds --max-value-bytes 16",
        ),
        (hits_request, "hits_addend: 11 exceeds --max-hits-addend 10"),
        (
            with_victim(vec![hits_descriptor]),
            "descriptors[1].hits_addend: 18446744073709551615 exceeds --max-hits-addend 10",
        ),
    ];
    for (req, message) in cases {
        let err = client
            .should_rate_limit(req)
            .await
            .expect_err("over a limit");
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
        assert_eq!(err.message(), message);
    }

    // Right at each limit is accepted.
    let at_limits = request(
        "edge1234",
        vec![
            descriptor(&[("user", "x"), ("k".repeat(12).as_str(), &"v".repeat(16))]),
            descriptor(&[("user", "y")]),
            descriptor(&[("user", "z")]),
        ],
    );
    let resp = client
        .should_rate_limit(at_limits)
        .await
        .expect("at the limits");
    assert_eq!(resp.into_inner().overall_code, Code::Ok as i32);

    // None of the refused calls spent the victim's quota (5 per minute).
    let resp = client
        .should_rate_limit(with_victim(vec![]))
        .await
        .expect("valid call")
        .into_inner();
    assert_eq!(resp.statuses[0].limit_remaining, 4);

    // The HTTP face enforces the same limits with the same message, and records nothing either.
    let body = format!(
        r#"{{"domain":"edge","descriptors":[{{"entries":[{{"key":"user","value":"victim"}}]}},{{"entries":[{{"key":"user","value":"{long_value}"}}]}}]}}"#
    );
    let (status, text) = http_request(sluice.admin_addr, "POST", "/json", &body);
    assert_eq!(status, 400, "{text}");
    assert!(
        text.contains("descriptors[1].entries[0].value: 5000 bytes exceeds --max-value-bytes 16"),
        "{text}"
    );
    let resp = client
        .should_rate_limit(with_victim(vec![]))
        .await
        .expect("valid call")
        .into_inner();
    assert_eq!(resp.statuses[0].limit_remaining, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_message_is_refused_and_the_server_survives() {
    let mut settings = settings(None, |_| {});
    settings.ports.max_message_bytes = 4096;
    let sluice = TestServer::start(settings);
    let mut client = sluice.client().await;
    // 8 KB of entries: over the transport limit, though every field is within its own limit.
    let big: Vec<_> = (0..16)
        .map(|i| descriptor(&[("user", &format!("{i}-{}", "x".repeat(500)))]))
        .collect();
    let err = client
        .should_rate_limit(request("edge", big))
        .await
        .expect_err("refused");
    assert!(
        matches!(
            err.code(),
            tonic::Code::OutOfRange | tonic::Code::ResourceExhausted
        ),
        "{err:?}"
    );
    // The same connection, and a new one, still get answers.
    let resp = client
        .should_rate_limit(request("edge", vec![descriptor(&[("user", "after")])]))
        .await
        .expect("served after the oversized message")
        .into_inner();
    assert_eq!(resp.statuses[0].limit_remaining, 4);
    let mut fresh = sluice.client().await;
    let resp = fresh
        .should_rate_limit(request("edge", vec![descriptor(&[("user", "after")])]))
        .await
        .expect("served on a new connection")
        .into_inner();
    assert_eq!(resp.statuses[0].limit_remaining, 3);
}

/// The defaults admit the longest names Envoy Gateway writes: its domain is the listener's
/// name (`NAMESPACE/GATEWAY/LISTENER`, up to 63 + 253 + 253 bytes) and its route descriptor's
/// key and value the route rule's (`httproute/NAMESPACE/ROUTE/rule/I/match/J/HOSTNAME`, up to
/// about 600 bytes). Such a request reaches its rule: the second call is over the limit of 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_defaults_admit_envoy_gateways_longest_names() {
    let namespace = "n".repeat(63);
    let domain = format!("{namespace}/{}/{}", "g".repeat(253), "l".repeat(253));
    let route = format!(
        "httproute/{namespace}/{}/rule/99/match/99/{}",
        "r".repeat(253),
        "h".repeat(253)
    );
    assert_eq!((domain.len(), route.len()), (571, 598));
    let dir = tempfile::tempdir().expect("temp dir");
    let yaml = format!(
        "domain: {domain}\ndescriptors:\n  - key: {route}\n    value: {route}\n    descriptors:\n      - key: rule-0-match-0\n        value: rule-0-match-0\n        rate_limit: {{unit: minute, requests_per_unit: 1}}\n"
    );
    std::fs::write(dir.path().join("eg.yaml"), yaml).expect("config written");
    let sluice = TestServer::start(test_settings(dir.path(), None));
    let mut client = sluice.client().await;
    let call = || {
        request(
            &domain,
            vec![descriptor(&[
                (route.as_str(), route.as_str()),
                ("rule-0-match-0", "rule-0-match-0"),
            ])],
        )
    };
    for expected in [Code::Ok, Code::OverLimit] {
        let resp = client
            .should_rate_limit(call())
            .await
            .expect("a valid Envoy Gateway request")
            .into_inner();
        assert_eq!(resp.overall_code, expected as i32, "{resp:?}");
    }
}

/// With the hits limit lifted to u64::MAX, a huge consume is rejected (filling the key) and a
/// huge refund applied at once on both backends: a log entry carries its hits as a weight, so
/// neither backend does work in proportion to them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_hits_are_answered_at_once_on_both_backends() {
    let redis = RedisServer::start();
    for url in [None, Some(redis.url())] {
        let sluice = TestServer::start(settings(url.as_deref(), |l| l.max_hits_addend = u64::MAX));
        let mut client = sluice.client().await;
        let spend = client
            .should_rate_limit(request("edge", vec![descriptor(&[("user", "big")])]))
            .await
            .expect("one hit")
            .into_inner();
        assert_eq!(spend.statuses[0].limit_remaining, 4);

        let mut huge = descriptor(&[("user", "big")]);
        huge.hits_addend = Some(u64::MAX);
        let resp = answered_at_once(
            "huge consume",
            client.should_rate_limit(request("edge", vec![huge.clone()])),
        )
        .await;
        assert_eq!(resp.overall_code, Code::OverLimit as i32, "{url:?}");
        // The default `over_limit: fill` records what fitted, as one entry: the key is full.
        assert_eq!(resp.statuses[0].limit_remaining, 0, "filled to the limit");
        let mut request_level = request("edge", vec![descriptor(&[("user", "big")])]);
        request_level.hits_addend = u32::MAX;
        let resp = answered_at_once(
            "huge request-level consume",
            client.should_rate_limit(request_level),
        )
        .await;
        assert_eq!(resp.overall_code, Code::OverLimit as i32, "{url:?}");

        huge.is_negative_hits = true;
        let resp = answered_at_once(
            "huge refund",
            client.should_rate_limit(request("edge", vec![huge])),
        )
        .await;
        assert_eq!(resp.overall_code, Code::Ok as i32);
        assert_eq!(
            resp.statuses[0].limit_remaining, 5,
            "refund emptied the log"
        );
    }
}

/// Waits for one call's answer for 5 s at most: a loop over 2^64 hits (or a deadlock) would
/// never answer, and a bound checked only after the call returned could not catch it. Generous
/// for one loopback call (milliseconds) on a loaded 2-core machine.
async fn answered_at_once<T>(
    what: &str,
    call: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> T {
    match tokio::time::timeout(Duration::from_secs(5), call).await {
        Ok(result) => result
            .unwrap_or_else(|status| panic!("{what}: {status:?}"))
            .into_inner(),
        Err(_) => panic!("{what}: no answer within 5 s"),
    }
}
