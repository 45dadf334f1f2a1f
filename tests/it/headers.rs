//! Response headers end to end: sluice in process over real gRPC, on both backends, with exact
//! header values for a known sequence of requests; the `legacy` style's names renamed (flags,
//! envoyproxy/ratelimit's variables on the binary, through a real Envoy), and names that cannot
//! be header names refused at start-up.

use crate::helpers;

use helpers::Upstream;
use helpers::envoy_config::{bootstrap, cluster, generic_key, grpc_cluster, http_listener};
use helpers::envoy_config::{ratelimit_filter, route};
use helpers::process::run_sluice;
use helpers::{Envoy, RedisServer, Req, Sluice, TestServer, descriptor, request, test_settings};
use serde_json::json;
use sluice::headers::LegacyNames;
use sluice::proto::envoy::service::ratelimit::v3::RateLimitRequest;
use sluice::proto::envoy::service::ratelimit::v3::rate_limit_response::Code;

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

/// envoyproxy/ratelimit's header names, as `LIMIT_RESPONSE_HEADERS_ENABLED` sends them.
fn envoyproxy_names() -> LegacyNames {
    LegacyNames::new("RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset").unwrap()
}

fn limits_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("hdr.yaml"), LIMITS).unwrap();
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn legacy_headers_take_the_configured_names() {
    let dir = limits_dir();
    let mut settings = test_settings(dir.path(), None);
    settings.legacy_names = envoyproxy_names();
    let sluice = TestServer::start(settings);
    let partner = || request("hdr", vec![descriptor(&[("endpoint", "partner")])]);
    let ok = Code::Ok as i32;
    assert_eq!(
        call(&sluice, partner()).await,
        (
            ok,
            h(&[
                ("RateLimit-Limit", "2"),
                ("RateLimit-Remaining", "1"),
                ("RateLimit-Reset", "1"),
            ])
        )
    );
    // Other styles keep their own names.
    let api = request("hdr", vec![descriptor(&[("endpoint", "api")])]);
    let (_, headers) = call(&sluice, api).await;
    assert_eq!(headers[0].0, "RateLimit-Policy");
}

/// The binary with envoyproxy/ratelimit's variables: headers on, one of them renamed; a config
/// that says nothing of headers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoyproxy_header_variables_on_the_binary() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("plain.yaml"),
        "domain: plain\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5}\n",
    )
    .unwrap();
    let sluice = Sluice::start_with_env(
        dir.path(),
        None,
        &[],
        &[
            ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
            ("LIMIT_RESET_HEADER", "X-Window-Reset"),
        ],
    );
    let r = sluice
        .client()
        .await
        .should_rate_limit(request("plain", vec![descriptor(&[("k", "v")])]))
        .await
        .expect("ShouldRateLimit")
        .into_inner();
    let headers: Vec<(String, String)> = r
        .response_headers_to_add
        .into_iter()
        .map(|h| (h.key, h.value))
        .collect();
    assert_eq!(
        headers,
        h(&[
            ("RateLimit-Limit", "5"),
            ("RateLimit-Remaining", "4"),
            ("X-Window-Reset", "60"),
        ])
    );
}

#[test]
fn header_names_that_cannot_be_used_stop_the_start() {
    let dir = limits_dir();
    let config = dir.path().to_str().unwrap();
    let serve = |extra: &[&str], env: &[(&str, &str)]| {
        let mut args = vec!["serve", "--config", config];
        args.extend_from_slice(&["--grpc-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0"]);
        args.extend_from_slice(extra);
        let out = run_sluice(args, env);
        assert!(!out.status.success(), "started with {extra:?} {env:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = serve(&["--legacy-limit-header", "X Limit"], &[]);
    assert!(err.contains("--legacy-limit-header"), "{err}");
    assert!(
        err.contains(r#""X Limit" is not a valid HTTP header name"#),
        "{err}"
    );
    // From envoyproxy/ratelimit's variable, onto the flag it maps to.
    let err = serve(
        &[],
        &[
            ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
            ("LIMIT_REMAINING_HEADER", "Remaining:"),
        ],
    );
    assert!(err.contains("--legacy-remaining-header"), "{err}");
    assert!(err.contains("not a valid HTTP header name"), "{err}");
    let err = serve(
        &[
            "--legacy-limit-header",
            "X-Quota",
            "--legacy-reset-header",
            "x-quota",
        ],
        &[],
    );
    assert!(
        err.contains("legacy response headers: the limit and reset headers have the same name"),
        "{err}"
    );
}

/// Through Envoy: the renamed headers are on the response the client gets, the 429 included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renamed_headers_reach_the_client_through_envoy() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("renamed.yaml"),
        "domain: renamed\nresponse_headers: {format: legacy}\ndescriptors:\n  - key: endpoint\n    \
         value: partner\n    rate_limit: {unit: minute, requests_per_unit: 2}\n",
    )
    .unwrap();
    let mut settings = test_settings(dir.path(), None);
    settings.legacy_names = envoyproxy_names();
    let sluice = TestServer::start(settings);
    let upstream = Upstream::start();
    let rate_limits = json!([{"actions": [generic_key("endpoint", "partner")]}]);
    let listener = http_listener(
        "edge",
        vec![route("/", "app", rate_limits, json!({}))],
        vec![ratelimit_filter("renamed", "sluice", 1000, true, json!({}))],
    );
    let clusters = vec![
        cluster("app", &[upstream.addr]),
        grpc_cluster("sluice", &[sluice.grpc_addr]),
    ];
    let envoy = Envoy::start_json(&bootstrap(vec![listener], clusters));
    let edge = envoy.listener("edge");
    let first = Req::get("/").send(edge).await;
    assert_eq!(first.status, 200, "{first:?}");
    assert_eq!(first.header("ratelimit-limit"), Some("2"), "{first:?}");
    assert_eq!(first.header("ratelimit-remaining"), Some("1"), "{first:?}");
    assert_eq!(first.header("x-ratelimit-limit"), None, "{first:?}");
    let _ = Req::get("/").send(edge).await;
    let third = Req::get("/").send(edge).await;
    assert_eq!(third.status, 429, "{third:?}");
    assert_eq!(third.header("ratelimit-limit"), Some("2"), "{third:?}");
    assert_eq!(third.header("ratelimit-remaining"), Some("0"), "{third:?}");
    let reset: u64 = third.header("ratelimit-reset").unwrap().parse().unwrap();
    assert!((1..=60).contains(&reset), "{third:?}");
}
