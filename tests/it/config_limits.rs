//! A config path that is hostile or just large: a FIFO, a link to `/dev/zero`, a file over
//! `--max-config-bytes`, and YAML past the parser's limits. Each is refused at once with an error
//! that says what is wrong (and, for a limit, the flag that raises it), the previous config keeps
//! serving, and shutdown never waits on the watcher. Every wait here is bounded.

use crate::helpers;

use std::path::Path;
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use helpers::Sluice;
use helpers::process::run_sluice;
use sluice::config::{Config, ConfigLimits, LoadOptions};
use sluice::decision::Engine;
use sluice::limiter::SystemClock;
use sluice::limiter::memory::MemoryLimiter;
use sluice::reload::{Poll, ReloadError, Reloader};

fn limits(rpu: u32) -> String {
    format!(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {{unit: minute, requests_per_unit: {rpu}}}\n"
    )
}

/// One anchor used by `aliases` descriptors.
fn anchored(aliases: usize) -> String {
    let mut yaml = String::from(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: &std {unit: minute, requests_per_unit: 5}\n",
    );
    for i in 0..aliases {
        yaml.push_str(&format!("  - key: k{i}\n    rate_limit: *std\n"));
    }
    yaml
}

fn mkfifo(path: &Path) {
    let status = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .expect("run mkfifo");
    assert!(status.success(), "mkfifo {}", path.display());
}

/// A plain config file with `limits(3)` and a reloader watching it with `options`.
fn watched(options: LoadOptions) -> (tempfile::TempDir, std::path::PathBuf, Arc<Engine>, Reloader) {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("d.yaml");
    std::fs::write(&file, limits(3)).expect("write config");
    let engine = Arc::new(Engine::new(
        Config::load(&file).expect("valid config"),
        Arc::new(MemoryLimiter::new(Arc::new(SystemClock))),
    ));
    let reloader = Reloader::new(file.clone(), engine.clone()).with_options(options);
    (dir, file, engine, reloader)
}

/// One poll, on a thread of its own: panics if it takes more than 5 s (a blocked or endless
/// read), instead of hanging the test.
fn poll_within_5s(reloader: Reloader) -> (Reloader, Poll) {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut reloader = reloader;
        let poll = reloader.poll();
        let _ = tx.send((reloader, poll));
    });
    rx.recv_timeout(Duration::from_secs(5))
        .expect("the reload poll did not finish within 5 s")
}

fn served_limit(engine: &Engine) -> Option<String> {
    engine.config().describe().lines().next().map(str::to_owned)
}

/// Polls once and expects a rejection whose text contains `expected`, the old config kept.
fn expect_refused(reloader: Reloader, engine: &Engine, expected: &str) -> Reloader {
    let before = served_limit(engine);
    let (reloader, poll) = poll_within_5s(reloader);
    match poll {
        Poll::Rejected(ReloadError::Invalid(errors)) => {
            let text = errors.to_string();
            assert!(text.contains(expected), "{text}");
        }
        other => panic!("expected a rejection naming `{expected}`, got {other:?}"),
    }
    assert_eq!(served_limit(engine), before, "the old config keeps serving");
    reloader
}

#[test]
fn a_fifo_at_the_config_path_is_refused_at_once() {
    let (_dir, file, engine, reloader) = watched(LoadOptions::default());
    std::fs::remove_file(&file).expect("remove");
    mkfifo(&file);
    let reloader = expect_refused(reloader, &engine, "not a regular file (a FIFO)");
    // The watcher is not stuck: a regular file again is loaded by the next poll.
    std::fs::remove_file(&file).expect("remove");
    std::fs::write(&file, limits(7)).expect("write");
    let (_, poll) = poll_within_5s(reloader);
    assert!(matches!(poll, Poll::Reloaded { .. }), "{poll:?}");
    assert!(
        served_limit(&engine).is_some_and(|l| l.contains("requests_per_unit=7")),
        "{:?}",
        served_limit(&engine)
    );
}

#[test]
fn a_link_to_dev_zero_is_refused_at_once() {
    let (_dir, file, engine, reloader) = watched(LoadOptions::default());
    std::fs::remove_file(&file).expect("remove");
    std::os::unix::fs::symlink("/dev/zero", &file).expect("symlink");
    expect_refused(reloader, &engine, "not a regular file (a character device)");
}

#[test]
fn a_config_over_max_config_bytes_is_refused_naming_the_flag() {
    let options = LoadOptions {
        limits: ConfigLimits {
            max_bytes: 4096,
            ..ConfigLimits::default()
        },
        ..LoadOptions::default()
    };
    let (_dir, file, engine, reloader) = watched(options);
    let mut big = limits(9);
    big.push_str(&format!("# {}\n", "x".repeat(8192)));
    std::fs::write(&file, big).expect("write");
    expect_refused(reloader, &engine, "larger than --max-config-bytes 4096");
    // And at start-up, with check-config's flag.
    let out = run_sluice(
        ["check-config", "--max-config-bytes", "4096"]
            .iter()
            .map(std::ffi::OsStr::new)
            .chain([file.as_os_str()]),
        &[],
    );
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("larger than --max-config-bytes 4096"),
        "{stderr}"
    );
}

