//! Envoy features whose semantics sluice must honour, end to end through a real Envoy: a
//! per-descriptor `hits_addend` (`RateLimitPerRoute`), `apply_on_stream_done` with the cost taken
//! from the response, a limit override from dynamic metadata, Envoy's `X-RateLimit-*` headers
//! next to sluice's own, `rate_limited_as_resource_exhausted` for a gRPC upstream, the network
//! filter on a `tcp_proxy`, and the window edge. Each test runs its own sluice (memory backend,
//! `tests/fixtures/envoy/features.yaml`) and Envoy.
//!
//! The filters' timeout is [`TIMEOUT_MS`] (1 s): these cases test semantics, and on a 2-core
//! machine shared with other test processes a scheduler stall past the production 20 ms would
//! turn an answer into Envoy's failure mode (`tests/it/envoy_faults.rs` tests the 20 ms budget).

use crate::helpers;

use std::net::SocketAddr;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use helpers::Upstream;
use helpers::envoy_config::{
    bootstrap, cluster, generic_key, grpc_cluster, http_listener, ratelimit_filter, route,
};
use helpers::{Envoy, HttpResponse, Req, TestServer, descriptor, fixture, request, test_settings};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

const TIMEOUT_MS: u64 = 1000;
const PER_ROUTE: &str =
    "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimitPerRoute";

/// sluice, an upstream and an Envoy with `listeners`, which may use the clusters `app` (the
/// upstream), `sluice` (the RLS) and `grpc_app` (sluice's own gRPC port as an application: its
/// health service is the gRPC upstream).
struct Stack {
    sluice: TestServer,
    _upstream: Upstream,
    envoy: Envoy,
}

fn stack(listeners: Vec<Value>) -> Stack {
    let sluice = TestServer::start(test_settings(&fixture("envoy/features.yaml"), None));
    let upstream = Upstream::start();
    let clusters = vec![
        cluster("app", &[upstream.addr]),
        grpc_cluster("sluice", &[sluice.grpc_addr]),
        grpc_cluster("grpc_app", &[sluice.grpc_addr]),
    ];
    let envoy = Envoy::start_json(&bootstrap(listeners, clusters));
    Stack {
        sluice,
        _upstream: upstream,
        envoy,
    }
}

/// The HTTP rate-limit filter of these tests (domain `features`, fail closed), with `extra`.
fn filter(extra: Value) -> Value {
    ratelimit_filter("features", "sluice", TIMEOUT_MS, true, extra)
}

/// `typed_per_filter_config` giving the route these `rate_limits` in `RateLimitPerRoute`, the
/// only place Envoy honours `hits_addend`.
fn per_route(rate_limits: Value) -> Value {
    json!({"typed_per_filter_config": {"envoy.filters.http.ratelimit": {
        "@type": PER_ROUTE, "rate_limits": rate_limits,
    }}})
}

/// `RateLimit: "NAME";r=R;t=T` -> R.
fn remaining(resp: &HttpResponse) -> u64 {
    let value = resp.header("ratelimit").expect("a RateLimit header");
    let r = value.split(";r=").nth(1).expect("r=");
    r.split(';').next().unwrap().parse().expect("r is a number")
}

/// Per-descriptor `hits_addend` from a request header: 4 tokens of 10 per minute, twice
/// admitted (6, then 2 left), the third 4 refused although a 1-hit request would fit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hits_addend_per_descriptor_from_a_request_header() {
    let rate_limits = json!([{
        "actions": [generic_key("tokens", "k")],
        "hits_addend": {"format": "%REQ(x-tokens)%"},
    }]);
    let routes = vec![route("/", "app", json!([]), per_route(rate_limits))];
    let s = stack(vec![http_listener("edge", routes, vec![filter(json!({}))])]);
    let edge = s.envoy.listener("edge");
    let send = || Req::get("/chat").header("x-tokens", "4").send(edge);
    let first = send().await;
    assert_eq!((first.status, remaining(&first)), (200, 6), "{first:?}");
    let second = send().await;
    assert_eq!((second.status, remaining(&second)), (200, 2), "{second:?}");
    let third = send().await;
    assert_eq!(third.status, 429, "4 tokens with 2 left: {third:?}");
    assert!(third.header("retry-after").is_some(), "{third:?}");
}

