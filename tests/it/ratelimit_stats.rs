//! envoyproxy/ratelimit's stats, under its names, as what operators wired around it reads them:
//! the statsd lines a real statsd daemon (Etsy's, over TCP) receives, and the Prometheus page
//! on `PROMETHEUS_ADDR` read by the Prometheus project's own parser, for the same calls as
//! envoyproxy/ratelimit's `base_limiter.go` and statsd_exporter's mapper count them: five calls
//! on a limit of 3 (three within, the third near the limit at the 0.8 ratio, two over), a
//! `detailed_metric` rule, a two-level `shadow_mode` rule over its limit, an unknown domain, an
//! invalid call, a health check.

use crate::helpers;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use helpers::prometheus::{Family, parse_families};
use helpers::statsd::StatsdDaemon;
use helpers::{Sluice, TestServer, descriptor, free_port, http_get, request, test_settings};
use sluice::metrics::upstream::{Protocol, StatsdSettings, Tags, default_mapping};
use sluice::proto::envoy::service::ratelimit::v3::rate_limit_response::Code;

const LIMITS: &str = "
domain: edge
descriptors:
  - key: generic_key
    value: demo
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: user
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: tier
    value: premium
    descriptors:
      - key: plan
        shadow_mode: true
        rate_limit: {unit: minute, requests_per_unit: 1}
";

fn limits_file(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("limits.yaml");
    std::fs::write(&path, LIMITS).unwrap();
    path
}

