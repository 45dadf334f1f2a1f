//! The rule listing (`GET /rlconfig` on the admin port): one line per loaded rule.
//!
//! Each line starts as envoyproxy/ratelimit's does (`domain.path: unit=MINUTE
//! requests_per_unit=5`), so scripts reading that part keep working. Then come, each only where
//! it is not the default: every counted limit's algorithm, its window where the unit reported
//! to Envoy does not say it (a custom `window`), its lease, burst or quantum; the rule's name,
//! `replaces`, `shadow_mode`, `over_limit` and `detailed_metric`.

use super::{Config, Limit, LimitAlgorithm, LimitSpec, OverLimitSetting, Rule};

impl Config {
    /// The loaded rules as text, one per line: `domain.path: limit, ...`.
    pub fn describe(&self) -> String {
        let mut out = String::new();
        for domain in &self.domains {
            let mut rules = Vec::new();
            domain.root.collect_rules(&mut rules);
            for (rule, nested) in rules {
                out.push_str(&format!("{}.{}: ", domain.name, rule.path));
                push_rule(&mut out, rule, nested);
                out.push('\n');
            }
        }
        out
    }
}

fn push_rule(out: &mut String, rule: &Rule, nested: bool) {
    match rule.limit {
        // docs/config.md's whitelist: a value with no limit and no nested descriptors.
        None if nested => out.push_str("no limit (nested descriptors only)"),
        None => out.push_str("no limit (whitelist)"),
        Some(LimitSpec::Unlimited) => out.push_str("unlimited"),
        Some(LimitSpec::PerUnit {
            requests_per_unit,
            unit,
        }) => out.push_str(&format!(
            "unit={} requests_per_unit={requests_per_unit}",
            unit.as_str().to_ascii_uppercase()
        )),
    }
    for (i, limit) in rule.limits.iter().enumerate() {
        // Indexed only when the rule has several limits.
        let at = if rule.limits.len() > 1 {
            format!("[{i}]")
        } else {
            String::new()
        };
        push_limit(out, limit, &at);
    }
    if let Some(name) = &rule.name {
        out.push_str(&format!(", name={name}"));
    }
    if !rule.replaces.is_empty() {
        out.push_str(&format!(", replaces={}", rule.replaces.join(",")));
    }
    if rule.shadow_mode {
        out.push_str(", shadow_mode=true");
    }
    if rule.over_limit != OverLimitSetting::default() {
        out.push_str(&format!(", over_limit={}", rule.over_limit.as_str()));
    }
    if rule.detailed_metric {
        out.push_str(", detailed_metric=true");
    }
}

/// How one counted limit counts, where that is not the default sliding log over its unit.
fn push_limit(out: &mut String, limit: &Limit, at: &str) {
    if limit.algorithm != LimitAlgorithm::SlidingLog {
        out.push_str(&format!(", algorithm{at}={}", limit.algorithm.name()));
    }
    match limit.algorithm {
        LimitAlgorithm::InFlight => out.push_str(&format!(", lease{at}={}ms", limit.window_ms)),
        _ if limit.window_ms != limit.unit.window_ms() => {
            out.push_str(&format!(", window{at}={}ms", limit.window_ms))
        }
        _ => {}
    }
    match limit.algorithm {
        LimitAlgorithm::Gcra { burst } => out.push_str(&format!(", burst{at}={burst}")),
        LimitAlgorithm::QuantizedLog { quantum_ms } => {
            out.push_str(&format!(", quantum{at}={quantum_ms}ms"))
        }
        _ => {}
    }
}
