//! The Rate Limit Quota Service over real gRPC on loopback, from a tonic client (Envoy itself:
//! `rlqs_envoy`): a stream's reports answered with allotments reserved in the same windows as
//! the RLS path, on the memory backend and on Redis shared by two sluice instances; a bad
//! report refused whole with INVALID_ARGUMENT naming the field and reserving nothing; a reload
//! applied at the next report; health, reflection and the metrics; and every open stream ended
//! when the server stops, so shutdown never waits for Envoy.

use crate::helpers;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use helpers::{
    QuotaStream, RedisServer, TestServer, descriptor, quota_actions, quota_line, request,
    test_settings,
};
use sluice::proto::envoy::service::ratelimit::v3::rate_limit_response::Code;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

const SERVICE: &str = "envoy.service.rate_limit_quota.v3.RateLimitQuotaService";

/// Domain `quota`: 20 per minute per client (so 2 tokens per assignment at most:
/// ceil(20 × 6 / 67)), unlimited bots, nothing else.
fn limits(dir: &Path) -> PathBuf {
    let path = dir.join("quota.yaml");
    std::fs::write(
        &path,
        "domain: quota\ndescriptors:\n  - key: client\n    rate_limit: {unit: minute, requests_per_unit: 20}\n  - key: bot\n    rate_limit: {unlimited: true}\n",
    )
    .unwrap();
    path
}

/// RLS calls for client `client` until one is refused: how many were admitted.
async fn rls_admitted(server: &TestServer, client: &str) -> usize {
    let mut rls = server.client().await;
    for admitted in 0..100 {
        let answer = rls
            .should_rate_limit(request("quota", vec![descriptor(&[("client", client)])]))
            .await
            .expect("an RLS answer")
            .into_inner();
        if answer.overall_code() == Code::OverLimit {
            return admitted;
        }
    }
    panic!("never refused");
}

