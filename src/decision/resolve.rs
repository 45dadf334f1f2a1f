//! Rule resolution: each descriptor of a request, against one config snapshot, becomes either a
//! verdict settled without the backend (unknown domain, no rule, whitelist, `unlimited`, a limit
//! dropped by `replaces`) or the limits it counts against and the limiter [`Item`]s they need.
//!
//! Why apart from the engine: this is the part of envoyproxy/ratelimit's semantics that needs
//! no backend (overrides, stacked limits, shadow and quota modes, `share_threshold` keys,
//! `replaces`), so `sluice explain` reuses it as is and cannot drift from what is served. Pure:
//! config and request in, plans out.

use std::collections::HashSet;

use crate::config::{
    Config, HeaderPolicy, LimitAlgorithm, LimitSpec, Lookup, OverLimitSetting, Rule,
};
use crate::descriptor::{Entry, limiter_key_tagged};
use crate::limiter::{Algorithm, Item, ItemKind, OverLimit};

use super::types::{
    CurrentLimit, Descriptor, EngineOptions, LEASE_KEY, Outcome, Request, StatKey, Verdict,
};

/// The rule-driven part of one descriptor, before the backend is asked: either settled without
/// the backend, or the limit and the limiter item it needs.
pub enum Resolution<'c> {
    Done(Verdict),
    Limited {
        rule: Option<&'c Rule>,
        limit: CurrentLimit,
        hit: Item,
        headers: HeaderPolicy,
        /// Stacked limits after the first (`rate_limits`): each its own key; the descriptor is
        /// admitted only if all admit, and its verdict reports the tightest.
        stacked: Vec<(CurrentLimit, Item)>,
        /// What names the descriptor's stats.
        stat: StatKey,
    },
}

/// Resolves every descriptor against one config snapshot: overrides, `unlimited`, whitelists and
/// `replaces` are settled here, so only real limits reach the backend.
pub fn resolve<'c>(
    config: &'c Config,
    request: &Request,
    options: &EngineOptions,
) -> Vec<Resolution<'c>> {
    let known_domain = config.has_domain(&request.domain);
    let mut plans: Vec<Resolution<'c>> = request
        .descriptors
        .iter()
        .map(|descriptor| {
            if known_domain {
                resolve_descriptor(config, request, descriptor, options)
            } else {
                Resolution::Done(Verdict::unlimited_or_none(Outcome::NoRule, None))
            }
        })
        .collect();
    drop_replaced(&mut plans);
    plans
}

/// A descriptor's entries without a last [`LEASE_KEY`] entry, and the lease that entry names:
/// its token, 0 for a value that is not one (such a refund releases nothing), `None` without
/// the entry.
pub fn split_lease(entries: &[Entry]) -> (&[Entry], Option<u64>) {
    match entries.split_last() {
        Some((last, rest)) if last.key == LEASE_KEY => {
            (rest, Some(last.value.trim().parse().unwrap_or(0)))
        }
        _ => (entries, None),
    }
}

/// Whether a descriptor's limit counted by `algorithm` takes part: a refund naming a lease
/// releases it on the `in_flight` limits and touches no other; any other item leaves leases
/// alone only when it is a refund without a lease (which would release nothing).
fn applies(algorithm: Algorithm, kind: ItemKind, lease: Option<u64>) -> bool {
    match (kind, lease) {
        (ItemKind::Refund, Some(_)) => algorithm == Algorithm::InFlight,
        (ItemKind::Refund, None) => algorithm != Algorithm::InFlight,
        _ => true,
    }
}

