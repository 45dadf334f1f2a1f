//! A token budget through a real Envoy: the request path checks the budget with
//! `hits_addend: {number: 0}`, and the cost is charged when the stream ends, from a response
//! header (`apply_on_stream_done: true`, `hits_addend: {format: "%RESP(x-tokens-used)%"}`), as
//! Envoy Gateway generates for `cost.request: 0` / `cost.response` and AI gateways use for
//! token limits. Envoy ignores the answer to the charge, so only what sluice records for it
//! can hold the budget: with no sluice-specific configuration (`over_limit` defaults to fill),
//! the charge that overdraws the budget fills it, the next request gets 429, and once the
//! window slides past the first charges requests are admitted again.
//!
//! Real parts: sluice in process on Redis, Envoy 1.40 (tests/it/helpers/envoy.rs), an HTTP upstream
//! that reports 4 tokens per request. The test prints the request-by-request timeline
//! (`--nocapture`).

use crate::helpers;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use helpers::envoy_config::{
    bootstrap, cluster, generic_key, grpc_cluster, http_listener, ratelimit_filter, route,
};
use helpers::{Envoy, RedisServer, Req, TestServer, Upstream, http_request, test_settings};
use serde_json::json;

/// The budget: 10 tokens per 4 s window (a short custom window, so that the test sees it slide).
const LIMITS: &str = "\
domain: llm
descriptors:
  - key: route
    value: tokens
    rate_limit:
      window: 4s
      requests_per_unit: 10
";
const BUDGET: u64 = 10;
const TOKENS_PER_REQUEST: u64 = 4;

/// How long a charge may take to reach sluice after its response (Envoy sends it when the
/// stream completes, asynchronously); generous for a loaded machine.
const CHARGE_TIMEOUT: Duration = Duration::from_secs(10);

/// The Envoy of the test: the budget's two rate limits in the route's `RateLimitPerRoute` (Envoy
/// ignores `hits_addend` on route-level `rate_limits`), sluice as the rate-limit service (fail
/// closed, 2 s timeout: the test is about semantics, not the 20 ms budget).
fn envoy(upstream: SocketAddr, sluice: SocketAddr) -> Envoy {
    let tokens = generic_key("route", "tokens");
    let per_route = json!({"typed_per_filter_config": {"envoy.filters.http.ratelimit": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimitPerRoute",
        "rate_limits": [
            {"actions": [tokens], "hits_addend": {"number": 0}},
            {
                "actions": [tokens],
                "apply_on_stream_done": true,
                "hits_addend": {"format": "%RESP(x-tokens-used)%"},
            },
        ],
    }}});
    let routes = vec![route("/", "app", json!([]), per_route)];
    let filter = ratelimit_filter("llm", "sluice", 2000, true, json!({}));
    Envoy::start_json(&bootstrap(
        vec![http_listener("ingress", routes, vec![filter])],
        vec![
            cluster("app", &[upstream]),
            grpc_cluster("sluice", &[sluice]),
        ],
    ))
}

/// The budget as sluice's `/json` reports it to a check of 0 hits (which records nothing):
/// tokens used in the window, and its `durationUntilReset` (whole seconds).
fn budget(admin: SocketAddr) -> (u64, String) {
    let body = r#"{"domain":"llm","descriptors":[{"entries":[{"key":"route","value":"tokens"}],"hitsAddend":0}]}"#;
    let (_, text) = http_request(admin, "POST", "/json", body);
    let doc: serde_json::Value = serde_json::from_str(&text).expect("/json answer");
    let status = &doc["statuses"][0];
    let remaining = &status["limitRemaining"];
    let remaining = remaining
        .as_u64()
        .or_else(|| remaining.as_str().and_then(|s| s.parse().ok()))
        .unwrap_or(0);
    let reset = status["durationUntilReset"]
        .as_str()
        .unwrap_or("-")
        .to_owned();
    (BUDGET - remaining, reset)
}

/// Waits until sluice's window holds `used` tokens (the charge of the last response arrived),
/// and returns what `/json` reports then; after [`CHARGE_TIMEOUT`], what it holds.
fn wait_for_budget(admin: SocketAddr, used: u64) -> (u64, String) {
    let deadline = Instant::now() + CHARGE_TIMEOUT;
    loop {
        let now = budget(admin);
        if now.0 == used || Instant::now() > deadline {
            return now;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

struct Timeline {
    started: Instant,
    rows: Vec<String>,
}

impl Timeline {
    fn row(&mut self, request: usize, status: u16, charged: &str, used: u64, reset: &str) {
        let row = format!(
            "{:>6} ms  request {request}: HTTP {status}, tokens charged {charged}, /json: {used}/{BUDGET} used, durationUntilReset {reset}",
            self.started.elapsed().as_millis()
        );
        println!("{row}");
        self.rows.push(row);
    }
}

#[test]
fn charges_after_the_response_hold_the_budget() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().expect("temp dir");
    let limits: PathBuf = dir.path().join("llm.yaml");
    std::fs::write(&limits, LIMITS).expect("write the limits");
    let sluice = TestServer::start(test_settings(&limits, Some(&redis.url())));
    let upstream = Upstream::start();
    let envoy = envoy(upstream.addr, sluice.grpc_addr);
    let (ingress, admin) = (envoy.listener("ingress"), sluice.admin_addr);

    let mut timeline = Timeline {
        started: Instant::now(),
        rows: Vec::new(),
    };
    // One request (the upstream answers `x-tokens-used: 4`: it echoes `x-reply-*` headers): its
    // status, the tokens the upstream reported, and sluice's window once the charge that
    // follows (if any) has arrived.
    let mut request = |n: usize, expected_status: u16, expected_used: u64| {
        let response = Req::get("/v1/chat")
            .header("x-reply-x-tokens-used", &TOKENS_PER_REQUEST.to_string())
            .send_blocking(ingress)
            .expect("request through Envoy");
        let charged = response.header("x-tokens-used").unwrap_or("-").to_owned();
        let (used, reset) = wait_for_budget(admin, expected_used);
        timeline.row(n, response.status, &charged, used, &reset);
        assert_eq!(
            response.status, expected_status,
            "request {n}: {response:?}"
        );
        assert_eq!(used, expected_used, "request {n}: tokens in the window");
    };

    println!("budget {BUDGET} tokens per 4 s window, {TOKENS_PER_REQUEST} tokens per response:");
    // 0 + 4 and 4 + 4 fit; the check of the third passes (8 < 10), its charge does not fit
    // (12 > 10): refused, and it fills the window to 10.
    request(1, 200, 4);
    // The first charge is in the window by now: it leaves 4 s later at the latest. The next
    // ones come 1.5 s later, so that they are still in the window when it has left (the margin
    // covers a loaded machine's latency).
    let first_charge_seen = Instant::now();
    std::thread::sleep(Duration::from_millis(1500));
    request(2, 200, 8);
    request(3, 200, BUDGET);
    // The budget is spent: the check is refused, and nothing reaches the upstream.
    request(4, 429, BUDGET);
    // Once the first charge has left the window, 6 tokens are held (the second charge and the
    // fill, both at least 1.5 s younger): the next request is admitted, and its charge fits
    // exactly.
    let slid = first_charge_seen + Duration::from_millis(4000 + 50);
    std::thread::sleep(slid.saturating_duration_since(Instant::now()));
    request(5, 200, BUDGET);
    request(6, 429, BUDGET);
    drop(envoy);
    println!("timeline:\n{}", timeline.rows.join("\n"));
}
