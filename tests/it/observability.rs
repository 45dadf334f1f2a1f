//! Observability end to end: the built binary serves real traffic over gRPC and `POST /json`, and
//! the tests scrape `/metrics` over HTTP and check exact values, on both backends; both faces are
//! recorded alike; a killed Redis shows in `/readyz`, gRPC health and the error counters, then
//! recovers; and 100,000 distinct per-user values leave the number of series under a fixed bound.

use crate::helpers;

use std::path::PathBuf;
use std::time::Duration;

use helpers::prometheus::{samples, scrape, value};
use helpers::{RedisServer, Sluice, descriptor, http_get, http_request, request, wait_until};
use sluice::proto::envoy::service::ratelimit::v3::RateLimitRequest;
use sluice::proto::envoy::service::ratelimit::v3::rate_limit_response::Code;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

fn limits() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/obs/limits")
}

async fn decide(sluice: &Sluice, req: RateLimitRequest) -> i32 {
    sluice
        .client()
        .await
        .should_rate_limit(req)
        .await
        .expect("ShouldRateLimit succeeds")
        .into_inner()
        .overall_code
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Backend {
    Memory,
    Redis,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exact_values_after_known_traffic_memory() {
    exact_values_after_known_traffic(Backend::Memory).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exact_values_after_known_traffic_redis() {
    exact_values_after_known_traffic(Backend::Redis).await
}

async fn exact_values_after_known_traffic(backend: Backend) {
    let redis = (backend == Backend::Redis).then(RedisServer::start);
    let url = redis.as_ref().map(RedisServer::url);
    let mut flags = vec!["--near-limit-ratio", "0.5", "--hot-keys", "2"];
    // A Redis setting without a Redis URL stops start-up, so only the Redis run gets one.
    if redis.is_some() {
        flags.extend(["--redis-pool-size", "3"]);
    }
    let sluice = Sluice::start_with(&limits(), url.as_deref(), &flags);

    // client=c1, limit 7 per minute: 10 calls -> 7 admitted, 3 rejected. Near the limit with
    // ratio 0.5 means more than floor(3.5) = 3 entries after admission: calls 4..7.
    let mut codes = Vec::new();
    for _ in 0..10 {
        codes.push(
            decide(
                &sluice,
                request("obs", vec![descriptor(&[("client", "c1")])]),
            )
            .await,
        );
    }
    let ok = Code::Ok as i32;
    assert_eq!(codes.iter().filter(|&&c| c == ok).count(), 7);
    // Two more keys of the same rule, and a detailed_metric rule.
    for _ in 0..2 {
        decide(
            &sluice,
            request("obs", vec![descriptor(&[("client", "c2")])]),
        )
        .await;
    }
    decide(
        &sluice,
        request("obs", vec![descriptor(&[("client", "c3")])]),
    )
    .await;
    for _ in 0..3 {
        decide(
            &sluice,
            request("obs", vec![descriptor(&[("user", "alice")])]),
        )
        .await;
    }
    // Unknown domain: labelled _unknown, not with the client's name.
    decide(&sluice, request("made-up", vec![descriptor(&[("x", "y")])])).await;

    let page = scrape(sluice.admin_addr);
    let v = |s: &str| value(&page, s);
    let rule =
        |name: &str, labels: &str| format!("{name}{{domain=\"obs\",rule=\"client\"{labels}}}");
    assert_eq!(
        v(&rule("sluice_decisions_total", ",outcome=\"admitted\"")),
        7.0 + 2.0 + 1.0
    );
    assert_eq!(
        v(&rule("sluice_decisions_total", ",outcome=\"rejected\"")),
        3.0
    );
    assert_eq!(v(&rule("sluice_near_limit_total", "")), 4.0);
    assert_eq!(
        v(r#"sluice_decisions_total{domain="obs",rule="user_alice",outcome="admitted"}"#),
        3.0
    );
    assert_eq!(v(r#"sluice_requests_total{domain="obs",code="ok"}"#), 13.0);
    assert_eq!(
        v(r#"sluice_requests_total{domain="obs",code="over_limit"}"#),
        3.0
    );
    assert_eq!(
        v(r#"sluice_decisions_total{domain="_unknown",rule="",outcome="no_rule"}"#),
        1.0
    );
    assert!(
        !page.contains("made-up"),
        "client-chosen domain became a label"
    );
    assert_eq!(v(r#"sluice_hits_total{domain="obs"}"#), 16.0);
    assert_eq!(v("sluice_request_duration_seconds_count"), 17.0);

    // Window cardinality: c1 holds 7 entries, c2 2, c3 1.
    assert_eq!(v(&rule("sluice_window_entries_max", "")), 7.0);
    assert_eq!(v(&rule("sluice_window_entries", "")), 10.0);
    assert_eq!(v(&rule("sluice_window_keys", "")), 3.0);
    assert_eq!(v(r#"sluice_window_entries{domain="obs",rule="user"}"#), 3.0);
    let hot: Vec<_> = samples(&page)
        .into_iter()
        .filter(|s| s.name() == "sluice_hot_key_entries")
        .collect();
    assert_eq!(hot.len(), 2, "--hot-keys 2: {hot:?}");
    assert!(
        hot[0]
            .series
            .starts_with(r#"sluice_hot_key_entries{domain="obs",rule="client",key="client=c1#"#)
            && hot[0].value == 7.0,
        "{hot:?}"
    );
    assert!(
        hot[1].series.contains(r#"key="user=alice#"#) && hot[1].value == 3.0,
        "{hot:?}"
    );

    // Backend calls: one per limited request (the unknown domain never reaches the backend).
    let name = format!("{backend:?}").to_lowercase();
    assert_eq!(
        v(&format!(
            "sluice_backend_call_duration_seconds_count{{backend=\"{name}\"}}"
        )),
        16.0
    );
    assert!(
        !page.contains("sluice_backend_errors_total"),
        "no errors yet"
    );
    assert_eq!(v("sluice_backend_up"), 1.0);
    assert_eq!(v(r#"sluice_config_loads_total{result="success"}"#), 1.0);
    assert_eq!(v("sluice_config_rules"), 3.0);
    assert!(v("sluice_config_last_success_timestamp_seconds") > 1.7e9);
    // Every family on the page is documented.
    let docs =
        std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs/metrics.md"))
            .expect("docs/metrics.md");
    for sample in samples(&page) {
        let family = sample.family();
        assert!(
            docs.contains(&format!("`{family}`")),
            "{family} missing from docs/metrics.md"
        );
    }
    match backend {
        Backend::Redis => {
            // Four live keys: c1 (7), c2 (2), c3 (1), alice (3), all listpacks: the tracker's
            // counts reach the gauge (redis_backend holds the figures to Redis's own).
            assert_eq!(
                v("sluice_redis_memory_estimate_bytes"),
                (4 * 160 + 13 * 16) as f64
            );
            assert_eq!(v("sluice_backend_script_loads_total"), 1.0, "loaded once");
            assert_eq!(v("sluice_backend_pool_size"), 3.0);
            assert_eq!(v("sluice_backend_in_flight"), 0.0);
            assert_eq!(v("sluice_backend_waiting"), 0.0);
            // Every backend call the local rejection cache did not answer is one decision
            // carried by some script call.
            let sent = 16.0 - v("sluice_local_cache_decisions_total");
            assert_eq!(v("sluice_backend_script_decisions_total"), sent);
            let calls = v("sluice_backend_script_calls_total");
            assert!(calls >= 1.0 && calls <= sent, "{calls} calls for {sent}");
            let connected = v("sluice_backend_pool_connected");
            assert!((1.0..=3.0).contains(&connected), "{connected}");
        }
        Backend::Memory => {
            assert!(!page.contains("sluice_redis_memory_estimate_bytes"));
            assert!(!page.contains("sluice_backend_pool_size"));
        }
    }
}

/// `POST /json` decides through the same engine as gRPC and is recorded on the same families
/// with the same labels; bad input on either face counts as `invalid_argument`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_decisions_are_recorded_like_grpc() {
    let sluice = Sluice::start(&limits(), None);
    let admin = sluice.admin_addr;
    // client=j1, limit 7 per minute: 9 calls over /json -> 7 answered 200, 2 answered 429.
    let body = r#"{"domain":"obs","descriptors":[{"entries":[{"key":"client","value":"j1"}]}]}"#;
    let statuses: Vec<u16> = (0..9)
        .map(|_| http_request(admin, "POST", "/json", body).0)
        .collect();
    assert_eq!(
        statuses.iter().filter(|&&s| s == 200).count(),
        7,
        "{statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|&&s| s == 429).count(),
        2,
        "{statuses:?}"
    );
    // The same key over gRPC: the same window, already full.
    let j1 = || request("obs", vec![descriptor(&[("client", "j1")])]);
    assert_eq!(decide(&sluice, j1()).await, Code::OverLimit as i32);

    // Bad input: a body that is not JSON and an empty domain over /json, an unknown override
    // unit over gRPC.
    assert_eq!(http_request(admin, "POST", "/json", "{not json").0, 400);
    let empty = r#"{"domain":"","descriptors":[]}"#;
    assert_eq!(http_request(admin, "POST", "/json", empty).0, 400);
    let mut bad_unit = j1();
    bad_unit.descriptors[0].limit = Some(
        sluice::proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride {
            requests_per_unit: 1,
            unit: 0,
        },
    );
    let err = sluice
        .client()
        .await
        .should_rate_limit(bad_unit)
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");

    let page = scrape(sluice.admin_addr);
    let v = |s: &str| value(&page, s);
    assert_eq!(v(r#"sluice_requests_total{domain="obs",code="ok"}"#), 7.0);
    assert_eq!(
        v(r#"sluice_requests_total{domain="obs",code="over_limit"}"#),
        3.0
    );
    assert_eq!(
        v(r#"sluice_decisions_total{domain="obs",rule="client",outcome="admitted"}"#),
        7.0
    );
    assert_eq!(
        v(r#"sluice_decisions_total{domain="obs",rule="client",outcome="rejected"}"#),
        3.0
    );
    // Default near-limit ratio 0.8: more than floor(5.6) = 5 entries after admission.
    assert_eq!(
        v(r#"sluice_near_limit_total{domain="obs",rule="client"}"#),
        2.0
    );
    assert_eq!(v(r#"sluice_hits_total{domain="obs"}"#), 10.0);
    assert_eq!(
        v(r#"sluice_window_entries{domain="obs",rule="client"}"#),
        7.0
    );
    assert_eq!(v(r#"sluice_window_keys{domain="obs",rule="client"}"#), 1.0);
    assert_eq!(
        v(r#"sluice_request_errors_total{kind="invalid_argument"}"#),
        3.0
    );
    assert_eq!(v("sluice_request_duration_seconds_count"), 13.0);
    assert_eq!(
        v(r#"sluice_backend_call_duration_seconds_count{backend="memory"}"#),
        10.0
    );
}

async fn serving_status(sluice: &Sluice) -> i32 {
    HealthClient::new(sluice.channel().await)
        .check(HealthCheckRequest {
            service: "envoy.service.ratelimit.v3.RateLimitService".into(),
        })
        .await
        .expect("health check")
        .into_inner()
        .status
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_redis_shows_everywhere_then_recovers() {
    let mut redis = RedisServer::start();
    // One connection, so the frozen-Redis step below meets an established one (a timeout), not
    // a fresh connection attempt.
    let sluice = Sluice::start_with(&limits(), Some(&redis.url()), &["--redis-pool-size", "1"]);
    let admin = sluice.admin_addr;
    let c1 = || request("obs", vec![descriptor(&[("client", "c1")])]);
    assert_eq!(decide(&sluice, c1()).await, Code::Ok as i32);
    assert_eq!(serving_status(&sluice).await, ServingStatus::Serving as i32);

    redis.stop();
    wait_until(
        "/readyz 503 with Redis down",
        Duration::from_secs(5),
        || async { http_get(admin, "/readyz").0 == 503 },
    )
    .await;
    assert_eq!(
        serving_status(&sluice).await,
        ServingStatus::NotServing as i32
    );
    let err = sluice
        .client()
        .await
        .should_rate_limit(c1())
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
    let page = scrape(sluice.admin_addr);
    assert_eq!(value(&page, "sluice_backend_up"), 0.0);
    assert_eq!(
        value(
            &page,
            r#"sluice_backend_errors_total{backend="redis",kind="unavailable"}"#
        ),
        1.0
    );
    assert_eq!(
        value(&page, r#"sluice_request_errors_total{kind="backend"}"#),
        1.0
    );
    assert!(
        sluice
            .log_text()
            .contains("backend unreachable: not serving"),
        "{}",
        sluice.log_text()
    );

    redis.start_again();
    wait_until(
        "/readyz 200 again after Redis came back",
        Duration::from_secs(5),
        || async { http_get(admin, "/readyz").0 == 200 },
    )
    .await;
    assert_eq!(serving_status(&sluice).await, ServingStatus::Serving as i32);
    // The restarted server is empty: one admitted entry, and the script was loaded again.
    assert_eq!(decide(&sluice, c1()).await, Code::Ok as i32);
    let page = scrape(sluice.admin_addr);
    assert_eq!(value(&page, "sluice_backend_up"), 1.0);
    assert_eq!(value(&page, "sluice_backend_script_loads_total"), 2.0);
    assert_eq!(
        value(
            &page,
            r#"sluice_decisions_total{domain="obs",rule="client",outcome="admitted"}"#
        ),
        2.0
    );
    // One line per state change, not one per probe.
    let log = sluice.log_text();
    assert_eq!(log.matches("backend unreachable").count(), 1, "{log}");
    assert_eq!(
        log.matches("backend reachable: serving").count(),
        2,
        "{log}"
    );

    // A frozen Redis answers nothing: the call times out and is counted as a timeout.
    redis.pause();
    let err = sluice
        .client()
        .await
        .should_rate_limit(c1())
        .await
        .unwrap_err();
    redis.resume();
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
    let page = scrape(sluice.admin_addr);
    assert_eq!(
        value(
            &page,
            r#"sluice_backend_errors_total{backend="redis",kind="timeout"}"#
        ),
        1.0
    );
}

/// 100,000 distinct users (a `detailed_metric` rule) and 100,000 distinct IPs: the series count
/// on /metrics stays under a fixed bound, whatever the number of values.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn series_stay_bounded_under_100k_distinct_values() {
    const VALUES: usize = 100_000;
    const PER_REQUEST: usize = 100;
    const TASKS: usize = 8;
    // 200 descriptors per request, over the default --max-descriptors (64): a bulk load, not
    // what Envoy sends.
    let sluice = Sluice::start_with(&limits(), None, &["--max-descriptors", "200"]);
    let channel = sluice.channel().await;
    let requests = VALUES / PER_REQUEST;
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let mut client =
            sluice::proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient::new(
                channel.clone(),
            );
        tasks.push(tokio::spawn(async move {
            for r in (t..requests).step_by(TASKS) {
                let descriptors = (0..PER_REQUEST)
                    .flat_map(|i| {
                        let n = (r * PER_REQUEST + i).to_string();
                        [
                            descriptor(&[("user", &format!("user-{n}"))]),
                            descriptor(&[("ip", &format!("10.{n}"))]),
                        ]
                    })
                    .collect();
                let resp = client
                    .should_rate_limit(request("obs", descriptors))
                    .await
                    .expect("call")
                    .into_inner();
                assert_eq!(resp.overall_code, Code::Ok as i32);
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }

    let page = scrape(sluice.admin_addr);
    let series = samples(&page).len();
    assert!(series < 250, "{series} series:\n{page}");
    // Every value was counted, in bounded series: 100 detailed ones, the rest in the overflow.
    let users: f64 = samples(&page)
        .iter()
        .filter(|s| {
            s.series
                .starts_with(r#"sluice_decisions_total{domain="obs",rule="user_"#)
        })
        .map(|s| s.value)
        .sum();
    assert_eq!(users, 100.0);
    assert_eq!(
        value(
            &page,
            r#"sluice_decisions_total{domain="obs",rule="user|_overflow",outcome="admitted"}"#
        ),
        (VALUES - 100) as f64
    );
    assert_eq!(
        value(
            &page,
            r#"sluice_decisions_total{domain="obs",rule="ip",outcome="admitted"}"#
        ),
        VALUES as f64
    );
    // The window tracker keeps 50,000 keys and counts the observations it had to drop.
    let tracked = value(&page, r#"sluice_window_keys{domain="obs",rule="user"}"#)
        + value(&page, r#"sluice_window_keys{domain="obs",rule="ip"}"#);
    assert_eq!(tracked, 50_000.0);
    assert_eq!(
        value(&page, "sluice_window_untracked_observations_total"),
        (2 * VALUES - 50_000) as f64
    );
    let hot = samples(&page)
        .iter()
        .filter(|s| s.name() == "sluice_hot_key_entries")
        .count();
    assert_eq!(hot, 10, "default --hot-keys");
}
