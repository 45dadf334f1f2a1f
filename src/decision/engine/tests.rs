//! Unit tests of the engine: validation, resolution against one snapshot, the failure policy,
//! the tightest stacked limit, an engine awaiting its config.

use super::*;
use crate::decision::test_support::{Recording, YAML, config, engine, engine_with, req};
use crate::limiter::{Algorithm, BatchOutcome};
use async_trait::async_trait;

#[tokio::test]
async fn global_shadow_mode_keeps_statuses_and_answers_ok() {
    let (engine, _) = engine_with(EngineOptions {
        shadow_mode: true,
        ..EngineOptions::default()
    });
    let one = req(&[&[("user", "a")], &[("user", "b")]]);
    for _ in 0..2 {
        assert_eq!(engine.decide(&one).await.unwrap().overall, Code::Ok);
    }
    let third = engine.decide(&one).await.unwrap();
    assert_eq!(third.overall, Code::Ok, "global shadow mode never rejects");
    assert_eq!(third.verdicts[0].code, Code::OverLimit, "statuses are kept");
    assert_eq!(third.verdicts[0].outcome, Outcome::ShadowRejected);
    assert_eq!(third.verdicts[0].remaining, 0);
}

/// The (code, outcome) of each verdict and the overall code of deciding `request`.
async fn codes(engine: &Engine, request: &Request) -> (Code, Vec<(Code, Outcome)>) {
    let d = engine.decide(request).await.unwrap();
    let verdicts = d.verdicts.iter().map(|v| (v.code, v.outcome)).collect();
    (d.overall, verdicts)
}

/// envoyproxy/ratelimit's `QUOTA_MODE`: every descriptor is a quota one; the request is over
/// the limit only when all of them are. A quota descriptor over its limit on an admitted
/// request reports OVER_LIMIT in its own status.
#[tokio::test]
async fn global_quota_mode_rejects_only_when_every_descriptor_is_over() {
    let (engine, _) = engine_with(EngineOptions {
        quota_mode: true,
        ..EngineOptions::default()
    });
    let (ok, over) = (Code::Ok, Code::OverLimit);
    // user a: 2 a minute; shadow: 1 a minute, but global quota does not touch shadow rules.
    let both = req(&[&[("user", "a")], &[("user", "b")]]);
    for _ in 0..2 {
        assert_eq!(codes(&engine, &both).await.0, ok);
    }
    let (overall, verdicts) = codes(&engine, &both).await;
    assert_eq!(overall, over, "{verdicts:?}");
    assert_eq!(
        verdicts,
        [(over, Outcome::Rejected), (over, Outcome::Rejected)]
    );
    // One with room: admitted; the full one says it is over.
    let mixed = req(&[&[("user", "a")], &[("user", "c")]]);
    let (overall, verdicts) = codes(&engine, &mixed).await;
    assert_eq!(overall, ok);
    assert_eq!(
        verdicts,
        [(over, Outcome::QuotaExhausted), (ok, Outcome::Admitted)]
    );
    // An unlimited descriptor is no quota descriptor: the full one alone decides.
    let unlimited = req(&[&[("user", "a")], &[("bot", "x")]]);
    assert_eq!(codes(&engine, &unlimited).await.0, over);
    // A descriptor without a limit is a quota descriptor that always passes.
    let no_rule = req(&[&[("user", "a")], &[("user", "b")], &[("user", "trusted")]]);
    let (overall, verdicts) = codes(&engine, &no_rule).await;
    assert_eq!(overall, ok);
    assert_eq!(
        verdicts,
        [
            (over, Outcome::QuotaExhausted),
            (over, Outcome::QuotaExhausted),
            (ok, Outcome::NoRule)
        ]
    );
}

/// Global shadow mode wins over global quota mode: nothing is ever rejected.
#[tokio::test]
async fn global_shadow_mode_wins_over_global_quota_mode() {
    let (engine, _) = engine_with(EngineOptions {
        shadow_mode: true,
        quota_mode: true,
        ..EngineOptions::default()
    });
    let one = req(&[&[("user", "a")], &[("user", "b")]]);
    for _ in 0..3 {
        assert_eq!(codes(&engine, &one).await.0, Code::Ok);
    }
    let (_, verdicts) = codes(&engine, &one).await;
    assert!(
        verdicts
            .iter()
            .all(|v| *v == (Code::OverLimit, Outcome::ShadowRejected)),
        "{verdicts:?}"
    );
}