/// The binary watching its config every 100 ms: the file becomes a FIFO, the watcher reports
/// it (the old config serving meanwhile), and SIGTERM ends the process within 10 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_exits_promptly_with_a_fifo_at_the_config_path() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("d.yaml");
    std::fs::write(&file, limits(3)).expect("write config");
    let mut sluice = Sluice::start_with(&file, None, &["--watch-interval-ms", "100"]);
    std::fs::remove_file(&file).expect("remove");
    mkfifo(&file);
    let deadline = Instant::now() + Duration::from_secs(5);
    while !sluice.log_text().contains("not a regular file (a FIFO)") {
        assert!(
            Instant::now() < deadline,
            "the FIFO was not reported:\n{}",
            sluice.log_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut client = sluice.client().await;
    let reply = client
        .should_rate_limit(helpers::request(
            "d",
            vec![helpers::descriptor(&[("k", "v")])],
        ))
        .await
        .expect("still serving")
        .into_inner();
    assert_eq!(reply.statuses[0].limit_remaining, 2, "the old limit of 3");

    let signalled = Instant::now();
    let status = std::process::Command::new("kill")
        .args(["-TERM", &sluice.pid().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    while sluice.is_running() {
        assert!(
            signalled.elapsed() < Duration::from_secs(10),
            "sluice did not exit within 10 s of SIGTERM:\n{}",
            sluice.log_text()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `check-config` names each YAML limit and its flag, and the flag raises it.
#[test]
fn each_yaml_limit_is_named_with_its_flag_and_raised_by_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let check = |file: &Path, flags: &[&str]| {
        let out = run_sluice(
            ["check-config"]
                .iter()
                .chain(flags)
                .map(std::ffi::OsStr::new)
                .chain([file.as_os_str()]),
            &[],
        );
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    };

    // 60 descriptors of about 10 nodes each.
    let nodes = dir.path().join("nodes.yaml");
    let mut yaml = String::from("domain: d\ndescriptors:\n");
    for i in 0..60 {
        yaml.push_str(&format!(
            "  - key: k\n    value: v{i}\n    rate_limit: {{unit: minute, requests_per_unit: 5}}\n"
        ));
    }
    std::fs::write(&nodes, yaml).expect("write");
    let (ok, text) = check(&nodes, &["--max-yaml-nodes", "300"]);
    assert!(!ok, "{text}");
    assert!(
        text.contains("YAML node limit exceeded: 301 nodes")
            && text.contains("of at most 300; raise with --max-yaml-nodes"),
        "{text}"
    );
    assert!(!text.contains("malformed"), "{text}");
    let (ok, text) = check(&nodes, &[]);
    assert!(ok, "{text}");

    // 20 levels of nested descriptors: 42 YAML levels.
    let deep = dir.path().join("deep.yaml");
    let mut yaml = String::from("domain: d\ndescriptors:\n");
    let mut pad = String::from("  ");
    for level in 0..20 {
        yaml.push_str(&format!("{pad}- key: k{level}\n{pad}  descriptors:\n"));
        pad.push_str("    ");
    }
    yaml.push_str(&format!(
        "{pad}- key: leaf\n{pad}  rate_limit: {{unit: minute, requests_per_unit: 5}}\n"
    ));
    std::fs::write(&deep, yaml).expect("write");
    let (ok, text) = check(&deep, &[]);
    assert!(!ok, "{text}");
    assert!(
        text.contains("YAML nesting limit exceeded: 33 levels of at most 32")
            && text.contains("raise with --max-yaml-depth"),
        "{text}"
    );
    let (ok, text) = check(&deep, &["--max-yaml-depth", "64"]);
    assert!(ok, "{text}");

    // One anchor used 150 times.
    let anchor = dir.path().join("anchor.yaml");
    std::fs::write(&anchor, anchored(150)).expect("write");
    let (ok, text) = check(&anchor, &[]);
    assert!(!ok, "{text}");
    assert!(
        text.contains(
            "YAML alias limit exceeded: 150 aliases of 1 anchor(s), at most 10 per anchor"
        ) && text.contains("raise with --max-yaml-aliases-per-anchor"),
        "{text}"
    );
    let (ok, text) = check(&anchor, &["--max-yaml-aliases-per-anchor", "200"]);
    assert!(ok, "{text}");

    // The billion-laughs file stays refused by the defaults, quickly.
    let laughs = dir.path().join("laughs.yaml");
    let mut yaml = String::from("domain: d\nx0: &a0 [lol,lol,lol,lol,lol,lol,lol,lol,lol,lol]\n");
    for i in 1..10 {
        let aliases = vec![format!("*a{}", i - 1); 10].join(",");
        yaml.push_str(&format!("x{i}: &a{i} [{aliases}]\n"));
    }
    yaml.push_str("descriptors: []\n");
    std::fs::write(&laughs, yaml).expect("write");
    let (ok, text) = check(&laughs, &[]);
    assert!(!ok, "{text}");
    assert!(text.contains("YAML node limit exceeded"), "{text}");
}

/// `serve` takes the same flags, at start-up and for every reload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_honours_the_yaml_limits_at_start_and_on_reload() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("d.yaml");
    std::fs::write(&file, anchored(150)).expect("write");
    let sluice = Sluice::start_with(
        &file,
        None,
        &[
            "--max-yaml-aliases-per-anchor",
            "200",
            "--watch-interval-ms",
            "100",
        ],
    );
    std::fs::write(&file, anchored(300)).expect("write");
    let deadline = Instant::now() + Duration::from_secs(5);
    while !sluice
        .log_text()
        .contains("300 aliases of 1 anchor(s), at most 200 per anchor")
    {
        assert!(
            Instant::now() < deadline,
            "the reload was not refused by the raised limit:\n{}",
            sluice.log_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    std::fs::write(&file, anchored(180)).expect("write");
    let deadline = Instant::now() + Duration::from_secs(5);
    while sluice.log_text().matches("config loaded").count() < 2 {
        assert!(
            Instant::now() < deadline,
            "180 aliases were not reloaded under the raised limit:\n{}",
            sluice.log_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
