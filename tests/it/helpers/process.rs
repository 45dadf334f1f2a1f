//! Runs the built `sluice` binary as a child process on ephemeral loopback ports, the way an
//! operator runs it, and gives tests a gRPC client to it. For the black-box tests of the binary
//! (flags, environment, start-up errors, signals, its log, its memory); everything else runs
//! sluice in process ([`super::TestServer`]), which is quicker and needs no log parsing.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sluice::proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tonic::transport::Channel;

use super::in_process::TEST_BACKEND_TIMEOUT;

/// The binary under test: the dev build cargo made for this crate, or the one
/// `SLUICE_TEST_BINARY` names (a release build, to measure what an operator runs: e.g. the
/// memory figures of docs/security.md).
pub fn binary() -> std::ffi::OsString {
    std::env::var_os("SLUICE_TEST_BINARY").unwrap_or_else(|| env!("CARGO_BIN_EXE_sluice").into())
}

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
        let any = SocketAddr::from(([127, 0, 0, 1], 0));
        Self::start_serving(any, config, redis_url, extra, env)
    }

    /// Like [`Sluice::start_with`], the gRPC port at `grpc_addr`: a replacement on the port of
    /// the process it replaces (a static Envoy cluster's endpoint).
    pub fn start_at(
        grpc_addr: SocketAddr,
        config: &Path,
        redis_url: Option<&str>,
        extra: &[&str],
    ) -> Sluice {
        Self::start_serving(grpc_addr, config, redis_url, extra, &[])
    }

    fn start_serving(
        grpc_addr: SocketAddr,
        config: &Path,
        redis_url: Option<&str>,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Sluice {
        let mut cmd = Command::new(binary());
        cmd.arg("serve")
            .arg("--config")
            .arg(config)
            .args(["--grpc-addr", &grpc_addr.to_string()])
            .args(["--admin-addr", "127.0.0.1:0"])
            .args(extra);
        Self::quiet_defaults(&mut cmd);
        cmd.envs(env.iter().copied());
        if let Some(url) = redis_url {
            cmd.args(["--redis-url", url]);
        }
        Self::launch(cmd)
    }

    /// What every test start shares: no Redis from the caller's environment, the test deadline
    /// (see [`TEST_BACKEND_TIMEOUT`]; tests about deadlines pass `--backend-timeout-ms`, which
    /// wins), no drain delay (nothing routes to a test's sluice but the test; the drain tests
    /// pass `--drain-delay-secs`, which wins), info logs on a piped stderr.
    fn quiet_defaults(cmd: &mut Command) {
        cmd.env_remove("SLUICE_REDIS_URL")
            .env(
                "SLUICE_BACKEND_TIMEOUT_MS",
                TEST_BACKEND_TIMEOUT.as_millis().to_string(),
            )
            .env("SLUICE_DRAIN_DELAY_SECS", "0")
            .env("SLUICE_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
    }

    /// Starts `sluice serve` with no flag at all: everything comes from `env` (e.g. an
    /// envoyproxy/ratelimit Deployment's variables). `env` must pick ephemeral ports.
    pub fn start_env_only(env: &[(&str, &str)]) -> Sluice {
        let mut cmd = Command::new(binary());
        cmd.arg("serve");
        Self::quiet_defaults(&mut cmd);
        cmd.envs(env.iter().copied());
        Self::launch(cmd)
    }

    /// Runs `cmd` as it is (its program, arguments and environment: e.g. the binary under
    /// another name, in a sandbox, with nothing but a Deployment's variables), stdin closed,
    /// stderr read into the log; returns once it logs "listening".
    pub fn start_command(mut cmd: Command) -> Sluice {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
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
        super::grpc_channel(self.grpc_addr).await
    }

    pub async fn client(&self) -> RateLimitServiceClient<Channel> {
        RateLimitServiceClient::new(self.channel().await)
    }

    /// Sends SIGTERM and waits for the process to exit.
    pub fn terminate(&mut self) -> ExitStatus {
        self.signal_term();
        self.wait_exit()
    }

    /// Sends SIGTERM and returns at once.
    pub fn signal_term(&self) {
        self.signal("TERM");
    }

    /// Sends the signal named `name` (`TERM`, `INT`, ...) and returns at once.
    pub fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .args([&format!("-{name}"), &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{name} failed");
    }

    /// Waits (10 s at most) for the process to exit, then for the last lines of its log.
    pub fn wait_exit(&mut self) -> ExitStatus {
        self.wait_exit_within(Duration::from_secs(10))
    }

    /// Waits (`limit` at most) for the process to exit, then for the last lines of its log.
    pub fn wait_exit_within(&mut self, limit: Duration) -> ExitStatus {
        let deadline = Instant::now() + limit;
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
                "sluice did not exit within {limit:?}; its log:\n{}",
                self.log_text()
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
        self.status_kib("VmRSS")
    }

    /// Peak resident memory (`VmHWM`) of the process in KiB, from /proc.
    pub fn peak_rss_kib(&self) -> u64 {
        self.status_kib("VmHWM")
    }

    /// A `NAME:   N kB` line of /proc/PID/status.
    fn status_kib(&self, name: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .expect("read /proc/PID/status");
        status
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or_else(|| panic!("{name} in /proc/PID/status"))
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

/// Longest a command run by [`run_sluice`] may take: one that should have exited (a start-up
/// error) but serves instead is killed, and the test fails on its exit status, not by hanging.
pub const RUN_TIMEOUT: Duration = Duration::from_secs(30);

/// Runs `sluice ARGS` to completion (no Redis URL from the caller's environment) and returns
/// its output: for commands that exit by themselves, and start-up errors. Killed after
/// [`RUN_TIMEOUT`].
pub fn run_sluice<I, S>(args: I, env: &[(&str, &str)]) -> std::process::Output
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let child = Command::new(binary())
        .args(args)
        .env_remove("SLUICE_REDIS_URL")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run the sluice binary");
    let pid = child.id();
    let (done, finished) = mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        if finished.recv_timeout(RUN_TIMEOUT).is_err() {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
        }
    });
    let output = child
        .wait_with_output()
        .expect("wait for the sluice binary");
    let _ = done.send(());
    let _ = watchdog.join();
    output
}
