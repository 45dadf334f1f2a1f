//! A throwaway Sentinel deployment: a primary, its replicas and three `redis-server --sentinel`
//! processes, each on its own loopback port in a temp dir of its own, killed on drop.
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