#[tokio::test]
async fn one_batch_per_request_with_every_limited_descriptor() {
    let (engine, backend) = engine();
    engine
        .decide(&req(&[
            &[("user", "a")],
            &[("bot", "b")],
            &[("shadow", "s")],
        ]))
        .await
        .unwrap();
    let batches = backend.batches.lock().unwrap();
    assert_eq!(batches.len(), 1);
    let kinds: Vec<_> = batches[0]
        .iter()
        .map(|h| (h.kind, h.limit, h.window_ms))
        .collect();
    assert_eq!(
        kinds,
        [
            (ItemKind::Consume, 2, 60_000),
            (ItemKind::Shadow, 1, 60_000)
        ]
    );
    // The engine keeps no clock: the backend decides on its own (Redis: the server's time).
    assert_eq!(*backend.nows.lock().unwrap(), [None]);
}

#[tokio::test]
async fn invalid_requests_never_reach_the_backend() {
    let (engine, backend) = engine();
    let mut bad = req(&[&[("user", "a")], &[("", "x")]]);
    let err = engine.decide(&bad).await.unwrap_err();
    assert!(
        matches!(err, DecisionError::Invalid(ref e) if e.field == "descriptors[1].entries[0].key")
    );
    bad.domain.clear();
    assert!(engine.decide(&bad).await.is_err());
    assert!(backend.batches.lock().unwrap().is_empty());
}

#[tokio::test]
async fn verdicts_report_remaining_and_rejection() {
    let (engine, _) = engine();
    let one = req(&[&[("user", "a")]]);
    let first = engine.decide(&one).await.unwrap();
    assert_eq!(
        (first.verdicts[0].remaining, first.verdicts[0].reset_ms),
        (1, 60_000)
    );
    assert_eq!(first.backend_failed, None);
    engine.decide(&one).await.unwrap();
    let third = engine.decide(&one).await.unwrap();
    assert_eq!(third.overall, Code::OverLimit);
    assert_eq!(third.verdicts[0].outcome, Outcome::Rejected);
    assert_eq!(third.hits, 1);
}

#[tokio::test]
async fn stacked_limits_admit_only_if_all_admit_and_report_the_tightest() {
    let yaml = "
domain: d
descriptors:
  - key: user
    rate_limits:
      - {unit: second, requests_per_unit: 3, name: burst}
      - {window: 90s, requests_per_unit: 4, algorithm: gcra, burst: 4, name: sustained}
";
    let limiter = Arc::new(Recording::new());
    let engine = Engine::new(config(yaml), limiter.clone());
    let one = req(&[&[("user", "a")]]);
    let first = engine.decide(&one).await.unwrap();
    let v = &first.verdicts[0];
    // Both admit; the per-second limit has 2 left, the 90 s GCRA 3: the first is tighter.
    assert_eq!(v.outcome, Outcome::Admitted);
    assert_eq!(v.limit.as_ref().unwrap().name.as_deref(), Some("burst"));
    assert_eq!(v.remaining, 2);
    {
        let batches = limiter.batches.lock().unwrap();
        let keys: Vec<&str> = batches[0].iter().map(|h| h.key.as_str()).collect();
        assert_eq!(
            keys,
            ["sluice:{d|user=a|1000}", "sluice:{d|user=a|90000|gcras1}"]
        );
        assert_eq!(batches[0][1].algorithm, Algorithm::Gcra { burst: 4 });
    }
    engine.decide(&one).await.unwrap();
    engine.decide(&one).await.unwrap();
    // The GCRA (4 per 90 s, burst 4) has one token left, the per-second limit none.
    let fourth = engine.decide(&one).await.unwrap();
    assert_eq!(fourth.overall, Code::OverLimit);
    let v = &fourth.verdicts[0];
    assert_eq!(v.outcome, Outcome::Rejected);
    let limit = v.limit.as_ref().unwrap();
    assert_eq!(limit.name.as_deref(), Some("burst"));
    // Nothing was recorded on the other limit of the rejected request.
    let probe = Item {
        hits: 0,
        ..limiter.batches.lock().unwrap()[0][1].clone()
    };
    let out = limiter.inner.decide(&[probe], None).await.unwrap();
    assert_eq!(out.items[0].count, 3);
}

