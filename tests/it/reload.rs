//! Hot reload against the running binary: the kubelet's ConfigMap layout and `..data` swap
//! reproduced in a temp dir, checked over gRPC, in the log and on /metrics.
//!
//! Black-box (the built binary): the operator's view of a reload is the log line naming file,
//! line and rule, and exact reload counts on /metrics, which need a metrics recorder of this
//! process alone.

use crate::helpers;

use std::path::Path;
use std::time::{Duration, Instant};

use helpers::prometheus::{scrape, value};
use helpers::{Sluice, descriptor, request};
use sluice::proto::envoy::service::ratelimit::v3::rate_limit_response::Code;

fn limits(per_minute: u32) -> String {
    format!(
        "domain: edge\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: minute\n      \
         requests_per_unit: {per_minute}\n"
    )
}

/// What the kubelet does on a ConfigMap update: a new `..TIMESTAMP` directory with every key,
/// then `..data` renamed over atomically; the visible names are symlinks through `..data`.
fn publish(dir: &Path, stamp: &str, name: &str, text: &str) {
    let generation = dir.join(stamp);
    std::fs::create_dir(&generation).unwrap();
    std::fs::write(generation.join(name), text).unwrap();
    let visible = dir.join(name);
    if std::fs::symlink_metadata(&visible).is_err() {
        std::os::unix::fs::symlink(Path::new("..data").join(name), &visible).unwrap();
    }
    let tmp = dir.join("..data_tmp");
    std::os::unix::fs::symlink(stamp, &tmp).unwrap();
    std::fs::rename(&tmp, dir.join("..data")).unwrap();
}

/// The limit the serving config applies to a fresh user (a new counter every call).
async fn served_limit(sluice: &Sluice, probe: &mut u32) -> u32 {
    *probe += 1;
    let user = format!("probe-{probe}");
    let response = sluice
        .client()
        .await
        .should_rate_limit(request("edge", vec![descriptor(&[("user", &user)])]))
        .await
        .expect("ShouldRateLimit")
        .into_inner();
    response.statuses[0]
        .current_limit
        .as_ref()
        .expect("a limited descriptor reports its limit")
        .requests_per_unit
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configmap_symlink_swap_reloads_and_invalid_update_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    publish(
        dir.path(),
        "..2026_01_01_00_00_00.1",
        "edge.yaml",
        &limits(3),
    );
    let sluice = Sluice::start_with(dir.path(), None, &["--watch-interval-ms", "200"]);
    let mut probe = 0;

    // Generation 1: 3 per minute, enforced.
    let mut client = sluice.client().await;
    let one = || request("edge", vec![descriptor(&[("user", "alice")])]);
    for expected in [Code::Ok, Code::Ok, Code::Ok, Code::OverLimit] {
        let r = client.should_rate_limit(one()).await.unwrap().into_inner();
        assert_eq!(r.overall_code, expected as i32);
    }

    // Generation 2 swapped in: the new limit applies within a few seconds, and alice's log
    // carries over (3 hits recorded, limit now 5: two more admitted, then rejected).
    publish(
        dir.path(),
        "..2026_01_01_00_01_00.2",
        "edge.yaml",
        &limits(5),
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while served_limit(&sluice, &mut probe).await != 5 {
        assert!(
            Instant::now() < deadline,
            "new limit not served within 5 s:\n{}",
            sluice.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for expected in [Code::Ok, Code::Ok, Code::OverLimit] {
        let r = client.should_rate_limit(one()).await.unwrap().into_inner();
        assert_eq!(r.overall_code, expected as i32);
    }
    // One "config loaded" line at start-up, one for the reload.
    assert_eq!(sluice.log_text().matches("config loaded").count(), 2);

    // Generation 3 is invalid: logged with file, line and rule; generation 2 keeps serving.
    publish(
        dir.path(),
        "..2026_01_01_00_02_00.3",
        "edge.yaml",
        "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while !sluice.log_text().contains("config reload rejected") {
        assert!(
            Instant::now() < deadline,
            "invalid config not reported:\n{}",
            sluice.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let log = sluice.log_text();
    let line = log
        .lines()
        .find(|l| l.contains("config reload rejected"))
        .unwrap();
    // As `sluice check-config` prints it: FILE:LINE: RULE: MESSAGE.
    assert!(
        line.contains("..2026_01_01_00_02_00.3/edge.yaml:4: user: "),
        "{line}"
    );
    assert!(line.contains("invalid unit `fortnight`"), "{line}");
    // Several polls later it is still the old generation, and the failure was logged once.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(served_limit(&sluice, &mut probe).await, 5);
    assert_eq!(
        sluice.log_text().matches("config reload rejected").count(),
        1
    );

    let metrics = scrape(sluice.admin_addr);
    // Start-up and the first reload succeeded; the broken generation failed once.
    assert_eq!(
        value(&metrics, r#"sluice_config_loads_total{result="success"}"#),
        2.0
    );
    assert_eq!(
        value(&metrics, r#"sluice_config_loads_total{result="failure"}"#),
        1.0
    );
    assert_eq!(value(&metrics, "sluice_config_rules"), 1.0);

    // A fixed generation 4 is picked up again.
    publish(
        dir.path(),
        "..2026_01_01_00_03_00.4",
        "edge.yaml",
        &limits(8),
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while served_limit(&sluice, &mut probe).await != 8 {
        assert!(
            Instant::now() < deadline,
            "fixed config not served:\n{}",
            sluice.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_config_false_keeps_the_start_up_config() {
    let dir = tempfile::tempdir().unwrap();
    publish(
        dir.path(),
        "..2026_01_01_00_00_00.1",
        "edge.yaml",
        &limits(3),
    );
    let sluice = Sluice::start_with(
        dir.path(),
        None,
        &["--watch-config", "false", "--watch-interval-ms", "100"],
    );
    let mut probe = 0;
    assert_eq!(served_limit(&sluice, &mut probe).await, 3);
    publish(
        dir.path(),
        "..2026_01_01_00_01_00.2",
        "edge.yaml",
        &limits(5),
    );
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(served_limit(&sluice, &mut probe).await, 3);
    assert!(!sluice.log_text().contains("watching the config"));
}
