//! `sluice explain`: which rule governs each descriptor of a request, and why, without touching
//! any backend.
//!
//! Why: envoyproxy/ratelimit's matching (exact, then wildcard, then key-only; a limit only at the
//! last entry; `replaces` across descriptors) surprises people, and the only way to find out what
//! a descriptor gets is usually to send traffic. This reuses the engine's own resolution
//! ([`crate::decision::resolve`]) so the explanation cannot drift from what is served.

use std::fmt::Write as _;

use crate::config::{
    Config, HeaderFormat, HeaderPolicy, LimitSpec, MatchKind, Rule, Trace, TraceEnd,
};
use crate::decision::{self, CurrentLimit, Descriptor, Outcome, Request, Resolution};
use crate::descriptor::Entry;
use crate::limiter::{Algorithm, Item, OverLimit};
use crate::quota;

/// A limit as people say it: `3 per minute`, or `3 in flight (lease 60000 ms)`.
fn limit_text(requests_per_unit: u32, unit: crate::config::Unit, hit: &Item) -> String {
    match hit.algorithm {
        Algorithm::InFlight => {
            format!("{requests_per_unit} in flight (lease {} ms)", hit.window_ms)
        }
        _ => format!("{requests_per_unit} per {unit}"),
    }
}

/// How the limiter counts a key: `(sliding_log, window 60000 ms)`, `(in_flight, lease ...)`.
fn counting_text(hit: &Item) -> String {
    let span = match hit.algorithm {
        Algorithm::InFlight => "lease",
        _ => "window",
    };
    format!("({}, {span} {} ms)", hit.algorithm.name(), hit.window_ms)
}

/// Parses one descriptor written as `key=value[,key=value...]`. A value may contain `=`; keys
/// and values cannot contain `,` in this syntax.
pub fn parse_descriptor(text: &str) -> Result<Vec<Entry>, String> {
    text.split(',')
        .map(|pair| match pair.split_once('=') {
            Some(("", _)) => Err(format!("empty key in `{pair}`")),
            Some((key, value)) => Ok(Entry::new(key, value)),
            None => Err(format!("`{pair}` is not key=value")),
        })
        .collect()
}

fn kind_text(kind: MatchKind) -> &'static str {
    match kind {
        MatchKind::Exact => "exact",
        MatchKind::Wildcard => "wildcard",
        MatchKind::KeyOnly => "key-only",
    }
}

fn format_text(format: HeaderFormat) -> &'static str {
    match format {
        HeaderFormat::None => "none",
        HeaderFormat::Draft => "draft",
        HeaderFormat::Legacy => "legacy",
    }
}

fn entries_text(entries: &[Entry]) -> String {
    entries
        .iter()
        .map(|e| format!("{}={}", e.key, e.value))
        .collect::<Vec<_>>()
        .join(",")
}

/// Renders the explanation of a request made of `descriptors` in `domain`.
pub fn explain(config: &Config, domain: &str, descriptors: &[Vec<Entry>]) -> String {
    let request = Request {
        domain: domain.to_owned(),
        descriptors: descriptors.iter().cloned().map(Descriptor::new).collect(),
        hits_addend: 0,
    };
    let mut out = String::new();
    if !config.has_domain(domain) {
        let known: Vec<&str> = config.domains().collect();
        let _ = writeln!(
            out,
            "domain `{domain}` is not in the config (domains: {}): every descriptor is OK without a limit",
            known.join(", ")
        );
        return out;
    }
    let resolutions = decision::resolve(config, &request, &decision::EngineOptions::default());
    for (i, (entries, resolution)) in descriptors.iter().zip(&resolutions).enumerate() {
        let _ = writeln!(out, "descriptor {i}: {}", entries_text(entries));
        let trace = config.trace(domain, entries);
        steps(&mut out, entries, &trace);
        match resolution {
            Resolution::Done(verdict) => {
                let reason = no_limit_reason(verdict.outcome, entries, &trace);
                let _ = writeln!(out, "  result: OK without a limit ({reason})");
            }
            Resolution::Limited {
                rule,
                limit,
                hit,
                headers,
                stacked,
                ..
            } => limited(&mut out, *rule, limit, hit, *headers, stacked),
        }
    }
    out
}