/// Stacked limits in the other order: the tighter is reported wherever it stands, and of
/// two with as much left, the one resetting later.
#[tokio::test]
async fn the_tightest_stacked_limit_is_reported_whatever_its_place() {
    let yaml = "
domain: d
descriptors:
  - key: user
    rate_limits:
      - {window: 90s, requests_per_unit: 4, algorithm: gcra, burst: 4, name: sustained}
      - {unit: second, requests_per_unit: 3, name: burst}
  - key: tie
    rate_limits:
      - {unit: second, requests_per_unit: 3, name: short}
      - {unit: minute, requests_per_unit: 3, name: long}
  - key: same
    rate_limits:
      - {unit: second, requests_per_unit: 3, name: log}
      - {unit: second, requests_per_unit: 3, algorithm: fixed_window, name: fixed}
  - key: shadow
    shadow_mode: true
    rate_limits:
      - {unit: minute, requests_per_unit: 1, name: slow}
      - {unit: second, requests_per_unit: 5, name: fast}
";
    let engine = Engine::new(config(yaml), Arc::new(Recording::new()));
    let name = |d: &Decision| d.verdicts[0].limit.as_ref().unwrap().name.clone();
    let first = engine.decide(&req(&[&[("user", "a")]])).await.unwrap();
    assert_eq!(name(&first).as_deref(), Some("burst"));
    assert_eq!(first.verdicts[0].remaining, 2);
    let tie = engine.decide(&req(&[&[("tie", "a")]])).await.unwrap();
    assert_eq!(name(&tie).as_deref(), Some("long"));
    assert_eq!(tie.verdicts[0].reset_ms, 60_000);
    // Alike in everything (2 left, reset in 1 s on the engine's fixed clock): the first.
    let same = engine.decide(&req(&[&[("same", "a")]])).await.unwrap();
    assert_eq!(name(&same).as_deref(), Some("log"));
    assert_eq!(
        (same.verdicts[0].remaining, same.verdicts[0].reset_ms),
        (2, 1000)
    );
    // A shadow rule: the limit that failed (in shadow) is reported, not the one with room.
    let shadow = req(&[&[("shadow", "a")]]);
    engine.decide(&shadow).await.unwrap();
    let second = engine.decide(&shadow).await.unwrap();
    assert_eq!(name(&second).as_deref(), Some("slow"));
    assert_eq!(second.verdicts[0].outcome, Outcome::ShadowRejected);
}

/// A rule in shadow mode (the engine's global shadow mode off): over its limit, its status
/// says so and the request is still OK.
#[tokio::test]
async fn a_shadow_rule_over_its_limit_answers_ok() {
    let (engine, _) = engine();
    let one = req(&[&[("shadow", "s")]]);
    assert_eq!(engine.decide(&one).await.unwrap().overall, Code::Ok);
    let second = engine.decide(&one).await.unwrap();
    assert_eq!(second.overall, Code::Ok);
    assert_eq!(second.verdicts[0].code, Code::Ok);
    assert_eq!(second.verdicts[0].outcome, Outcome::ShadowRejected);
}

/// An engine started without limits answers NoConfig until the first config is swapped
/// in, then decides with it.
#[tokio::test]
async fn an_engine_awaiting_its_config_decides_once_it_arrives() {
    let engine = Engine::awaiting_config(Arc::new(Recording::new()), EngineOptions::default());
    assert!(!engine.is_configured());
    let one = req(&[&[("user", "a")]]);
    assert!(matches!(
        engine.decide(&one).await,
        Err(DecisionError::NoConfig)
    ));
    engine.replace_config(config(YAML));
    assert!(engine.is_configured());
    let decision = engine.decide(&one).await.unwrap();
    assert_eq!(
        decision.verdicts[0].remaining, 1,
        "decided with the new limits"
    );
}

/// A backend that always fails.
struct Down;

