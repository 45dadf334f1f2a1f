//! Response headers end to end: sluice in process over real gRPC, on both backends, with exact
//! header values for a known sequence of requests.

mod helpers;

use helpers::{descriptor, request, test_settings, RedisServer, TestServer};
use sluice::proto::envoy::service::ratelimit::v3::rate_limit_response::Code;
use sluice::proto::envoy::service::ratelimit::v3::RateLimitRequest;

const LIMITS: &str = r#"
domain: hdr
response_headers: {format: draft}
descriptors:
  - key: endpoint
    value: api
    rate_limit: {unit: minute, requests_per_unit: 10, name: api}
    descriptors:
      - key: user
        rate_limit: {unit: minute, requests_per_unit: 2, name: per_user}
  - key: endpoint
    value: public
    response_headers: {format: legacy, hide_remaining: true}
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: endpoint
    value: partner
    response_headers: {format: legacy}
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: plain
    response_headers: {format: none}
    rate_limit: {unit: minute, requests_per_unit: 1}
"#;

async fn call(sluice: &TestServer, req: RateLimitRequest) -> (i32, Vec<(String, String)>) {
    let r = sluice
        .client()
        .await
        .should_rate_limit(req)
        .await
        .expect("ShouldRateLimit")
        .into_inner();
    let headers = r
        .response_headers_to_add
        .into_iter()
        .map(|h| (h.key, h.value))
        .collect();
    (r.overall_code, headers)
}

fn h(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

async fn known_sequence(redis: Option<&RedisServer>) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("hdr.yaml"), LIMITS).unwrap();
    let url = redis.map(RedisServer::url);
    let sluice = TestServer::start(test_settings(dir.path(), url.as_deref()));

    // Two limits per request (the endpoint, and the user on it): the tighter per-user limit is
    // the one advertised, in the domain's draft format.
    let api = || {
        request(
            "hdr",
            vec![
                descriptor(&[("endpoint", "api")]),
                descriptor(&[("endpoint", "api"), ("user", "u1")]),
            ],
        )
    };
    let ok = Code::Ok as i32;
    let over = Code::OverLimit as i32;
    assert_eq!(
        call(&sluice, api()).await,
        (
            ok,
            h(&[
                ("RateLimit-Policy", r#""per_user";q=2;w=60"#),
                ("RateLimit", r#""per_user";r=1;t=60"#),
            ])
        )
    );
    assert_eq!(
        call(&sluice, api()).await,
        (
            ok,
            h(&[
                ("RateLimit-Policy", r#""per_user";q=2;w=60"#),
                ("RateLimit", r#""per_user";r=0;t=60"#),
            ])
        )
    );
    assert_eq!(
        call(&sluice, api()).await,
        (
            over,
            h(&[
                ("RateLimit-Policy", r#""per_user";q=2;w=60"#),
                ("RateLimit", r#""per_user";r=0;t=60"#),
                ("Retry-After", "60"),
            ])
        )
    );

    // Legacy with every header.
    let partner = || request("hdr", vec![descriptor(&[("endpoint", "partner")])]);
    assert_eq!(
        call(&sluice, partner()).await,
        (
            ok,
            h(&[
                ("X-RateLimit-Limit", "2"),
                ("X-RateLimit-Remaining", "1"),
                ("X-RateLimit-Reset", "1"),
            ])
        )
    );

    // A public endpoint: limit and reset, never the remaining count.
    let public = || request("hdr", vec![descriptor(&[("endpoint", "public")])]);
    assert_eq!(
        call(&sluice, public()).await,
        (
            ok,
            h(&[("X-RateLimit-Limit", "1"), ("X-RateLimit-Reset", "3600")])
        )
    );
    assert_eq!(
        call(&sluice, public()).await,
        (
            over,
            h(&[
                ("X-RateLimit-Limit", "1"),
                ("X-RateLimit-Reset", "3600"),
                ("Retry-After", "3600"),
            ])
        )
    );

    // `none`: no headers even when rejected.
    let plain = || request("hdr", vec![descriptor(&[("plain", "p")])]);
    assert_eq!(call(&sluice, plain()).await, (ok, vec![]));
    assert_eq!(call(&sluice, plain()).await, (over, vec![]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exact_headers_memory() {
    known_sequence(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exact_headers_redis() {
    let redis = RedisServer::start();
    known_sequence(Some(&redis)).await;
}
