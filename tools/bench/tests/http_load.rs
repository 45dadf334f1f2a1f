//! `sluice-http-load` does what scripts/bench/envoy.sh relies on: requests leave on the
//! schedule (rate x duration of them), the header spreads them over exactly `--values` clients
//! in turn, statuses are tallied as the server answered them, and latency counts from each
//! request's due instant, so a server that makes requests queue shows it (no coordinated
//! omission). The server is a small HTTP/1.1 keep-alive server in the test, on loopback.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const LOAD: &str = env!("CARGO_BIN_EXE_sluice-http-load");

/// Serves HTTP/1.1 on a loopback port: every request is answered after `delay`, 429 when its
/// `x-client` value ends in an odd digit, else 200. Returns the address and the values seen.
fn serve(delay: Duration) -> (SocketAddr, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("local addr");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            let log = log.clone();
            std::thread::spawn(move || {
                let mut out = stream.try_clone().expect("clone stream");
                let mut lines = BufReader::new(stream);
                loop {
                    let mut value = None;
                    loop {
                        let mut line = String::new();
                        if lines.read_line(&mut line).unwrap_or(0) == 0 {
                            return;
                        }
                        let line = line.trim_end();
                        if line.is_empty() {
                            break;
                        }
                        if let Some((name, v)) = line.split_once(':')
                            && name.eq_ignore_ascii_case("x-client")
                        {
                            value = Some(v.trim().to_string());
                        }
                    }
                    let value = value.expect("every request carries x-client");
                    let odd = value.ends_with(['1', '3', '5', '7', '9']);
                    log.lock().expect("log").push(value);
                    std::thread::sleep(delay);
                    let status = if odd {
                        "429 Too Many Requests"
                    } else {
                        "200 OK"
                    };
                    let response = format!("HTTP/1.1 {status}\r\ncontent-length: 2\r\n\r\nok");
                    if out.write_all(response.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, seen)
}

fn run(addr: SocketAddr, args: &[&str]) -> serde_json::Value {
    let out = Command::new(LOAD)
        .args(["--target", &addr.to_string(), "--json"])
        .args(args)
        .output()
        .expect("run sluice-http-load");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON report")
}

#[test]
fn requests_follow_the_schedule_spread_over_the_clients_and_are_tallied_by_status() {
    let (addr, seen) = serve(Duration::ZERO);
    // 400/s for 0.5 s: due at 0, 2.5, ..., 497.5 ms, so exactly 200 requests, 20 per client.
    let report = run(
        addr,
        &[
            "--rate",
            "400",
            "--duration-secs",
            "0.5",
            "--values",
            "10",
            "--connections",
            "4",
        ],
    );
    assert_eq!(report["requests"], 200, "{report}");
    assert_eq!(report["errors"], 0, "{report}");
    assert_eq!(report["statuses"]["200"], 100, "{report}");
    assert_eq!(report["statuses"]["429"], 100, "{report}");
    assert!(report["p99_ms"].as_f64().unwrap_or(0.0) > 0.0, "{report}");
    assert!(
        report["cpu_secs"]["sluice-http-load"].is_number(),
        "{report}"
    );
    let mut per_client: BTreeMap<String, usize> = BTreeMap::new();
    for value in seen.lock().expect("log").iter() {
        *per_client.entry(value.clone()).or_default() += 1;
    }
    let expected: BTreeMap<String, usize> = (0..10).map(|i| (format!("c{i}"), 20)).collect();
    assert_eq!(per_client, expected);
}

#[test]
fn latency_counts_from_the_due_instant_so_queueing_shows() {
    // One connection, 20 ms per response, 200 requests/s due for 0.25 s: 50 requests that
    // take 1 s to serve. The last is due at 245 ms and answered at about 1,000 ms; the median
    // one waits about 0.4 s. Timed from when each was sent, every request would show ~20 ms.
    let (addr, _) = serve(Duration::from_millis(20));
    let report = run(
        addr,
        &[
            "--rate",
            "200",
            "--duration-secs",
            "0.25",
            "--connections",
            "1",
        ],
    );
    assert_eq!(report["requests"], 50, "{report}");
    let p50 = report["p50_ms"].as_f64().unwrap_or(0.0);
    let p99 = report["p99_ms"].as_f64().unwrap_or(0.0);
    // Lower bounds only (a loaded machine can only make it slower): half the ideal values.
    assert!(p50 > 200.0, "p50 {p50} ms: {report}");
    assert!(p99 > 350.0, "p99 {p99} ms: {report}");
    // The generator itself was on time: the queueing is the server's.
    let lag = report["schedule_lag_p99_ms"].as_f64().unwrap_or(f64::MAX);
    assert!(lag < 100.0, "generator lag p99 {lag} ms: {report}");
}
