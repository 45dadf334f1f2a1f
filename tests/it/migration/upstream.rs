//! envoyproxy/ratelimit's own tests, translated case by case into calls on sluice: its config
//! tests (`test/config/config_test.go`: which limit a descriptor gets, which files are refused),
//! its service tests (`test/service/ratelimit_test.go`: shadow and quota modes, unlimited,
//! response headers, dynamic metadata, errors) and its integration tests
//! (`test/integration/integration_test.go`: counts over many calls, shared thresholds, config
//! reloads). Where that service's tests mock its cache, the translation gives the config a real
//! limit and spends it with real calls, so the answer is the one the service gives, not the
//! mock's.
//!
//! Black-box: each group of cases starts the binary with envoyproxy/ratelimit's variables only
//! (`RUNTIME_ROOT` on a directory of `tests/fixtures/upstream`, the group's switches such as
//! `SHADOW_MODE` or `QUOTA_MODE`), on the memory backend and on Redis (`REDIS_URL`), and sends
//! the calls over gRPC. A case [`Agrees`](Agreement::Agrees) when its expected answers are
//! envoyproxy/ratelimit's; a case that [`Differs`](Agreement::Differs) asserts sluice's own
//! answer and names the sentence of docs/migration.md that says why
//! ([`every_difference_is_documented`] checks it is there). Each run prints its counts.

mod cases;

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::helpers;
use helpers::process::run_sluice;
use helpers::{RedisServer, Sluice, fixture};
use sluice::proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use sluice::proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use sluice::proto::envoy::service::ratelimit::v3::RateLimitRequest;
use sluice::proto::envoy::service::ratelimit::v3::rate_limit_response::Code;
use sluice::proto::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use sluice::proto::envoy::r#type::v3::RateLimitUnit;

/// Whether sluice answers a case as envoyproxy/ratelimit does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Agreement {
    Agrees,
    /// sluice's answer differs, for the reason docs/migration.md gives in this very text.
    Differs(&'static str),
}

/// One upstream case (an assertion block of one of its tests), translated.
pub struct Case {
    /// The upstream test and what it checks there.
    pub from: &'static str,
    pub calls: Vec<Call>,
    pub agreement: Agreement,
}

pub fn agrees(from: &'static str, calls: Vec<Call>) -> Case {
    Case {
        from,
        calls,
        agreement: Agreement::Agrees,
    }
}

pub fn differs(from: &'static str, why: &'static str, calls: Vec<Call>) -> Case {
    Case {
        from,
        calls,
        agreement: Agreement::Differs(why),
    }
}

/// The expected status of one descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// OK, no `current_limit`, 0 remaining.
    NoLimit,
    /// OK, no `current_limit`, 4294967295 remaining.
    Unlimited,
    Limit {
        code: Code,
        requests_per_unit: u32,
        unit: Unit,
        remaining: u32,
        name: &'static str,
    },
}

pub const NONE: Status = Status::NoLimit;
pub const UNLIMITED: Status = Status::Unlimited;

/// OK under a limit of `rpu` per `unit`, `remaining` left.
pub fn ok(rpu: u32, unit: Unit, remaining: u32) -> Status {
    Status::Limit {
        code: Code::Ok,
        requests_per_unit: rpu,
        unit,
        remaining,
        name: "",
    }
}

/// OVER_LIMIT under a limit of `rpu` per `unit` (nothing remaining).
pub fn over(rpu: u32, unit: Unit) -> Status {
    Status::Limit {
        code: Code::OverLimit,
        requests_per_unit: rpu,
        unit,
        remaining: 0,
        name: "",
    }
}

impl Status {
    /// The limit's `name`.
    pub fn named(self, limit_name: &'static str) -> Status {
        match self {
            Status::Limit {
                code,
                requests_per_unit,
                unit,
                remaining,
                ..
            } => Status::Limit {
                code,
                requests_per_unit,
                unit,
                remaining,
                name: limit_name,
            },
            other => other,
        }
    }
}

/// What a call must get.
#[derive(Debug)]
pub enum Expect {
    Answer {
        overall: Code,
        statuses: Vec<Status>,
        /// The response headers, in order; a value `*` matches any.
        headers: Option<Vec<(String, String)>>,
        /// The dynamic metadata as JSON, when checked.
        metadata: Option<serde_json::Value>,
    },
    Refused(tonic::Code),
}

