//! Black-box tests of the `sluice` binary itself, as an operator runs it: what only `main`
//! does (flags and their `SLUICE_*` variables, `--help`, the `check-config` command, start-up
//! errors, SIGTERM, the log on stderr). Everything behind `main` runs in process in the other
//! suites; the binary's other black-box suites are `migration` (envoyproxy/ratelimit's
//! environment), `reload` (the reload log), `redis_tls_auth` (passwords from a file or the
//! environment, never logged), `soak` (two processes, their memory) and `observability`.

use crate::helpers;

use std::ffi::OsStr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use helpers::process::run_sluice;
use helpers::{RedisServer, Sluice, descriptor, fixture, http_request, request};
use sluice::proto::envoy::service::ratelimit::v3::rate_limit_response::Code;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

fn limits() -> PathBuf {
    fixture("e2e/limits")
}

#[test]
fn check_config_accepts_good_and_rejects_bad() {
    let ok = run_sluice([OsStr::new("check-config"), limits().as_os_str()], &[]);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert!(String::from_utf8_lossy(&ok.stdout).contains("edge"));

    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 1\n",
    )
    .unwrap();
    let out = run_sluice([OsStr::new("check-config"), bad.as_os_str()], &[]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("bad.yaml"), "{stderr}");
    assert!(stderr.contains("fortnight"), "{stderr}");
}

/// `serve` with ephemeral ports and `extra` arguments, run to its (start-up error) exit.
fn serve_fails(extra: &[&str]) -> String {
    let mut args = vec![
        "serve",
        "--grpc-addr",
        "127.0.0.1:0",
        "--admin-addr",
        "127.0.0.1:0",
    ];
    args.extend_from_slice(extra);
    let out = run_sluice(&args, &[]);
    assert!(!out.status.success(), "serve {extra:?} started");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn serve_refuses_a_bad_config() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("x.yaml"), "domain: [unclosed\n").unwrap();
    let stderr = serve_fails(&["--config", dir.path().to_str().unwrap()]);
    assert!(stderr.contains("x.yaml"), "{stderr}");
}

/// `host:port` is the first thing a newcomer types: the error says what is wrong and what
/// works, and the process exits at once instead of serving without its backend.
#[test]
fn a_redis_url_without_scheme_is_refused_naming_the_accepted_forms() {
    let config = limits();
    let stderr = serve_fails(&[
        "--config",
        config.to_str().unwrap(),
        "--redis-url",
        "localhost:6379",
    ]);
    assert!(stderr.contains("the scheme is missing"), "{stderr}");
    for form in [
        "redis://",
        "rediss://",
        "redis+cluster://",
        "rediss+cluster://",
    ] {
        assert!(stderr.contains(form), "{form} not shown: {stderr}");
    }
    assert!(!stderr.contains("backend unavailable"), "{stderr}");
}

/// The limits come from files or from an xDS server: exactly one, each mistake named.
#[test]
fn the_config_source_is_files_or_xds_and_its_flags_are_checked() {
    let config = limits();
    let config = config.to_str().unwrap();
    let cases: [(&[&str], &str); 5] = [
        (
            &[],
            "no config source: give --config PATH (a limits file or directory) or --config-xds \
             URL (an xDS management server)",
        ),
        (
            &["--config", config, "--config-xds", "http://127.0.0.1:1"],
            "--config and --config-xds are exclusive",
        ),
        (
            &["--config", config, "--force-start-without-initial-config"],
            "--force-start-without-initial-config applies to --config-xds only",
        ),
        (
            &["--config-xds", "envoy-gateway:18001"],
            "--config-xds `envoy-gateway:18001`: the scheme must be http:// (plaintext) or \
             https:// (TLS)",
        ),
        (
            &[
                "--config-xds",
                "https://envoy-gateway:18001",
                "--config-xds-client-cert",
                "/certs/tls.crt",
            ],
            "--config-xds-client-cert and --config-xds-client-key go together",
        ),
    ];
    for (args, expected) in cases {
        let stderr = serve_fails(args);
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
}

/// `serve --help` names every endpoint of the admin port, and each one answers there (a path
/// the server does not serve answers 404, so a stale list cannot pass).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn help_names_every_admin_endpoint_and_each_answers() {
    let out = run_sluice(["serve", "--help"], &[]);
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    let admin = help
        .split("--admin-addr")
        .nth(1)
        .and_then(|rest| rest.split("\n      --").next())
        .expect("--admin-addr in serve --help");
    let mut named: Vec<&str> = admin
        .split(|c: char| c.is_whitespace() || c == ',' || c == ':')
        .filter(|w| w.starts_with('/') && w.len() > 1)
        .collect();
    named.sort_unstable();
    assert_eq!(
        named,
        ["/healthz", "/json", "/metrics", "/readyz", "/rlconfig"],
        "{admin}"
    );

    let sluice = Sluice::start(&limits(), None);
    assert_eq!(
        http_request(sluice.admin_addr, "GET", "/nothing-here", "").0,
        404
    );
    for path in named {
        let method = if path == "/json" { "POST" } else { "GET" };
        let (status, body) = http_request(
            sluice.admin_addr,
            method,
            path,
            r#"{"domain":"edge","descriptors":[{"entries":[{"key":"user","value":"u"}]}]}"#,
        );
        assert_eq!(status, 200, "{method} {path}: {body}");
    }
}

