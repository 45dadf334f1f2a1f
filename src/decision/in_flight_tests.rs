//! The engine's side of `in_flight` limits: one lease token per admitted request, returned in
//! the decision; a refund that names it (its descriptor's last entry `sluice_lease`) releases
//! that lease on the rule's `in_flight` limits and touches no other limit; a refund that names
//! none leaves leases alone.

use std::sync::Arc;

use super::test_support::{Recording, config, req};
use super::{Code, Decision, Engine, LEASE_KEY, Outcome, Request, split_lease};
use crate::descriptor::Entry;
use crate::limiter::{Algorithm, ItemKind};

const YAML: &str = "
domain: d
descriptors:
  - key: client
    rate_limit: {requests_per_unit: 2, algorithm: in_flight, lease: 60s}
  - key: route
    rate_limits:
      - {requests_per_unit: 1, algorithm: in_flight, lease: 60s}
      - {unit: minute, requests_per_unit: 5}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1}
";

fn engine() -> (Engine, Arc<Recording>) {
    let backend = Arc::new(Recording::new());
    (Engine::new(config(YAML), backend.clone()), backend)
}

async fn admit(engine: &Engine, key: &str) -> Decision {
    engine.decide(&req(&[&[(key, "a")]])).await.unwrap()
}

/// The refund Envoy sends when the stream is done: the same entries, the lease entry last.
fn refund(key: &str, lease: Option<u64>) -> Request {
    let lease = lease.map(|t| t.to_string());
    let mut pairs = vec![(key, "a")];
    if let Some(lease) = &lease {
        pairs.push((LEASE_KEY, lease.as_str()));
    }
    let mut request = req(&[&pairs]);
    request.descriptors[0].negative = true;
    request
}

#[tokio::test]
async fn each_admitted_request_gets_its_own_lease_and_its_refund_releases_it() {
    let (engine, backend) = engine();
    let first = admit(&engine, "client").await;
    let second = admit(&engine, "client").await;
    let (Some(t1), Some(t2)) = (first.lease, second.lease) else {
        panic!("admitted requests hold leases: {first:?} {second:?}");
    };
    assert_ne!(t1, t2);
    let refused = admit(&engine, "client").await;
    assert_eq!(refused.overall, Code::OverLimit);
    assert_eq!(refused.lease, None, "a refused request holds no lease");
    assert_fresh_token(&backend);

    let released = engine.decide(&refund("client", Some(t1))).await.unwrap();
    assert_eq!(released.verdicts[0].outcome, Outcome::Refunded);
    assert_eq!(released.verdicts[0].window_count, 1);
    assert_eq!(released.lease, None);
    // The same refund again (or a late one) releases nothing more.
    let again = engine.decide(&refund("client", Some(t1))).await.unwrap();
    assert_eq!(again.verdicts[0].window_count, 1);
    assert_eq!(admit(&engine, "client").await.overall, Code::Ok);
}

/// The third (refused) request's batch carried a fresh token, as every request gets one.
fn assert_fresh_token(backend: &Recording) {
    let batches = backend.batches.lock().unwrap();
    let token = batches[2][0].lease;
    assert!(token != 0 && token != batches[0][0].lease && token != batches[1][0].lease);
}

#[tokio::test]
async fn a_refund_naming_no_lease_releases_none() {
    let (engine, backend) = engine();
    admit(&engine, "client").await;
    let decision = engine.decide(&refund("client", None)).await.unwrap();
    assert_eq!(decision.verdicts[0].outcome, Outcome::NoRule);
    assert_eq!(backend.batches.lock().unwrap().len(), 1, "nothing sent");
    // A value that is no token releases nothing either.
    let mut odd = refund("client", None);
    odd.descriptors[0]
        .entries
        .push(Entry::new(LEASE_KEY, "not-a-token"));
    let decision = engine.decide(&odd).await.unwrap();
    assert_eq!(decision.verdicts[0].window_count, 1);
    assert_eq!(backend.batches.lock().unwrap()[1][0].lease, 0);
}

#[tokio::test]
async fn stacked_limits_split_refunds_by_lease() {
    let (engine, backend) = engine();
    let admitted = admit(&engine, "route").await;
    let token = admitted.lease.expect("a lease");
    {
        let batches = backend.batches.lock().unwrap();
        let algorithms: Vec<_> = batches[0].iter().map(|h| (h.algorithm, h.lease)).collect();
        assert_eq!(
            algorithms,
            [(Algorithm::InFlight, token), (Algorithm::SlidingLog, 0)]
        );
    }
    engine.decide(&refund("route", Some(token))).await.unwrap();
    engine.decide(&refund("route", None)).await.unwrap();
    let batches = backend.batches.lock().unwrap();
    let sent = |i: usize| -> Vec<_> {
        batches[i]
            .iter()
            .map(|h| (h.algorithm, h.kind, h.lease))
            .collect()
    };
    assert_eq!(sent(1), [(Algorithm::InFlight, ItemKind::Refund, token)]);
    assert_eq!(sent(2), [(Algorithm::SlidingLog, ItemKind::Refund, 0)]);
}

/// A decision names a lease only when its request was admitted and one of its `in_flight`
/// items recorded one: not when another descriptor refused the request, not for a probe
/// (`hits_addend: 0`) beside an admitted rate limit, not for a refund beside a probe.
#[tokio::test]
async fn a_decision_names_a_lease_only_when_one_was_recorded() {
    let (engine, _) = engine();
    assert_eq!(admit(&engine, "user").await.overall, Code::Ok);
    let refused = engine
        .decide(&req(&[&[("client", "a")], &[("user", "a")]]))
        .await
        .unwrap();
    assert_eq!(refused.overall, Code::OverLimit);
    assert_eq!(
        refused.verdicts[0].code,
        Code::Ok,
        "the lease itself fitted"
    );
    assert_eq!(refused.lease, None, "refused by the other descriptor");

    let mut probe = req(&[&[("client", "a")], &[("user", "b")]]);
    probe.descriptors[0].hits_addend = Some(0);
    let probed = engine.decide(&probe).await.unwrap();
    assert_eq!(probed.overall, Code::Ok);
    assert_eq!(probed.lease, None, "a probe records no lease");

    let held = admit(&engine, "client").await.lease.expect("a lease");
    let mut release = refund("client", Some(held));
    release
        .descriptors
        .push(req(&[&[("route", "a")]]).descriptors.remove(0));
    release.descriptors[1].hits_addend = Some(0);
    let released = engine.decide(&release).await.unwrap();
    assert_eq!(released.verdicts[0].outcome, Outcome::Refunded);
    assert_eq!(released.lease, None, "a refund holds no lease");
}

#[test]
fn the_lease_entry_is_only_ever_the_last_one() {
    let entries = [Entry::new("client", "a"), Entry::new(LEASE_KEY, " 42 ")];
    assert_eq!(split_lease(&entries), (&entries[..1], Some(42)));
    let reversed = [Entry::new(LEASE_KEY, "42"), Entry::new("client", "a")];
    assert_eq!(split_lease(&reversed), (&reversed[..], None));
}
