//! What a client that holds connections and streams, or never finishes a request, can cost: the
//! binary on loopback with low limits, driven by raw TCP and hand-written HTTP/2 frames (what a
//! hostile client sends; a real gRPC client would not). Every wait is bounded.
//!
//! - the gRPC port advertises `SETTINGS_MAX_CONCURRENT_STREAMS` and refuses streams past it;
//! - a connection that never sends the HTTP/2 preface, a partial request head or a body shorter
//!   than its `Content-Length` on the admin port, and an idle connection on either port are
//!   closed;
//! - connections past the per-port limit are closed at once, and a freed slot is reused;
//! - out of file descriptors, the accept loop waits instead of spinning a core;
//! - a reset flood on many connections writes a bounded number of log lines.

use crate::helpers;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use helpers::Sluice;

const CONFIG: &str = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1000}\n";
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const RLS_PATH: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

fn start(flags: &[&str]) -> (tempfile::TempDir, Sluice) {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("d.yaml");
    std::fs::write(&config, CONFIG).expect("write config");
    let sluice = Sluice::start_with(&config, None, flags);
    (dir, sluice)
}

/// An HTTP/2 frame: 9-byte header and payload.
fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len()).expect("short payload");
    let mut out = len.to_be_bytes()[1..].to_vec();
    out.extend_from_slice(&[kind, flags]);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

const DATA: u8 = 0;
const HEADERS: u8 = 1;
const RST_STREAM: u8 = 3;
const SETTINGS: u8 = 4;
const GOAWAY: u8 = 7;
const END_HEADERS: u8 = 4;
const ACK: u8 = 1;
const REFUSED_STREAM: u32 = 7;
const CANCEL: u32 = 8;

/// A HEADERS frame opening a unary RLS call on `stream` (no END_STREAM: the message is still to
/// come). HPACK without Huffman coding: indexed `:method: POST` and `:scheme: http`, literal
/// `:path`, `:authority` and `content-type`.
fn open_call(stream: u32) -> Vec<u8> {
    let mut block = vec![0x83, 0x86];
    let literal = |block: &mut Vec<u8>, index: &[u8], value: &str| {
        block.extend_from_slice(index);
        block.push(u8::try_from(value.len()).expect("short value"));
        block.extend_from_slice(value.as_bytes());
    };
    literal(&mut block, &[0x04], RLS_PATH);
    literal(&mut block, &[0x01], "localhost");
    literal(&mut block, &[0x0f, 0x10], "application/grpc");
    frame(HEADERS, END_HEADERS, stream, &block)
}

fn rst(stream: u32) -> Vec<u8> {
    frame(RST_STREAM, 0, stream, &CANCEL.to_be_bytes())
}

/// Reads frames from `conn` until `pick` returns something or `within` passes.
fn read_frames<T>(
    conn: &mut TcpStream,
    within: Duration,
    mut pick: impl FnMut(u8, u8, u32, &[u8]) -> Option<T>,
) -> Option<T> {
    let deadline = Instant::now() + within;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        while buf.len() >= 9 {
            let len = usize::from(buf[0]) << 16 | usize::from(buf[1]) << 8 | usize::from(buf[2]);
            if buf.len() < 9 + len {
                break;
            }
            let stream = u32::from_be_bytes([buf[5], buf[6], buf[7], buf[8]]) & 0x7fff_ffff;
            let found = pick(buf[3], buf[4], stream, &buf[9..9 + len]);
            buf.drain(..9 + len);
            if found.is_some() {
                return found;
            }
        }
        let left = deadline.checked_duration_since(Instant::now())?;
        conn.set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .expect("read timeout");
        match conn.read(&mut chunk) {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// Connects and sends the preface and an empty SETTINGS; returns the server's
/// SETTINGS_MAX_CONCURRENT_STREAMS (None: not advertised), having acknowledged its SETTINGS.
fn handshake(addr: SocketAddr) -> (TcpStream, Option<u32>) {
    try_handshake(addr).expect("the server's SETTINGS")
}

/// [`handshake`], or `None` when the server closes the connection instead.
fn try_handshake(addr: SocketAddr) -> Option<(TcpStream, Option<u32>)> {
    let mut conn = TcpStream::connect(addr).expect("connect");
    conn.write_all(&[PREFACE, &frame(SETTINGS, 0, 0, &[])].concat())
        .ok()?;
    let settings = read_frames(
        &mut conn,
        Duration::from_secs(5),
        |kind, flags, _, payload| (kind == SETTINGS && flags & ACK == 0).then(|| payload.to_vec()),
    )?;
    let max_streams = settings.chunks(6).find_map(|s| {
        (u16::from_be_bytes([s[0], s[1]]) == 3)
            .then(|| u32::from_be_bytes([s[2], s[3], s[4], s[5]]))
    });
    conn.write_all(&frame(SETTINGS, ACK, 0, &[])).ok()?;
    Some((conn, max_streams))
}

/// Whether the server closed `conn` within `within` (EOF or reset), reading what it sends.
fn closed_within(conn: &mut TcpStream, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    let mut chunk = [0u8; 4096];
    loop {
        let Some(left) = deadline.checked_duration_since(Instant::now()) else {
            return false;
        };
        conn.set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .expect("read timeout");
        match conn.read(&mut chunk) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return false;
            }
            Err(_) => return true,
        }
    }
}

