//! What one xDS push may cost (the management server is not trusted with sluice's memory or
//! its log): the built binary subscribed to a test double (`helpers::xds_server`), pushed
//! responses of tens of thousands of descriptors, its peak resident set (`VmHWM`) read from
//! /proc, its log counted. Figures in docs/security.md ("Config limits").

use crate::helpers;

use std::time::Duration;

use prost::Message;

use helpers::Sluice;
use helpers::xds_server::XdsServer;
use sluice::proto::ratelimit::config::ratelimit::v3::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
};

/// One domain of `rules` flat descriptors, each with its own value and limit: the smallest
/// encoding of a rule (about 16 bytes each).
fn flat_rules(rules: usize) -> RateLimitConfig {
    RateLimitConfig {
        name: "flood".into(),
        domain: "flood".into(),
        descriptors: (0..rules)
            .map(|i| RateLimitDescriptor {
                key: "k".into(),
                value: format!("{i:x}"),
                rate_limit: Some(RateLimitPolicy {
                    unit: RateLimitUnit::Second as i32,
                    requests_per_unit: 1,
                    ..RateLimitPolicy::default()
                }),
                ..RateLimitDescriptor::default()
            })
            .collect(),
    }
}

fn subscribe(xds: &XdsServer, extra: &[&str]) -> Sluice {
    let url = xds.url(false);
    let mut args = vec![
        "--config-xds",
        url.as_str(),
        "--force-start-without-initial-config",
    ];
    args.extend_from_slice(extra);
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"));
    cmd.arg("serve")
        .args(["--grpc-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0"])
        .args(&args)
        .env_remove("SLUICE_REDIS_URL")
        .env("SLUICE_LOG", "info");
    Sluice::start_command(cmd)
}

/// The answer to the newest push (compiling 100,000 rules takes seconds in a debug build).
async fn answer(xds: &XdsServer) -> sluice::proto::envoy::service::discovery::v3::DiscoveryRequest {
    let wait = xds.request_within(Duration::from_secs(60)).await;
    wait.expect("an ACK or NACK within 60 s").request
}

/// About 95,000 rules in 1.6 MB are applied within 128 MiB of peak resident memory (they took
/// 275 MB when the xDS config passed through the file model); twice as many are refused by
/// `--max-xds-nodes` before they are decoded, costing next to nothing, and the previous config
/// keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_is_bounded_before_it_is_decoded() {
    let xds = XdsServer::start().await;
    let sluice = subscribe(&xds, &[]);
    xds.next_request().await;
    let idle = sluice.peak_rss_kib();

    let rules = flat_rules(94_772);
    assert!(rules.encoded_len() < 1_700_000, "{}", rules.encoded_len());
    xds.push("1", &[rules]).await;
    let ack = answer(&xds).await;
    assert!(ack.error_detail.is_none(), "{:?}", ack.error_detail);
    assert_eq!(ack.version_info, "1");
    let applied = sluice.peak_rss_kib();
    println!("94,772 rules: peak resident {idle} KiB idle, {applied} KiB applied");
    assert!(applied < 128 * 1024, "peak {applied} KiB");

    let twice = flat_rules(190_000);
    xds.push("2", &[twice]).await;
    let nack = answer(&xds).await;
    assert_eq!(nack.version_info, "1", "the served version stays");
    let detail = nack.error_detail.expect("a NACK").message;
    assert_eq!(
        detail,
        "resources[0]: xDS node limit exceeded: more than 100000 nodes (resources, \
         descriptors, `replaces` entries, `metadata` values) in one response; raise with \
         --max-xds-nodes"
    );
    let refused = sluice.peak_rss_kib();
    println!("190,000 rules refused: peak resident {refused} KiB");
    // The 3 MB response itself, and nothing of what decoding it would have built.
    assert!(
        refused < applied + 16 * 1024,
        "{refused} KiB after {applied} KiB"
    );

    let admin = sluice.admin_addr;
    let metrics = tokio::task::spawn_blocking(move || helpers::prometheus::scrape(admin))
        .await
        .unwrap();
    assert_eq!(
        helpers::prometheus::value(
            &metrics,
            r#"sluice_xds_responses_total{result="too_large"}"#
        ),
        1.0
    );
    assert_eq!(
        helpers::prometheus::value(&metrics, "sluice_config_rules"),
        94_772.0
    );
}

