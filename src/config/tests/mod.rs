//! Unit tests of the config module: matching precedence and depth rules, units, and the
//! validator's messages and lines on in-memory YAML.
//!
//! Why here and not only in `tests/`: these exercise the lookup tree directly and cheaply;
//! the file-based fixtures in `tests/it/config_errors.rs` cover the loader end to end.
//!
//! This file: matching (precedence, depth, flags, whitelists). `errors`: every problem
//! collected with its line, and malformed input never panics. `rate_limits`: units, windows,
//! algorithms, stacked limits and response headers. `buckets`: a Rate Limit Quota Service bucket
//! read as a descriptor in the rule tree's order.

use super::*;

mod buckets;
mod errors;
mod rate_limits;

const SAMPLE: &str = r#"
domain: mongo_cps
descriptors:
  - key: database
    value: users
    rate_limit:
      unit: second
      requests_per_unit: 500
  - key: remote_address          # key only: one counter per runtime value
    rate_limit: {unit: minute, requests_per_unit: 10, name: per_ip}
    shadow_mode: true
    detailed_metric: true
  - key: remote_address
    value: 10.0.0.1              # whitelisted
  - key: path
    value: "/api/*"
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: path
    value: "/api/admin/*"        # shadowed by the earlier wildcard: config order wins
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: path
    value: "/api/health"
    rate_limit: {unit: Second, requests_per_unit: 1000}
  - key: path
    rate_limit: {unit: DAY, requests_per_unit: 7}
  - key: client
    descriptors:
      - key: path
        rate_limit:
          unit: day
          requests_per_unit: 1000
          replaces:
            - name: per_ip
  - key: tenant
    value: acme
    rate_limit: {unit: week, requests_per_unit: 2}
    descriptors:
      - key: user
        rate_limit: {unit: month, requests_per_unit: 3}
  - key: bot
    rate_limit: {unlimited: true}
"#;

fn config() -> Config {
    match Config::from_yaml_str(Path::new("sample.yaml"), SAMPLE) {
        Ok(c) => c,
        Err(e) => panic!("sample must load:\n{e}"),
    }
}

fn entries(pairs: &[(&str, &str)]) -> Vec<Entry> {
    pairs.iter().map(|(k, v)| Entry::new(*k, *v)).collect()
}

/// (path, kind) of the rule found, or the variant name.
fn find(config: &Config, pairs: &[(&str, &str)]) -> Result<(String, MatchKind), &'static str> {
    match config.lookup("mongo_cps", &entries(pairs)) {
        Lookup::Rule { rule, kind } => Ok((rule.path.clone(), kind)),
        Lookup::NoRule => Err("NoRule"),
        Lookup::UnknownDomain => Err("UnknownDomain"),
    }
}

fn rule<'a>(config: &'a Config, pairs: &[(&str, &str)]) -> &'a Rule {
    match config.lookup("mongo_cps", &entries(pairs)) {
        Lookup::Rule { rule, .. } => rule,
        other => panic!("expected a rule for {pairs:?}, got {other:?}"),
    }
}

#[test]
fn exact_match() {
    let c = config();
    assert_eq!(
        find(&c, &[("database", "users")]),
        Ok(("database_users".into(), MatchKind::Exact))
    );
    assert_eq!(
        rule(&c, &[("database", "users")]).limit,
        Some(LimitSpec::PerUnit {
            requests_per_unit: 500,
            unit: Unit::Second
        })
    );
    // No key-only `database` node: another value matches nothing.
    assert_eq!(find(&c, &[("database", "orders")]), Err("NoRule"));
}

#[test]
fn exact_beats_wildcard_beats_key_only() {
    let c = config();
    assert_eq!(
        find(&c, &[("path", "/api/health")]),
        Ok(("path_/api/health".into(), MatchKind::Exact))
    );
    assert_eq!(
        find(&c, &[("path", "/api/users")]),
        Ok(("path_/api/*".into(), MatchKind::Wildcard))
    );
    assert_eq!(
        find(&c, &[("path", "/other")]),
        Ok(("path".into(), MatchKind::KeyOnly))
    );
    // A request value equal to the pattern itself is an exact match.
    assert_eq!(
        find(&c, &[("path", "/api/*")]),
        Ok(("path_/api/*".into(), MatchKind::Exact))
    );
}

