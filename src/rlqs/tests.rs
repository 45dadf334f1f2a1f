//! The quota face without a network: reports mapped and checked, answers mapped, and a refused
//! report reserving nothing.

use std::path::Path;
use std::sync::Arc;

use super::*;
use crate::config::Config;
use crate::limiter::memory::MemoryLimiter;
use crate::limiter::{Algorithm, Item, ItemKind, OverLimit, SystemClock};
use crate::proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use crate::quota::{Answer, BucketId, TokenBucket};

const YAML: &str = "
domain: edge
descriptors:
  - key: client
    rate_limit: {unit: minute, requests_per_unit: 100}
";

fn bucket(client: &str) -> BucketId {
    BucketId::from([("client".to_owned(), client.to_owned())])
}

fn line(client: &str, allowed: u64, elapsed: i64) -> BucketQuotaUsage {
    BucketQuotaUsage {
        bucket_id: Some(ProtoBucketId {
            bucket: bucket(client),
        }),
        time_elapsed: Some(ProtoDuration {
            seconds: elapsed,
            nanos: 0,
        }),
        num_requests_allowed: allowed,
        num_requests_denied: 1,
        last_report: None,
    }
}

fn report(domain: &str, lines: Vec<BucketQuotaUsage>) -> RateLimitQuotaUsageReports {
    RateLimitQuotaUsageReports {
        domain: domain.into(),
        bucket_quota_usages: lines,
    }
}

#[test]
fn a_report_maps_to_usages() {
    let mapped = to_domain(report("edge", vec![line("a", 4, 5)])).unwrap();
    assert_eq!(mapped.domain, "edge");
    assert_eq!(
        mapped.usages,
        [Usage {
            bucket: bucket("a"),
            allowed: 4,
            denied: 1,
            elapsed_s: 5,
        }]
    );
}

#[test]
fn a_line_without_what_it_needs_names_the_field() {
    let mut no_id = line("a", 1, 0);
    no_id.bucket_id = None;
    let err = to_domain(report("edge", vec![line("b", 1, 0), no_id])).unwrap_err();
    assert_eq!(
        (err.field.as_str(), &*err.reason),
        ("bucket_quota_usages[1].bucket_id", "required")
    );
    let mut no_time = line("a", 1, 0);
    no_time.time_elapsed = None;
    let err = to_domain(report("edge", vec![no_time])).unwrap_err();
    assert_eq!(err.field, "bucket_quota_usages[0].time_elapsed");
    let err = to_domain(report("edge", vec![line("a", 1, -1)])).unwrap_err();
    assert_eq!(
        (err.field.as_str(), &*err.reason),
        (
            "bucket_quota_usages[0].time_elapsed",
            "must not be negative"
        )
    );
}

