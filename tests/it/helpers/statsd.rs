//! Etsy's statsd daemon (npm's `statsd`, installed by scripts/setup.sh) on a loopback TCP port
//! of its own, with `dumpMessages`: it logs every line it receives, and tests read those lines
//! as the daemon got them. A missing `statsd` fails the test.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

pub struct StatsdDaemon {
    child: Child,
    pub addr: SocketAddr,
    lines: Arc<Mutex<Vec<String>>>,
    _dir: tempfile::TempDir,
}

impl StatsdDaemon {
    /// A daemon on a free port.
    pub fn start() -> StatsdDaemon {
        Self::start_on(super::free_port())
    }

    /// A daemon on `port` (a sink may be pointed at it before it runs); returns once it
    /// listens.
    pub fn start_on(port: u16) -> StatsdDaemon {
        let dir = tempfile::tempdir().expect("temp dir");
        let config = dir.path().join("statsd.js");
        // The TCP server, every received line logged, the console backend's flush far away;
        // the management port a free one too (its default, 8126, is one per machine).
        let mgmt = super::free_port();
        std::fs::write(
            &config,
            format!(
                "{{ port: {port}, address: \"127.0.0.1\", server: \"./servers/tcp\", \
                 mgmt_port: {mgmt}, mgmt_address: \"127.0.0.1\", \
                 backends: [\"./backends/console\"], dumpMessages: true, \
                 flushInterval: 3600000 }}\n"
            ),
        )
        .expect("statsd config");
        let mut child = Command::new("statsd")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot run Etsy's statsd (`statsd`, scripts/setup.sh installs it): {e}")
            });
        let stdout = child.stdout.take().expect("stdout piped");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let (up_tx, up) = mpsc::channel();
        let sink = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if line.contains("server is up") {
                    let _ = up_tx.send(());
                }
                // `4 Dec 19:04:19 - DEBUG: name:1|c`
                if let Some((_, message)) = line.split_once(" - DEBUG: ") {
                    sink.lock().unwrap().push(message.to_owned());
                }
            }
        });
        up.recv_timeout(Duration::from_secs(20))
            .expect("statsd did not come up within 20 s");
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        // "server is up" is logged once the servers started; the socket may lag a moment.
        super::timing::wait_until_blocking("statsd's port", Duration::from_secs(5), || {
            std::net::TcpStream::connect(addr).is_ok()
        });
        StatsdDaemon {
            child,
            addr,
            lines,
            _dir: dir,
        }
    }

    /// Every line received so far, in order.
    pub fn received(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }

    /// Waits (up to `within`) until `done` holds for the lines received; returns them.
    pub fn wait_for(&self, within: Duration, done: impl Fn(&[String]) -> bool) -> Vec<String> {
        let deadline = Instant::now() + within;
        loop {
            let lines = self.received();
            if done(&lines) {
                return lines;
            }
            assert!(
                Instant::now() < deadline,
                "statsd did not receive what was expected within {within:?}; it got:\n{}",
                lines.join("\n")
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for StatsdDaemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