/// Renders what the Rate Limit Quota Service gives each of `buckets` (their entries, in no
/// order) on a stream of `domain`: the descriptor the bucket reads as, the walk, and the
/// answer: allotments reserved on the rule's limits, or a blanket rule and why.
pub fn explain_buckets(config: &Config, domain: &str, buckets: &[Vec<Entry>]) -> String {
    let mut out = String::new();
    let options = decision::EngineOptions::default();
    for (i, entries) in buckets.iter().enumerate() {
        let bucket: quota::BucketId = entries
            .iter()
            .map(|e| (e.key.clone(), e.value.clone()))
            .collect();
        let plan = quota::plan(config, domain, &bucket, &options);
        let sorted: Vec<Entry> = bucket.iter().map(|(k, v)| Entry::new(k, v)).collect();
        let _ = writeln!(out, "bucket {i}: {}", entries_text(&sorted));
        let _ = writeln!(out, "  read as descriptor: {}", entries_text(&plan.entries));
        let trace = config.trace(domain, &plan.entries);
        steps(&mut out, &plan.entries, &trace);
        match &plan.kind {
            quota::PlanKind::Blanket(answer) => {
                let rule = match answer.blanket() {
                    Some(quota::Assignment::AllowAll) => "ALLOW_ALL",
                    _ => "DENY_ALL",
                };
                let why = match answer {
                    quota::Answer::Unlimited => {
                        "unlimited: always allowed, never counted".to_owned()
                    }
                    quota::Answer::Whitelisted => {
                        "the descriptor it reaches has no rate_limit (a whitelist)".to_owned()
                    }
                    quota::Answer::Shadow => "shadow mode: never enforced".to_owned(),
                    quota::Answer::Unsupported => "a limit of its rule counts with an algorithm \
                                                  other than sliding_log, which cannot hold a \
                                                  reservation"
                        .to_owned(),
                    quota::Answer::UnknownDomain => {
                        format!("domain `{domain}` is not in the config")
                    }
                    _ => format!("no rule: {}", unmatched(&plan.entries, &trace)),
                };
                let _ = writeln!(
                    out,
                    "  quota service: {rule} at every report, for {} s each ({why})",
                    quota::ASSIGNMENT_TTL_S
                );
            }
            quota::PlanKind::Reserve {
                rule,
                items,
                pace,
                cap,
            } => {
                let tokens = if *cap == 1 { "token" } else { "tokens" };
                let _ = writeln!(
                    out,
                    "  quota service: allotments from rule `{rule}` of at most {cap} {tokens} \
                     per assignment (each lives {} s), each counted on every key below from its \
                     grant until {} ms + the key's window later",
                    quota::ASSIGNMENT_TTL_S,
                    quota::HOLD_MS
                );
                for item in items {
                    let _ = writeln!(
                        out,
                        "  reserves on key {} {}, limit {}",
                        item.key,
                        counting_text(item),
                        item.limit
                    );
                }
                for item in pace {
                    let _ = writeln!(
                        out,
                        "  paced on key {} (gcra: {} per {} ms, burst {cap})",
                        item.key, item.limit, item.window_ms
                    );
                }
            }
        }
    }
    out
}

/// A line per entry the walk matched: how, which rule, and that rule's limit.
fn steps(out: &mut String, entries: &[Entry], trace: &Trace<'_>) {
    for (j, (rule, kind)) in trace.steps.iter().enumerate() {
        let entry = &entries[j];
        let limit = match rule.limit {
            Some(LimitSpec::Unlimited) => " (unlimited)".to_owned(),
            Some(LimitSpec::PerUnit {
                requests_per_unit,
                unit,
            }) => format!(" (limit {requests_per_unit} per {unit})"),
            None => String::new(),
        };
        let _ = writeln!(
            out,
            "  entry {j} {}={}: {} match of `{}`{limit}",
            entry.key,
            entry.value,
            kind_text(*kind),
            rule.path
        );
    }
}

/// Why a descriptor settled without the backend is OK without a limit.
fn no_limit_reason(outcome: Outcome, entries: &[Entry], trace: &Trace<'_>) -> String {
    match (outcome, trace.end) {
        (Outcome::Unlimited, _) => "unlimited: always OK, never counted".to_owned(),
        (_, TraceEnd::Matched { nested }) => {
            match (trace.steps.last().and_then(|(r, _)| r.limit), nested) {
                (Some(_), _) => "replaced: another descriptor of this request matched a rule \
                                 whose `replaces` names this limit"
                    .to_owned(),
                (None, false) => "whitelisted: the matched descriptor has no rate_limit and no \
                                  nested descriptors"
                    .to_owned(),
                (None, true) => "no limit at this level: the matched descriptor has no \
                                 rate_limit of its own, only its nested descriptors do (a \
                                 longer descriptor reaches them)"
                    .to_owned(),
            }
        }
        _ => format!("no rule: {}", unmatched(entries, trace)),
    }
}