/// One call and its expected answer.
pub struct Call {
    request: RateLimitRequest,
    expect: Expect,
}

/// A call on `domain` with one descriptor per list of `(key, value)` entries; its expected
/// answer is set by [`Call::ok`], [`Call::over`] or [`Call::refused`].
pub fn call(domain: &str, descriptors: &[&[(&str, &str)]]) -> Call {
    Call {
        request: RateLimitRequest {
            domain: domain.into(),
            descriptors: descriptors
                .iter()
                .map(|pairs| helpers::descriptor(pairs))
                .collect(),
            hits_addend: 0,
        },
        expect: Expect::Refused(tonic::Code::Unknown),
    }
}

impl Call {
    /// The request's `hits_addend`.
    pub fn hits(mut self, hits: u32) -> Call {
        self.request.hits_addend = hits;
        self
    }

    /// Descriptor `i` carries a `limit` override.
    pub fn limit(mut self, i: usize, requests_per_unit: u32, unit: RateLimitUnit) -> Call {
        self.descriptor(i).limit = Some(RateLimitOverride {
            requests_per_unit,
            unit: unit as i32,
        });
        self
    }

    fn descriptor(&mut self, i: usize) -> &mut RateLimitDescriptor {
        &mut self.request.descriptors[i]
    }

    fn answer(mut self, overall: Code, statuses: &[Status]) -> Call {
        self.expect = Expect::Answer {
            overall,
            statuses: statuses.to_vec(),
            headers: None,
            metadata: None,
        };
        self
    }

    /// Answered OK overall, with `statuses`.
    pub fn ok(self, statuses: &[Status]) -> Call {
        self.answer(Code::Ok, statuses)
    }

    /// Answered OVER_LIMIT overall, with `statuses`.
    pub fn over(self, statuses: &[Status]) -> Call {
        self.answer(Code::OverLimit, statuses)
    }

    /// Refused with `code`.
    pub fn refused(mut self, code: tonic::Code) -> Call {
        self.expect = Expect::Refused(code);
        self
    }

    /// With exactly these response headers (`*`: any value).
    pub fn headers(mut self, expected: &[(&str, &str)]) -> Call {
        if let Expect::Answer { headers, .. } = &mut self.expect {
            *headers = Some(
                expected
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            );
        }
        self
    }

    /// With exactly this dynamic metadata.
    pub fn metadata(mut self, expected: serde_json::Value) -> Call {
        if let Expect::Answer { metadata, .. } = &mut self.expect {
            *metadata = Some(expected);
        }
        self
    }
}

/// What one call got that it should not have, or `None`.
async fn check(
    client: &mut sluice::proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient<
        tonic::transport::Channel,
    >,
    call: &Call,
) -> Option<String> {
    let answer = client.should_rate_limit(call.request.clone()).await;
    let (overall, statuses, headers, metadata) = match &call.expect {
        Expect::Refused(code) => {
            return match answer {
                Err(status) if status.code() == *code => None,
                got => Some(format!("expected {code:?}, got {got:?}")),
            };
        }
        Expect::Answer {
            overall,
            statuses,
            headers,
            metadata,
        } => (*overall, statuses, headers, metadata),
    };
    let response = match answer {
        Ok(response) => response.into_inner(),
        Err(status) => return Some(format!("expected {overall:?}, got {status:?}")),
    };
    if response.overall_code != overall as i32 || response.statuses.len() != statuses.len() {
        return Some(format!(
            "expected {overall:?} {statuses:?}, got {response:?}"
        ));
    }
    for (i, (got, want)) in response.statuses.iter().zip(statuses).enumerate() {
        let (code, limit, remaining, name) = match *want {
            Status::NoLimit => (Code::Ok, None, 0, ""),
            Status::Unlimited => (Code::Ok, None, u32::MAX, ""),
            Status::Limit {
                code,
                requests_per_unit,
                unit,
                remaining,
                name,
            } => (
                code,
                Some((requests_per_unit, unit as i32)),
                remaining,
                name,
            ),
        };
        let got_limit = got
            .current_limit
            .as_ref()
            .map(|l| (l.requests_per_unit, l.unit));
        let got_name = got.current_limit.as_ref().map_or("", |l| l.name.as_str());
        if got.code != code as i32
            || got_limit != limit
            || got.limit_remaining != remaining
            || got_name != name
        {
            return Some(format!("status {i}: expected {want:?}, got {got:?}"));
        }
    }
    if let Some(want) = headers {
        let got: Vec<(String, String)> = response
            .response_headers_to_add
            .iter()
            .map(|h| (h.key.clone(), h.value.clone()))
            .collect();
        let matches = got.len() == want.len()
            && got
                .iter()
                .zip(want)
                .all(|(g, w)| g.0 == w.0 && (w.1 == "*" || g.1 == w.1));
        if !matches {
            return Some(format!("headers: expected {want:?}, got {got:?}"));
        }
    }
    if let Some(want) = metadata {
        let got = response
            .dynamic_metadata
            .as_ref()
            .map(|m| serde_json::Value::Object(sluice::metadata::struct_to_json(m)));
        if got.as_ref() != Some(want) {
            return Some(format!("dynamic metadata: expected {want}, got {got:?}"));
        }
    }
    None
}

