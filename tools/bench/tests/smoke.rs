//! Smoke run of the load generator: it must keep working. No timing is asserted (figures depend
//! on the machine; scripts/bench/bench.sh prints them); only that both phases run, every request
//! is answered, and the JSON report the scripts read is complete. The target is the no-op RLS
//! server in a process of its own (`--serve-noop`), as scripts/bench/bench.sh starts it; the
//! run against sluice and Redis is `bash scripts/bench/bench.sh --smoke`, part of the test
//! command.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

const BENCH: &str = env!("CARGO_BIN_EXE_sluice-bench");

/// The `--serve-noop` process, killed when dropped.
struct Noop {
    child: Child,
    addr: String,
}

impl Noop {
    fn start() -> Noop {
        let mut child = Command::new(BENCH)
            .args(["--serve-noop", "127.0.0.1:0"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start sluice-bench --serve-noop");
        let stderr = child.stderr.take().expect("stderr is piped");
        let mut line = String::new();
        BufReader::new(stderr)
            .read_line(&mut line)
            .expect("read the no-op server's address");
        let addr = line
            .trim()
            .strip_prefix("no-op RLS server on ")
            .unwrap_or_else(|| panic!("unexpected first line: {line:?}"))
            .to_string();
        Noop { child, addr }
    }
}

impl Drop for Noop {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn both_phases_run_and_the_json_report_is_complete() {
    let noop = Noop::start();
    let out = Command::new(BENCH)
        .args(["--target", &noop.addr, "--ceiling", &noop.addr])
        .args([
            "--duration-secs",
            "0.5",
            "--concurrency",
            "8",
            "--connections",
            "2",
        ])
        .args(["--descriptor-keys", "endpoint,user", "--json"])
        .args(["--pid", &format!("noop={}", noop.child.id())])
        .output()
        .expect("run sluice-bench");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON report");
    let phases = report["phases"].as_array().expect("phases");
    assert_eq!(phases.len(), 2, "{report}");
    assert_eq!(phases[0]["name"], "noop");
    assert_eq!(phases[1]["name"], "target");
    for phase in phases {
        assert!(phase["requests"].as_u64().unwrap_or(0) > 0, "{phase}");
        assert_eq!(phase["errors"], 0, "{phase}");
        assert_eq!(
            phase["over_limit"], 0,
            "the no-op server admits all: {phase}"
        );
        assert!(phase["p99_ms"].as_f64().unwrap_or(0.0) > 0.0, "{phase}");
        // The scripts divide these by the requests: the generator's own and the --pid ones.
        assert!(phase["cpu_secs"]["sluice-bench"].is_number(), "{phase}");
        assert!(phase["cpu_secs"]["noop"].is_number(), "{phase}");
    }
    assert!(report["target_to_noop_ratio"].as_f64().unwrap_or(0.0) > 0.0);
}

#[test]
fn print_lua_script_prints_the_decision_script() {
    let out = Command::new(BENCH)
        .arg("--print-lua-script")
        .output()
        .expect("run sluice-bench");
    assert!(out.status.success());
    let script = String::from_utf8(out.stdout).expect("UTF-8");
    // scripts/bench/bench.sh and script-cost.sh load it with FUNCTION LOAD: it must be a
    // library that registers its function, reads the clock and touches sorted sets.
    assert!(script.starts_with("#!lua name=sluice_"), "{script}");
    assert!(script.contains("redis.register_function"), "{script}");
    assert!(script.contains("redis.call"), "{script}");
    assert!(script.contains("ZADD"), "{script}");
}