/// Why the walk found no rule for the descriptor.
fn unmatched(entries: &[Entry], trace: &Trace<'_>) -> String {
    match trace.end {
        TraceEnd::UnknownDomain => "unknown domain".to_owned(),
        TraceEnd::NoMatch { entry } => format!(
            "entry {entry} ({}) matches no descriptor at its level",
            entries
                .get(entry)
                .map_or(String::new(), |e| format!("{}={}", e.key, e.value))
        ),
        TraceEnd::DeeperThanConfig { entry } => format!(
            "deeper than config: `{}` has no nested descriptors for entry {entry}; a limit \
             applies only at the request's last entry",
            trace.steps.last().map_or("", |(r, _)| r.path.as_str())
        ),
        TraceEnd::Matched { .. } => String::new(),
    }
}

/// The lines of a descriptor the backend would count: its limit and rule, the limiter key,
/// the response headers, and each stacked limit.
fn limited(
    out: &mut String,
    rule: Option<&Rule>,
    limit: &CurrentLimit,
    hit: &Item,
    headers: HeaderPolicy,
    stacked: &[(CurrentLimit, Item)],
) {
    let rule_text = rule.map_or("(no rule)".to_owned(), |r| format!("`{}`", r.path));
    let name = limit
        .name
        .as_deref()
        .map_or(String::new(), |n| format!(", name `{n}`"));
    let mode = if rule.is_some_and(|r| r.shadow_mode) {
        ", shadow mode: over-limit reported OK"
    } else if rule.is_some_and(|r| r.quota_mode) {
        ", quota mode: rejects only when every quota descriptor is over"
    } else {
        ""
    };
    let over_limit = match hit.over_limit {
        OverLimit::Fill => String::new(),
        other => format!(", over limit: {}", other.name()),
    };
    let _ = writeln!(
        out,
        "  result: limit {}{name} from rule {rule_text}{mode}{over_limit}",
        limit_text(limit.requests_per_unit, limit.unit, hit)
    );
    let _ = writeln!(out, "  limiter key: {} {}", hit.key, counting_text(hit));
    let hidden = if headers.hide_remaining {
        ", remaining count hidden"
    } else {
        ""
    };
    let _ = writeln!(
        out,
        "  response headers: {}{hidden}",
        format_text(headers.format)
    );
    for (limit, hit) in stacked {
        let _ = writeln!(
            out,
            "  and stacked limit {}: key {} {}",
            limit_text(limit.requests_per_unit, limit.unit, hit),
            hit.key,
            counting_text(hit)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    const YAML: &str = "
domain: edge
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 5, name: per_user}
  - key: user
    value: ops
  - key: path
    value: /api/*
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: tier
    value: gold
    descriptors:
      - key: user
        rate_limit: {unit: hour, requests_per_unit: 100, replaces: [{name: per_user}]}
  - key: bot
    rate_limit: {unlimited: true}
  - key: public
    response_headers: {format: legacy, hide_remaining: true}
    rate_limit: {unit: second, requests_per_unit: 9}
";

    fn run(descriptors: &[&str]) -> String {
        let config = Config::from_yaml_str(Path::new("edge.yaml"), YAML).unwrap();
        let parsed: Vec<Vec<Entry>> = descriptors
            .iter()
            .map(|d| parse_descriptor(d).unwrap())
            .collect();
        explain(&config, "edge", &parsed)
    }

    #[test]
    fn explains_each_kind_of_match() {
        let text = run(&[
            "user=alice",
            "path=/api/x",
            "user=ops",
            "bot=b",
            "color=red",
        ]);
        assert!(
            text.contains("entry 0 user=alice: key-only match of `user` (limit 5 per minute)"),
            "{text}"
        );
        assert!(
            text.contains("limiter key: sluice:{edge|user=alice|60000}"),
            "{text}"
        );
        assert!(
            text.contains("entry 0 path=/api/x: wildcard match of `path_/api/*`"),
            "{text}"
        );
        assert!(
            text.contains("whitelisted: the matched descriptor has no rate_limit and no nested"),
            "{text}"
        );
        assert!(text.contains("unlimited: always OK"), "{text}");
        assert!(
            text.contains("entry 0 (color=red) matches no descriptor"),
            "{text}"
        );
    }

    #[test]
    fn says_which_response_headers_a_limit_asks_for() {
        let text = run(&["user=alice", "public=x"]);
        let blocks: Vec<&str> = text.split("descriptor ").skip(1).collect();
        assert!(blocks[0].contains("  response headers: none\n"), "{text}");
        assert!(
            blocks[1].contains("  response headers: legacy, remaining count hidden\n"),
            "{text}"
        );
    }

    #[test]
    fn explains_replaced_and_deeper_than_config() {
        let text = run(&["user=alice", "tier=gold,user=alice", "user=bob,extra=1"]);
        assert!(text.contains("replaced: another descriptor"), "{text}");
        assert!(text.contains("limit 100 per hour"), "{text}");
        assert!(
            text.contains("deeper than config: `user` has no nested descriptors"),
            "{text}"
        );
    }

    /// A node with nested descriptors but no limit of its own is not a whitelist entry
    /// (docs/config.md: a whitelist is a value with no limit and no children): the walk stopped
    /// above its limits.
    #[test]
    fn a_node_with_nested_descriptors_is_not_called_whitelisted() {
        let text = run(&["tier=gold"]);
        assert!(text.contains("no limit at this level"), "{text}");
        assert!(!text.contains("whitelisted"), "{text}");
    }

    #[test]
    fn in_flight_limits_are_said_in_requests_and_lease() {
        let yaml = "
domain: edge
descriptors:
  - key: client
    rate_limits:
      - {requests_per_unit: 4, algorithm: in_flight, lease: 60s}
      - {unit: second, requests_per_unit: 10}
";
        let config = Config::from_yaml_str(Path::new("edge.yaml"), yaml).unwrap();
        let text = explain(&config, "edge", &[parse_descriptor("client=a").unwrap()]);
        assert!(
            text.contains("result: limit 4 in flight (lease 60000 ms) from rule `client`"),
            "{text}"
        );
        assert!(
            text.contains(
                "limiter key: sluice:{edge|client=a|60000|if} (in_flight, lease 60000 ms)"
            ),
            "{text}"
        );
        assert!(
            text.contains("and stacked limit 10 per second: key sluice:{edge|client=a|1000|s1} (sliding_log, window 1000 ms)"),
            "{text}"
        );
    }

    fn buckets(buckets: &[&str]) -> String {
        let config = Config::from_yaml_str(Path::new("edge.yaml"), YAML).unwrap();
        let parsed: Vec<Vec<Entry>> = buckets
            .iter()
            .map(|b| parse_descriptor(b).unwrap())
            .collect();
        explain_buckets(&config, "edge", &parsed)
    }

    #[test]
    fn a_bucket_is_read_in_the_trees_order_and_reserves_on_its_rules_keys() {
        let text = buckets(&["user=alice,tier=gold"]);
        assert!(text.contains("bucket 0: tier=gold,user=alice\n"), "{text}");
        assert!(
            text.contains("  read as descriptor: tier=gold,user=alice\n"),
            "{text}"
        );
        assert!(
            text.contains("quota service: allotments from rule `tier_gold.user` of at most 1 token per assignment (each lives 6 s)"),
            "{text}"
        );
        assert!(
            text.contains("reserves on key sluice:{edge|tier=gold|user=alice|3600000} (sliding_log, window 3600000 ms), limit 100"),
            "{text}"
        );
    }

    #[test]
    fn a_bucket_without_a_limit_is_told_a_blanket_rule_and_why() {
        let text = buckets(&["bot=b", "user=ops", "color=red", "user=a,color=red"]);
        let blocks: Vec<&str> = text.split("bucket ").skip(1).collect();
        assert!(
            blocks[0].contains("ALLOW_ALL at every report, for 6 s each (unlimited"),
            "{text}"
        );
        assert!(blocks[1].contains("ALLOW_ALL at every report, for 6 s each (the descriptor it reaches has no rate_limit"), "{text}");
        assert!(blocks[2].contains("DENY_ALL at every report, for 6 s each (no rule: entry 0 (color=red) matches no descriptor"), "{text}");
        assert!(
            blocks[3].contains("read as descriptor: user=a,color=red"),
            "{text}"
        );
        assert!(blocks[3].contains("DENY_ALL"), "{text}");
    }

    #[test]
    fn unknown_domain_is_said() {
        let config = Config::from_yaml_str(Path::new("edge.yaml"), YAML).unwrap();
        let text = explain(&config, "other", &[vec![Entry::new("a", "b")]]);
        assert!(text.contains("domain `other` is not in the config (domains: edge)"));
    }

    #[test]
    fn descriptor_syntax_errors_are_clear() {
        assert_eq!(parse_descriptor("a=b,c=d=e").unwrap()[1].value, "d=e");
        assert!(parse_descriptor("a").unwrap_err().contains("not key=value"));
        assert!(parse_descriptor("=x").unwrap_err().contains("empty key"));
    }
}