#[test]
fn grpc_advertises_and_enforces_max_concurrent_streams() {
    let (_dir, sluice) = start(&["--grpc-max-concurrent-streams", "8"]);
    let (mut conn, advertised) = handshake(sluice.grpc_addr);
    assert_eq!(advertised, Some(8), "SETTINGS_MAX_CONCURRENT_STREAMS");
    let opens: Vec<u8> = (0..9).flat_map(|i| open_call(1 + 2 * i)).collect();
    conn.write_all(&opens).expect("open 9 calls");
    let refused = read_frames(
        &mut conn,
        Duration::from_secs(5),
        |kind, _, stream, payload| {
            (kind == RST_STREAM && payload == REFUSED_STREAM.to_be_bytes()).then_some(stream)
        },
    );
    assert_eq!(refused, Some(17), "the 9th stream is refused");
}

#[test]
fn silent_and_unfinished_clients_are_closed_on_both_ports() {
    let (_dir, sluice) = start(&["--request-timeout-ms", "500", "--idle-timeout-ms", "1500"]);
    // gRPC: no preface at all.
    let started = Instant::now();
    let mut silent = TcpStream::connect(sluice.grpc_addr).expect("connect");
    assert!(
        closed_within(&mut silent, Duration::from_secs(5)),
        "a connection without the HTTP/2 preface stayed open"
    );
    assert!(
        started.elapsed() >= Duration::from_millis(450),
        "closed too early"
    );
    // gRPC: handshake done, then nothing: closed after the idle timeout, not before.
    let (mut idle, _) = handshake(sluice.grpc_addr);
    let started = Instant::now();
    assert!(
        closed_within(&mut idle, Duration::from_secs(6)),
        "an idle gRPC connection stayed open"
    );
    assert!(
        started.elapsed() >= Duration::from_millis(1000),
        "closed before the idle timeout: {:?}",
        started.elapsed()
    );
    // gRPC: a call whose message never comes is cancelled at the request timeout.
    let (mut held, _) = handshake(sluice.grpc_addr);
    held.write_all(&open_call(1)).expect("open a call");
    let answered = read_frames(
        &mut held,
        Duration::from_secs(5),
        |kind, flags, stream, _| {
            (stream == 1 && (kind == RST_STREAM || (kind == HEADERS && flags & 1 == 1)))
                .then_some(())
        },
    );
    assert!(answered.is_some(), "a call without its message was held");

    // Admin: nothing, half a head, a body shorter than its Content-Length.
    let cases: [&[u8]; 3] = [
        b"",
        b"GET /healthz HTTP/1.1\r\nHost: x\r\n",
        b"POST /json HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{",
    ];
    for request in cases {
        let mut conn = TcpStream::connect(sluice.admin_addr).expect("connect admin");
        conn.write_all(request).expect("write");
        assert!(
            closed_within(&mut conn, Duration::from_secs(5)),
            "admin connection stayed open after {:?}",
            String::from_utf8_lossy(request)
        );
    }
    // Admin: a kept-alive connection that starts no new request.
    let mut conn = TcpStream::connect(sluice.admin_addr).expect("connect admin");
    conn.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .expect("write");
    assert!(
        closed_within(&mut conn, Duration::from_secs(5)),
        "an idle keep-alive admin connection stayed open"
    );
}