/// One descriptor of a configured domain.
fn resolve_descriptor<'c>(
    config: &'c Config,
    request: &Request,
    descriptor: &Descriptor,
    options: &EngineOptions,
) -> Resolution<'c> {
    let (entries, lease) = split_lease(&descriptor.entries);
    let rule = match config.lookup(&request.domain, entries) {
        Lookup::Rule { rule, .. } => Some(rule),
        Lookup::NoRule | Lookup::UnknownDomain => None,
    };
    let limits = match limits_of(descriptor, rule) {
        Ok(limits) => limits,
        Err(outcome) => return Resolution::Done(Verdict::unlimited_or_none(outcome, rule)),
    };
    let kind = hit_kind(descriptor, rule, options);
    let headers = match kind {
        ItemKind::Consume | ItemKind::Quota => {
            rule.map_or_else(|| config.domain_headers(&request.domain), |r| r.headers)
        }
        ItemKind::Shadow | ItemKind::Refund => HeaderPolicy::default(),
    };
    let hits = descriptor.hits_addend.unwrap_or(request_hits(request));
    let over_limit = over_limit_of(rule.map_or_else(OverLimitSetting::default, |r| r.over_limit));
    let mut parts = limits
        .into_iter()
        .enumerate()
        .filter(|(_, (_, algorithm))| applies(*algorithm, kind, lease))
        .map(|(i, (limit, algorithm))| {
            let key = key_for(
                options,
                &request.domain,
                entries,
                rule,
                limit.window_ms,
                &key_tag(algorithm, i),
            );
            let hit = Item {
                key,
                limit: u64::from(limit.requests_per_unit),
                window_ms: limit.window_ms,
                hits,
                kind,
                over_limit,
                algorithm,
                // A refund's lease; a recording item's is the request's, set by the engine.
                lease: if kind == ItemKind::Refund {
                    lease.unwrap_or(0)
                } else {
                    0
                },
                hold_ms: 0,
            };
            (limit, hit)
        });
    let Some((limit, hit)) = parts.next() else {
        return Resolution::Done(Verdict::unlimited_or_none(Outcome::NoRule, rule));
    };
    let stat = match (descriptor.limit_override, rule) {
        (None, Some(rule)) => StatKey::Rule(rule.stat.clone()),
        _ => StatKey::Override,
    };
    Resolution::Limited {
        rule,
        headers,
        limit,
        hit,
        stacked: parts.collect(),
        stat,
    }
}

/// The request's own hits, for descriptors without theirs: `hits_addend`, 0 meaning 1.
fn request_hits(request: &Request) -> u64 {
    if request.hits_addend == 0 {
        1
    } else {
        u64::from(request.hits_addend)
    }
}

/// The limits a descriptor counts against, first the one it reports, or the outcome of a
/// descriptor that counts against none (`unlimited`, a whitelist, no rule).
fn limits_of(
    descriptor: &Descriptor,
    rule: Option<&Rule>,
) -> Result<Vec<(CurrentLimit, Algorithm)>, Outcome> {
    // An override names a count and a unit only: it counts with the sliding log.
    if let Some(o) = descriptor.limit_override {
        let limit = CurrentLimit {
            requests_per_unit: o.requests_per_unit,
            unit: o.unit,
            name: None,
            window_ms: o.unit.window_ms(),
        };
        return Ok(vec![(limit, Algorithm::SlidingLog)]);
    }
    let Some(rule) = rule else {
        return Err(Outcome::NoRule);
    };
    // A counted rule lists each of its limits in `limits`, a single `rate_limit` included.
    match rule.limit {
        Some(LimitSpec::PerUnit { .. }) => Ok(rule
            .limits
            .iter()
            .map(|l| {
                let limit = CurrentLimit {
                    requests_per_unit: l.requests_per_unit,
                    unit: l.unit,
                    name: l.name.clone(),
                    window_ms: l.window_ms,
                };
                (limit, algorithm_of(l.algorithm))
            })
            .collect()),
        Some(LimitSpec::Unlimited) => Err(Outcome::Unlimited),
        None => Err(Outcome::NoRule),
    }
}

/// How the descriptor's hits treat their keys: a refund, shadow mode (global or the rule's),
/// quota mode (global or the rule's), or plain consumption.
fn hit_kind(descriptor: &Descriptor, rule: Option<&Rule>, options: &EngineOptions) -> ItemKind {
    if descriptor.negative {
        ItemKind::Refund
    } else if options.shadow_mode || rule.is_some_and(|r| r.shadow_mode) {
        ItemKind::Shadow
    } else if options.quota_mode || rule.is_some_and(|r| r.quota_mode) {
        ItemKind::Quota
    } else {
        ItemKind::Consume
    }
}