/// Every assignment lives the TTL; a token bucket follows a DENY_ALL of its bucket, so that
/// Envoy starts it full; nothing is sent for an answer without an assignment.
#[test]
fn answers_map_to_actions_in_report_order() {
    let allot = |client: &str, answer: Answer, assignment| Allotment {
        bucket: bucket(client),
        answer,
        assignment,
        tokens: 0,
        rule: None,
    };
    let tokens = TokenBucket {
        max_tokens: 9,
        tokens_per_fill: 10,
        fill_interval_s: 60,
    };
    let response = to_proto(vec![
        allot("a", Answer::Granted, Some(Assignment::Tokens(tokens))),
        allot("b", Answer::BackendFailed, None),
        allot("c", Answer::NoRule, Some(Assignment::DenyAll)),
        allot("d", Answer::Unlimited, Some(Assignment::AllowAll)),
        allot("e", Answer::Abandoned, Some(Assignment::Abandon)),
    ])
    .unwrap();
    let clients: Vec<&str> = response
        .bucket_action
        .iter()
        .map(|a| a.bucket_id.as_ref().unwrap().bucket["client"].as_str())
        .collect();
    assert_eq!(clients, ["a", "a", "c", "d", "e"]);
    let strategy = |i: usize| match &response.bucket_action[i].bucket_action {
        Some(Action::QuotaAssignmentAction(q)) => {
            assert_eq!(q.assignment_time_to_live, Some(seconds(ASSIGNMENT_TTL_S)));
            q.rate_limit_strategy.clone().unwrap().strategy.unwrap()
        }
        other => panic!("{other:?}"),
    };
    assert_eq!(
        strategy(0),
        Strategy::BlanketRule(BlanketRule::DenyAll as i32)
    );
    assert_eq!(
        strategy(1),
        Strategy::TokenBucket(ProtoTokenBucket {
            max_tokens: 9,
            tokens_per_fill: Some(10),
            fill_interval: Some(seconds(60)),
            name: String::new(),
        })
    );
    assert_eq!(
        strategy(2),
        Strategy::BlanketRule(BlanketRule::DenyAll as i32)
    );
    assert_eq!(
        strategy(3),
        Strategy::BlanketRule(BlanketRule::AllowAll as i32)
    );
    assert!(matches!(
        response.bucket_action[4].bucket_action,
        Some(Action::AbandonAction(_))
    ));
    assert_eq!(to_proto(vec![allot("b", Answer::NoConfig, None)]), None);
}

fn handler() -> (QuotaHandler, Arc<Engine>) {
    let config = Config::from_yaml_str(Path::new("edge.yaml"), YAML).unwrap();
    let limiter = Arc::new(MemoryLimiter::new(Arc::new(SystemClock)));
    let engine = Arc::new(Engine::new(config, limiter));
    (QuotaHandler::new(engine.clone()), engine)
}

async fn held(engine: &Engine, client: &str) -> u64 {
    let probe = Item {
        key: format!("sluice:{{edge|client={client}|60000}}"),
        limit: u64::MAX,
        window_ms: 60_000,
        hits: 0,
        kind: ItemKind::Consume,
        over_limit: OverLimit::Refuse,
        algorithm: Algorithm::SlidingLog,
        lease: 0,
        hold_ms: 0,
    };
    engine.limiter().decide(&[probe], None).await.unwrap().items[0].count
}

#[tokio::test]
async fn a_stream_takes_its_domain_from_its_first_report() {
    let (handler, engine) = handler();
    let mut stream = handler.stream();
    let answer = handler
        .report(&mut stream, report("edge", vec![line("a", 1, 0)]))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(answer.bucket_action.len(), 2);
    assert_eq!(stream.domain(), Some("edge"));
    assert_eq!(held(&engine, "a").await, crate::quota::cap(100, 60_000));
    // A later report need not name it.
    let answer = handler
        .report(&mut stream, report("", vec![line("a", 1, 5)]))
        .await
        .unwrap();
    assert!(answer.is_some());
}

/// A report with one bad line is refused whole: INVALID_ARGUMENT naming the field, and no
/// bucket of it reserves anything.
#[tokio::test]
async fn a_bad_report_is_refused_whole_and_reserves_nothing() {
    let (handler, engine) = handler();
    let mut stream = handler.stream();
    let mut bad = line("c", 1, 0);
    bad.bucket_id = Some(ProtoBucketId {
        bucket: BucketId::from([(String::new(), "x".to_owned())]),
    });
    let status = handler
        .report(&mut stream, report("edge", vec![line("b", 1, 0), bad]))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert_eq!(
        status.message(),
        "bucket_quota_usages[1].bucket_id.bucket: an entry with an empty key"
    );
    assert_eq!(held(&engine, "b").await, 0);
    assert_eq!(stream.domain(), None);
    let status = handler
        .report(&mut stream, report("", vec![line("b", 1, 0)]))
        .await
        .unwrap_err();
    assert_eq!(
        status.message(),
        "domain: must not be empty in a stream's first report"
    );
}
