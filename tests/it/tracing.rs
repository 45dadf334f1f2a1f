//! OpenTelemetry tracing end to end: sluice (in process, and the binary) exports to a real OTLP
//! receiver on loopback (`helpers::otlp`: the collector's TraceService over gRPC, or
//! `POST /v1/traces`). Each test checks what a collector would store: the decision span under
//! the caller's `traceparent`, the backend span under it, their attributes (domain, rules,
//! outcomes; no descriptor value anywhere in the export), sampling (parent-based, rate 0
//! exports nothing of its own), and that an exporter that fails never touches a decision.
//!
//! Exports are every 100 ms here (`export_interval`) or, where a test must know that nothing
//! more will come, flushed by stopping the server, which exports what is queued before `run`
//! returns.

use crate::helpers;

use std::time::{Duration, Instant};

use helpers::otlp::{OtlpReceiver, Received, int_attr, str_attr, strings_attr, traceparent};
use helpers::{RedisServer, Req, Sluice, TestServer, descriptor, request, test_settings};
use sluice::otel::{BACKEND_SPAN, Protocol, TracingSettings};
use sluice::proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use sluice::proto::envoy::service::ratelimit::v3::RateLimitRequest;
use sluice::proto::envoy::service::ratelimit::v3::rate_limit_response::Code;
use sluice::proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tonic::transport::Channel;

const LIMITS: &str = r#"
domain: traced
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: path
    value: "/api/*"
    rate_limit: {unit: minute, requests_per_unit: 100}
"#;

/// Descriptor values that must never leave sluice in a span.
const USER: &str = "alice-5f1e";
const PATH: &str = "/api/orders-93c2";
const DECISION_SPAN: &str = "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
const SERVER: i32 = 2;
const INTERNAL: i32 = 1;
const CLIENT: i32 = 3;

fn limits_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("traced.yaml"), LIMITS).unwrap();
    dir
}

fn tracing_to(receiver: &OtlpReceiver, protocol: Protocol) -> TracingSettings {
    TracingSettings {
        protocol,
        endpoint: Some(receiver.url()),
        export_interval: Some(Duration::from_millis(100)),
        ..TracingSettings::default()
    }
}

fn user_and_path() -> RateLimitRequest {
    request(
        "traced",
        vec![descriptor(&[("user", USER)]), descriptor(&[("path", PATH)])],
    )
}

/// One call, with `traceparent` in its metadata when given; the overall code or the error code.
async fn call(
    client: &mut RateLimitServiceClient<Channel>,
    parent: Option<&str>,
    req: RateLimitRequest,
) -> Result<i32, tonic::Code> {
    let mut req = tonic::Request::new(req);
    if let Some(parent) = parent {
        req.metadata_mut()
            .insert("traceparent", parent.parse().unwrap());
    }
    client
        .should_rate_limit(req)
        .await
        .map(|r| r.into_inner().overall_code)
        .map_err(|s| s.code())
}

fn named<'a>(spans: &'a [Received], name: &str) -> Vec<&'a Received> {
    spans.iter().filter(|r| r.span.name == name).collect()
}

/// The backend span whose parent is `decision`.
fn child_of<'a>(spans: &'a [Received], decision: &Received) -> &'a Received {
    let children: Vec<_> = spans
        .iter()
        .filter(|r| r.span.parent_span_id == decision.span.span_id)
        .collect();
    assert_eq!(children.len(), 1, "one child of {decision:#?}");
    assert_eq!(children[0].span.name, BACKEND_SPAN);
    assert_eq!(children[0].span.trace_id, decision.span.trace_id);
    children[0]
}

