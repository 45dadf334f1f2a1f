//! At most N requests in flight, through a real Envoy: `algorithm: in_flight` with a short
//! lease, the request path checking (and taking a lease), and the refund sent when the stream is
//! done (`apply_on_stream_done: true`, `hits_addend: {number: 1, is_negative_hits: true}`)
//! naming the request's lease through a `metadata` action that reads the `sluice_lease` dynamic
//! metadata sluice returned with the admission. Envoy 1.40 sends the stream-done descriptors
//! after a 429 as well; a refused request has no such metadata, so Envoy drops that descriptor
//! and sends no refund (the test checks that the 429 released nothing).
//!
//! Real parts: sluice in process on Redis, two Envoy 1.40 (tests/it/helpers/envoy.rs), and an
//! upstream that holds each request until the test lets it finish. The story: 3 slow requests
//! in flight, the 4th refused with 429, one completes, the next admitted; then the Envoy that
//! carries three requests in flight is killed (their refunds are lost), the other Envoy refuses
//! the next request, and each lost lease frees `lease` after its request was admitted. The test
//! prints its request-by-request timeline (`--nocapture`).

use crate::helpers;

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use helpers::envoy_config::{
    bootstrap, cluster, generic_key, grpc_cluster, http_listener, ratelimit_filter, route,
};
use helpers::{Envoy, RedisServer, Req, TestServer, http_request, prometheus, test_settings};
use serde_json::json;

const LIMIT: u64 = 3;
/// Short, so that the test sees leases run out; long enough that the steps before the kill
/// (about a second here, more on a loaded machine: checked) fit in it.
const LEASE: Duration = Duration::from_secs(3);
const LIMITS: &str = "\
domain: edge
descriptors:
  - key: concurrency
    value: api
    rate_limit:
      algorithm: in_flight
      requests_per_unit: 3
      lease: 3s
";
/// Bound of every wait for something the test caused (a request reaching the upstream, a
/// refund reaching sluice): generous for a loaded 2-core machine.
const STEP_TIMEOUT: Duration = Duration::from_secs(10);
/// How late a lease may be seen to end after `LEASE`: the probe's polling (20 ms) plus a loaded
/// machine's scheduling; the lower bound is exact.
const EXPIRY_SLACK: Duration = Duration::from_millis(1000);

/// The Envoy of the test: the check (and lease) on the request path, the refund when the
/// stream is done, both in the route's `RateLimitPerRoute` (Envoy ignores `hits_addend` on
/// route-level `rate_limits`); fail closed, 2 s timeout. With `name_the_lease`, the refund
/// names the request's lease (the way docs/algorithms.md configures it); without, it is the
/// plain refund, which Envoy sends for every request, refused ones included.
fn envoy(upstream: SocketAddr, sluice: SocketAddr, name_the_lease: bool) -> Envoy {
    let api = generic_key("concurrency", "api");
    let lease = json!({"metadata": {
        "descriptor_key": "sluice_lease",
        "metadata_key": {"key": "envoy.filters.http.ratelimit", "path": [{"key": "sluice_lease"}]},
        "source": "DYNAMIC",
    }});
    let refund_actions = if name_the_lease {
        json!([api, lease])
    } else {
        json!([api])
    };
    let per_route = json!({
        "route": {"timeout": "30s"},
        "typed_per_filter_config": {"envoy.filters.http.ratelimit": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimitPerRoute",
            "rate_limits": [
                {"actions": [api]},
                {
                    "actions": refund_actions,
                    "apply_on_stream_done": true,
                    "hits_addend": {"number": 1, "is_negative_hits": true},
                },
            ],
        }},
    });
    let routes = vec![route("/", "app", json!([]), per_route)];
    let filter = ratelimit_filter("edge", "sluice", 2000, true, json!({}));
    Envoy::start_json(&bootstrap(
        vec![http_listener("ingress", routes, vec![filter])],
        vec![
            cluster("app", &[upstream]),
            grpc_cluster("sluice", &[sluice]),
        ],
    ))
}

/// The application: holds every request (`GET /<name>`) until the test releases its name, then
/// answers `200 ok` and closes. Records the names that arrived.
#[derive(Clone)]
struct HeldUpstream {
    addr: SocketAddr,
    state: Arc<(Mutex<Held>, Condvar)>,
}

#[derive(Default)]
struct Held {
    arrived: Vec<String>,
    released: HashSet<String>,
    all: bool,
}