/// The limiter's over-limit setting for a configured one.
fn over_limit_of(setting: OverLimitSetting) -> OverLimit {
    match setting {
        OverLimitSetting::Refuse => OverLimit::Refuse,
        OverLimitSetting::Fill => OverLimit::Fill,
        OverLimitSetting::Record => OverLimit::Record,
    }
}

/// The limiter's algorithm for a configured one.
fn algorithm_of(spec: LimitAlgorithm) -> Algorithm {
    match spec {
        LimitAlgorithm::SlidingLog => Algorithm::SlidingLog,
        LimitAlgorithm::QuantizedLog { quantum_ms } => Algorithm::QuantizedLog { quantum_ms },
        LimitAlgorithm::SlidingCounter => Algorithm::SlidingCounter,
        LimitAlgorithm::Gcra { burst } => Algorithm::Gcra {
            burst: u64::from(burst),
        },
        LimitAlgorithm::FixedWindow => Algorithm::FixedWindow,
        LimitAlgorithm::InFlight => Algorithm::InFlight,
    }
}

/// The key tag of a descriptor's `index`-th limit: the algorithm's, then `s<index>` for stacked
/// limits after the first, so algorithms and stacked limits never share a key.
fn key_tag(algorithm: Algorithm, index: usize) -> String {
    let mut tag = algorithm.key_tag();
    if index > 0 {
        tag.push_str(&format!("s{index}"));
    }
    tag
}

/// The limiter key of a limited descriptor: its own entries, except that values matched by a
/// `share_threshold` wildcard are replaced by the wildcard, so all of them share one counter.
/// `tag` keeps algorithms and stacked limits apart (empty for a lone sliding-log limit, whose
/// key is what it always was).
fn key_for(
    options: &EngineOptions,
    domain: &str,
    entries: &[Entry],
    rule: Option<&Rule>,
    window_ms: u64,
    tag: &str,
) -> String {
    let shared = rule.map_or(&[][..], |r| r.shared_values.as_slice());
    if shared.is_empty() {
        return limiter_key_tagged(&options.key_prefix, domain, entries, window_ms, tag);
    }
    let mut entries = entries.to_vec();
    for (depth, pattern) in shared {
        if let Some(entry) = entries.get_mut(*depth) {
            entry.value.clone_from(pattern);
        }
    }
    limiter_key_tagged(&options.key_prefix, domain, &entries, window_ms, tag)
}

