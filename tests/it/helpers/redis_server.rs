//! Throwaway `redis-server` processes, one per test, and 3-primary clusters.
//!
//! Why a real server and not a mock: the Redis backend's correctness lives in a Lua script and in
//! Redis semantics (sorted-set tie-breaks, TTLs, loading functions), which only a real server exercises.
//! Each [`RedisServer`] runs in its own temp dir on its own loopback port, persists nothing, and
//! is killed on drop, so tests run in parallel without sharing state. A missing `redis-server`
//! is a hard failure, never a skip: a silently skipped backend is an untested backend.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

const STARTUP_TIMEOUT: Duration = Duration::from_secs(10);
const PORT_ATTEMPTS: usize = 10;

pub struct RedisServer {
    child: Option<Child>,
    dir: TempDir,
    port: u16,
    extra: Vec<String>,
}

impl RedisServer {
    /// Starts a fresh server on a free loopback port; panics if that is impossible.
    pub fn start() -> RedisServer {
        Self::start_with(&[])
    }

    /// Like [`RedisServer::start`] with extra `redis-server` arguments (TLS, ACL users, ...).
    /// The plain port stays open for the readiness check.
    pub fn start_with(extra: &[String]) -> RedisServer {
        let dir = tempfile::tempdir().expect("create temp dir for redis-server");
        let mut last_error = String::new();
        for _ in 0..PORT_ATTEMPTS {
            let port = free_port();
            match spawn(port, &dir, extra) {
                Ok(child) => {
                    return RedisServer {
                        child: Some(child),
                        dir,
                        port,
                        extra: extra.to_vec(),
                    };
                }
                // Another test may have grabbed the port between our probe and the spawn.
                Err(e) => last_error = e,
            }
        }
        panic!("could not start redis-server after {PORT_ATTEMPTS} ports: {last_error}");
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// A connection of the test's own, next to the limiter's (to look at what it stored).
    pub async fn raw(&self) -> redis::aio::MultiplexedConnection {
        raw_connection(&self.url()).await
    }

    /// The child's process id (while running), for signals.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Kills the server; the port stays reserved for [`RedisServer::start_again`] by convention.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Restarts a stopped server on the same port (empty: nothing is persisted).
    pub fn start_again(&mut self) {
        self.stop();
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        loop {
            match spawn(self.port, &self.dir, &self.extra) {
                Ok(child) => {
                    self.child = Some(child);
                    return;
                }
                Err(e) if Instant::now() > deadline => {
                    panic!("could not restart redis-server on port {}: {e}", self.port)
                }
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    /// Freezes the server (SIGSTOP): connections stay open but nothing answers.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Thaws a paused server (SIGCONT).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, sig: &str) {
        let pid = self.pid().expect("redis-server is not running");
        let status = Command::new("kill")
            .arg(sig)
            .arg(pid.to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill {sig} {pid} failed");
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        // SIGKILL also ends a SIGSTOPped server, so a test that panics while paused leaks nothing.
        self.stop();
    }
}

/// `INFO section` on `conn` as (field, value) pairs, in order.
async fn info(conn: &redis::aio::MultiplexedConnection, section: &str) -> Vec<(String, String)> {
    let info: String = redis::cmd("INFO")
        .arg(section)
        .query_async(&mut conn.clone())
        .await
        .expect("INFO");
    info.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.to_owned(), v.trim().to_owned()))
        .collect()
}

/// The number `field` of `INFO section` (e.g. `stats`, `expired_keys`) on `conn`.
pub async fn info_number(
    conn: &redis::aio::MultiplexedConnection,
    section: &str,
    field: &str,
) -> u64 {
    let fields = info(conn, section).await;
    fields
        .iter()
        .find_map(|(k, v)| (k == field).then(|| v.parse().ok())?)
        .unwrap_or_else(|| panic!("INFO {section} has no number {field}:\n{fields:?}"))
}

/// The calls of each command Redis has executed so far (`INFO commandstats`), by lowercase
/// command name (`evalsha`, `client|setinfo`); a command never called is absent.
pub async fn command_calls(conn: &redis::aio::MultiplexedConnection) -> BTreeMap<String, u64> {
    info(conn, "commandstats")
        .await
        .into_iter()
        .filter_map(|(k, v)| {
            let name = k.strip_prefix("cmdstat_")?;
            let calls = v.strip_prefix("calls=")?.split(',').next()?.parse().ok()?;
            Some((name.to_owned(), calls))
        })
        .collect()
}

/// Sends `call` as an `FCALL` of the decide library's function on `conn`, loading the library
/// first when Redis does not hold it, as the limiters do (for tests that call the Lua directly).
pub async fn fcall<C: redis::aio::ConnectionLike + Send>(
    conn: &mut C,
    call: &sluice::limiter::redis::script::DecideCall<'_>,
) -> redis::RedisResult<redis::Value> {
    use sluice::limiter::redis::script::{LIBRARY, is_function_missing};
    let cmd = call.fcall();
    match cmd.query_async(conn).await {
        Err(e) if is_function_missing(&e) => {
            let _: redis::Value = LIBRARY.load().query_async(conn).await?;
            cmd.query_async(conn).await
        }
        other => other,
    }
}

/// A multiplexed connection to `url`.
pub async fn raw_connection(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .expect("client")
        .get_multiplexed_async_connection()
        .await
        .expect("raw connection")
}

pub fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind 127.0.0.1:0 to find a free port")
}

/// Spawns redis-server on `port` and waits until it answers PING.
fn spawn(port: u16, dir: &TempDir, extra: &[String]) -> Result<Child, String> {
    let mut child = spawn_redis_server(
        Command::new("redis-server")
            .args(["--port", &port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .args(["--save", ""])
            .args(["--appendonly", "no"])
            .arg("--dir")
            .arg(dir.path())
            .args(extra),
    );
    let deadline = Instant::now() + STARTUP_TIMEOUT;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("redis-server on port {port} exited: {status}"));
        }
        if answers_ping(port) {
            return Ok(child);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!(
                "redis-server on port {port} did not answer PING in time"
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Spawns `redis-server` as `cmd` says, output discarded; a missing binary is a hard failure.
pub fn spawn_redis_server(cmd: &mut Command) -> Child {
    match cmd.stdout(Stdio::null()).stderr(Stdio::null()).spawn() {
        Ok(child) => child,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            panic!("redis-server not found: run scripts/test.sh, which installs it")
        }
        Err(e) => panic!("could not spawn redis-server: {e}"),
    }
}

/// Whether something on loopback `port` answers `PING` with `PONG` (a Redis or a sentinel).
pub fn answers_ping(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect((Ipv4Addr::LOCALHOST, port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    if stream.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut buf = [0u8; 7];
    stream.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
}

/// A throwaway Redis Cluster: 3 primaries (no replicas) on loopback, each a [`RedisServer`] in
/// its own temp dir, joined with `redis-cli --cluster create`. Full slot coverage is not
/// required, so the other primaries keep serving while one is down (restart tests).
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    pub fn start() -> RedisCluster {
        let extra: Vec<String> = [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            "1000",
            "--cluster-require-full-coverage",
            "no",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let nodes: Vec<RedisServer> = (0..3).map(|_| RedisServer::start_with(&extra)).collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .expect("redis-cli not found: run scripts/test.sh, which installs it");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let cluster = RedisCluster { nodes };
        cluster.wait_ok();
        cluster
    }

    /// `redis+cluster://` URL naming every node as a seed.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        format!("redis+cluster://{}", hosts.join(","))
    }

    /// Runs `redis-cli -p port args...` and returns its stdout.
    pub fn cli(port: u16, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &port.to_string()])
            .args(args)
            .output()
            .expect("run redis-cli");
        assert!(out.status.success(), "redis-cli {args:?} failed");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Waits until every running node reports `cluster_state:ok` and agrees on all 3 primaries.
    pub fn wait_ok(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let ok = self.nodes.iter().filter(|n| n.pid().is_some()).all(|n| {
                let info = Self::cli(n.port(), &["CLUSTER", "INFO"]);
                info.contains("cluster_state:ok") && info.contains("cluster_known_nodes:3")
            });
            if ok {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "cluster did not become ok in 20 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The node id of the node on `port`.
    pub fn node_id(port: u16) -> String {
        Self::cli(port, &["CLUSTER", "MYID"]).trim().to_owned()
    }

    /// The index of the node serving `slot`.
    pub fn owner(&self, slot: u16) -> usize {
        for (i, n) in self.nodes.iter().enumerate() {
            let nodes = Self::cli(n.port(), &["CLUSTER", "NODES"]);
            let me = nodes
                .lines()
                .find(|l| l.contains("myself"))
                .expect("myself line");
            if me.split_whitespace().skip(8).any(|range| {
                let (lo, hi) = range.split_once('-').unwrap_or((range, range));
                match (lo.parse::<u16>(), hi.parse::<u16>()) {
                    (Ok(lo), Ok(hi)) => lo <= slot && slot <= hi,
                    _ => false,
                }
            }) {
                return i;
            }
        }
        panic!("no node serves slot {slot}");
    }
}