/// Remaining count of the `budget` descriptor straight from sluice, by a check that records
/// nothing (descriptor-level `hits_addend: 0`).
async fn budget_remaining(sluice: &TestServer) -> u32 {
    let mut d = descriptor(&[("budget", "k")]);
    d.hits_addend = Some(0);
    let resp = sluice
        .client()
        .await
        .should_rate_limit(request("features", vec![d]))
        .await
        .expect("check-only call")
        .into_inner();
    resp.statuses[0].limit_remaining
}

/// Waits (10 s at most: a bound for a loaded machine) until the stream-done charge has landed:
/// Envoy sends it after the response, without waiting for the answer.
async fn wait_for_budget(sluice: &TestServer, want: u32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = budget_remaining(sluice).await;
        if left == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the stream-done charge did not land: {left} left, expected {want}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The token-budget pattern: the request path only checks (`hits_addend: 0`); the cost (4,
/// from the response's `x-cost`) is charged when the stream is done (`apply_on_stream_done`).
/// A budget of 8 per minute: two requests admitted and charged, filling it exactly; the third
/// is refused on its check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_on_stream_done_charges_the_cost_from_the_response() {
    let rate_limits = json!([
        {"actions": [generic_key("budget", "k")], "hits_addend": {"number": 0}},
        {
            "actions": [generic_key("budget", "k")],
            "apply_on_stream_done": true,
            "hits_addend": {"format": "%RESP(x-cost)%"},
        },
    ]);
    let routes = vec![route("/", "app", json!([]), per_route(rate_limits))];
    let s = stack(vec![http_listener("edge", routes, vec![filter(json!({}))])]);
    let edge = s.envoy.listener("edge");
    // The upstream answers `x-cost: 4` (it echoes x-reply-* headers).
    let send = || {
        Req::get("/generate")
            .header("x-reply-x-cost", "4")
            .send(edge)
    };
    for (nth, left_after) in [(1, 4), (2, 0)] {
        let resp = send().await;
        assert_eq!(resp.status, 200, "request {nth}: {resp:?}");
        assert_eq!(resp.header("x-cost"), Some("4"));
        wait_for_budget(&s.sluice, left_after).await;
    }
    let third = send().await;
    assert_eq!(third.status, 429, "the budget is spent: {third:?}");
    assert_eq!(third.header("x-envoy-ratelimited"), Some("true"));
    assert_eq!(
        budget_remaining(&s.sluice).await,
        0,
        "a refused check charges nothing"
    );
}

/// A Lua filter puts `{requests_per_unit, unit}` from request headers into dynamic metadata;
/// the route's `limit.dynamic_metadata` sends it as the descriptor's limit override, which
/// wins over the config's 100 per minute. Envoy's override unit has no WEEK (nor has our
/// proto): an override in weeks is dropped by Envoy and the config's limit applies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limit_override_from_dynamic_metadata() {
    let lua = json!({
        "name": "envoy.filters.http.lua",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua",
            "default_source_code": {"inline_string": r#"
function envoy_on_request(handle)
  local n = handle:headers():get("x-limit")
  if n then
    handle:streamInfo():dynamicMetadata():set("sluice.test", "limit", {
      requests_per_unit = tonumber(n),
      unit = handle:headers():get("x-limit-unit"),
    })
  end
end
"#},
        },
    });
    let rate_limits = json!([{
        "actions": [{"request_headers": {"header_name": "x-client", "descriptor_key": "override"}}],
        "limit": {"dynamic_metadata": {"metadata_key": {
            "key": "sluice.test", "path": [{"key": "limit"}],
        }}},
    }]);
    let routes = vec![route("/", "app", rate_limits, json!({}))];
    let s = stack(vec![http_listener(
        "edge",
        routes,
        vec![lua, filter(json!({}))],
    )]);
    let edge = s.envoy.listener("edge");
    let policy = |r: &HttpResponse| r.header("ratelimit-policy").map(str::to_owned);

    let plain = Req::get("/").header("x-client", "a").send(edge).await;
    assert_eq!(plain.status, 200);
    assert_eq!(policy(&plain).as_deref(), Some("\"default\";q=100;w=60"));

    let overridden = |unit: &'static str| {
        Req::get("/")
            .header("x-client", unit)
            .header("x-limit", "2")
            .header("x-limit-unit", unit)
            .send(edge)
    };
    for nth in 1..=3 {
        let resp = overridden("HOUR").await;
        assert_eq!(
            policy(&resp).as_deref(),
            Some("\"default\";q=2;w=3600"),
            "{resp:?}"
        );
        assert_eq!(resp.status, if nth <= 2 { 200 } else { 429 }, "{resp:?}");
    }
    let weekly = overridden("WEEK").await;
    assert_eq!(weekly.status, 200);
    assert_eq!(
        policy(&weekly).as_deref(),
        Some("\"default\";q=100;w=60"),
        "Envoy has no WEEK override unit: the config's limit applies"
    );
}