#[test]
fn first_wildcard_in_config_order_wins() {
    let c = config();
    assert_eq!(
        find(&c, &[("path", "/api/admin/x")]),
        Ok(("path_/api/*".into(), MatchKind::Wildcard))
    );
}

#[test]
fn key_only_rule_carries_its_flags() {
    let c = config();
    let r = rule(&c, &[("remote_address", "192.168.1.1")]);
    assert_eq!(r.path, "remote_address");
    assert_eq!(r.name.as_deref(), Some("per_ip"));
    assert!(r.shadow_mode);
    assert!(r.detailed_metric);
    assert_eq!(
        r.limit,
        Some(LimitSpec::PerUnit {
            requests_per_unit: 10,
            unit: Unit::Minute
        })
    );
}

#[test]
fn whitelist_is_a_rule_without_limit() {
    let c = config();
    let r = rule(&c, &[("remote_address", "10.0.0.1")]);
    assert_eq!(r.path, "remote_address_10.0.0.1");
    assert_eq!(r.limit, None);
    assert!(!r.shadow_mode);
}

#[test]
fn nested_match_and_replaces() {
    let c = config();
    let r = rule(&c, &[("client", "anything"), ("path", "/x")]);
    assert_eq!(r.path, "client.path");
    assert_eq!(r.replaces, vec!["per_ip".to_string()]);
    assert_eq!(
        r.limit,
        Some(LimitSpec::PerUnit {
            requests_per_unit: 1000,
            unit: Unit::Day
        })
    );
    // The parent alone is a node without limit.
    assert_eq!(rule(&c, &[("client", "a")]).limit, None);
}

#[test]
fn limit_not_at_last_entry_does_not_apply() {
    let c = config();
    // database_users has a limit but no children: a deeper request gets no rule.
    assert_eq!(
        find(&c, &[("database", "users"), ("x", "y")]),
        Err("NoRule")
    );
    // tenant_acme has a limit and children; a second entry that matches no child: NoRule.
    assert_eq!(
        find(&c, &[("tenant", "acme"), ("other", "v")]),
        Err("NoRule")
    );
    assert_eq!(
        find(&c, &[("tenant", "acme"), ("user", "bob")]),
        Ok(("tenant_acme.user".into(), MatchKind::KeyOnly))
    );
}

#[test]
fn deeper_than_config_is_no_rule() {
    let c = config();
    assert_eq!(
        find(&c, &[("client", "c"), ("path", "/x"), ("extra", "1")]),
        Err("NoRule")
    );
}

#[test]
fn unknown_key_empty_request_and_unknown_domain() {
    let c = config();
    assert_eq!(find(&c, &[("nope", "x")]), Err("NoRule"));
    assert_eq!(find(&c, &[]), Err("NoRule"));
    assert_eq!(
        c.lookup("other_domain", &entries(&[("database", "users")])),
        Lookup::UnknownDomain
    );
    assert!(c.has_domain("mongo_cps"));
    assert!(!c.has_domain("other_domain"));
}

#[test]
fn unlimited_rule() {
    let c = config();
    assert_eq!(
        rule(&c, &[("bot", "googlebot")]).limit,
        Some(LimitSpec::Unlimited)
    );
}

#[test]
fn units_are_case_insensitive() {
    let c = config();
    assert_eq!(
        rule(&c, &[("path", "/api/health")]).limit,
        Some(LimitSpec::PerUnit {
            requests_per_unit: 1000,
            unit: Unit::Second
        })
    );
    assert_eq!(
        rule(&c, &[("path", "/zzz")]).limit,
        Some(LimitSpec::PerUnit {
            requests_per_unit: 7,
            unit: Unit::Day
        })
    );
    assert_eq!(Unit::parse("MiNuTe"), Some(Unit::Minute));
    assert_eq!(Unit::parse("fortnight"), None);
}

#[test]
fn unit_windows() {
    assert_eq!(Unit::Second.window_ms(), 1_000);
    assert_eq!(Unit::Minute.window_ms(), 60_000);
    assert_eq!(Unit::Hour.window_ms(), 3_600_000);
    assert_eq!(Unit::Day.window_ms(), 86_400_000);
    assert_eq!(Unit::Week.window_ms(), 7 * 86_400_000);
    assert_eq!(Unit::Month.window_ms(), 30 * 86_400_000);
    assert_eq!(Unit::Year.window_ms(), 365 * 86_400_000);
}