/// Every flag can come from its `SLUICE_*` variable (shown with one input limit).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flags_also_come_from_sluice_variables() {
    let sluice = Sluice::start_with_env(&limits(), None, &[], &[("SLUICE_MAX_HITS_ADDEND", "10")]);
    let mut req = request("edge", vec![descriptor(&[("user", "env")])]);
    req.hits_addend = 11;
    let err = sluice
        .client()
        .await
        .should_rate_limit(req)
        .await
        .expect_err("over the limit from the environment");
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    assert_eq!(
        err.message(),
        "hits_addend: 11 exceeds --max-hits-addend 10"
    );
}

/// Kubernetes stops a pod with SIGTERM: the process says so, lets the call in flight finish
/// with its answer, then exits 0. The call is held in flight by a SIGSTOPped Redis, so it is
/// provably still running when the signal arrives and while the process drains; the failure
/// policy `allow` makes its answer OK whether Redis decides it after SIGCONT or redis-rs gives
/// up on the paused server first (its response timeout is 1 s; the deadline here is longer), so
/// anything but OK means the call was cut, not drained.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_the_call_in_flight_and_exits_zero() {
    let redis = RedisServer::start();
    let mut sluice = Sluice::start_with(
        &limits(),
        Some(&redis.url()),
        &[
            "--backend-timeout-ms",
            "5000",
            "--on-backend-error",
            "allow",
        ],
    );
    let mut client = sluice.client().await;
    let resp = client
        .should_rate_limit(request("edge", vec![descriptor(&[("user", "term")])]))
        .await
        .expect("served before SIGTERM")
        .into_inner();
    assert_eq!(resp.overall_code, Code::Ok as i32);
    assert_eq!(resp.statuses[0].limit_remaining, 4, "decided by Redis");
    let mut health = HealthClient::new(sluice.channel().await);
    let status = health
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .expect("health check")
        .into_inner()
        .status;
    assert_eq!(status, ServingStatus::Serving as i32);
    drop(health);

    redis.pause();
    let in_flight = tokio::spawn(async move {
        client
            .should_rate_limit(request("edge", vec![descriptor(&[("user", "drained")])]))
            .await
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !in_flight.is_finished(),
        "the paused Redis did not hold the call"
    );
    sluice.signal_term();
    let asked = Instant::now();
    while !sluice.log_text().contains("shutdown requested") {
        assert!(
            asked.elapsed() < Duration::from_secs(10),
            "no shutdown logged: {}",
            sluice.log_text()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Draining: the process waits for the call, which waits for Redis.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(sluice.is_running(), "exited with a call in flight");
    redis.resume();
    let answer = tokio::time::timeout(Duration::from_secs(10), in_flight)
        .await
        .expect("the drained call was answered within 10 s")
        .expect("call task")
        .expect("the call in flight got its answer, not a cut stream")
        .into_inner();
    assert_eq!(answer.overall_code, Code::Ok as i32);
    let status = sluice.wait_exit();
    assert!(status.success(), "exit status {status:?}");
    let log = sluice.log_text();
    assert!(log.contains("stopped"), "{log}");
}

/// Never a silent fallback, for sluice's own flags: a Redis-only setting without a Redis URL,
/// or one the URL cannot use, stops start-up naming it (docs/redis.md).
#[test]
fn redis_settings_that_cannot_be_honoured_stop_start_up() {
    let config = limits();
    let config = config.to_str().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty-password");
    std::fs::write(&empty, "\n").unwrap();
    let empty = empty.to_str().unwrap();
    let serve = |extra: &[&str], env: &[(&str, &str)]| -> String {
        let mut args = vec![
            "serve",
            "--config",
            config,
            "--grpc-addr",
            "127.0.0.1:0",
            "--admin-addr",
            "127.0.0.1:0",
        ];
        args.extend_from_slice(extra);
        let out = run_sluice(&args, env);
        let log = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!out.status.success(), "{extra:?} {env:?} started:\n{log}");
        assert!(!log.contains("listening"), "{extra:?} {env:?}:\n{log}");
        log
    };
    type Vars<'a> = &'a [(&'a str, &'a str)];
    let cases: &[(&[&str], Vars, &str)] = &[
        (
            &["--redis-password-file", empty],
            &[],
            "--redis-password-file (SLUICE_REDIS_PASSWORD_FILE) given but no Redis URL",
        ),
        (
            &[],
            &[
                ("SLUICE_REDIS_POOL_SIZE", "4"),
                ("SLUICE_REDIS_PASSWORD", "pw"),
            ],
            "--redis-pool-size (SLUICE_REDIS_POOL_SIZE), SLUICE_REDIS_PASSWORD given but no \
             Redis URL",
        ),
        (
            &[
                "--redis-url",
                "redis://127.0.0.1:1",
                "--redis-password-file",
                empty,
            ],
            &[],
            "is empty",
        ),
        (
            &[
                "--redis-url",
                "rediss://127.0.0.1:1",
                "--redis-tls-cert",
                empty,
            ],
            &[],
            "--redis-tls-cert without --redis-tls-key",
        ),
        (
            &[
                "--redis-url",
                "redis://127.0.0.1:1",
                "--redis-ca-file",
                empty,
            ],
            &[],
            "--redis-ca-file is given but the Redis URL redis://127.0.0.1:1 does not use TLS",
        ),
        (
            &[
                "--redis-url",
                "rediss://127.0.0.1:1",
                "--redis-ca-file",
                empty,
            ],
            &[],
            "empty-password: holds no CERTIFICATE block",
        ),
        (
            &[
                "--redis-url",
                "redis+cluster://127.0.0.1:1",
                "--redis-wait-replicas",
                "1",
            ],
            &[],
            "--redis-wait-replicas applies to one Redis or a Sentinel primary",
        ),
        (
            &[
                "--redis-url",
                "redis://127.0.0.1:1",
                "--redis-sentinel-user",
                "s",
            ],
            &[],
            "a sentinel user or password is given but the Redis URL redis://127.0.0.1:1 names \
             no sentinels",
        ),
        (
            &["--redis-url", "redis+sentinel://127.0.0.1:1"],
            &[],
            "the master name is missing",
        ),
    ];
    for (extra, env, message) in cases {
        let log = serve(extra, env);
        assert!(
            log.contains(message),
            "{extra:?} {env:?}: {message:?} not in:\n{log}"
        );
    }
}

/// `sluice explain --bucket`: the session docs/cli.md shows is what the binary prints, on the
/// example limits.
#[test]
fn explain_of_a_bucket_is_what_the_manual_shows() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let manual = std::fs::read_to_string(root.join("docs/cli.md")).unwrap();
    let prompt =
        "$ sluice explain --config examples/limits --domain edge --bucket generic_key=demo\n";
    let start = manual
        .find(prompt)
        .expect("docs/cli.md shows the bucket session")
        + prompt.len();
    let shown = &manual[start..start + manual[start..].find("```").unwrap()];
    let config = root.join("examples/limits");
    let out = run_sluice(
        [
            OsStr::new("explain"),
            OsStr::new("--config"),
            config.as_os_str(),
            OsStr::new("--domain"),
            OsStr::new("edge"),
            OsStr::new("--bucket"),
            OsStr::new("generic_key=demo"),
        ],
        &[],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), shown);
}