impl HeldUpstream {
    fn start() -> HeldUpstream {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the upstream");
        let upstream = HeldUpstream {
            addr: listener.local_addr().expect("upstream address"),
            state: Arc::default(),
        };
        let serving = upstream.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let serving = serving.clone();
                std::thread::spawn(move || serving.serve(stream));
            }
        });
        upstream
    }

    fn serve(&self, stream: std::net::TcpStream) {
        let Ok(mut writer) = stream.try_clone() else {
            return;
        };
        let mut reader = BufReader::new(stream);
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let name = line
            .split_whitespace()
            .nth(1)
            .unwrap_or("/")
            .trim_start_matches('/')
            .to_owned();
        loop {
            let mut header = String::new();
            if reader.read_line(&mut header).unwrap_or(0) == 0 || header.trim().is_empty() {
                break;
            }
        }
        let (lock, changed) = &*self.state;
        let mut held = lock.lock().unwrap();
        held.arrived.push(name.clone());
        changed.notify_all();
        let deadline = Instant::now() + Duration::from_secs(60);
        while !held.all && !held.released.contains(&name) && Instant::now() < deadline {
            held = changed
                .wait_timeout(held, Duration::from_millis(100))
                .unwrap()
                .0;
        }
        drop(held);
        let _ = writer
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\nconnection: close\r\n\r\nok\n");
    }

    /// Waits until every one of `names` has arrived.
    fn wait_arrived(&self, names: &[&str]) {
        let (lock, changed) = &*self.state;
        let deadline = Instant::now() + STEP_TIMEOUT;
        let mut held = lock.lock().unwrap();
        while !names.iter().all(|n| held.arrived.iter().any(|a| a == n)) {
            assert!(
                Instant::now() < deadline,
                "{names:?} did not all reach the upstream (arrived: {:?})",
                held.arrived
            );
            held = changed
                .wait_timeout(held, Duration::from_millis(50))
                .unwrap()
                .0;
        }
    }

    fn release(&self, name: &str) {
        let (lock, changed) = &*self.state;
        lock.lock().unwrap().released.insert(name.to_owned());
        changed.notify_all();
    }

    fn release_all(&self) {
        let (lock, changed) = &*self.state;
        lock.lock().unwrap().all = true;
        changed.notify_all();
    }
}

/// The leases sluice holds, as its `/json` reports them to a check of 0 hits (which records
/// nothing and takes no lease; answered 429 when every lease is taken). A check that missed
/// sluice's backend deadline (a loaded machine) reports nothing and is asked again, for
/// [`STEP_TIMEOUT`] at most.
fn leases(admin: SocketAddr) -> u64 {
    let body = r#"{"domain":"edge","descriptors":[{"entries":[{"key":"concurrency","value":"api"}],"hitsAddend":0}]}"#;
    let deadline = Instant::now() + STEP_TIMEOUT;
    let text = loop {
        let (status, text) = http_request(admin, "POST", "/json", body);
        if status == 200 || status == 429 {
            break text;
        }
        assert!(Instant::now() < deadline, "/json: {status} {text}");
        std::thread::sleep(Duration::from_millis(20));
    };
    let doc: serde_json::Value = serde_json::from_str(&text).expect("/json answer");
    let remaining = doc["statuses"][0]["limitRemaining"].as_u64().unwrap_or(0);
    LIMIT - remaining
}