/// The calls every test makes; returns how many gRPC ShouldRateLimit calls it sent.
async fn calls(grpc: std::net::SocketAddr) -> u64 {
    let mut client = sluice::proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient::new(
        helpers::grpc_channel(grpc).await,
    );
    let mut sent = 0;
    let mut codes = Vec::new();
    for _ in 0..5 {
        let r = request("edge", vec![descriptor(&[("generic_key", "demo")])]);
        codes.push(
            client
                .should_rate_limit(r)
                .await
                .unwrap()
                .into_inner()
                .overall_code,
        );
        sent += 1;
    }
    assert_eq!(
        codes,
        [
            Code::Ok,
            Code::Ok,
            Code::Ok,
            Code::OverLimit,
            Code::OverLimit
        ]
        .map(|c| c as i32)
    );
    for r in [
        request("edge", vec![descriptor(&[("user", "alice")])]),
        request(
            "edge",
            vec![descriptor(&[("tier", "premium"), ("plan", "x")])],
        ),
        request(
            "edge",
            vec![descriptor(&[("tier", "premium"), ("plan", "x")])],
        ),
        request("nowhere", vec![descriptor(&[("a", "b")])]),
    ] {
        let response = client.should_rate_limit(r).await.unwrap().into_inner();
        assert_eq!(
            response.overall_code,
            Code::Ok as i32,
            "shadow or unknown: OK"
        );
        sent += 1;
    }
    // An empty domain is refused: envoyproxy/ratelimit's service_error.
    let err = client
        .should_rate_limit(request("", vec![descriptor(&[("a", "b")])]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    sent + 1
}

/// The counts envoyproxy/ratelimit makes of [`calls`], by stat name (before tags).
fn expected_counts(calls: u64) -> BTreeMap<String, u64> {
    [
        (
            "ratelimit.service.rate_limit.edge.generic_key_demo.total_hits",
            5,
        ),
        (
            "ratelimit.service.rate_limit.edge.generic_key_demo.within_limit",
            3,
        ),
        (
            "ratelimit.service.rate_limit.edge.generic_key_demo.near_limit",
            1,
        ),
        (
            "ratelimit.service.rate_limit.edge.generic_key_demo.over_limit",
            2,
        ),
        ("ratelimit.service.rate_limit.edge.user_alice.total_hits", 1),
        (
            "ratelimit.service.rate_limit.edge.user_alice.within_limit",
            1,
        ),
        (
            "ratelimit.service.rate_limit.edge.tier_premium.plan.total_hits",
            2,
        ),
        (
            "ratelimit.service.rate_limit.edge.tier_premium.plan.within_limit",
            1,
        ),
        (
            "ratelimit.service.rate_limit.edge.tier_premium.plan.near_limit",
            1,
        ),
        (
            "ratelimit.service.rate_limit.edge.tier_premium.plan.over_limit",
            1,
        ),
        (
            "ratelimit.service.rate_limit.edge.tier_premium.plan.shadow_mode",
            1,
        ),
        ("ratelimit.service.rate_limit.nowhere.domain_not_found", 1),
        ("ratelimit.service.call.should_rate_limit.service_error", 1),
        ("ratelimit.service.config_load_success", 1),
        ("ratelimit_server.ShouldRateLimit.total_requests", calls),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

/// Counter lines summed by name (a count may arrive over several flushes); every line is
/// `name:value|c` or `name:value|ms`, nothing else.
fn sums(lines: &[String], tags: &str) -> (BTreeMap<String, u64>, Vec<u64>) {
    let mut counters = BTreeMap::new();
    let mut times = Vec::new();
    for line in lines {
        let (name, rest) = line.rsplit_once(':').expect("name:value|type");
        let (value, kind) = rest.split_once('|').expect("value|type");
        let value: u64 = value.parse().expect("an integer value");
        let name = name
            .strip_suffix(tags)
            .unwrap_or_else(|| panic!("{line}: every name ends in the tags {tags:?}"));
        match kind {
            "c" => *counters.entry(name.to_owned()).or_insert(0) += value,
            "ms" => {
                assert_eq!(
                    name, "ratelimit_server.ShouldRateLimit.response_time",
                    "{line}"
                );
                times.push(value);
            }
            other => panic!("{line}: type {other}"),
        }
    }
    (counters, times)
}

fn statsd_settings(addr: std::net::SocketAddr) -> StatsdSettings {
    StatsdSettings {
        addr: addr.to_string(),
        protocol: Protocol::Tcp,
        flush_interval: Duration::from_millis(200),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statsd_daemon_receives_envoyproxy_ratelimits_lines() {
    let daemon = StatsdDaemon::start();
    let dir = tempfile::tempdir().unwrap();
    let mut settings = test_settings(&limits_file(dir.path()), None);
    settings.metrics.upstream.statsd = Some(statsd_settings(daemon.addr));
    let server = TestServer::start(settings);
    let sent = calls(server.grpc_addr).await;
    let expected = expected_counts(sent);
    let lines = daemon.wait_for(Duration::from_secs(20), |lines| {
        sums(lines, "").0 == expected && sums(lines, "").1.len() as u64 == sent
    });
    println!(
        "statsd received {} lines, e.g.:\n  {}",
        lines.len(),
        lines
            .iter()
            .take(8)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n  ")
    );
    server.stop().await.unwrap();
}

/// The daemon is down while calls are answered: they are answered as fast, and the lines
/// wait (bounded) until it is up, tags and all.
/// A free port below the kernel's ephemeral range: one the test leaves unbound for a while
/// that no other test's `free_port` (ephemeral) can take meanwhile, and that no connection's
/// own source port can be (a TCP connection to a free local port from that same port
/// connects to itself).
fn port_outside_the_ephemeral_range() -> u16 {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    let seed = u64::from(std::process::id()) ^ now.map_or(0, |d| d.subsec_nanos().into());
    (0..1000u64)
        .map(|i| 20_000 + ((seed.wrapping_mul(2654435761).wrapping_add(i * 7919)) % 10_000) as u16)
        .find(|p| std::net::TcpListener::bind(("127.0.0.1", *p)).is_ok())
        .expect("a free port in 20000..30000")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_that_is_down_costs_calls_nothing_and_gets_the_lines_later() {
    let port = port_outside_the_ephemeral_range();
    let dir = tempfile::tempdir().unwrap();
    let mut settings = test_settings(&limits_file(dir.path()), None);
    settings.metrics.upstream.statsd = Some(statsd_settings(
        format!("127.0.0.1:{port}").parse().unwrap(),
    ));
    settings.metrics.upstream.tags = Tags::parse("env:test,zone:eu.1").unwrap();
    let server = TestServer::start(settings);
    let started = Instant::now();
    let sent = calls(server.grpc_addr).await;
    let took = started.elapsed();
    // Several flushes fail meanwhile (each connection attempt up to 1.5 s); the calls do not
    // wait for any of them.
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(took < Duration::from_secs(5), "{sent} calls took {took:?}");
    let daemon = tokio::task::spawn_blocking(move || StatsdDaemon::start_on(port))
        .await
        .unwrap();
    let tags = ".__env=test.__zone=eu_1";
    let expected = expected_counts(sent);
    let lines = tokio::task::spawn_blocking(move || {
        daemon.wait_for(Duration::from_secs(20), |lines| {
            sums(lines, tags).0 == expected && sums(lines, tags).1.len() as u64 == sent
        })
    })
    .await
    .unwrap();
    assert!(lines.iter().all(|l| l.contains(tags)), "{lines:#?}");
    server.stop().await.unwrap();
}

/// The families of `page` whose names start with `ratelimit_`, by name.
fn ratelimit_families(page: &str) -> BTreeMap<String, Family> {
    parse_families(page)
        .into_iter()
        .filter(|f| f.name.starts_with("ratelimit_"))
        .map(|f| (f.name.clone(), f))
        .collect()
}

/// The counter families of the default mapping, exactly as envoyproxy/ratelimit's Prometheus
/// sink (client_golang's text format) writes them for [`calls`] (`TOTAL` for the calls).
const COUNTERS_PAGE: &str = r#"# HELP ratelimit_service_config_load_success Metric autogenerated by statsd_exporter.
# TYPE ratelimit_service_config_load_success counter
ratelimit_service_config_load_success 1
# HELP ratelimit_service_rate_limit_near_limit Metric autogenerated by statsd_exporter.
# TYPE ratelimit_service_rate_limit_near_limit counter
ratelimit_service_rate_limit_near_limit{domain="edge",key1="generic_key_demo"} 1
ratelimit_service_rate_limit_near_limit{domain="edge",key1="tier_premium",key2="plan"} 1
# HELP ratelimit_service_rate_limit_nowhere_domain_not_found Metric autogenerated by statsd_exporter.
# TYPE ratelimit_service_rate_limit_nowhere_domain_not_found counter
ratelimit_service_rate_limit_nowhere_domain_not_found 1
# HELP ratelimit_service_rate_limit_over_limit Metric autogenerated by statsd_exporter.
# TYPE ratelimit_service_rate_limit_over_limit counter
ratelimit_service_rate_limit_over_limit{domain="edge",key1="generic_key_demo"} 2
ratelimit_service_rate_limit_over_limit{domain="edge",key1="tier_premium",key2="plan"} 1
# HELP ratelimit_service_rate_limit_shadow_mode Metric autogenerated by statsd_exporter.
# TYPE ratelimit_service_rate_limit_shadow_mode counter
ratelimit_service_rate_limit_shadow_mode{domain="edge",key1="tier_premium",key2="plan"} 1
# HELP ratelimit_service_rate_limit_total_hits Metric autogenerated by statsd_exporter.
# TYPE ratelimit_service_rate_limit_total_hits counter
ratelimit_service_rate_limit_total_hits{domain="edge",key1="generic_key_demo"} 5
ratelimit_service_rate_limit_total_hits{domain="edge",key1="user_alice"} 1
ratelimit_service_rate_limit_total_hits{domain="edge",key1="tier_premium",key2="plan"} 2
# HELP ratelimit_service_rate_limit_within_limit Metric autogenerated by statsd_exporter.
# TYPE ratelimit_service_rate_limit_within_limit counter
ratelimit_service_rate_limit_within_limit{domain="edge",key1="generic_key_demo"} 3
ratelimit_service_rate_limit_within_limit{domain="edge",key1="user_alice"} 1
ratelimit_service_rate_limit_within_limit{domain="edge",key1="tier_premium",key2="plan"} 1
"#;

/// The page on `PROMETHEUS_ADDR` with envoyproxy/ratelimit's variables (`USE_PROMETHEUS`,
/// its default mapping): its families, types, help and labels as the Prometheus parser reads
/// them, the counters byte for byte, a health check counted, sluice's own families beside.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_addr_serves_the_default_mappings_series() {
    let dir = tempfile::tempdir().unwrap();
    let limits = limits_file(dir.path());
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let sluice = Sluice::start_with_env(
        &limits,
        None,
        &[],
        &[
            ("USE_PROMETHEUS", "true"),
            ("PROMETHEUS_ADDR", addr.as_str()),
            ("USE_STATSD", "false"),
        ],
    );
    let sent = calls(sluice.grpc_addr).await;
    // One health check: envoyproxy/ratelimit's interceptor counts every unary call.
    let mut health = tonic_health::pb::health_client::HealthClient::new(sluice.channel().await);
    health
        .check(tonic_health::pb::HealthCheckRequest::default())
        .await
        .unwrap();
    let page = tokio::task::spawn_blocking(move || {
        let (status, page) = http_get(addr.parse().unwrap(), "/metrics");
        assert_eq!(status, 200, "{page}");
        page
    })
    .await
    .unwrap();
    let families = ratelimit_families(&page);
    let family = |name: &str| {
        families
            .get(name)
            .unwrap_or_else(|| panic!("no family {name} in:\n{page}"))
    };
    for (name, kind) in [
        ("ratelimit_service_rate_limit_total_hits", "counter"),
        ("ratelimit_service_rate_limit_over_limit", "counter"),
        ("ratelimit_service_should_rate_limit_error", "counter"),
        ("ratelimit_service_total_requests", "counter"),
        ("ratelimit_service_config_load_success", "counter"),
        ("ratelimit_service_response_time_seconds", "histogram"),
    ] {
        let f = family(name);
        assert_eq!(f.kind, kind, "{name}");
        assert_eq!(f.help, "Metric autogenerated by statsd_exporter.", "{name}");
    }
    let total_hits = family("ratelimit_service_rate_limit_total_hits");
    let name = "ratelimit_service_rate_limit_total_hits_total";
    let two_keys = [
        ("domain", "edge"),
        ("key1", "tier_premium"),
        ("key2", "plan"),
    ];
    assert_eq!(total_hits.value(name, &two_keys), Some(2.0));
    assert_eq!(
        family("ratelimit_service_should_rate_limit_error").value(
            "ratelimit_service_should_rate_limit_error_total",
            &[("err_type", "service_error")]
        ),
        Some(1.0)
    );
    let requests = family("ratelimit_service_total_requests");
    let requests_of = |method| {
        requests.value(
            "ratelimit_service_total_requests_total",
            &[("grpc_method", method)],
        )
    };
    assert_eq!(requests_of("ShouldRateLimit"), Some(sent as f64));
    assert_eq!(requests_of("Check"), Some(1.0));
    let times = family("ratelimit_service_response_time_seconds");
    let bounds: Vec<&str> = times
        .samples
        .iter()
        .filter(|s| s.name.ends_with("_bucket") && s.labels["grpc_method"] == "ShouldRateLimit")
        .map(|s| s.labels["le"].as_str())
        .collect();
    assert_eq!(
        bounds,
        [
            "0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1", "2.5", "5", "10", "+Inf"
        ]
    );
    assert_eq!(
        times.value(
            "ratelimit_service_response_time_seconds_count",
            &[("grpc_method", "ShouldRateLimit")]
        ),
        Some(sent as f64)
    );
    // The counters, byte for byte (the page keeps client_golang's order: families by name).
    let counters: String = page
        .split_inclusive('\n')
        .filter(|l| {
            let name = l
                .trim_start_matches("# HELP ")
                .trim_start_matches("# TYPE ");
            name.starts_with("ratelimit_service_rate_limit_")
                || name.starts_with("ratelimit_service_config_load_success")
        })
        .collect();
    assert_eq!(counters, COUNTERS_PAGE);
    // sluice's own families stay on the page.
    assert!(page.contains("sluice_requests_total{"), "{page}");
    println!(
        "{}",
        page.lines()
            .filter(|l| l.starts_with("ratelimit_"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// Envoy Gateway's mapping (envoyproxy/ratelimit's without `scale`: response times observed
/// in milliseconds) from `PROMETHEUS_MAPPER_YAML`, on `PROMETHEUS_PATH`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mapping_file_and_path_of_the_deployments_own() {
    let dir = tempfile::tempdir().unwrap();
    let limits = limits_file(dir.path());
    let mapping = dir.path().join("conf.yaml");
    std::fs::write(&mapping, default_mapping::yaml(true)).unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let sluice = Sluice::start_with_env(
        &limits,
        None,
        &[],
        &[
            ("USE_PROMETHEUS", "true"),
            ("PROMETHEUS_ADDR", addr.as_str()),
            ("PROMETHEUS_PATH", "/stats/prometheus"),
            ("PROMETHEUS_MAPPER_YAML", mapping.to_str().unwrap()),
        ],
    );
    let sent = calls(sluice.grpc_addr).await;
    let page = tokio::task::spawn_blocking(move || {
        let addr = addr.parse().unwrap();
        assert_eq!(http_get(addr, "/metrics").0, 404, "only PROMETHEUS_PATH");
        let (status, page) = http_get(addr, "/stats/prometheus");
        assert_eq!(status, 200, "{page}");
        page
    })
    .await
    .unwrap();
    let families = ratelimit_families(&page);
    let times = &families["ratelimit_service_response_time_seconds"];
    assert_eq!(times.kind, "histogram");
    let count = times
        .value(
            "ratelimit_service_response_time_seconds_count",
            &[("grpc_method", "ShouldRateLimit")],
        )
        .unwrap();
    assert_eq!(count, sent as f64);
    // Whole milliseconds, unscaled: the sum is an integer.
    let sum = times
        .value(
            "ratelimit_service_response_time_seconds_sum",
            &[("grpc_method", "ShouldRateLimit")],
        )
        .unwrap();
    assert_eq!(sum.fract(), 0.0, "{sum}");
    assert_eq!(
        families["ratelimit_service_rate_limit_over_limit"].value(
            "ratelimit_service_rate_limit_over_limit_total",
            &[("domain", "edge"), ("key1", "generic_key_demo")]
        ),
        Some(2.0)
    );
}

/// A mapping sluice's mapper does not serve stops start-up, naming the file and the line.
#[test]
fn an_unsupported_mapping_stops_start_up_with_its_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let limits = limits_file(dir.path());
    let mapping = dir.path().join("conf.yaml");
    std::fs::write(
        &mapping,
        "mappings:\n  - match: ratelimit.*\n    name: x\n    ttl: 1m\n",
    )
    .unwrap();
    let out = helpers::process::run_sluice(
        [
            "serve",
            "--config",
            limits.to_str().unwrap(),
            "--grpc-addr",
            "127.0.0.1:0",
            "--admin-addr",
            "127.0.0.1:0",
        ],
        &[
            ("USE_PROMETHEUS", "true"),
            ("PROMETHEUS_ADDR", "127.0.0.1:0"),
            ("PROMETHEUS_MAPPER_YAML", mapping.to_str().unwrap()),
        ],
    );
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let expected = format!("{}:4: `ttl` is not supported", mapping.display());
    assert!(stderr.contains(&expected), "{stderr}");
}
