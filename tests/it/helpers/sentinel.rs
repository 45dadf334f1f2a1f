//! A throwaway Sentinel deployment: a primary, its replicas and three `redis-server --sentinel`
//! processes, each on its own loopback port in a temp dir of its own, killed on drop. And a
//! [`FakeSentinel`] for what a real one will not do (flood a reply, name any node).
//!
//! Failover is tuned to be quick (`down-after-milliseconds` [`DOWN_AFTER_MS`], a short
//! `failover-timeout`), so a test can kill the primary and see a replica promoted within a few
//! seconds. Like every Redis of the suite, a missing `redis-server` is a hard failure.

use std::process::{Child, Command};
use std::time::{Duration, Instant};

use tempfile::TempDir;

use super::redis_server::{RedisCluster, RedisServer, answers_ping, free_port, spawn_redis_server};
use super::timing::wait_until_blocking;

/// The master name the sentinels monitor.
pub const MASTER: &str = "mymaster";
/// How long a primary must be unreachable before a sentinel flags it down.
pub const DOWN_AFTER_MS: u64 = 500;
/// Sentinels deployed (a quorum of two).
pub const SENTINELS: usize = 3;

struct SentinelProcess {
    child: Child,
    port: u16,
    _dir: TempDir,
}

impl Drop for SentinelProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub struct SentinelSet {
    pub primary: RedisServer,
    pub replicas: Vec<RedisServer>,
    sentinels: Vec<SentinelProcess>,
}

impl SentinelSet {
    /// A primary with `replicas` replicas in sync, then three sentinels that know all of them
    /// and each other.
    pub fn start(replicas: usize) -> SentinelSet {
        let primary = RedisServer::start();
        let replicaof = [
            "--replicaof".to_string(),
            "127.0.0.1".to_string(),
            primary.port().to_string(),
        ];
        let replicas: Vec<RedisServer> = (0..replicas)
            .map(|_| RedisServer::start_with(&replicaof))
            .collect();
        wait_until_blocking("the replicas are in sync", Duration::from_secs(20), || {
            let info = cli(primary.port(), &["INFO", "replication"]);
            info.matches("state=online").count() == replicas.len()
        });
        let sentinels = (0..SENTINELS)
            .map(|_| spawn_sentinel(primary.port()))
            .collect();
        let set = SentinelSet {
            primary,
            replicas,
            sentinels,
        };
        wait_until_blocking(
            "the sentinels know the replicas and each other",
            Duration::from_secs(20),
            || {
                set.sentinel_ports().iter().all(|&port| {
                    let fields = master_fields(port);
                    fields.get("num-slaves").map(String::as_str)
                        == Some(&set.replicas.len().to_string())
                        && fields.get("num-other-sentinels").map(String::as_str)
                            == Some(&(SENTINELS - 1).to_string())
                })
            },
        );
        set
    }

    pub fn sentinel_ports(&self) -> Vec<u16> {
        self.sentinels.iter().map(|s| s.port).collect()
    }

    /// `redis+sentinel://` naming every sentinel.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinel_ports()
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        format!("redis+sentinel://{}/{MASTER}", hosts.join(","))
    }

    /// The port of the primary every sentinel names now, once they all name the same one that
    /// is not `old` (a promotion); panics after `timeout`.
    pub fn wait_promotion(&self, old: u16, timeout: Duration) -> u16 {
        let mut promoted = 0;
        wait_until_blocking("a replica is promoted", timeout, || {
            let named: Vec<u16> = self
                .sentinel_ports()
                .iter()
                .map(|&port| master_port(port))
                .collect();
            promoted = named[0];
            named.iter().all(|&p| p == named[0] && p != old)
        });
        promoted
    }
}

impl SentinelSet {
    /// Cuts the replicas off the primary's writes, as a partition or a slow link would: their
    /// replication links are killed and their reconnects refused (a wrong `masterauth`), while
    /// the primary keeps serving. What it admits from now on exists only on the primary.
    pub fn cut_replication(&self) {
        for replica in &self.replicas {
            cli(
                replica.port(),
                &["CONFIG", "SET", "masterauth", "cut-off-on-purpose"],
            );
        }
        cli(self.primary.port(), &["CLIENT", "KILL", "TYPE", "replica"]);
    }

    /// Lets the replicas replicate again (from whichever primary they are told to follow).
    pub fn restore_replication(&self) {
        for replica in &self.replicas {
            cli(replica.port(), &["CONFIG", "SET", "masterauth", ""]);
        }
    }
}

/// A lone sentinel on a TLS port only, monitoring the primary at `primary` (quorum 1).
pub struct TlsSentinel {
    pub port: u16,
    _process: SentinelProcess,
}