/// Envoy's `X-RateLimit-*` (`enable_x_ratelimit_headers`) next to sluice's draft headers: every
/// rate-limit header reaches the client once, and the two sets agree (limit, remaining, reset;
/// on 429 `Retry-After`). Three limits per request (4 per minute, 100 per hour, 3 per week):
/// both describe the tightest (the weekly one: fewest left, then refusing), and the weekly
/// limit travels as Envoy's WEEK (`w=604800` in both).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_x_ratelimit_headers_agree_with_sluice_headers() {
    let rate_limits = json!([
        {"actions": [generic_key("burst", "k")]},
        {"actions": [generic_key("hourly", "k")]},
        {"actions": [generic_key("weekly", "k")]},
    ]);
    let routes = vec![route("/", "app", rate_limits, json!({}))];
    let x_headers = filter(json!({"enable_x_ratelimit_headers": "DRAFT_VERSION_03"}));
    let s = stack(vec![http_listener("edge", routes, vec![x_headers])]);
    let edge = s.envoy.listener("edge");
    let all = r#"4;w=60;name="burst", 100;w=3600;name="hourly", 3;w=604800;name="weekly""#;
    for nth in 1..=4u64 {
        let resp = Req::get("/").send(edge).await;
        let ctx = format!("request {nth}: {resp:?}");
        for name in resp.names() {
            assert_eq!(resp.all(name).len(), 1, "{name} duplicated: {ctx}");
        }
        let r = remaining(&resp);
        let t = resp
            .header("ratelimit")
            .unwrap()
            .rsplit(";t=")
            .next()
            .unwrap()
            .to_owned();
        assert_eq!(
            resp.header("ratelimit-policy"),
            Some("\"weekly\";q=3;w=604800"),
            "{ctx}"
        );
        assert_eq!(
            resp.header("x-ratelimit-remaining"),
            Some(r.to_string().as_str()),
            "{ctx}"
        );
        assert_eq!(resp.header("x-ratelimit-reset"), Some(t.as_str()), "{ctx}");
        let limit = resp.header("x-ratelimit-limit").expect("X-RateLimit-Limit");
        assert!(limit.starts_with("3, ") && limit.contains(all), "{ctx}");
        if nth <= 3 {
            assert_eq!(resp.status, 200, "{ctx}");
            assert_eq!(r, 3 - nth, "{ctx}");
            assert_eq!(resp.header("retry-after"), None, "{ctx}");
        } else {
            assert_eq!(resp.status, 429, "{ctx}");
            assert_eq!(resp.header("retry-after"), Some(t.as_str()), "{ctx}");
            assert_eq!(resp.header("x-envoy-ratelimited"), Some("true"), "{ctx}");
        }
    }
}

/// `rate_limited_as_resource_exhausted`: a gRPC client behind the filter sees
/// RESOURCE_EXHAUSTED over the limit (2 per minute), instead of the UNAVAILABLE Envoy maps a
/// 429 to by default (the second listener). The gRPC upstream is sluice's own health service.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_upstream_sees_resource_exhausted() {
    let grpc_route = |name: &str| {
        vec![route(
            "/",
            "grpc_app",
            json!([{"actions": [generic_key("grpc", name)]}]),
            json!({}),
        )]
    };
    let exhausted = filter(json!({"rate_limited_as_resource_exhausted": true}));
    let s = stack(vec![
        http_listener("exhausted", grpc_route("exhausted"), vec![exhausted]),
        http_listener("plain", grpc_route("plain"), vec![filter(json!({}))]),
    ]);
    for (listener, over) in [
        ("exhausted", tonic::Code::ResourceExhausted),
        ("plain", tonic::Code::Unavailable),
    ] {
        let mut client = HealthClient::new(helpers::grpc_channel(s.envoy.listener(listener)).await);
        for nth in 1..=3 {
            let result = client.check(HealthCheckRequest::default()).await;
            match result {
                Ok(_) if nth <= 2 => {}
                Err(status) if nth == 3 && status.code() == over => {}
                other => panic!("{listener}, call {nth}: {other:?}"),
            }
        }
    }
}

