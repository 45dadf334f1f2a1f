//! The drop-in promise, end to end: a config directory written for envoyproxy/ratelimit and
//! that service's environment variables start sluice with no sluice flag at all, and a table of
//! requests gets the expected code, limit and remaining over gRPC and over `/json`.
//!
//! Black-box (the built binary): the variables are translated by `main` before its flags are
//! parsed, and what it logs about them is part of the promise.

mod upstream;

use crate::helpers;

use std::path::PathBuf;

use helpers::RedisServer;
use helpers::process::run_sluice;
use helpers::{Sluice, descriptor, http_get, http_request, request};
use sluice::proto::envoy::service::ratelimit::v3::rate_limit_response::Code;

/// One expected status: code, requests_per_unit (None: no current_limit), remaining.
type Expect = (Code, Option<u32>, u32);

struct Row {
    domain: &'static str,
    descriptors: &'static [&'static [(&'static str, &'static str)]],
    overall: Code,
    statuses: &'static [Expect],
}

const OK: Code = Code::Ok;
const OVER: Code = Code::OverLimit;

/// Sent in order; the rows depend on the ones before them (shared windows).
const TABLE: &[Row] = &[
    // Nested descriptor with a name.
    Row {
        domain: "rl",
        descriptors: &[&[
            ("source_cluster", "proxy"),
            ("destination_cluster", "bkthomps"),
        ]],
        overall: OK,
        statuses: &[(OK, Some(2), 1)],
    },
    Row {
        domain: "rl",
        descriptors: &[&[
            ("source_cluster", "proxy"),
            ("destination_cluster", "bkthomps"),
        ]],
        overall: OK,
        statuses: &[(OK, Some(2), 0)],
    },
    Row {
        domain: "rl",
        descriptors: &[&[
            ("source_cluster", "proxy"),
            ("destination_cluster", "bkthomps"),
        ]],
        overall: OVER,
        statuses: &[(OVER, Some(2), 0)],
    },
    // `category=account` replaces `bkthomps` in the same request.
    Row {
        domain: "rl",
        descriptors: &[
            &[("category", "account")],
            &[
                ("source_cluster", "proxy"),
                ("destination_cluster", "bkthomps"),
            ],
        ],
        overall: OK,
        statuses: &[(OK, Some(4), 3), (OK, None, 0)],
    },
    // The nested limit applies only at the last entry: the parent alone has none.
    Row {
        domain: "rl",
        descriptors: &[&[("source_cluster", "proxy")]],
        overall: OK,
        statuses: &[(OK, None, 0)],
    },
    // Exact beats key-only; a value without limit whitelists.
    Row {
        domain: "rl",
        descriptors: &[&[("foo", "bar")]],
        overall: OK,
        statuses: &[(OK, Some(3), 2)],
    },
    Row {
        domain: "rl",
        descriptors: &[&[("foo", "baz")]],
        overall: OK,
        statuses: &[(OK, Some(2), 1)],
    },
    Row {
        domain: "rl",
        descriptors: &[&[("foo", "bar2")]],
        overall: OK,
        statuses: &[(OK, None, 0)],
    },
    // share_threshold: every /foo/* value spends one counter.
    Row {
        domain: "rl",
        descriptors: &[&[("path", "/foo/a")]],
        overall: OK,
        statuses: &[(OK, Some(2), 1)],
    },
    Row {
        domain: "rl",
        descriptors: &[&[("path", "/foo/b")]],
        overall: OK,
        statuses: &[(OK, Some(2), 0)],
    },
    Row {
        domain: "rl",
        descriptors: &[&[("path", "/foo/c")]],
        overall: OVER,
        statuses: &[(OVER, Some(2), 0)],
    },
    // Without it, one counter per value.
    Row {
        domain: "rl",
        descriptors: &[&[("path", "/bar/a")]],
        overall: OK,
        statuses: &[(OK, Some(1), 0)],
    },
    Row {
        domain: "rl",
        descriptors: &[&[("path", "/bar/b")]],
        overall: OK,
        statuses: &[(OK, Some(1), 0)],
    },
    // Shadow mode: over the limit of 1, still OK.
    Row {
        domain: "rl",
        descriptors: &[&[("shadow", "s")]],
        overall: OK,
        statuses: &[(OK, Some(1), 0)],
    },
    Row {
        domain: "rl",
        descriptors: &[&[("shadow", "s")]],
        overall: OK,
        statuses: &[(OK, Some(1), 0)],
    },
    // quota_mode: tenant over (its status says so), team still has room: admitted; both
    // over: rejected.
    Row {
        domain: "rl",
        descriptors: &[&[("tenant_quota", "t1")], &[("team_quota", "x")]],
        overall: OK,
        statuses: &[(OK, Some(1), 0), (OK, Some(2), 1)],
    },
    Row {
        domain: "rl",
        descriptors: &[&[("tenant_quota", "t1")], &[("team_quota", "x")]],
        overall: OK,
        statuses: &[(OVER, Some(1), 0), (OK, Some(2), 0)],
    },
    Row {
        domain: "rl",
        descriptors: &[&[("tenant_quota", "t1")], &[("team_quota", "x")]],
        overall: OVER,
        statuses: &[(OVER, Some(1), 0), (OVER, Some(2), 0)],
    },
    // Second domain from a second file.
    Row {
        domain: "mongo_cps",
        descriptors: &[&[("database", "users")]],
        overall: OK,
        statuses: &[(OK, Some(500), 499)],
    },
    // Unknown domain: OK without a limit.
    Row {
        domain: "nope",
        descriptors: &[&[("foo", "bar")]],
        overall: OK,
        statuses: &[(OK, None, 0)],
    },
];