/// Waits until sluice holds `expected` leases; returns when it first saw them.
fn wait_for_leases(admin: SocketAddr, expected: u64, timeout: Duration) -> Instant {
    let deadline = Instant::now() + timeout;
    loop {
        let seen = leases(admin);
        if seen == expected {
            return Instant::now();
        }
        assert!(
            Instant::now() < deadline,
            "sluice holds {seen} leases, expected {expected} within {timeout:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

struct Timeline {
    started: Instant,
    rows: Vec<String>,
}

impl Timeline {
    fn at(&self, when: Instant) -> u128 {
        when.saturating_duration_since(self.started).as_millis()
    }

    /// One line: when, what, and the leases sluice held then (when known).
    fn row(&mut self, when: Instant, event: &str, leases: Option<u64>) {
        let held = leases.map_or("-".to_owned(), |n| format!("{n}/{LIMIT}"));
        let row = format!("{:>6} ms  {event:<72} leases: {held}", self.at(when));
        println!("{row}");
        self.rows.push(row);
    }
}

/// A request through `ingress`, in the background: its status, or 0 if its connection broke.
fn send(ingress: SocketAddr, name: &str) -> tokio::task::JoinHandle<u16> {
    let req = Req::get(&format!("/{name}"));
    tokio::spawn(async move { req.try_send(ingress).await.map_or(0, |r| r.status) })
}

async fn status(request: tokio::task::JoinHandle<u16>) -> u16 {
    tokio::time::timeout(STEP_TIMEOUT, request)
        .await
        .expect("the request ended in time")
        .expect("the request task")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_most_n_requests_in_flight_through_envoy() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().expect("temp dir");
    let limits: PathBuf = dir.path().join("edge.yaml");
    std::fs::write(&limits, LIMITS).expect("write the limits");
    let sluice = TestServer::start(test_settings(&limits, Some(&redis.url())));
    let admin = sluice.admin_addr;
    let upstream = HeldUpstream::start();
    // Two Envoys, as two replicas in front of one sluice: the first is killed mid-request.
    let (first, second) = tokio::task::spawn_blocking({
        let (up, rls) = (upstream.addr, sluice.grpc_addr);
        move || (envoy(up, rls, true), envoy(up, rls, true))
    })
    .await
    .expect("start the Envoys");
    let (ingress, other) = (first.listener("ingress"), second.listener("ingress"));

    let mut timeline = Timeline {
        started: Instant::now(),
        rows: Vec::new(),
    };
    println!("limit {LIMIT} requests in flight, lease {LEASE:?}:");

    // Three slow requests: admitted, each holding a lease, all held by the upstream.
    let sent_first = Instant::now();
    let held: Vec<_> = ["r1", "r2", "r3"]
        .iter()
        .map(|n| send(ingress, n))
        .collect();
    upstream.wait_arrived(&["r1", "r2", "r3"]);
    let arrived_first = Instant::now();
    timeline.row(sent_first, "r1, r2, r3 sent through Envoy A", None);
    timeline.row(
        arrived_first,
        "r1, r2, r3 admitted, held by the upstream",
        Some(leases(admin)),
    );
    assert_eq!(leases(admin), 3);

    // The next is refused; Envoy sends no refund for it (it has no lease to name).
    let refused = status(send(ingress, "r4")).await;
    timeline.row(
        Instant::now(),
        &format!("r4: HTTP {refused}"),
        Some(leases(admin)),
    );
    assert_eq!(refused, 429);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after_429 = leases(admin);
    timeline.row(
        Instant::now(),
        "300 ms after r4's 429 (no refund released a lease)",
        Some(after_429),
    );
    assert_eq!(
        after_429, 3,
        "a refused request's stream end must release nothing"
    );

    // One completes: its refund releases its lease, and the next request is admitted.
    upstream.release("r1");
    let mut held = held.into_iter();
    let r1 = status(held.next().expect("r1")).await;
    timeline.row(
        Instant::now(),
        &format!("r1 released by the upstream: HTTP {r1}"),
        Some(leases(admin)),
    );
    assert_eq!(r1, 200);
    let refunded = wait_for_leases(admin, 2, STEP_TIMEOUT);
    timeline.row(
        refunded,
        "r1's refund arrived (its lease released)",
        Some(2),
    );
    let r5 = send(ingress, "r5");
    upstream.wait_arrived(&["r5"]);
    let r5_arrived = Instant::now();
    timeline.row(
        r5_arrived,
        "r5 admitted, in flight at the upstream",
        Some(leases(admin)),
    );
    assert_eq!(leases(admin), 3);

    // Envoy A dies with r2, r3 and r5 in flight: their refunds are never sent.
    let before_kill = Instant::now();
    drop(first);
    timeline.row(
        Instant::now(),
        "Envoy A killed (SIGKILL) with r2, r3, r5 in flight",
        Some(leases(admin)),
    );
    for (name, request) in [("r2", held.next()), ("r3", held.next()), ("r5", Some(r5))] {
        let code = status(request.expect("a held request")).await;
        assert_eq!(code, 0, "{name}'s connection broke with its Envoy");
    }
    assert!(
        before_kill.duration_since(sent_first) < LEASE,
        "the steps before the kill took {:?}, longer than the lease: the machine is too slow \
         for this test's timeline",
        before_kill.duration_since(sent_first)
    );
    let r6 = status(send(other, "r6")).await;
    timeline.row(
        Instant::now(),
        &format!("r6 through Envoy B: HTTP {r6}"),
        Some(leases(admin)),
    );
    assert_eq!(r6, 429, "the lost leases still count");

    // Each lost lease runs out `LEASE` after its request was admitted (between sending it and
    // its arrival upstream), and not before.
    for (held, what, sent, arrived) in [
        (1, "r2's and r3's leases", sent_first, arrived_first),
        (0, "r5's lease", refunded, r5_arrived),
    ] {
        let freed = wait_for_leases(admin, held, LEASE + STEP_TIMEOUT);
        let after = freed.duration_since(arrived);
        let since_sent = freed.duration_since(sent).as_millis();
        timeline.row(
            freed,
            &format!(
                "{what} ran out: {since_sent} ms after sent, {} after upstream",
                after.as_millis()
            ),
            Some(held),
        );
        assert!(freed >= sent + LEASE, "{what} ended early");
        assert!(
            after <= LEASE + EXPIRY_SLACK,
            "{what} ended {after:?} after admission"
        );
    }

    // Capacity is back.
    let r7 = send(other, "r7");
    upstream.wait_arrived(&["r7"]);
    timeline.row(
        Instant::now(),
        "r7 through Envoy B admitted, in flight",
        Some(leases(admin)),
    );
    upstream.release("r7");
    let r7 = status(r7).await;
    assert_eq!(r7, 200);
    let done = wait_for_leases(admin, 0, STEP_TIMEOUT);
    timeline.row(
        done,
        &format!("r7 done (HTTP {r7}), its refund released its lease"),
        Some(0),
    );

    upstream.release_all();
    drop(second);
    println!("timeline:\n{}", timeline.rows.join("\n"));
}

/// Why the refund must name its lease: Envoy 1.40 sends the stream-done descriptors of a request
/// it refused with 429 too. Without the `metadata` action that names the lease, the refund of
/// the 429 reaches sluice (which releases nothing for it: a refund naming no lease leaves
/// `in_flight` limits alone, and is counted `no_rule` on the rule).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_sends_the_refund_of_a_refused_request_too() {
    let dir = tempfile::tempdir().expect("temp dir");
    let limits: PathBuf = dir.path().join("edge.yaml");
    std::fs::write(
        &limits,
        LIMITS.replace("requests_per_unit: 3", "requests_per_unit: 0"),
    )
    .expect("write the limits");
    let sluice = TestServer::start(test_settings(&limits, None));
    let upstream = HeldUpstream::start();
    let envoy = tokio::task::spawn_blocking({
        let (up, rls) = (upstream.addr, sluice.grpc_addr);
        move || envoy(up, rls, false)
    })
    .await
    .expect("start Envoy");
    let refunds_seen = || {
        let page = helpers::in_process::metrics().render();
        let labels = [("rule", "concurrency_api"), ("outcome", "no_rule")];
        prometheus::sum(&page, "sluice_decisions_total", &labels)
    };
    let before = refunds_seen();
    let refused = status(send(envoy.listener("ingress"), "refused")).await;
    assert_eq!(refused, 429, "a limit of 0 refuses everything");
    let deadline = Instant::now() + STEP_TIMEOUT;
    while refunds_seen() == before {
        assert!(
            Instant::now() < deadline,
            "no refund reached sluice after the 429 (Envoy no longer sends stream-done \
             descriptors for refused requests?)"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(refunds_seen(), before + 1.0);
    upstream.release_all();
}

/// A caller that reaches the gRPC port sees its own lease token; refunds forged from tokens
/// near it (they were the previous token + 1) release no other request's lease, on the memory
/// backend and on Redis. In process, over gRPC.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_forged_from_a_neighbouring_token_releases_nothing() {
    use helpers::{descriptor, request};
    use sluice::proto::envoy::service::ratelimit::v3::rate_limit_response::Code;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("limits.yaml");
    std::fs::write(
        &config,
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: \
         {requests_per_unit: 3, algorithm: in_flight, lease: 60s}\n",
    )
    .unwrap();
    let redis = RedisServer::start();
    for url in [None, Some(redis.url())] {
        let sluice = TestServer::start(test_settings(&config, url.as_deref()));
        let client = sluice.client().await;
        let admit = || {
            let mut client = client.clone();
            async move {
                let reply = client
                    .should_rate_limit(request("d", vec![descriptor(&[("k", "v")])]))
                    .await
                    .expect("a decision")
                    .into_inner();
                let token = reply.dynamic_metadata.and_then(|m| {
                    match m.fields.get("sluice_lease")?.kind.clone()? {
                        prost_types::value::Kind::StringValue(t) => t.parse::<u64>().ok(),
                        _ => None,
                    }
                });
                (reply.overall_code, token)
            }
        };
        let (code, victim) = admit().await;
        assert_eq!(code, Code::Ok as i32);
        let (_, mine) = admit().await;
        let (victim, mine) = (victim.expect("a token"), mine.expect("a token"));
        assert!(
            mine.abs_diff(victim) > 1_000,
            "consecutive tokens {victim} and {mine} are neighbours ({url:?})"
        );
        // Forged refunds: the 200 tokens on either side of the caller's own.
        let forged = (1..=200u64).flat_map(|d| [mine + d, mine.saturating_sub(d)]);
        for token in forged.filter(|&t| t != victim && t != mine) {
            let mut refund = descriptor(&[("k", "v"), ("sluice_lease", &token.to_string())]);
            refund.hits_addend = Some(1);
            refund.is_negative_hits = true;
            client
                .clone()
                .should_rate_limit(request("d", vec![refund]))
                .await
                .expect("a refund is answered");
        }
        // Both leases still held: one more is admitted, then the limit of 3 is reached.
        assert_eq!(admit().await.0, Code::Ok as i32, "{url:?}");
        assert_eq!(admit().await.0, Code::OverLimit as i32, "{url:?}");
        sluice.stop().await.expect("clean stop");
    }
}