/// Starts a [`TlsSentinel`] whose config adds `conf` (the TLS files, `tls-replication`,
/// `requirepass`, ...); ready once its TLS port accepts connections.
pub fn start_tls_sentinel(primary: u16, conf: &str) -> TlsSentinel {
    let dir = tempfile::tempdir().expect("temp dir for a sentinel");
    let port = free_port();
    let file = dir.path().join("sentinel.conf");
    std::fs::write(
        &file,
        format!(
            "port 0\ntls-port {port}\nbind 127.0.0.1\ndir {dir}\n{conf}\n\
             sentinel monitor {MASTER} 127.0.0.1 {primary} 1\n",
            dir = dir.path().display()
        ),
    )
    .expect("write sentinel.conf");
    let child = spawn_redis_server(Command::new("redis-server").arg(&file).arg("--sentinel"));
    let process = SentinelProcess {
        child,
        port,
        _dir: dir,
    };
    wait_until_blocking("the TLS sentinel listens", Duration::from_secs(10), || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    TlsSentinel {
        port,
        _process: process,
    }
}

/// `SENTINEL MASTER mymaster` of the sentinel on `port`, as field -> value.
fn master_fields(port: u16) -> std::collections::HashMap<String, String> {
    let out = cli(port, &["SENTINEL", "MASTER", MASTER]);
    let lines: Vec<&str> = out.lines().collect();
    lines
        .chunks(2)
        .filter_map(|pair| match pair {
            [k, v] => Some(((*k).to_owned(), (*v).to_owned())),
            _ => None,
        })
        .collect()
}

/// The primary's port as the sentinel on `port` names it now.
fn master_port(port: u16) -> u16 {
    let out = cli(port, &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER]);
    out.lines()
        .nth(1)
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or(0)
}

fn cli(port: u16, args: &[&str]) -> String {
    RedisCluster::cli(port, args)
}

fn spawn_sentinel(primary: u16) -> SentinelProcess {
    let dir = tempfile::tempdir().expect("temp dir for a sentinel");
    for _ in 0..10 {
        let port = free_port();
        // Sentinel rewrites its config file (it records what it learns): one file per process.
        let conf = dir.path().join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\ndir {dir}\n\
                 sentinel monitor {MASTER} 127.0.0.1 {primary} 2\n\
                 sentinel down-after-milliseconds {MASTER} {DOWN_AFTER_MS}\n\
                 sentinel failover-timeout {MASTER} 2000\n\
                 sentinel parallel-syncs {MASTER} 4\n",
                dir = dir.path().display()
            ),
        )
        .expect("write sentinel.conf");
        let mut child =
            spawn_redis_server(Command::new("redis-server").arg(&conf).arg("--sentinel"));
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if answers_ping(port) {
                return SentinelProcess {
                    child,
                    port,
                    _dir: dir,
                };
            }
            // Exited (e.g. the port was taken meanwhile): try another port.
            if matches!(child.try_wait(), Ok(Some(_))) || Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    panic!("could not start a sentinel");
}