/// Where a group's config lives and how envoyproxy/ratelimit's environment sets it up.
pub struct Group {
    pub name: &'static str,
    /// A directory of `tests/fixtures/upstream`.
    pub dir: &'static str,
    /// The group's own variables, beside the config directory and the ports.
    pub env: &'static [(&'static str, &'static str)],
    pub cases: fn() -> Vec<Case>,
}

/// The backends a group runs on.
#[derive(Debug, Clone, Copy)]
enum Backend {
    Memory,
    Redis,
    /// Redis with envoyproxy/ratelimit's local cache and a key prefix, as its integration tests
    /// also run.
    RedisCachePrefix,
}

/// envoyproxy/ratelimit's environment for `dir` (its `RUNTIME_ROOT`, subdirectory and app
/// directory), ephemeral loopback ports, and `extra`.
fn environment(dir: &Path, extra: &[(&str, String)]) -> Vec<(String, String)> {
    let root = dir.parent().expect("a fixture directory's parent");
    let sub = dir.file_name().expect("a directory name");
    let mut env: Vec<(String, String)> = vec![
        ("RUNTIME_ROOT".into(), root.display().to_string()),
        ("RUNTIME_SUBDIRECTORY".into(), sub.to_string_lossy().into()),
        ("RUNTIME_APPDIRECTORY".into(), ".".into()),
        ("GRPC_HOST".into(), "127.0.0.1".into()),
        ("GRPC_PORT".into(), "0".into()),
        ("HOST".into(), "127.0.0.1".into()),
        ("PORT".into(), "0".into()),
    ];
    env.extend(extra.iter().map(|(k, v)| ((*k).to_owned(), v.clone())));
    env
}

fn start(dir: &Path, extra: &[(&str, String)]) -> Sluice {
    let env = environment(dir, extra);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    Sluice::start_env_only(&env)
}

/// Counts of one run.
#[derive(Debug, Default, Clone, Copy)]
pub struct Tally {
    pub cases: usize,
    pub calls: usize,
    pub agree: usize,
    pub differ: usize,
}

impl Tally {
    fn add(&mut self, case: &Case) {
        self.cases += 1;
        self.calls += case.calls.len();
        match case.agreement {
            Agreement::Agrees => self.agree += 1,
            Agreement::Differs(_) => self.differ += 1,
        }
    }
}

/// Runs `cases` in order on the sluice at `grpc`; the failures, one line each.
async fn run_cases(grpc: SocketAddr, cases: &[Case], failures: &mut Vec<String>) {
    let mut client = sluice::proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient::new(
        helpers::grpc_channel(grpc).await,
    );
    for case in cases {
        for (i, call) in case.calls.iter().enumerate() {
            if let Some(failure) = check(&mut client, call).await {
                failures.push(format!("{} (call {i}): {failure}", case.from));
                break;
            }
        }
    }
}