#[test]
fn summary_accessors() {
    let c = config();
    assert_eq!(c.domains().collect::<Vec<_>>(), vec!["mongo_cps"]);
    // database_users, remote_address, path_/api/*, path_/api/admin/*, path_/api/health, path,
    // client.path, tenant_acme, tenant_acme.user, bot
    assert_eq!(c.rule_count(), 10);
    assert_eq!(c.sources(), &[PathBuf::from("sample.yaml")]);
}

#[test]
fn empty_value_is_key_only() {
    let yaml = "domain: d\ndescriptors:\n  - key: k\n    value: \"\"\n    rate_limit: {unit: second, requests_per_unit: 1}\n";
    let c = Config::from_yaml_str(Path::new("x.yaml"), yaml).map_err(|e| e.to_string());
    let c = c.as_ref().map_err(String::as_str);
    let Ok(c) = c else { panic!("{c:?}") };
    match c.lookup("d", &entries(&[("k", "anything")])) {
        Lookup::Rule { rule, kind } => {
            assert_eq!(rule.path, "k");
            assert_eq!(kind, MatchKind::KeyOnly);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn numeric_and_boolean_looking_values_stay_text() {
    let yaml = "domain: d\ndescriptors:\n  - key: port\n    value: 08\n  - key: v\n    value: 1.0\n  - key: flag\n    value: yes\n";
    let c = match Config::from_yaml_str(Path::new("x.yaml"), yaml) {
        Ok(c) => c,
        Err(e) => panic!("{e}"),
    };
    for (k, v) in [("port", "08"), ("v", "1.0"), ("flag", "yes")] {
        assert!(
            matches!(
                c.lookup("d", &entries(&[(k, v)])),
                Lookup::Rule {
                    kind: MatchKind::Exact,
                    ..
                }
            ),
            "{k}={v}"
        );
    }
}

/// A `share_threshold` wildcard is recorded with the request entry it stands for (its depth),
/// its ancestors' ones kept: the limiter key replaces those entries' values, no other.
#[test]
fn shared_wildcards_are_recorded_at_their_depth() {
    let yaml = r#"
domain: mongo_cps
descriptors:
  - key: tenant
    value: "team-*"
    share_threshold: true
    descriptors:
      - key: region
        value: "eu-*"
        descriptors:
          - key: path
            value: "/api/*"
            share_threshold: true
            rate_limit: {unit: second, requests_per_unit: 1}
"#;
    let c = Config::from_yaml_str(Path::new("t.yaml"), yaml).expect("loads");
    let r = rule(
        &c,
        &[
            ("tenant", "team-a"),
            ("region", "eu-west"),
            ("path", "/api/x"),
        ],
    );
    assert_eq!(
        r.shared_values,
        [(0, "team-*".to_string()), (2, "/api/*".to_string())]
    );
}

fn errors_of(yaml: &str) -> Vec<ConfigError> {
    match Config::from_yaml_str(Path::new("t.yaml"), yaml) {
        Ok(_) => panic!("expected errors for:\n{yaml}"),
        Err(e) => e.0,
    }
}

/// envoyproxy/ratelimit's structs rendered as YAML (Envoy Gateway prints its configs so) write
/// every field at its zero value on every descriptor: they load as if absent.
#[test]
fn zero_valued_fields_as_renderings_write_them_load() {
    let yaml = r#"
domain: first-listener
descriptors:
  - key: first-route
    value: first-route
    rate_limit: null
    descriptors:
      - key: masked_remote_address
        value: 0.0.0.0/0
        rate_limit:
          requests_per_unit: 5
          unit: SECOND
          unlimited: false
          name: ""
          replaces: []
        descriptors: []
        shadow_mode: false
        quota_mode: false
        detailed_metric: false
        value_to_metric: false
        share_threshold: false
    shadow_mode: false
    quota_mode: false
    detailed_metric: false
    value_to_metric: false
    share_threshold: false
"#;
    let c = match Config::from_yaml_str(Path::new("eg.yaml"), yaml) {
        Ok(c) => c,
        Err(e) => panic!("{e}"),
    };
    assert_eq!(
        c.describe(),
        "first-listener.first-route_first-route: no limit (nested descriptors only)\n\
         first-listener.first-route_first-route.masked_remote_address_0.0.0.0/0: unit=SECOND \
         requests_per_unit=5\n"
    );
}