#[async_trait]
impl Limiter for Down {
    async fn decide(&self, _: &[Item], _: Option<u64>) -> Result<BatchOutcome, LimiterError> {
        Err(LimiterError::Timeout(5))
    }
    async fn ping(&self) -> Result<(), LimiterError> {
        Ok(())
    }
    fn name(&self) -> &'static str {
        "down"
    }
}

#[tokio::test]
async fn a_failed_backend_is_answered_by_the_policy_and_the_decision_says_which() {
    let request = req(&[&[("user", "a")], &[("shadow", "s")], &[("bot", "b")]]);
    let failing = |on_backend_error| {
        let options = EngineOptions {
            on_backend_error,
            ..EngineOptions::default()
        };
        Engine::with_options(config(YAML), Arc::new(Down), options)
    };
    let err = failing(FailurePolicy::Error).decide(&request).await;
    assert!(matches!(
        err,
        Err(DecisionError::Backend(LimiterError::Timeout(5)))
    ));

    let allowed = failing(FailurePolicy::Allow)
        .decide(&request)
        .await
        .unwrap();
    assert_eq!(allowed.backend_failed, Some(FailurePolicy::Allow));
    assert_eq!(allowed.overall, Code::Ok);
    let outcomes: Vec<_> = allowed.verdicts.iter().map(|v| v.outcome).collect();
    assert_eq!(
        outcomes,
        [
            Outcome::BackendAllowed,
            Outcome::BackendAllowed,
            Outcome::Unlimited
        ]
    );

    let denied = failing(FailurePolicy::Deny).decide(&request).await.unwrap();
    assert_eq!(denied.backend_failed, Some(FailurePolicy::Deny));
    assert_eq!(denied.overall, Code::OverLimit);
    let codes: Vec<_> = denied
        .verdicts
        .iter()
        .map(|v| (v.code, v.outcome))
        .collect();
    assert_eq!(
        codes,
        [
            (Code::OverLimit, Outcome::BackendDenied),
            (Code::Ok, Outcome::BackendDenied),
            (Code::Ok, Outcome::Unlimited)
        ],
        "a shadow limit never rejects, even under deny"
    );
    assert!(denied.verdicts.iter().all(|v| v.key.is_none()));
    // The limit each descriptor was decided against is still reported (Envoy's
    // `current_limit`), with nothing known of its window.
    let limits: Vec<_> = denied
        .verdicts
        .iter()
        .map(|v| v.limit.as_ref().map(|l| l.requests_per_unit))
        .collect();
    assert_eq!(limits, [Some(2), Some(1), None]);
    // Nothing is known of a limited window; the unlimited descriptor keeps its whole budget.
    let remaining: Vec<_> = denied
        .verdicts
        .iter()
        .map(|v| (v.remaining, v.reset_ms))
        .collect();
    assert_eq!(remaining, [(0, 0), (0, 0), (u32::MAX, 0)]);
}

/// Lease tokens run from 1 to 2^52 - 1 (the script's exact range), never 0 (no lease), and
/// one does not tell the next: no two consecutive ones are neighbours, and two processes'
/// sequences differ.
#[test]
fn lease_tokens_stay_in_the_scripts_range_and_cannot_be_guessed() {
    let top = (1u64 << 52) - 1;
    let tokens = LeaseTokens::new();
    let seen: Vec<u64> = (0..10_000).map(|_| tokens.next()).collect();
    let edges = [0, 1, u64::MAX - 1, u64::MAX].map(|n| tokens.token(n));
    assert!(
        seen.iter().chain(&edges).all(|&t| (1..=top).contains(&t)),
        "a token out of range"
    );
    let neighbours = seen
        .windows(2)
        .filter(|w| w[0].abs_diff(w[1]) <= 1_000)
        .count();
    assert_eq!(
        neighbours, 0,
        "consecutive tokens lie within 1,000 of each other"
    );
    let distinct: std::collections::HashSet<_> = seen.iter().collect();
    assert_eq!(distinct.len(), seen.len());
    let other = LeaseTokens::new();
    assert_ne!(
        (0..4).map(|_| other.next()).collect::<Vec<_>>(),
        seen[..4],
        "another process (another key) has other tokens"
    );
}