/// Runs `group` on every backend; panics with every failure.
pub async fn run_group(group: &Group) -> Tally {
    let mut tally = Tally::default();
    for case in (group.cases)() {
        tally.add(&case);
    }
    let dir = fixture(&format!("upstream/{}", group.dir));
    let mut failures = Vec::new();
    for backend in [Backend::Memory, Backend::Redis, Backend::RedisCachePrefix] {
        let redis = match backend {
            Backend::Memory => None,
            _ => Some(RedisServer::start()),
        };
        let mut extra: Vec<(&str, String)> = group
            .env
            .iter()
            .map(|(k, v)| (*k, (*v).to_owned()))
            .collect();
        if let Some(redis) = &redis {
            extra.push(("REDIS_URL", format!("127.0.0.1:{}", redis.port())));
        }
        if let Backend::RedisCachePrefix = backend {
            extra.push(("LOCAL_CACHE_SIZE_IN_BYTES", "1000000".into()));
            extra.push(("CACHE_KEY_PREFIX", "prefix:".into()));
        }
        let sluice = start(&dir, &extra);
        let before = failures.len();
        run_cases(sluice.grpc_addr, &(group.cases)(), &mut failures).await;
        for failure in &mut failures[before..] {
            *failure = format!("{backend:?}: {failure}");
        }
    }
    println!(
        "envoyproxy/ratelimit's cases, {} ({}): {} cases ({} calls), {} agree, {} differ as \
         docs/migration.md says, on memory, Redis and Redis with the local cache and a key prefix",
        group.name, group.dir, tally.cases, tally.calls, tally.agree, tally.differ
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    tally
}

/// Waits (10 s at most) until `call` gets what it expects on `grpc`.
async fn until_answered(grpc: SocketAddr, call: &Call) -> Option<String> {
    let mut client = sluice::proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient::new(
        helpers::grpc_channel(grpc).await,
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match check(&mut client, call).await {
            None => return None,
            Some(failure) if Instant::now() > deadline => return Some(failure),
            Some(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_environment() {
    run_group(&cases::DEFAULT).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_mode_environment() {
    run_group(&cases::SHADOW).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quota_mode_and_dynamic_metadata_environment() {
    run_group(&cases::QUOTA).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_headers_environment() {
    run_group(&cases::HEADERS).await;
    run_group(&cases::CUSTOM_HEADERS).await;
}

/// `config_test.go`'s refused files, and `TestInitialLoadError`: each bad file is refused by
/// `sluice check-config` (with its file, line and rule); a bad config at start-up stops `serve`.
#[test]
fn refused_configs() {
    let mut tally = Tally::default();
    let mut failures = Vec::new();
    for case in cases::refused() {
        tally.cases += 1;
        tally.agree += 1;
        let (path, merge) = case.path;
        let mut args = vec!["check-config".to_owned()];
        if merge {
            args.push("--merge-domain-config".into());
        }
        args.push(
            fixture(&format!("upstream/bad/{path}"))
                .display()
                .to_string(),
        );
        let out = run_sluice(&args, &[]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        if out.status.success() || !text.contains(case.says) {
            failures.push(format!("{}: {path}: {text}", case.from));
        }
    }
    // A config that does not load at start-up: envoyproxy/ratelimit starts and answers every
    // request with an error; sluice does not start.
    let bad = fixture("upstream/bad/bad_unit.yaml");
    let env = environment(
        bad.parent().unwrap(),
        &[("RUNTIME_APPDIRECTORY", "bad_unit.yaml".into())],
    );
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let out = run_sluice(["serve"], &env);
    let log = String::from_utf8_lossy(&out.stderr);
    tally.cases += 1;
    tally.differ += 1;
    if out.status.success() || !log.contains("invalid unit `fortnight`") {
        failures.push(format!("TestInitialLoadError: started:\n{log}"));
    }
    println!(
        "envoyproxy/ratelimit's refused configs: {} cases, {} agree, {} differ as \
         docs/migration.md says",
        tally.cases, tally.agree, tally.differ
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// `integration_test.go`'s reload test (without `RUNTIME_WATCH_ROOT`) and `TestService`'s
/// failed reload: a file added to the config directory is served, a file removed is no longer,
/// and a file that does not load leaves the config served before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reloads() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("reload");
    std::fs::create_dir(&dir).unwrap();
    std::fs::copy(
        fixture("upstream/reload/before.yaml"),
        dir.join("before.yaml"),
    )
    .unwrap();
    let sluice = start(
        &dir,
        &[
            ("RUNTIME_WATCH_ROOT", "false".into()),
            ("SLUICE_WATCH_INTERVAL_MS", "100".into()),
        ],
    );
    let mut failures = Vec::new();
    for step in cases::reload_steps() {
        match step {
            cases::ReloadStep::Write(name, text) => std::fs::write(dir.join(name), text).unwrap(),
            cases::ReloadStep::Remove(name) => std::fs::remove_file(dir.join(name)).unwrap(),
            cases::ReloadStep::Logged(text) => {
                let deadline = Instant::now() + Duration::from_secs(10);
                while !sluice.log_text().contains(text) && Instant::now() < deadline {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                if !sluice.log_text().contains(text) {
                    failures.push(format!("{text:?} never logged:\n{}", sluice.log_text()));
                }
            }
            cases::ReloadStep::Until(from, call) => {
                if let Some(failure) = until_answered(sluice.grpc_addr, &call).await {
                    failures.push(format!("{from}: {failure}"));
                }
            }
        }
    }
    println!(
        "envoyproxy/ratelimit's reload cases: {} cases, all agree",
        cases::RELOAD_CASES
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// `TestCacheError`: the backend fails a call; envoyproxy/ratelimit answers an error (its status
/// UNKNOWN), sluice UNAVAILABLE. And `integration_test.go`'s duration check: a second call 2 s
/// after the first is told a shorter time until reset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_errors_and_durations() {
    let mut redis = RedisServer::start();
    let dir = fixture("upstream/default");
    let sluice = start(
        &dir,
        &[
            ("REDIS_URL", format!("127.0.0.1:{}", redis.port())),
            ("MERGE_DOMAIN_CONFIG", "true".into()),
        ],
    );
    let mut client = sluice.client().await;
    let durations = call("another", &[&[("key4", "durTest")]]);
    let first = client
        .should_rate_limit(durations.request.clone())
        .await
        .unwrap()
        .into_inner();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let second = client
        .should_rate_limit(durations.request.clone())
        .await
        .unwrap()
        .into_inner();
    let reset = |r: &sluice::proto::envoy::service::ratelimit::v3::RateLimitResponse| {
        r.statuses[0]
            .duration_until_reset
            .as_ref()
            .map(|d| d.seconds)
    };
    println!(
        "duration until reset: {:?} then, 2 s later, {:?}",
        reset(&first),
        reset(&second)
    );
    assert!(reset(&second) < reset(&first), "{first:?} {second:?}");

    redis.stop();
    let refused = call("another", &[&[("key2", "down")]]).refused(tonic::Code::Unavailable);
    assert_eq!(check(&mut client, &refused).await, None);
    println!(
        "envoyproxy/ratelimit's backend-error and duration cases: 2 cases, 1 agrees, 1 differs"
    );
}

/// Every difference names a sentence of docs/migration.md that is there; the counts of every
/// table.
#[test]
fn every_difference_is_documented() {
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/migration.md"))
            .unwrap();
    let doc = doc.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut total = Tally::default();
    for group in cases::GROUPS {
        for case in (group.cases)() {
            total.add(&case);
            if let Agreement::Differs(why) = case.agreement {
                assert!(
                    doc.contains(why),
                    "{}: {why:?} is not in docs/migration.md",
                    case.from
                );
            }
        }
    }
    let tables = total;
    let refused = cases::refused().len();
    for why in cases::OTHER_DIFFERENCES {
        assert!(doc.contains(why), "{why:?} is not in docs/migration.md");
    }
    // The refused files agree; the start-up case differs; the reload cases agree; of the
    // backend error and the durations, one differs.
    let others = refused + 1 + cases::RELOAD_CASES + 2;
    let (agree, differ) = (
        tables.agree + refused + cases::RELOAD_CASES + 1,
        tables.differ + 2,
    );
    assert_eq!(agree + differ, tables.cases + others);
    println!(
        "envoyproxy/ratelimit's cases translated: {} ({} agree, {} differ as docs/migration.md \
         says): {} in the call tables ({} calls), {refused} refused files, {} reloads, the \
         start-up, the backend error and the durations",
        tables.cases + others,
        agree,
        differ,
        tables.cases,
        tables.calls,
        cases::RELOAD_CASES
    );
}
