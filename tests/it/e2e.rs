//! End-to-end: sluice in process (the production server `sluice::Server` builds, served on
//! port 0) over real gRPC and HTTP on loopback, against both backends
//! (embedded memory, and a real `redis-server` the test starts). The binary itself is tested in
//! `cli.rs`.

use crate::helpers;

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use helpers::prometheus::{scrape, value};
use helpers::{RedisServer, TestServer};
use helpers::{descriptor, fixture, http_get, http_request, request, test_settings, wait_until};
use sluice::proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use sluice::proto::envoy::service::ratelimit::v3::rate_limit_response::Code;
use sluice::proto::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use sluice::proto::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

#[derive(Clone, Copy, Debug)]
enum Backend {
    Memory,
    Redis,
}

struct Env {
    sluice: TestServer,
    _redis: Option<RedisServer>,
}

fn limits() -> PathBuf {
    fixture("e2e/limits")
}

/// sluice with `sluice serve`'s defaults (and the test deadline) on `config`.
fn serve(config: &Path, redis: Option<&RedisServer>) -> TestServer {
    let url = redis.map(RedisServer::url);
    TestServer::start(test_settings(config, url.as_deref()))
}

fn start(backend: Backend) -> Env {
    match backend {
        Backend::Memory => Env {
            sluice: serve(&limits(), None),
            _redis: None,
        },
        Backend::Redis => {
            let redis = RedisServer::start();
            Env {
                sluice: serve(&limits(), Some(&redis)),
                _redis: Some(redis),
            }
        }
    }
}

async fn call(env: &Env, req: RateLimitRequest) -> RateLimitResponse {
    env.sluice
        .client()
        .await
        .should_rate_limit(req)
        .await
        .expect("ShouldRateLimit succeeds")
        .into_inner()
}

fn code(c: Code) -> i32 {
    c as i32
}

