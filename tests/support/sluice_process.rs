//! Runs the built `sluice` binary as a child process on ephemeral loopback ports, the way an
//! operator runs it, and gives tests a gRPC client to it.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sluice::proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use sluice::proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use sluice::proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use sluice::proto::envoy::service::ratelimit::v3::RateLimitRequest;
use tonic::transport::Channel;

pub struct Sluice {
    child: Child,
    pub grpc_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    pub log: Arc<Mutex<Vec<String>>>,
    /// Reads stderr into `log`; ends when the process closes it (exits).
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Sluice {
    /// Starts `sluice serve` on port 0 for both servers and waits for its "listening" line.
    pub fn start(config: &Path, redis_url: Option<&str>) -> Sluice {
        Self::start_with(config, redis_url, &[])
    }

    pub fn start_with(config: &Path, redis_url: Option<&str>, extra: &[&str]) -> Sluice {
        Self::start_with_env(config, redis_url, extra, &[])
    }

    /// Like [`Sluice::start_with`], with extra environment variables (e.g. secrets).
    pub fn start_with_env(
        config: &Path,
        redis_url: Option<&str>,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Sluice {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_sluice"));
        cmd.arg("serve")
            .arg("--config")
            .arg(config)
            .args(["--grpc-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0"])
            .args(extra)
            .env_remove("SLUICE_REDIS_URL")
            // The production deadline (10 ms) is for a quiet host; on a loaded 2-core test
            // machine it would turn scheduler hiccups into flaky failures of tests that are not
            // about deadlines. Tests about deadlines pass `--backend-timeout-ms`, which wins.
            .env("SLUICE_BACKEND_TIMEOUT_MS", "500")
            .env("SLUICE_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        cmd.envs(env.iter().copied());
        if let Some(url) = redis_url {
            cmd.args(["--redis-url", url]);
        }
        Self::launch(cmd)
    }

    /// Starts `sluice serve` with no flag at all: everything comes from `env` (e.g. an
    /// envoyproxy/ratelimit Deployment's variables). `env` must pick ephemeral ports.
    pub fn start_env_only(env: &[(&str, &str)]) -> Sluice {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_sluice"));
        cmd.arg("serve")
            .env_remove("SLUICE_REDIS_URL")
            .env("SLUICE_BACKEND_TIMEOUT_MS", "500")
            .env("SLUICE_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        cmd.envs(env.iter().copied());
        Self::launch(cmd)
    }

    fn launch(mut cmd: Command) -> Sluice {
        let mut child = cmd.spawn().expect("spawn sluice binary");
        let stderr = child.stderr.take().expect("stderr piped");
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = mpsc::channel();
        let sink = log.clone();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if line.contains("listening") {
                    let _ = tx.send(line.clone());
                }
                sink.lock().unwrap().push(line);
            }
        });
        let line = match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(line) => line,
            Err(_) => {
                let _ = child.kill();
                panic!(
                    "sluice did not start listening; its log:\n{}",
                    log.lock().unwrap().join("\n")
                );
            }
        };
        let field = |name: &str| -> SocketAddr {
            let start = line.find(name).expect("address field") + name.len();
            line[start..]
                .split_whitespace()
                .next()
                .expect("address value")
                .parse()
                .expect("socket address")
        };
        Sluice {
            grpc_addr: field("grpc_addr="),
            admin_addr: field("admin_addr="),
            child,
            log,
            reader: Some(reader),
        }
    }

    pub async fn channel(&self) -> Channel {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match Channel::from_shared(format!("http://{}", self.grpc_addr))
                .expect("uri")
                .connect()
                .await
            {
                Ok(channel) => return channel,
                Err(err) if Instant::now() > deadline => panic!("cannot connect to sluice: {err}"),
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }

    pub async fn client(&self) -> RateLimitServiceClient<Channel> {
        RateLimitServiceClient::new(self.channel().await)
    }

    /// Sends SIGTERM and waits for the process to exit.
    pub fn terminate(&mut self) -> ExitStatus {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -TERM failed");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = self.child.try_wait().expect("wait sluice") {
                // The last lines may still be in the pipe: read them all before returning.
                if let Some(reader) = self.reader.take() {
                    let _ = reader.join();
                }
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "sluice did not exit after SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The process id, for /proc and signals.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether the process is still running (it has not exited or died).
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Resident memory (`VmRSS`) of the process in KiB, from /proc.
    pub fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .expect("read /proc/PID/status");
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS in /proc/PID/status")
    }

    pub fn log_text(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }
}

impl Drop for Sluice {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A descriptor from `key=value` pairs.
pub fn descriptor(pairs: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: pairs
            .iter()
            .map(|(k, v)| Entry {
                key: (*k).into(),
                value: (*v).into(),
            })
            .collect(),
        ..Default::default()
    }
}

pub fn request(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors,
        hits_addend: 0,
    }
}

/// A plain HTTP/1.1 request to the admin port over loopback; returns (status, body).
pub fn http_request(addr: SocketAddr, method: &str, path: &str, body: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).expect("connect admin");
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("read timeout");
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .expect("write request");
    let mut text = String::new();
    stream.read_to_string(&mut text).expect("read response");
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status code");
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// `GET path` on the admin port; returns (status, body).
pub fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    http_request(addr, "GET", path, "")
}