fn runtime_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/migration")
}

fn start(redis: &RedisServer) -> Sluice {
    let root = runtime_root();
    let redis_url = format!("127.0.0.1:{}", redis.port());
    Sluice::start_env_only(&[
        ("RUNTIME_ROOT", root.to_str().expect("utf-8 path")),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ("RUNTIME_WATCH_ROOT", "false"),
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_TYPE", "single"),
        ("REDIS_URL", &redis_url),
        ("REDIS_POOL_SIZE", "4"),
        ("GRPC_HOST", "127.0.0.1"),
        ("GRPC_PORT", "0"),
        ("HOST", "127.0.0.1"),
        ("PORT", "0"),
        ("NEAR_LIMIT_RATIO", "0.9"),
        ("LOCAL_CACHE_SIZE_IN_BYTES", "1048576"),
        // A sink sluice does not have: reported, not silently dropped.
        ("USE_DOG_STATSD", "true"),
    ])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoyproxy_config_and_environment_serve_unchanged() {
    let redis = RedisServer::start();
    let sluice = start(&redis);
    let log = sluice.log_text();
    assert!(
        log.contains("backend: redis"),
        "REDIS_URL was not applied:\n{log}"
    );
    assert!(
        log.contains("USE_DOG_STATSD is not supported"),
        "an unsupported variable must be reported:\n{log}"
    );
    assert!(sluice.grpc_addr.ip().is_loopback() && sluice.admin_addr.ip().is_loopback());

    let mut client = sluice.client().await;
    for (i, row) in TABLE.iter().enumerate() {
        let req = request(
            row.domain,
            row.descriptors.iter().map(|d| descriptor(d)).collect(),
        );
        let resp = client
            .should_rate_limit(req)
            .await
            .unwrap_or_else(|e| panic!("row {i}: {e}"))
            .into_inner();
        assert_eq!(resp.overall_code, row.overall as i32, "row {i}: {resp:?}");
        assert_eq!(resp.statuses.len(), row.statuses.len(), "row {i}");
        for (j, (status, (code, rpu, remaining))) in
            resp.statuses.iter().zip(row.statuses).enumerate()
        {
            assert_eq!(status.code, *code as i32, "row {i} status {j}: {status:?}");
            assert_eq!(
                status.current_limit.as_ref().map(|l| l.requests_per_unit),
                *rpu,
                "row {i} status {j}"
            );
            assert_eq!(status.limit_remaining, *remaining, "row {i} status {j}");
        }
    }

    // The same service over envoyproxy/ratelimit's HTTP face on PORT.
    let body = r#"{"domain":"rl","descriptors":[{"entries":[{"key":"foo","value":"qux"}]}]}"#;
    for (status, remaining) in [(200, Some(1)), (200, None), (429, None)] {
        let (code, text) = http_request(sluice.admin_addr, "POST", "/json", body);
        assert_eq!(code, status, "{text}");
        let json: serde_json::Value = serde_json::from_str(&text).expect("JSON");
        assert_eq!(json["statuses"][0]["currentLimit"]["requestsPerUnit"], 2);
        assert_eq!(
            json["statuses"][0]["limitRemaining"].as_u64(),
            remaining,
            "{text}"
        );
    }
    let (code, rules) = http_request(sluice.admin_addr, "POST", "/rlconfig", "");
    assert_eq!(code, 405, "rlconfig is GET-only");
    let (code, rules_get) = http_get(sluice.admin_addr, "/rlconfig");
    assert_eq!(code, 200, "{rules}");
    assert!(
        rules_get.contains("rl.source_cluster_proxy.destination_cluster_bkthomps: unit=MINUTE requests_per_unit=2, name=bkthomps"),
        "{rules_get}"
    );
    assert!(rules_get.contains("mongo_cps.database_users: unit=SECOND requests_per_unit=500"));
}

/// envoyproxy/ratelimit's environment (the fixture's config, ephemeral loopback ports) plus
/// `vars`, run to its exit: sluice must refuse to start, and its log says why.
fn refused(vars: &[(&str, &str)]) -> String {
    let root = runtime_root();
    let mut env = vec![
        ("RUNTIME_ROOT", root.to_str().expect("utf-8 path")),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ("GRPC_HOST", "127.0.0.1"),
        ("GRPC_PORT", "0"),
        ("HOST", "127.0.0.1"),
        ("PORT", "0"),
    ];
    env.extend_from_slice(vars);
    let out = run_sluice(["serve"], &env);
    let log = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{vars:?} started:\n{log}");
    assert!(!log.contains("listening"), "{vars:?} listened:\n{log}");
    log
}

/// Never a silent fallback: every backend setting that cannot be honoured stops start-up with
/// an error naming it (docs/migration.md). Only the absence of every backend variable selects
/// the memory backend.
#[test]
fn backend_settings_that_cannot_be_honoured_stop_start_up() {
    type Vars = &'static [(&'static str, &'static str)];
    let cases: &[(Vars, &[&str])] = &[
        (
            &[
                ("REDIS_TYPE", "replicated"),
                ("REDIS_URL", "127.0.0.1:6379"),
            ],
            &["REDIS_TYPE=replicated is not supported (single, cluster or sentinel)"],
        ),
        (
            &[
                ("BACKEND_TYPE", "memcache"),
                ("MEMCACHE_HOST_PORT", "m:11211"),
            ],
            &[
                "BACKEND_TYPE=memcache is not supported",
                "MEMCACHE_HOST_PORT is set",
            ],
        ),
        (
            &[("REDIS_AUTH", "pw"), ("REDIS_TLS", "true")],
            &["REDIS_AUTH, REDIS_TLS set but REDIS_URL is not"],
        ),
        (
            &[("BACKEND_TYPE", "redis")],
            &["BACKEND_TYPE set but REDIS_URL is not"],
        ),
        (
            &[("REDIS_TYPE", "sentinel"), ("REDIS_URL", "127.0.0.1:26379")],
            &["REDIS_TYPE=sentinel expects REDIS_URL=master-name,host1:port1"],
        ),
        (
            &[("REDIS_URL", "127.0.0.1:notaport")],
            &["invalid Redis URL redis://127.0.0.1:notaport"],
        ),
        (
            &[
                ("REDIS_URL", "127.0.0.1:6379"),
                ("REDIS_TLS", "true"),
                ("REDIS_TLS_CACERT", "/nonexistent/ca.crt"),
            ],
            &["reading --redis-ca-file /nonexistent/ca.crt"],
        ),
        (
            &[
                ("REDIS_URL", "127.0.0.1:6379"),
                ("REDIS_TLS", "true"),
                ("REDIS_TLS_CLIENT_CERT", "/nonexistent/client.crt"),
                ("REDIS_TLS_CLIENT_KEY", "/nonexistent/client.key"),
            ],
            &["reading --redis-tls-cert /nonexistent/client.crt"],
        ),
        (
            &[
                ("REDIS_URL", "127.0.0.1:6379"),
                ("REDIS_TLS", "true"),
                ("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "true"),
            ],
            &["REDIS_TLS_SKIP_HOSTNAME_VERIFICATION=true is not supported"],
        ),
    ];
    for (vars, messages) in cases {
        let log = refused(vars);
        for message in *messages {
            assert!(
                log.contains(message),
                "{vars:?}: {message:?} not in:\n{log}"
            );
        }
        assert!(
            !log.contains("backend: embedded memory"),
            "{vars:?}:\n{log}"
        );
    }
}