/// A stream's first report reserves an allotment (2 tokens: ceil(20 × 6 / 67)); RLS calls for
/// the same client then get the 18 left, and the next report gets DENY_ALL: the window is full
/// (and the pace, which refills 20 per 69 s, has nothing yet).
async fn allotments_and_rls_share_the_limit(server: &TestServer) {
    let mut stream = QuotaStream::open(server.channel().await).await;
    let a = [("client", "a")];
    let first = stream.report("quota", vec![quota_line(&a, 0, 1, 0)]).await;
    assert_eq!(
        quota_actions(&first.unwrap()),
        ["client=a deny", "client=a tokens:2"]
    );
    assert_eq!(rls_admitted(server, "a").await, 18);
    let answer = stream
        .report("quota", vec![quota_line(&a, 2, 40, 5)])
        .await
        .unwrap();
    assert_eq!(quota_actions(&answer), ["client=a deny"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allotments_share_the_window_with_the_rls_path_in_memory() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(test_settings(&limits(dir.path()), None));
    allotments_and_rls_share_the_limit(&server).await;
}

/// Two sluice instances on one Redis: the first's allotment counts in the window the second
/// answers RLS calls from, and the pace is shared too (the second's first report finds it
/// spent).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_on_one_redis_share_allotments_and_rls_calls() {
    let dir = tempfile::tempdir().unwrap();
    let redis = RedisServer::start();
    let path = limits(dir.path());
    let one = TestServer::start(test_settings(&path, Some(&redis.url())));
    let two = TestServer::start(test_settings(&path, Some(&redis.url())));
    let b = [("client", "b")];
    let mut first = QuotaStream::open(one.channel().await).await;
    let answer = first.report("quota", vec![quota_line(&b, 0, 1, 0)]).await;
    assert_eq!(
        quota_actions(&answer.unwrap()),
        ["client=b deny", "client=b tokens:2"]
    );
    let mut second = QuotaStream::open(two.channel().await).await;
    let answer = second.report("quota", vec![quota_line(&b, 0, 1, 0)]).await;
    assert_eq!(quota_actions(&answer.unwrap()), ["client=b deny"]);
    assert_eq!(rls_admitted(&two, "b").await, 18);
    let _ = one.stop().await;
    let _ = two.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_report_ends_the_stream_naming_the_field_and_reserves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(test_settings(&limits(dir.path()), None));
    let mut stream = QuotaStream::open(server.channel().await).await;
    let status = stream
        .report(
            "quota",
            vec![
                quota_line(&[("client", "c")], 0, 1, 0),
                quota_line(&[], 0, 1, 0),
            ],
        )
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert_eq!(
        status.message(),
        "bucket_quota_usages[1].bucket_id.bucket: must hold at least one entry"
    );
    assert!(stream.next().await.is_none(), "the stream ended");
    assert_eq!(rls_admitted(&server, "c").await, 20);
    // A stream's second report may not change its domain.
    let mut stream = QuotaStream::open(server.channel().await).await;
    let bot = [("bot", "x")];
    let answer = stream
        .report("quota", vec![quota_line(&bot, 0, 1, 0)])
        .await;
    assert_eq!(quota_actions(&answer.unwrap()), ["bot=x allow"]);
    let status = stream
        .report("other", vec![quota_line(&bot, 0, 1, 0)])
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status.message().starts_with("domain: differs"),
        "{status:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_applies_at_the_next_report() {
    let dir = tempfile::tempdir().unwrap();
    let path = limits(dir.path());
    let mut settings = test_settings(&path, None);
    settings.watch_interval = Some(Duration::from_millis(50));
    let server = TestServer::start(settings);
    let mut stream = QuotaStream::open(server.channel().await).await;
    let d = [("client", "d")];
    let answer = stream.report("quota", vec![quota_line(&d, 0, 1, 0)]).await;
    assert_eq!(
        quota_actions(&answer.unwrap()),
        ["client=d deny", "client=d tokens:2"]
    );
    std::fs::write(
        &path,
        "domain: quota\ndescriptors:\n  - key: client\n    rate_limit: {unlimited: true}\n",
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let answer = stream
            .report("quota", vec![quota_line(&d, 1, 0, 5)])
            .await
            .unwrap();
        if quota_actions(&answer) == ["client=d allow"] {
            break;
        }
        assert!(Instant::now() < deadline, "the reload never applied");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_metrics_and_shutdown() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(test_settings(&limits(dir.path()), None));
    let health = HealthClient::new(server.channel().await)
        .check(HealthCheckRequest {
            service: SERVICE.into(),
        })
        .await
        .expect("health of the quota service")
        .into_inner();
    assert_eq!(health.status(), ServingStatus::Serving);

    let mut stream = QuotaStream::open(server.channel().await).await;
    let e = [("client", "e")];
    stream
        .report("quota", vec![quota_line(&e, 0, 1, 0)])
        .await
        .unwrap();
    stream
        .report("quota", vec![quota_line(&[("x", "y")], 3, 4, 0)])
        .await
        .unwrap();
    let (_, metrics) = helpers::http_get(server.admin_addr, "/metrics");
    for line in [
        "sluice_rlqs_streams 1",
        "sluice_rlqs_reports_total{domain=\"quota\"} 2",
        "sluice_rlqs_assignments_total{domain=\"quota\",answer=\"granted\"} 1",
        "sluice_rlqs_assignments_total{domain=\"quota\",answer=\"no_rule\"} 1",
        "sluice_rlqs_tokens_total{domain=\"quota\"} 2",
        "sluice_rlqs_envoy_requests_total{domain=\"quota\",verdict=\"allowed\"} 3",
        "sluice_rlqs_envoy_requests_total{domain=\"quota\",verdict=\"denied\"} 5",
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "{line} not in:\n{metrics}"
        );
    }

    // Stopping the server ends the open stream, and does not wait for it.
    let started = Instant::now();
    server.stop().await.expect("stopped");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "shutdown took {:?}",
        started.elapsed()
    );
    match stream.next().await {
        None | Some(Err(_)) => {}
        Some(Ok(answer)) => panic!("an answer after shutdown: {answer:?}"),
    }
}