/// The network filter `envoy.filters.network.ratelimit` before a `tcp_proxy`: one descriptor
/// per connection, 3 per minute; the 4th connection is closed before any byte reaches the
/// upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn network_filter_refuses_connections_over_the_limit() {
    let tcp = json!({
        "name": "tcp",
        "address": helpers::envoy_config::any_port(),
        "filter_chains": [{"filters": [
            {
                "name": "envoy.filters.network.ratelimit",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.network.ratelimit.v3.RateLimit",
                    "stat_prefix": "tcp",
                    "domain": "features",
                    "descriptors": [{"entries": [{"key": "tcp", "value": "conn"}]}],
                    "timeout": "1s",
                    "failure_mode_deny": true,
                    "rate_limit_service": {
                        "transport_api_version": "V3",
                        "grpc_service": {"envoy_grpc": {"cluster_name": "sluice"}},
                    },
                },
            },
            {
                "name": "envoy.filters.network.tcp_proxy",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
                    "stat_prefix": "tcp",
                    "cluster": "app",
                },
            },
        ]}],
    });
    let s = stack(vec![tcp]);
    let addr = s.envoy.listener("tcp");
    for nth in 1..=4 {
        let raw = raw_exchange(addr).await;
        if nth <= 3 {
            assert!(
                raw.starts_with("HTTP/1.1 200 OK"),
                "connection {nth}: {raw:?}"
            );
        } else {
            assert_eq!(raw, "", "connection {nth} must be closed unanswered");
        }
    }
}

/// Writes one HTTP request on a new connection and reads until the peer closes (10 s at most).
async fn raw_exchange(addr: SocketAddr) -> String {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await?;
        // The peer may close before reading: a failed write is part of the answer.
        let _ = stream
            .write_all(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
            .await;
        let mut raw = Vec::new();
        match stream.read_to_end(&mut raw).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            Err(e) => return Err(e),
        }
        Ok::<_, std::io::Error>(String::from_utf8_lossy(&raw).into_owned())
    };
    tokio::time::timeout(Duration::from_secs(10), exchange)
        .await
        .expect("the exchange ends")
        .expect("connect and read")
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// The window edge through Envoy: 5 requests (the limit, 5 per second) in the last 200 ms of a
/// second, 5 more just after the whole second: a fixed window would admit the second batch, the
/// sliding log refuses it; a second after the first batch, a slot is free again. Each attempt
/// uses a client key of its own; an attempt whose first batch did not end before the boundary,
/// or whose second batch was answered a window after the first began (a stall of this shared
/// machine), proves nothing and is repeated, 3 times at most.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn window_edge_through_envoy() {
    let rate_limits = json!([{"actions": [
        {"request_headers": {"header_name": "x-client", "descriptor_key": "edge"}}
    ]}]);
    let routes = vec![route("/", "app", rate_limits, json!({}))];
    let s = stack(vec![http_listener("edge", routes, vec![filter(json!({}))])]);
    let edge = s.envoy.listener("edge");
    for attempt in 1..=3 {
        let client = format!("attempt-{attempt}");
        let send = || Req::get("/").header("x-client", &client).send(edge);
        while !(800..850).contains(&(now_ms() % 1000)) {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let first_second = now_ms() / 1000;
        let first_batch_start = now_ms();
        for _ in 0..5 {
            assert_eq!(
                send().await.status,
                200,
                "the first batch is within the limit"
            );
        }
        if now_ms() / 1000 != first_second {
            continue;
        }
        while now_ms() / 1000 == first_second {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        let mut inconclusive = false;
        for nth in 1..=5 {
            let resp = send().await;
            // Only an answer within a window of the first batch's start must be a refusal.
            if now_ms() >= first_batch_start + 1000 {
                inconclusive = true;
                break;
            }
            assert_eq!(resp.status, 429, "request {nth} after the edge: {resp:?}");
        }
        if inconclusive {
            continue;
        }
        tokio::time::sleep(Duration::from_millis(1000)).await;
        assert_eq!(
            send().await.status,
            200,
            "a slot frees a window after the first batch"
        );
        return;
    }
    panic!("3 attempts could not send both batches within a window around a whole second");
}