/// The flag raises the bound, and nesting has one of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bounds_are_flags() {
    let xds = XdsServer::start().await;
    let sluice = subscribe(&xds, &["--max-xds-nodes", "2001", "--max-xds-depth", "2"]);
    xds.next_request().await;
    // One resource and 2,000 descriptors: exactly the limit.
    xds.push("1", &[flat_rules(2_000)]).await;
    assert!(answer(&xds).await.error_detail.is_none());
    xds.push("2", &[flat_rules(2_001)]).await;
    let detail = answer(&xds).await.error_detail.expect("NACK").message;
    assert!(detail.contains("more than 2001 nodes"), "{detail}");

    let mut deep = flat_rules(1);
    for _ in 0..2 {
        let inner = deep.descriptors.pop().expect("one");
        deep.descriptors.push(RateLimitDescriptor {
            key: "outer".into(),
            descriptors: vec![inner],
            ..RateLimitDescriptor::default()
        });
    }
    xds.push("3", &[deep]).await;
    let detail = answer(&xds).await.error_detail.expect("NACK").message;
    assert_eq!(
        detail,
        "resources[0]: xDS nesting limit exceeded: descriptors nested more than 2 levels deep; \
         raise with --max-xds-depth"
    );
    drop(sluice);
}

/// A push of 50,000 broken rules under a 5 MB version writes a bounded log: the first 20
/// errors and a count (it wrote one line per rule, 16 MB, and the version whole).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_push_writes_a_bounded_log() {
    let xds = XdsServer::start().await;
    let sluice = subscribe(&xds, &[]);
    xds.next_request().await;
    let mut broken = flat_rules(50_000);
    for d in &mut broken.descriptors {
        d.rate_limit.as_mut().expect("a limit").unit = RateLimitUnit::Unknown as i32;
    }
    let version = "v".repeat(5 << 20);
    let lines_before = sluice.log.lock().unwrap().len();
    xds.push(&version, &[broken]).await;
    let nack = answer(&xds).await;
    let detail = nack.error_detail.expect("a NACK").message;
    assert_eq!(detail.lines().count(), 21, "20 errors and a count");
    assert!(
        detail.ends_with("... and 49980 more"),
        "{}",
        &detail[detail.len() - 80..]
    );
    // The log has caught up once the NACK is sent; give the pipe a moment.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let log = sluice.log.lock().unwrap()[lines_before..].to_vec();
    let bytes: usize = log.iter().map(String::len).sum();
    println!(
        "50,000 broken rules: {} log lines, {bytes} bytes",
        log.len()
    );
    assert!(log.len() <= 30, "{} lines", log.len());
    assert!(bytes < 64 * 1024, "{bytes} bytes of log");
    assert!(
        log.iter().any(|l| l.contains("not_logged=49980")),
        "the rest is counted: {log:?}"
    );
}

/// A long key over many nested descriptors: each compiled rule keeps its path (the parent's
/// key and its own), so 2,000 children under a 100 KB key cost 200 MB from a 132 KB push
/// (35 to 289 MiB of peak resident memory, within the node limit). `--max-xds-path-bytes`
/// refuses it before decoding.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_key_repeated_in_nested_paths_is_bounded() {
    let xds = XdsServer::start().await;
    let sluice = subscribe(&xds, &[]);
    xds.next_request().await;
    let idle = sluice.peak_rss_kib();
    let mut config = flat_rules(2_000);
    let children = std::mem::take(&mut config.descriptors);
    config.descriptors.push(RateLimitDescriptor {
        key: "p".repeat(100_000),
        descriptors: children,
        ..RateLimitDescriptor::default()
    });
    assert!(config.encoded_len() < 140_000);
    xds.push("1", &[config]).await;
    let detail = answer(&xds).await.error_detail.expect("a NACK").message;
    assert!(
        detail.starts_with("resources[0]: xDS path limit exceeded"),
        "{detail}"
    );
    assert!(
        detail.ends_with("raise with --max-xds-path-bytes"),
        "{detail}"
    );
    let peak = sluice.peak_rss_kib();
    println!("2,000 children of a 100 KB key refused: peak {idle} KiB idle, {peak} KiB after");
    assert!(peak < idle + 16 * 1024, "{peak} KiB after {idle} KiB");
}