/// Runs one scenario against each backend.
macro_rules! on_both_backends {
    ($($scenario:ident),* $(,)?) => {$(
        mod $scenario {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn memory() {
                super::$scenario(super::Backend::Memory).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn redis() {
                super::$scenario(super::Backend::Redis).await
            }
        }
    )*};
}

on_both_backends!(
    ok_then_over_limit,
    unknown_domain_and_unmatched_descriptors_are_ok_without_limit,
    invalid_requests_name_the_field_and_record_nothing,
    all_or_nothing_across_descriptors,
    replaces_drops_the_named_limit,
    unlimited_whitelist_wildcard_and_shadow,
    limit_override_wins_over_config,
    hits_addend_check_only_and_refund,
    whole_second_boundary_does_not_double_the_limit,
    health_reports_serving_and_shutdown_returns_ok,
    json_api_mirrors_grpc,
);

/// envoyproxy/ratelimit's HTTP face: POST /json answers 200, then 429 when over the limit,
/// 400 naming the field for bad input (recording nothing); GET /rlconfig lists the rules.
async fn json_api_mirrors_grpc(backend: Backend) {
    let env = start(backend);
    let admin = env.sluice.admin_addr;
    let body =
        r#"{"domain":"edge","descriptors":[{"entries":[{"key":"generic_key","value":"demo"}]}]}"#;
    let (status, text) = http_request(admin, "POST", "/json", body);
    assert_eq!(status, 200, "{text}");
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(json["overallCode"], "OK");
    assert_eq!(json["statuses"][0]["currentLimit"]["requestsPerUnit"], 3);
    assert_eq!(json["statuses"][0]["currentLimit"]["unit"], "MINUTE");
    assert_eq!(json["statuses"][0]["limitRemaining"], 2);
    assert_eq!(json["statuses"][0]["durationUntilReset"], "60s");

    let (status, text) = http_request(admin, "POST", "/json", r#"{"domain":"","descriptors":[]}"#);
    assert_eq!(status, 400);
    assert!(text.contains("domain"), "{text}");
    let bad_unit = r#"{"domain":"edge","descriptors":[{"entries":[{"key":"generic_key","value":"demo"}],"limit":{"requestsPerUnit":1,"unit":"FORTNIGHT"}}]}"#;
    let (status, text) = http_request(admin, "POST", "/json", bad_unit);
    assert_eq!(status, 400);
    assert!(text.contains("descriptors[0].limit.unit"), "{text}");

    // Shared with gRPC: the same window.
    call(
        &env,
        request("edge", vec![descriptor(&[("generic_key", "demo")])]),
    )
    .await;
    let (status, text) = http_request(admin, "POST", "/json", body);
    assert_eq!(status, 200, "{text}");
    let (status, text) = http_request(admin, "POST", "/json", body);
    assert_eq!(status, 429, "{text}");
    assert!(text.contains(r#""overallCode":"OVER_LIMIT""#), "{text}");

    let (status, rules) = http_get(admin, "/rlconfig");
    assert_eq!(status, 200);
    assert!(
        rules.contains("edge.generic_key_demo: unit=MINUTE requests_per_unit=3"),
        "{rules}"
    );
    assert!(rules.contains("edge.bot: unlimited"), "{rules}");
}

async fn ok_then_over_limit(backend: Backend) {
    let env = start(backend);
    let demo = || request("edge", vec![descriptor(&[("generic_key", "demo")])]);
    for expected_remaining in [2u32, 1, 0] {
        let resp = call(&env, demo()).await;
        assert_eq!(resp.overall_code, code(Code::Ok));
        let status = &resp.statuses[0];
        assert_eq!(status.code, code(Code::Ok));
        assert_eq!(status.limit_remaining, expected_remaining);
        let limit = status.current_limit.as_ref().expect("current_limit");
        assert_eq!(limit.requests_per_unit, 3);
        assert_eq!(limit.unit, Unit::Minute as i32);
        let reset = status
            .duration_until_reset
            .as_ref()
            .expect("duration_until_reset");
        assert!((59..=60).contains(&reset.seconds), "reset {reset:?}");
    }
    let resp = call(&env, demo()).await;
    assert_eq!(resp.overall_code, code(Code::OverLimit));
    assert_eq!(resp.statuses[0].code, code(Code::OverLimit));
    assert_eq!(resp.statuses[0].limit_remaining, 0);
    let reset = resp.statuses[0].duration_until_reset.as_ref().unwrap();
    assert!(reset.seconds >= 1, "never 0 while limited: {reset:?}");
}

async fn unknown_domain_and_unmatched_descriptors_are_ok_without_limit(backend: Backend) {
    let env = start(backend);
    let resp = call(&env, request("nope", vec![descriptor(&[("user", "a")])])).await;
    assert_eq!(resp.overall_code, code(Code::Ok));
    assert_eq!(resp.statuses.len(), 1);
    assert!(resp.statuses[0].current_limit.is_none());

    // No rule for `color`; `user` has a limit only as the LAST entry, so a deeper request
    // gets none; both are OK without current_limit.
    let resp = call(
        &env,
        request(
            "edge",
            vec![
                descriptor(&[("color", "red")]),
                descriptor(&[("user", "a"), ("extra", "x")]),
            ],
        ),
    )
    .await;
    assert_eq!(resp.overall_code, code(Code::Ok));
    assert_eq!(resp.statuses.len(), 2);
    assert!(
        resp.statuses
            .iter()
            .all(|s| s.current_limit.is_none() && s.code == code(Code::Ok))
    );
}

async fn invalid_requests_name_the_field_and_record_nothing(backend: Backend) {
    let env = start(backend);
    let mut client = env.sluice.client().await;
    let cases = [
        (request("", vec![descriptor(&[("user", "u1")])]), "domain"),
        (request("edge", vec![]), "descriptors"),
        (
            request(
                "edge",
                vec![descriptor(&[("user", "u1")]), descriptor(&[("", "x")])],
            ),
            "descriptors[1].entries[0].key",
        ),
    ];
    for (req, field) in cases {
        let err = client.should_rate_limit(req).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
        assert!(
            err.message().starts_with(&format!("{field}:")),
            "message {:?} should name {field}",
            err.message()
        );
    }
    // None of the rejected calls spent user u1's quota (limit 5). A descriptor without entries
    // is no error (envoyproxy/ratelimit's answer): it matches no rule, the other one counts.
    let resp = call(
        &env,
        request("edge", vec![descriptor(&[("user", "u1")]), descriptor(&[])]),
    )
    .await;
    assert_eq!(resp.overall_code, code(Code::Ok));
    assert_eq!(resp.statuses[0].limit_remaining, 4);
    assert_eq!(resp.statuses[1].code, code(Code::Ok));
    assert_eq!(resp.statuses[1].current_limit, None);
}

async fn all_or_nothing_across_descriptors(backend: Backend) {
    let env = start(backend);
    // Exhaust the per-endpoint limit (4) using four different users.
    for i in 0..4 {
        let user = format!("u{i}");
        let resp = call(
            &env,
            request(
                "edge",
                vec![
                    descriptor(&[("endpoint", "checkout")]),
                    descriptor(&[("user", &user)]),
                ],
            ),
        )
        .await;
        assert_eq!(resp.overall_code, code(Code::Ok));
    }
    // The endpoint is full: the request is rejected and user "fresh" records nothing.
    for _ in 0..3 {
        let resp = call(
            &env,
            request(
                "edge",
                vec![
                    descriptor(&[("endpoint", "checkout")]),
                    descriptor(&[("user", "fresh")]),
                ],
            ),
        )
        .await;
        assert_eq!(resp.overall_code, code(Code::OverLimit));
        assert_eq!(resp.statuses[0].code, code(Code::OverLimit));
        assert_eq!(resp.statuses[1].code, code(Code::Ok));
        assert_eq!(
            resp.statuses[1].limit_remaining, 5,
            "nothing recorded for the user"
        );
    }
    let resp = call(
        &env,
        request("edge", vec![descriptor(&[("user", "fresh")])]),
    )
    .await;
    assert_eq!(resp.statuses[0].limit_remaining, 4);
}

async fn replaces_drops_the_named_limit(backend: Backend) {
    let env = start(backend);
    for i in 0..4 {
        let user = format!("r{i}");
        call(
            &env,
            request(
                "edge",
                vec![
                    descriptor(&[("endpoint", "checkout")]),
                    descriptor(&[("user", &user)]),
                ],
            ),
        )
        .await;
    }
    // A premium user's rule replaces `checkout_global`: the full endpoint limit no longer applies.
    let resp = call(
        &env,
        request(
            "edge",
            vec![
                descriptor(&[("endpoint", "checkout")]),
                descriptor(&[("tier", "premium"), ("user", "vip")]),
            ],
        ),
    )
    .await;
    assert_eq!(resp.overall_code, code(Code::Ok));
    assert!(
        resp.statuses[0].current_limit.is_none(),
        "replaced limit is dropped"
    );
    assert_eq!(
        resp.statuses[1]
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit,
        50
    );
    assert_eq!(resp.statuses[1].limit_remaining, 49);
}

async fn unlimited_whitelist_wildcard_and_shadow(backend: Backend) {
    let env = start(backend);
    for _ in 0..5 {
        let resp = call(
            &env,
            request(
                "edge",
                vec![
                    descriptor(&[("bot", "crawler")]),
                    descriptor(&[("remote_address", "10.0.0.1")]),
                ],
            ),
        )
        .await;
        assert_eq!(resp.overall_code, code(Code::Ok));
        assert!(resp.statuses.iter().all(|s| s.current_limit.is_none()));
        // envoyproxy/ratelimit's answers: an unlimited budget is all left, no limit has none.
        let remaining: Vec<_> = resp.statuses.iter().map(|s| s.limit_remaining).collect();
        assert_eq!(remaining, [u32::MAX, 0]);
    }
    // Wildcard value: /api/* matches both paths, one counter per runtime value.
    for path in ["/api/a", "/api/b"] {
        for expected in [Code::Ok, Code::Ok, Code::OverLimit] {
            let resp = call(&env, request("edge", vec![descriptor(&[("path", path)])])).await;
            assert_eq!(resp.overall_code, code(expected), "{path}");
        }
    }
    // Shadow mode: over its limit of 1 yet reported OK.
    for _ in 0..3 {
        let resp = call(&env, request("edge", vec![descriptor(&[("shadow", "s")])])).await;
        assert_eq!(resp.overall_code, code(Code::Ok));
        assert_eq!(resp.statuses[0].code, code(Code::Ok));
    }
}

async fn limit_override_wins_over_config(backend: Backend) {
    let env = start(backend);
    let mut d = descriptor(&[("user", "o1")]);
    d.limit = Some(RateLimitOverride {
        requests_per_unit: 1,
        unit: sluice::proto::envoy::r#type::v3::RateLimitUnit::Hour as i32,
    });
    let resp = call(&env, request("edge", vec![d.clone()])).await;
    assert_eq!(resp.overall_code, code(Code::Ok));
    let limit = resp.statuses[0].current_limit.as_ref().unwrap();
    assert_eq!(
        (limit.requests_per_unit, limit.unit),
        (1, Unit::Hour as i32)
    );
    let resp = call(&env, request("edge", vec![d])).await;
    assert_eq!(resp.overall_code, code(Code::OverLimit));
}

async fn hits_addend_check_only_and_refund(backend: Backend) {
    let env = start(backend);
    // Request-level hits_addend 3 of user h1's 5.
    let mut req = request("edge", vec![descriptor(&[("user", "h1")])]);
    req.hits_addend = 3;
    let resp = call(&env, req.clone()).await;
    assert_eq!(resp.statuses[0].limit_remaining, 2);
    // Descriptor-level 0: check-only, records nothing (twice: the second sees the same 2).
    let mut probe = descriptor(&[("user", "h1")]);
    probe.hits_addend = Some(0);
    for _ in 0..2 {
        let resp = call(&env, request("edge", vec![probe.clone()])).await;
        assert_eq!(resp.overall_code, code(Code::Ok));
        assert_eq!(resp.statuses[0].limit_remaining, 2);
    }
    // 3 more do not fit: rejected, and the rule's default `over_limit: fill` records what
    // did fit, so the key is at its limit.
    let resp = call(&env, req).await;
    assert_eq!(resp.overall_code, code(Code::OverLimit));
    assert_eq!(resp.statuses[0].limit_remaining, 0);
    let resp = call(&env, request("edge", vec![probe.clone()])).await;
    assert_eq!(
        resp.overall_code,
        code(Code::OverLimit),
        "check-only sees a full window"
    );
    // Refund 4: the newest entries go first (the fill of 2, then 2 of the first 3).
    let mut refund = descriptor(&[("user", "h1")]);
    refund.hits_addend = Some(4);
    refund.is_negative_hits = true;
    let resp = call(&env, request("edge", vec![refund])).await;
    assert_eq!(resp.overall_code, code(Code::Ok));
    assert_eq!(resp.statuses[0].limit_remaining, 4);
    // Descriptor-level 2 overrides request-level 0 (=1).
    let mut two = request("edge", vec![descriptor(&[("user", "h1")])]);
    two.hits_addend = 0;
    two.descriptors[0].hits_addend = Some(2);
    let resp = call(&env, two).await;
    assert_eq!(resp.overall_code, code(Code::Ok));
    assert_eq!(resp.statuses[0].limit_remaining, 2);
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// `limit` hits just before a whole-second boundary and `limit` just after: a fixed window
/// resets at the boundary and admits the second batch; the sliding log rejects it.
///
/// The first batch must fit in the last ~150 ms of a wall-clock second. On a loaded machine
/// five round trips can take longer; such an attempt proves nothing either way, so it is
/// retried with a fresh key at a later second (at most 5 attempts) rather than failed, and the
/// test fails only if no attempt fits.
async fn whole_second_boundary_does_not_double_the_limit(backend: Backend) {
    let env = start(backend);
    let mut client = env.sluice.client().await;
    // Warm the connection so a batch fits in the last ~150 ms of a second.
    call(
        &env,
        request("edge", vec![descriptor(&[("per_second", "warmup")])]),
    )
    .await;
    for attempt in 0..5 {
        let client_name = format!("edge-client-{attempt}");
        let req = || request("edge", vec![descriptor(&[("per_second", &client_name)])]);
        loop {
            let ms = now_ms() % 1000;
            if (800..850).contains(&ms) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let first_second = now_ms() / 1000;
        let first_batch_start = now_ms();
        for _ in 0..5 {
            let resp = client.should_rate_limit(req()).await.unwrap().into_inner();
            assert_eq!(resp.overall_code, code(Code::Ok));
        }
        if now_ms() / 1000 != first_second {
            println!("attempt {attempt}: the first batch crossed the boundary; retrying");
            continue;
        }
        while now_ms() / 1000 == first_second {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        let mut inconclusive = false;
        for _ in 0..5 {
            let resp = client.should_rate_limit(req()).await.unwrap().into_inner();
            // Only an answer within a window of the first batch's start must be a rejection.
            if now_ms() >= first_batch_start + 1000 {
                inconclusive = true;
                break;
            }
            assert_eq!(
                resp.overall_code,
                code(Code::OverLimit),
                "a fixed window would admit this second batch"
            );
        }
        if inconclusive {
            println!("attempt {attempt}: the second batch ran past a window; retrying");
            continue;
        }
        // Once the first batch is a full window old, slots free again.
        tokio::time::sleep(Duration::from_millis(1000)).await;
        let resp = client.should_rate_limit(req()).await.unwrap().into_inner();
        assert_eq!(resp.overall_code, code(Code::Ok));
        return;
    }
    panic!("5 attempts, none fit its first batch in the last 150 ms of a second");
}

/// Health reports SERVING; once the shutdown future completes, `run` returns Ok. Draining a call
/// in flight is tested on the binary in `cli.rs` (SIGTERM, which `main` turns into that future,
/// with a call held by a paused Redis).
async fn health_reports_serving_and_shutdown_returns_ok(backend: Backend) {
    let env = start(backend);
    let mut health = HealthClient::new(env.sluice.channel().await);
    for service in ["", "envoy.service.ratelimit.v3.RateLimitService"] {
        let status = health
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .expect("health check")
            .into_inner()
            .status;
        assert_eq!(status, ServingStatus::Serving as i32, "service {service:?}");
    }
    drop(health);
    env.sluice
        .stop()
        .await
        .expect("run returns Ok after draining");
}

/// Three instances share one Redis and hammer one key concurrently: the admitted count equals
/// the limit, never more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_share_one_redis_exactly() {
    let redis = RedisServer::start();
    let instances: Vec<TestServer> = (0..3).map(|_| serve(&limits(), Some(&redis))).collect();
    let mut tasks = Vec::new();
    for instance in &instances {
        for _ in 0..4 {
            let mut client = instance.client().await;
            tasks.push(tokio::spawn(async move {
                let mut admitted = 0u32;
                for _ in 0..25 {
                    let resp = client
                        .should_rate_limit(request("edge", vec![descriptor(&[("hammer", "k")])]))
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
    }
    let mut admitted = 0;
    for task in tasks {
        admitted += task.await.unwrap();
    }
    assert_eq!(admitted, 20, "300 calls against a limit of 20 per hour");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_endpoints_follow_the_backend() {
    // A domain of its own: the metrics recorder is shared by every server of this test process,
    // and the exact count below must be this test's alone.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("admin.yaml"),
        "domain: admin\ndescriptors:\n  - key: generic_key\n    value: demo\n    \
         rate_limit: {unit: minute, requests_per_unit: 3}\n",
    )
    .unwrap();
    let demo = || request("admin", vec![descriptor(&[("generic_key", "demo")])]);
    let mut redis = RedisServer::start();
    let env = Env {
        sluice: serve(dir.path(), Some(&redis)),
        _redis: None,
    };
    let admin = env.sluice.admin_addr;
    assert_eq!(http_get(admin, "/healthz").0, 200);
    assert_eq!(http_get(admin, "/readyz").0, 200);
    call(&env, demo()).await;
    let metrics = scrape(admin);
    assert_eq!(
        value(
            &metrics,
            r#"sluice_decisions_total{domain="admin",rule="generic_key_demo",outcome="admitted"}"#
        ),
        1.0
    );

    // Redis goes away: readiness and gRPC health follow within a few probe periods, and a
    // decision is an UNAVAILABLE error, never an OK or an UNKNOWN code.
    redis.stop();
    let mut health = HealthClient::new(env.sluice.channel().await);
    wait_until(
        "/readyz 503 with Redis down",
        Duration::from_secs(5),
        || async { http_get(admin, "/readyz").0 == 503 },
    )
    .await;
    let status = health
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap()
        .into_inner()
        .status;
    assert_eq!(status, ServingStatus::NotServing as i32);
    let liveness = health
        .check(HealthCheckRequest {
            service: "sluice.liveness".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .status;
    assert_eq!(
        liveness,
        ServingStatus::Serving as i32,
        "a Redis outage must not fail liveness"
    );
    let err = env
        .sluice
        .client()
        .await
        .should_rate_limit(demo())
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");

    redis.start_again();
    wait_until(
        "/readyz 200 again after Redis came back",
        Duration::from_secs(5),
        || async { http_get(admin, "/readyz").0 == 200 },
    )
    .await;
    let resp = call(&env, demo()).await;
    assert_eq!(resp.overall_code, code(Code::Ok));
}

/// The benchmark's exactness check, through the whole gRPC path: 64 concurrent callers on one key
/// with a limit of 10 (benches/limits `flood`) admit exactly 10, on Redis and in memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_concurrent_callers_on_one_key_admit_exactly_the_limit() {
    let config = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("benches/limits");
    let redis = RedisServer::start();
    for url in [Some(redis.url()), None] {
        let mut settings = test_settings(&config, url.as_deref());
        // A generous deadline: a loaded test machine must not turn a slow call into an error.
        settings.backend.deadline = Duration::from_millis(2000);
        let sluice = TestServer::start(settings);
        let mut clients = Vec::new();
        for _ in 0..4 {
            clients.push(sluice.client().await);
        }
        let start = std::sync::Arc::new(tokio::sync::Barrier::new(64));
        let mut tasks = Vec::new();
        for i in 0..64 {
            let mut client = clients[i % clients.len()].clone();
            let start = start.clone();
            tasks.push(tokio::spawn(async move {
                start.wait().await;
                client
                    .should_rate_limit(request("bench", vec![descriptor(&[("flood", "v0")])]))
                    .await
                    .expect("call")
                    .into_inner()
                    .overall_code
            }));
        }
        let mut admitted = 0;
        for task in tasks {
            if task.await.unwrap() == Code::Ok as i32 {
                admitted += 1;
            }
        }
        assert_eq!(
            admitted, 10,
            "64 concurrent calls against a limit of 10 per hour"
        );
    }
}