#[test]
fn connections_past_the_port_limit_are_closed_at_once() {
    let (_dir, sluice) = start(&[
        "--grpc-max-connections",
        "4",
        "--admin-max-connections",
        "2",
    ]);
    let mut held: Vec<TcpStream> = (0..4).map(|_| handshake(sluice.grpc_addr).0).collect();
    let mut extra = TcpStream::connect(sluice.grpc_addr).expect("connect");
    assert!(
        closed_within(&mut extra, Duration::from_secs(3)),
        "a 5th gRPC connection was kept"
    );
    assert!(
        !closed_within(&mut held[0], Duration::from_millis(200)),
        "a held connection was closed"
    );
    // A closed connection frees its slot once sluice has seen the close: a new one is tried
    // until it is kept (a loaded machine may take a while), so a slot never freed still fails.
    drop(held.pop());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some((mut again, advertised)) = try_handshake(sluice.grpc_addr)
            && !closed_within(&mut again, Duration::from_millis(200))
        {
            assert!(advertised.is_some());
            break;
        }
        assert!(
            Instant::now() < deadline,
            "a freed connection slot was not reused"
        );
    }

    let _admin: Vec<TcpStream> = (0..2)
        .map(|_| {
            let mut conn = TcpStream::connect(sluice.admin_addr).expect("connect admin");
            conn.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                .expect("write");
            conn
        })
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let mut extra = TcpStream::connect(sluice.admin_addr).expect("connect admin");
    assert!(
        closed_within(&mut extra, Duration::from_secs(3)),
        "a 3rd admin connection was kept"
    );
    let log = sluice.log_text();
    assert!(
        log.contains("connection refused") && log.contains("--grpc-max-connections"),
        "{log}"
    );
}

/// CPU time (user + system) of `pid` in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("read stat");
    // Fields after the command name (which may hold spaces): utime is the 14th field.
    let rest = stat.rsplit_once(')').expect("stat format").1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime")
}

/// With its file descriptors exhausted (RLIMIT_NOFILE lowered to what it uses plus 4, then more
/// clients than that), sluice waits between accepts instead of spinning: over 2 s it uses well
/// under a core; once clients leave, it accepts and decides again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_file_descriptors_the_accept_loop_does_not_spin() {
    let (_dir, sluice) = start(&[]);
    let pid = sluice.pid();
    let open = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("list fds")
        .count();
    let limit = format!("--nofile={}:{}", open + 4, open + 4);
    let status = std::process::Command::new("prlimit")
        .args(["--pid", &pid.to_string(), &limit])
        .status()
        .expect("run prlimit");
    assert!(status.success(), "prlimit failed");
    let clients: Vec<TcpStream> = (0..16)
        .map(|_| TcpStream::connect(sluice.grpc_addr).expect("connect"))
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let before = cpu_ticks(pid);
    std::thread::sleep(Duration::from_secs(2));
    let used = cpu_ticks(pid) - before;
    // A spinning accept loop takes a whole core: about 200 ticks in 2 s.
    assert!(
        used < 60,
        "sluice used {used} ticks of CPU in 2 s while out of file descriptors"
    );
    assert!(
        sluice.log_text().contains("out of file descriptors"),
        "{}",
        sluice.log_text()
    );
    drop(clients);
    let mut client = tokio::time::timeout(Duration::from_secs(10), sluice.client())
        .await
        .expect("a client connects again within 10 s");
    let reply = client
        .should_rate_limit(helpers::request(
            "d",
            vec![helpers::descriptor(&[("k", "v")])],
        ))
        .await;
    assert!(reply.is_ok(), "{reply:?}");
}

/// 30 connections each open 25 calls and reset them at once, past h2's limit of 20 resets of
/// streams not yet accepted: each connection is closed with GOAWAY, and the log holds a bounded
/// number of lines about it, not one per connection.
#[test]
fn a_reset_flood_writes_a_bounded_number_of_log_lines() {
    let (_dir, sluice) = start(&[]);
    let flood: Vec<u8> = (0..25)
        .flat_map(|i| [open_call(1 + 2 * i), rst(1 + 2 * i)].concat())
        .collect();
    let mut goaways = 0;
    for _ in 0..30 {
        let (mut conn, _) = handshake(sluice.grpc_addr);
        conn.write_all(&flood).expect("flood");
        let goaway = read_frames(&mut conn, Duration::from_secs(5), |kind, _, _, _| {
            (kind == GOAWAY).then_some(())
        });
        goaways += usize::from(goaway.is_some());
    }
    assert_eq!(goaways, 30, "every flooding connection is sent away");
    std::thread::sleep(Duration::from_millis(300));
    let log = sluice.log_text();
    let lines = log.lines().filter(|l| l.contains("reached limit")).count();
    assert!(
        (1..=2).contains(&lines),
        "{lines} log lines about the reset limit for 30 connections:\n{log}"
    );
    let _ = DATA;
}