async fn decisions_are_traced_under_the_callers_parent(redis: Option<&RedisServer>) {
    let receiver = OtlpReceiver::grpc().await;
    let dir = limits_dir();
    let url = redis.map(RedisServer::url);
    let mut settings = test_settings(dir.path(), url.as_deref());
    settings.tracing = Some(TracingSettings {
        service_name: "sluice-under-test".into(),
        service_namespace: Some("tests".into()),
        service_instance_id: Some("pod-7".into()),
        ..tracing_to(&receiver, Protocol::Grpc)
    });
    let sluice = TestServer::start(settings);
    let mut client = sluice.client().await;

    let trace = [
        0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47,
        0x36,
    ];
    let parent = [0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7];
    let sampled = traceparent(&trace, &parent, true);
    let ok = Code::Ok as i32;
    let over = Code::OverLimit as i32;
    assert_eq!(
        call(&mut client, Some(&sampled), user_and_path()).await,
        Ok(ok)
    );
    assert_eq!(
        call(&mut client, Some(&sampled), user_and_path()).await,
        Ok(over)
    );
    // No parent: a trace of its own (rate 1).
    let root = request("traced", vec![descriptor(&[("path", PATH)])]);
    assert_eq!(call(&mut client, None, root).await, Ok(ok));
    // A domain the config does not know, and a request that cannot be mapped.
    let elsewhere = request("elsewhere-d41d", vec![descriptor(&[("user", USER)])]);
    assert_eq!(call(&mut client, Some(&sampled), elsewhere).await, Ok(ok));
    let mut bad_unit = descriptor(&[("user", USER)]);
    bad_unit.limit = Some(RateLimitOverride {
        requests_per_unit: 1,
        unit: 0,
    });
    let invalid = request("traced", vec![bad_unit]);
    assert_eq!(
        call(&mut client, Some(&sampled), invalid).await,
        Err(tonic::Code::InvalidArgument)
    );

    // Five decisions, three of which reached the backend; exported while serving.
    let spans = receiver
        .wait_for(Duration::from_secs(10), |s| {
            named(s, DECISION_SPAN).len() == 5 && named(s, BACKEND_SPAN).len() == 3
        })
        .await;
    let decisions = named(&spans, DECISION_SPAN);
    let (first, second, root, unknown, refused) = (
        decisions[0],
        decisions[1],
        decisions[2],
        decisions[3],
        decisions[4],
    );
    for d in [first, second, unknown, refused] {
        assert_eq!(d.span.trace_id, trace, "{d:#?}");
        assert_eq!(d.span.parent_span_id, parent, "{d:#?}");
    }
    assert_ne!(root.span.trace_id, trace);
    assert!(root.span.parent_span_id.is_empty(), "{root:#?}");
    for d in &decisions {
        assert_eq!(d.span.kind, SERVER);
        assert_eq!(str_attr(&d.span.attributes, "rpc.system"), "grpc");
        assert_eq!(
            str_attr(&d.span.attributes, "rpc.method"),
            "ShouldRateLimit"
        );
        assert_eq!(str_attr(&d.resource, "service.name"), "sluice-under-test");
        assert_eq!(str_attr(&d.resource, "service.namespace"), "tests");
        assert_eq!(str_attr(&d.resource, "service.instance.id"), "pod-7");
    }

    let a = &first.span.attributes;
    assert_eq!(str_attr(a, "sluice.domain"), "traced");
    assert_eq!(strings_attr(a, "sluice.rules"), ["user", "path_/api/*"]);
    assert_eq!(strings_attr(a, "sluice.outcomes"), ["admitted", "admitted"]);
    assert_eq!(str_attr(a, "sluice.code"), "ok");
    assert_eq!(int_attr(a, "sluice.hits"), 2);
    assert_eq!(int_attr(a, "rpc.grpc.status_code"), 0);
    let a = &second.span.attributes;
    assert_eq!(str_attr(a, "sluice.code"), "over_limit");
    assert_eq!(strings_attr(a, "sluice.outcomes")[0], "rejected");
    assert_eq!(
        strings_attr(&root.span.attributes, "sluice.rules"),
        ["path_/api/*"]
    );
    let a = &unknown.span.attributes;
    assert_eq!(str_attr(a, "sluice.domain"), "_unknown");
    assert_eq!(strings_attr(a, "sluice.outcomes"), ["no_rule"]);
    let a = &refused.span.attributes;
    assert_eq!(int_attr(a, "rpc.grpc.status_code"), 3);
    let status = refused.span.status.as_ref().expect("error status");
    assert_eq!(status.code, 2, "STATUS_CODE_ERROR");
    assert!(
        status.message.contains("descriptors[0].limit.unit"),
        "{status:?}"
    );

    let (backend, kind) = match redis {
        Some(_) => ("redis", CLIENT),
        None => ("memory", INTERNAL),
    };
    // On Redis the rejection cache knows after the first call that the user's window is full,
    // and answers the second without a backend call.
    let rejected_by = if redis.is_some() {
        "local_cache"
    } else {
        "backend"
    };
    for (decision, admitted, answered_by) in [
        (first, true, "backend"),
        (second, false, rejected_by),
        (root, true, "backend"),
    ] {
        let child = child_of(&spans, decision);
        let a = &child.span.attributes;
        assert_eq!(child.span.kind, kind);
        assert_eq!(str_attr(a, "sluice.backend"), backend);
        assert_eq!(str_attr(a, "sluice.answered_by"), answered_by);
        assert_eq!(
            helpers::otlp::attr(a, "sluice.admitted"),
            Some(&opentelemetry_proto::tonic::common::v1::any_value::Value::BoolValue(admitted))
        );
        if redis.is_some() {
            assert_eq!(str_attr(a, "db.system.name"), "redis");
        }
    }
    assert_eq!(
        int_attr(
            &child_of(&spans, first).span.attributes,
            "sluice.batch.items"
        ),
        2
    );

    // Nothing the caller sent as a value, nor the unknown domain, is anywhere in the export.
    let raw = receiver.raw();
    for secret in [USER, PATH, "orders-93c2", "elsewhere-d41d"] {
        assert!(
            !raw.windows(secret.len()).any(|w| w == secret.as_bytes()),
            "{secret} was exported"
        );
    }
    sluice.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decisions_are_traced_under_the_callers_parent_memory() {
    decisions_are_traced_under_the_callers_parent(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decisions_are_traced_under_the_callers_parent_redis() {
    let redis = RedisServer::start();
    decisions_are_traced_under_the_callers_parent(Some(&redis)).await;
}

/// Rate 0: nothing of sluice's own is sampled, and a caller's unsampled trace stays
/// unsampled; a caller's sampled trace is followed (parent-based, as envoyproxy/ratelimit
/// samples). Stopping flushes, so what the receiver holds afterwards is everything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sampling_follows_the_parent_and_the_rate() {
    let receiver = OtlpReceiver::grpc().await;
    let dir = limits_dir();
    let mut settings = test_settings(dir.path(), None);
    settings.tracing = Some(TracingSettings {
        sampling_rate: 0.0,
        export_interval: None,
        ..tracing_to(&receiver, Protocol::Grpc)
    });
    let sluice = TestServer::start(settings);
    let mut client = sluice.client().await;
    let path = || request("traced", vec![descriptor(&[("path", PATH)])]);
    let unsampled = traceparent(&[1; 16], &[2; 8], false);
    let sampled = traceparent(&[3; 16], &[4; 8], true);
    for _ in 0..20 {
        assert_eq!(call(&mut client, None, path()).await, Ok(Code::Ok as i32));
        assert_eq!(
            call(&mut client, Some(&unsampled), path()).await,
            Ok(Code::Ok as i32)
        );
    }
    assert_eq!(
        call(&mut client, Some(&sampled), path()).await,
        Ok(Code::Ok as i32)
    );
    sluice.stop().await.expect("clean stop");

    let spans = receiver.spans();
    assert_eq!(
        spans.len(),
        2,
        "the sampled call's two spans only: {spans:#?}"
    );
    assert!(
        spans.iter().all(|r| r.span.trace_id == [3; 16]),
        "{spans:#?}"
    );
}

/// envoyproxy/ratelimit's HTTP face, exported over OTLP/HTTP (envoyproxy/ratelimit's and Envoy
/// Gateway's default protocol).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_json_face_is_traced_over_otlp_http() {
    let receiver = OtlpReceiver::http().await;
    let dir = limits_dir();
    let mut settings = test_settings(dir.path(), None);
    settings.tracing = Some(tracing_to(&receiver, Protocol::Http));
    let sluice = TestServer::start(settings);
    let parent = traceparent(&[7; 16], &[8; 8], true);
    let body = format!(
        r#"{{"domain":"traced","descriptors":[{{"entries":[{{"key":"user","value":"{USER}"}}]}}]}}"#
    );
    let response = Req::new("POST", "/json")
        .header("traceparent", &parent)
        .body(&body)
        .send(sluice.admin_addr)
        .await;
    assert_eq!(response.status, 200, "{response:?}");
    let spans = receiver
        .wait_for(Duration::from_secs(10), |s| s.len() == 2)
        .await;
    let decision = named(&spans, "POST /json")[0];
    assert_eq!(decision.span.trace_id, [7; 16]);
    assert_eq!(decision.span.parent_span_id, [8; 8]);
    assert_eq!(str_attr(&decision.span.attributes, "http.route"), "/json");
    assert_eq!(
        str_attr(&decision.span.attributes, "sluice.domain"),
        "traced"
    );
    assert_eq!(
        strings_attr(&decision.span.attributes, "sluice.rules"),
        ["user"]
    );
    child_of(&spans, decision);
    assert_eq!(str_attr(&decision.resource, "service.name"), "sluice");
    assert!(
        !receiver
            .raw()
            .windows(USER.len())
            .any(|w| w == USER.as_bytes())
    );
    sluice.stop().await.expect("clean stop");
}

/// A collector that accepts connections and never answers: exports hang until their timeout,
/// spans pile up in the bounded queue, and decisions go on as if tracing were off. Tolerance:
/// each call within 2 s on a loaded test machine, where an export on the request path would
/// take the exporter's 10 s timeout.
async fn a_hanging_collector_never_touches_a_decision(protocol: Protocol) {
    let black_hole = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dir = limits_dir();
    let mut settings = test_settings(dir.path(), None);
    settings.tracing = Some(TracingSettings {
        protocol,
        endpoint: Some(format!("http://{}", black_hole.local_addr().unwrap())),
        export_interval: Some(Duration::from_millis(50)),
        ..TracingSettings::default()
    });
    let sluice = TestServer::start(settings);
    let mut client = sluice.client().await;
    let parent = traceparent(&[9; 16], &[9; 8], true);
    let mut slowest = Duration::ZERO;
    for i in 0..300 {
        let started = Instant::now();
        let req = request(
            "traced",
            vec![descriptor(&[("path", &format!("/api/{i}"))])],
        );
        assert_eq!(
            call(&mut client, Some(&parent), req).await,
            Ok(Code::Ok as i32)
        );
        slowest = slowest.max(started.elapsed());
        if i % 50 == 0 {
            tokio::time::sleep(Duration::from_millis(60)).await;
        }
    }
    assert!(slowest < Duration::from_secs(2), "slowest call {slowest:?}");
    // Stopping waits for the stuck export at most the flush bound, then stops anyway.
    sluice.stop().await.expect("stops despite the collector");
    drop(black_hole);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_grpc_collector_never_touches_a_decision() {
    a_hanging_collector_never_touches_a_decision(Protocol::Grpc).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_http_collector_never_touches_a_decision() {
    a_hanging_collector_never_touches_a_decision(Protocol::Http).await;
}

/// The binary with Envoy Gateway's environment for its rate-limit Deployment (no flag): it
/// exports over OTLP/HTTP to `OTEL_EXPORTER_OTLP_ENDPOINT`, names itself as told, and flushes
/// on SIGTERM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_gateways_environment_exports_from_the_binary() {
    let receiver = OtlpReceiver::http().await;
    let dir = limits_dir();
    let endpoint = receiver.url();
    let mut sluice = Sluice::start_with_env(
        dir.path(),
        None,
        &[],
        &[
            ("TRACING_ENABLED", "true"),
            ("TRACING_SERVICE_NAME", "envoy-ratelimit"),
            ("TRACING_SERVICE_NAMESPACE", "envoy-gateway-system"),
            ("TRACING_SERVICE_INSTANCE_ID", "envoy-ratelimit-7d4f9-x2x7q"),
            ("TRACING_SAMPLING_RATE", "1.0"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
        ],
    );
    let mut client = sluice.client().await;
    let parent = traceparent(&[5; 16], &[6; 8], true);
    assert_eq!(
        call(&mut client, Some(&parent), user_and_path()).await,
        Ok(Code::Ok as i32)
    );
    let status = tokio::task::spawn_blocking(move || {
        let status = sluice.terminate();
        (status, sluice.log_text())
    })
    .await
    .unwrap();
    let (status, log) = status;
    assert!(status.success(), "{log}");
    assert!(log.contains("tracing: exporting spans over OTLP"), "{log}");
    assert!(
        log.contains("SLUICE_TRACING set from an envoyproxy/ratelimit variable"),
        "{log}"
    );

    let spans = receiver.spans();
    let decision = named(&spans, DECISION_SPAN)[0];
    assert_eq!(decision.span.parent_span_id, [6; 8]);
    assert_eq!(
        str_attr(&decision.resource, "service.name"),
        "envoy-ratelimit"
    );
    assert_eq!(
        str_attr(&decision.resource, "service.namespace"),
        "envoy-gateway-system"
    );
    assert_eq!(
        str_attr(&decision.resource, "service.instance.id"),
        "envoy-ratelimit-7d4f9-x2x7q"
    );
    child_of(&spans, decision);
}

/// A collector URL sluice cannot use stops the start, naming the flag.
#[test]
fn a_bad_collector_url_stops_the_start() {
    let dir = limits_dir();
    for (url, why) in [
        (
            "https://collector:4318",
            "TLS to the collector is not supported",
        ),
        ("collector:4318", "must be an http://host:port URL"),
    ] {
        let config = dir.path().to_str().unwrap();
        let out = helpers::process::run_sluice(
            [
                "serve",
                "--config",
                config,
                "--grpc-addr",
                "127.0.0.1:0",
                "--admin-addr",
                "127.0.0.1:0",
                "--tracing",
                "--otlp-endpoint",
                url,
            ],
            &[],
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{stderr}");
        assert!(
            stderr.contains(&format!("--otlp-endpoint {url:?}")),
            "{stderr}"
        );
        assert!(stderr.contains(why), "{stderr}");
    }
}