/// What a [`FakeSentinel`] answers to `SENTINEL MASTER` (and `SENTINEL MASTERS`).
#[derive(Clone)]
pub enum FakeAnswer {
    /// The master at this loopback port, with these flags (`master`, `master,s_down`, ...).
    Master { port: u16, flags: &'static str },
    /// These bytes, whatever they are: a hostile or broken sentinel.
    Raw(std::sync::Arc<Vec<u8>>),
}

/// A sentinel played by the test: a loopback TCP server speaking RESP that answers `ROLE` as a
/// sentinel, `AUTH` (against a password, if given) and `SENTINEL MASTER(S)` with the
/// [`FakeAnswer`] set now. For what a real sentinel will not do: answer with a flood, or name a
/// node the test chooses. Stops accepting on drop (open connections end with their peer).
pub struct FakeSentinel {
    port: u16,
    answer: std::sync::Arc<std::sync::Mutex<FakeAnswer>>,
    /// `SENTINEL MASTER(S)` asked, and the `AUTH` arguments received, in order.
    asked: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    auths: std::sync::Arc<std::sync::Mutex<Vec<Vec<String>>>>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl FakeSentinel {
    /// A fake sentinel naming the master at `port` as an up primary; `password`, if given, is
    /// required (`AUTH` with it first, else every command is refused with `NOAUTH`).
    pub fn start(answer: FakeAnswer, password: Option<&str>) -> FakeSentinel {
        use std::sync::atomic::Ordering;
        let listener =
            std::net::TcpListener::bind("127.0.0.1:0").expect("bind a fake sentinel's port");
        listener.set_nonblocking(true).expect("non-blocking accept");
        let fake = FakeSentinel {
            port: listener.local_addr().expect("local address").port(),
            answer: std::sync::Arc::new(std::sync::Mutex::new(answer)),
            asked: Default::default(),
            auths: Default::default(),
            stop: Default::default(),
        };
        let (answer, asked, auths, stop) = (
            fake.answer.clone(),
            fake.asked.clone(),
            fake.auths.clone(),
            fake.stop.clone(),
        );
        let password = password.map(str::to_owned);
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        let (answer, asked, auths) = (answer.clone(), asked.clone(), auths.clone());
                        let password = password.clone();
                        std::thread::spawn(move || {
                            serve_fake(stream, &answer, &asked, &auths, password.as_deref())
                        });
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        fake
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis+sentinel://` naming this sentinel alone.
    pub fn url(&self) -> String {
        format!("redis+sentinel://127.0.0.1:{}/{MASTER}", self.port)
    }

    /// What the next `SENTINEL MASTER` is answered with.
    pub fn answer(&self, answer: FakeAnswer) {
        *self.answer.lock().unwrap() = answer;
    }

    /// How many times the master was asked for.
    pub fn asked(&self) -> usize {
        self.asked.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The arguments of every `AUTH` received.
    pub fn auths(&self) -> Vec<Vec<String>> {
        self.auths.lock().unwrap().clone()
    }

    /// A `SENTINEL MASTERS`-shaped reply of `entries` masters, none of them the one asked for:
    /// about 100 bytes each on the wire.
    pub fn flood_of_entries(entries: usize) -> FakeAnswer {
        let mut out = format!("*{entries}\r\n").into_bytes();
        for i in 0..entries {
            let name = format!("master-{i:07}");
            let fields = [
                "name",
                &name,
                "ip",
                "127.0.0.1",
                "port",
                "6379",
                "flags",
                "master",
            ];
            out.extend_from_slice(format!("*{}\r\n", fields.len()).as_bytes());
            for field in fields {
                out.extend_from_slice(format!("${}\r\n{field}\r\n", field.len()).as_bytes());
            }
        }
        FakeAnswer::Raw(std::sync::Arc::new(out))
    }

    /// One bulk string of `bytes` bytes.
    pub fn flood_of_bytes(bytes: usize) -> FakeAnswer {
        let mut out = format!("${bytes}\r\n").into_bytes();
        out.resize(out.len() + bytes, b'x');
        out.extend_from_slice(b"\r\n");
        FakeAnswer::Raw(std::sync::Arc::new(out))
    }
}

impl Drop for FakeSentinel {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// One connection to a [`FakeSentinel`]: commands read with redis-rs's parser, answered until
/// the peer goes (or a write fails: a client that stopped reading a flood).
fn serve_fake(
    stream: std::net::TcpStream,
    answer: &std::sync::Mutex<FakeAnswer>,
    asked: &std::sync::atomic::AtomicUsize,
    auths: &std::sync::Mutex<Vec<Vec<String>>>,
    password: Option<&str>,
) {
    use std::io::Write;
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
    let Ok(mut out) = stream.try_clone() else {
        return;
    };
    let mut input = std::io::BufReader::new(stream);
    let mut parser = redis::Parser::new();
    let mut authenticated = password.is_none();
    while let Ok(redis::Value::Array(args)) = parser.parse_value(&mut input) {
        let args: Vec<String> = args
            .iter()
            .map(|a| match a {
                redis::Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                _ => String::new(),
            })
            .collect();
        let command: Vec<String> = args.iter().take(2).map(|a| a.to_uppercase()).collect();
        let command: Vec<&str> = command.iter().map(String::as_str).collect();
        let reply: Vec<u8> = match command.as_slice() {
            ["AUTH", ..] => {
                auths.lock().unwrap().push(args[1..].to_vec());
                if password.is_none_or(|p| args.last().map(String::as_str) == Some(p)) {
                    authenticated = true;
                    b"+OK\r\n".to_vec()
                } else {
                    b"-WRONGPASS invalid username-password pair or user is disabled.\r\n".to_vec()
                }
            }
            _ if !authenticated => b"-NOAUTH Authentication required.\r\n".to_vec(),
            ["ROLE", ..] => format!(
                "*2\r\n$8\r\nsentinel\r\n*1\r\n${}\r\n{MASTER}\r\n",
                MASTER.len()
            )
            .into_bytes(),
            ["PING", ..] => b"+PONG\r\n".to_vec(),
            ["SENTINEL", which @ ("MASTER" | "MASTERS")] => {
                asked.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                match answer.lock().unwrap().clone() {
                    FakeAnswer::Raw(bytes) => {
                        if out.write_all(&bytes).is_err() {
                            return;
                        }
                        continue;
                    }
                    FakeAnswer::Master { port, flags } => {
                        let port = port.to_string();
                        let fields = [
                            "name",
                            MASTER,
                            "ip",
                            "127.0.0.1",
                            "port",
                            &port,
                            "flags",
                            flags,
                        ];
                        let mut map = format!("*{}\r\n", fields.len());
                        for field in fields {
                            map.push_str(&format!("${}\r\n{field}\r\n", field.len()));
                        }
                        match *which {
                            "MASTER" => map.into_bytes(),
                            _ => format!("*1\r\n{map}").into_bytes(),
                        }
                    }
                }
            }
            _ => b"-ERR unknown command\r\n".to_vec(),
        };
        if out.write_all(&reply).is_err() {
            return;
        }
    }
}