/// `replaces`: a limit named by another matched rule of this request is dropped (the
/// descriptor is then settled as `no_rule`).
fn drop_replaced(plans: &mut [Resolution<'_>]) {
    let replaced: HashSet<&str> = plans
        .iter()
        .filter_map(|p| match p {
            Resolution::Limited {
                rule: Some(rule), ..
            } => Some(rule.replaces.iter().map(String::as_str)),
            _ => None,
        })
        .flatten()
        .collect();
    if replaced.is_empty() {
        return;
    }
    for p in plans.iter_mut() {
        if let Resolution::Limited {
            rule: Some(rule),
            limit,
            ..
        } = p
            && limit.name.as_deref().is_some_and(|n| replaced.contains(n))
        {
            let rule = *rule;
            *p = Resolution::Done(Verdict::unlimited_or_none(Outcome::NoRule, Some(rule)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    use crate::config::Unit;
    use crate::decision::test_support::{FixedClock, YAML, config, engine, engine_with, req};
    use crate::decision::{Code, Engine, LimitOverride};
    use crate::limiter::memory::MemoryLimiter;

    /// A descriptor without hits of its own takes the request's `hits_addend` (0 meaning 1);
    /// its own wins.
    #[tokio::test]
    async fn hits_come_from_the_descriptor_else_the_request() {
        let (engine, backend) = engine();
        let mut request = req(&[&[("user", "a")], &[("path", "/web/x")]]);
        request.hits_addend = 3;
        request.descriptors[1].hits_addend = Some(5);
        engine.decide(&request).await.unwrap();
        request.hits_addend = 0;
        request.descriptors[1].hits_addend = None;
        engine.decide(&request).await.unwrap();
        let hits: Vec<Vec<u64>> = backend
            .batches
            .lock()
            .unwrap()
            .iter()
            .map(|b| b.iter().map(|h| h.hits).collect())
            .collect();
        assert_eq!(hits, [[3, 5], [1, 1]]);
    }

    #[tokio::test]
    async fn share_threshold_values_share_one_counter() {
        let (engine, backend) = engine();
        for (path, expected) in [
            ("/api/a", Code::Ok),
            ("/api/b", Code::Ok),
            ("/api/c", Code::OverLimit),
        ] {
            let d = engine.decide(&req(&[&[("path", path)]])).await.unwrap();
            assert_eq!(d.overall, expected, "{path}");
        }
        // Without share_threshold each value has its own counter.
        for path in ["/web/a", "/web/b", "/web/c"] {
            let d = engine.decide(&req(&[&[("path", path)]])).await.unwrap();
            assert_eq!(d.overall, Code::Ok, "{path}");
        }
        let batches = backend.batches.lock().unwrap();
        assert_eq!(batches[0][0].key, "sluice:{d|path=/api/*|60000}");
        assert_eq!(batches[1][0].key, batches[0][0].key);
        assert_ne!(batches[3][0].key, batches[4][0].key);
    }

    #[tokio::test]
    async fn over_limit_reaches_every_limit_of_its_rule() {
        let yaml = "
domain: d
descriptors:
  - key: a
    over_limit: record
    rate_limits: [{unit: minute, requests_per_unit: 2}, {unit: hour, requests_per_unit: 9}]
  - key: b
    over_limit: Refuse
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: c
    rate_limit: {unit: minute, requests_per_unit: 2}
";
        let backend = Arc::new(crate::decision::test_support::Recording::new());
        let engine = Engine::new(config(yaml), backend.clone());
        let request = req(&[&[("a", "x")], &[("b", "x")], &[("c", "x")]]);
        engine.decide(&request).await.unwrap();
        let batches = backend.batches.lock().unwrap();
        let settings: Vec<OverLimit> = batches[0].iter().map(|h| h.over_limit).collect();
        assert_eq!(
            settings,
            [
                OverLimit::Record,
                OverLimit::Record,
                OverLimit::Refuse,
                OverLimit::Fill
            ]
        );
    }

    #[tokio::test]
    async fn key_prefix_is_applied() {
        let (engine, backend) = engine_with(EngineOptions {
            key_prefix: "rl_".into(),
            ..EngineOptions::default()
        });
        engine.decide(&req(&[&[("user", "a")]])).await.unwrap();
        assert_eq!(
            backend.batches.lock().unwrap()[0][0].key,
            "rl_{d|user=a|60000}"
        );
    }

    #[tokio::test]
    async fn unlimited_whitelisted_and_unknown_never_reach_the_backend() {
        let (engine, backend) = engine();
        let d = engine
            .decide(&req(&[
                &[("bot", "x")],
                &[("user", "trusted")],
                &[("nope", "x")],
            ]))
            .await
            .unwrap();
        assert_eq!(d.overall, Code::Ok);
        let outcomes: Vec<_> = d.verdicts.iter().map(|v| v.outcome).collect();
        assert_eq!(
            outcomes,
            [Outcome::Unlimited, Outcome::NoRule, Outcome::NoRule]
        );
        // envoyproxy/ratelimit's answers: all of an unlimited budget remains, none of no limit.
        let remaining: Vec<_> = d.verdicts.iter().map(|v| v.remaining).collect();
        assert_eq!(remaining, [u32::MAX, 0, 0]);
        let mut other = req(&[&[("user", "a")]]);
        other.domain = "unknown".into();
        assert!(!engine.decide(&other).await.unwrap().known_domain);
        assert!(backend.batches.lock().unwrap().is_empty());
    }

    /// envoyproxy/ratelimit's answers to a descriptor without entries: no rule matches it (OK,
    /// no limit) and the request's other descriptors are decided as usual; a `limit` override
    /// still counts, on one key for the domain.
    #[tokio::test]
    async fn an_empty_descriptor_matches_no_rule() {
        let (engine, backend) = engine();
        let d = engine.decide(&req(&[&[], &[("user", "a")]])).await.unwrap();
        let outcomes: Vec<_> = d.verdicts.iter().map(|v| v.outcome).collect();
        assert_eq!(outcomes, [Outcome::NoRule, Outcome::Admitted]);
        assert_eq!(d.verdicts[0].limit, None);
        let mut overridden = req(&[&[]]);
        overridden.descriptors[0].limit_override = Some(LimitOverride {
            requests_per_unit: 1,
            unit: Unit::Minute,
        });
        let first = engine.decide(&overridden).await.unwrap();
        let second = engine.decide(&overridden).await.unwrap();
        assert_eq!((first.overall, second.overall), (Code::Ok, Code::OverLimit));
        let batches = backend.batches.lock().unwrap();
        assert_eq!(batches.len(), 3, "{batches:?}");
        assert_eq!(batches[1][0].key, "sluice:{d|60000}");
    }

    #[tokio::test]
    async fn replaced_limit_is_not_sent() {
        let (engine, backend) = engine();
        let d = engine
            .decide(&req(&[&[("user", "a")], &[("vip", "v")]]))
            .await
            .unwrap();
        assert_eq!(d.verdicts[0].outcome, Outcome::NoRule);
        assert!(d.verdicts[0].limit.is_none());
        assert_eq!(d.verdicts[1].limit.as_ref().unwrap().requests_per_unit, 10);
        assert_eq!(backend.batches.lock().unwrap()[0].len(), 1);
    }

    #[test]
    fn resolve_settles_what_needs_no_backend() {
        // `sluice explain` calls `resolve` directly, without an engine or a backend.
        let config = config(YAML);
        let request = req(&[&[("user", "a")], &[("vip", "v")], &[("bot", "b")]]);
        let plans = resolve(&config, &request, &EngineOptions::default());
        let shapes: Vec<_> = plans
            .iter()
            .map(|p| match p {
                Resolution::Done(v) => (v.outcome.as_str(), None),
                Resolution::Limited { hit, .. } => ("limited", Some(hit.key.as_str())),
            })
            .collect();
        assert_eq!(
            shapes,
            [
                ("no_rule", None),
                ("limited", Some("sluice:{d|vip=v|3600000}")),
                ("unlimited", None)
            ]
        );
    }

    #[tokio::test]
    async fn zero_requests_per_unit_is_always_over() {
        let (engine, _) = engine();
        let mut r = req(&[&[("user", "z")]]);
        r.descriptors[0].limit_override = Some(LimitOverride {
            requests_per_unit: 0,
            unit: Unit::Second,
        });
        let d = engine.decide(&r).await.unwrap();
        assert_eq!(d.overall, Code::OverLimit);
    }

    #[tokio::test]
    async fn custom_windows_report_the_nearest_unit_and_the_real_window() {
        let yaml = "
domain: d
descriptors:
  - key: k
    rate_limit: {window: 30s, requests_per_unit: 1}
";
        let engine = Engine::new(
            config(yaml),
            Arc::new(MemoryLimiter::new(Arc::new(FixedClock(0)))),
        );
        let d = engine.decide(&req(&[&[("k", "v")]])).await.unwrap();
        let limit = d.verdicts[0].limit.as_ref().unwrap();
        assert_eq!((limit.unit, limit.window_ms), (Unit::Minute, 30_000));
        assert_eq!(d.verdicts[0].reset_ms, 30_000);
    }
}
