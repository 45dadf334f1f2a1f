//! xDS resources compile to what the equivalent YAML compiles to, with the same errors.

use super::*;
use crate::config::{LimitSpec, Lookup, MatchKind, Unit};
use crate::descriptor::Entry;
use crate::proto::ratelimit::config::ratelimit::v3::RateLimitReplace;
use std::path::Path;

fn limit(unit: RateLimitUnit, requests_per_unit: u32) -> Option<RateLimitPolicy> {
    Some(RateLimitPolicy {
        unit: unit as i32,
        requests_per_unit,
        ..RateLimitPolicy::default()
    })
}

fn desc(key: &str, value: &str) -> RateLimitDescriptor {
    RateLimitDescriptor {
        key: key.into(),
        value: value.into(),
        ..RateLimitDescriptor::default()
    }
}

fn nest(mut parent: RateLimitDescriptor, child: RateLimitDescriptor) -> RateLimitDescriptor {
    parent.descriptors.push(child);
    parent
}

const LISTENER: &str = "envoy-gateway/gateway-1/http";
const ROUTE: &str = "httproute/default/backend/rule/0/match/0/*";

/// What Envoy Gateway's translator builds for one listener: the route descriptor (key and value
/// the route name) over one chain per rule, the limit on the chain's last descriptor.
fn envoy_gateway_resource() -> RateLimitConfig {
    // rule 0: a header value match, then a distinct CIDR: one counter per client address.
    let mut per_ip = desc("remote_address", "");
    per_ip.rate_limit = limit(RateLimitUnit::Second, 10);
    let rule0 = nest(
        desc("rule-0-match-0", "rule-0-match-0"),
        nest(desc("masked_remote_address", "192.168.0.0/16"), per_ip),
    );
    // rule 1: a distinct header (empty value: one counter per header value), in shadow mode.
    let mut rule1 = desc("rule-1-match-0", "");
    rule1.rate_limit = limit(RateLimitUnit::Week, 7);
    rule1.shadow_mode = true;
    // rule 2: no match at all, with method and path chains on another route.
    let mut rule2 = desc("rule-2-match--1", "rule-2-match--1");
    rule2.rate_limit = limit(RateLimitUnit::Year, 1000);
    let mut route = desc(ROUTE, ROUTE);
    route.descriptors = vec![rule0, rule1, rule2];

    let mut path = desc("rule-0-path", "rule-0-path");
    path.rate_limit = limit(RateLimitUnit::Hour, 5);
    let other = nest(
        desc("httproute/default/other", "httproute/default/other"),
        nest(desc("rule-0-method", "rule-0-method"), path),
    );
    RateLimitConfig {
        name: LISTENER.into(),
        domain: LISTENER.into(),
        descriptors: vec![route, other],
    }
}

/// The same limits as a YAML file.
const ENVOY_GATEWAY_YAML: &str = r#"
domain: envoy-gateway/gateway-1/http
descriptors:
  - key: "httproute/default/backend/rule/0/match/0/*"
    value: "httproute/default/backend/rule/0/match/0/*"
    descriptors:
      - key: rule-0-match-0
        value: rule-0-match-0
        descriptors:
          - key: masked_remote_address
            value: 192.168.0.0/16
            descriptors:
              - key: remote_address
                rate_limit: {unit: second, requests_per_unit: 10}
      - key: rule-1-match-0
        rate_limit: {unit: week, requests_per_unit: 7}
        shadow_mode: true
      - key: rule-2-match--1
        value: rule-2-match--1
        rate_limit: {unit: year, requests_per_unit: 1000}
  - key: httproute/default/other
    value: httproute/default/other
    descriptors:
      - key: rule-0-method
        value: rule-0-method
        descriptors:
          - key: rule-0-path
            value: rule-0-path
            rate_limit: {unit: hour, requests_per_unit: 5}
"#;

fn rule_at<'a>(config: &'a Config, entries: &[(&str, &str)]) -> &'a crate::config::Rule {
    let entries: Vec<Entry> = entries.iter().map(|(k, v)| Entry::new(*k, *v)).collect();
    match config.lookup(LISTENER, &entries) {
        Lookup::Rule { rule, .. } => rule,
        other => panic!("no rule for {entries:?}: {other:?}"),
    }
}

#[test]
fn envoy_gateway_resources_compile_as_their_yaml_does() {
    let from_xds = Config::from_xds(vec![envoy_gateway_resource()], LoadOptions::default())
        .expect("Envoy Gateway's shapes load");
    let from_yaml = Config::from_yaml_str(Path::new("eg.yaml"), ENVOY_GATEWAY_YAML).unwrap();
    assert_eq!(from_xds.describe(), from_yaml.describe());
    assert_eq!(from_xds.rule_count(), 4);
    assert_eq!(
        from_xds.sources(),
        [PathBuf::from("xds:envoy-gateway/gateway-1/http")]
    );

    // The limit sits on the last descriptor of the chain; an empty value matches any address.
    for address in ["10.0.0.1", "10.0.0.2"] {
        let rule = rule_at(
            &from_xds,
            &[
                (ROUTE, ROUTE),
                ("rule-0-match-0", "rule-0-match-0"),
                ("masked_remote_address", "192.168.0.0/16"),
                ("remote_address", address),
            ],
        );
        assert_eq!(
            rule.limit,
            Some(LimitSpec::PerUnit {
                requests_per_unit: 10,
                unit: Unit::Second
            })
        );
    }
    let entries = [Entry::new(ROUTE, ROUTE), Entry::new("rule-1-match-0", "x")];
    match from_xds.lookup(LISTENER, &entries) {
        Lookup::Rule { rule, kind } => {
            assert_eq!(kind, MatchKind::KeyOnly);
            assert!(rule.shadow_mode);
            assert_eq!(
                rule.limit,
                Some(LimitSpec::PerUnit {
                    requests_per_unit: 7,
                    unit: Unit::Week
                })
            );
        }
        other => panic!("{other:?}"),
    }
    // A route name holding `*` is matched exactly by its own descriptor.
    let rule = rule_at(
        &from_xds,
        &[(ROUTE, ROUTE), ("rule-2-match--1", "rule-2-match--1")],
    );
    assert_eq!(rule.limits[0].unit, Unit::Year);
}

#[test]
fn zero_values_mean_what_absent_yaml_keys_mean() {
    let mut unlimited = desc("bot", "");
    unlimited.rate_limit = Some(RateLimitPolicy {
        unlimited: true,
        ..RateLimitPolicy::default()
    });
    let mut deny_all = desc("blocked", "yes");
    deny_all.rate_limit = limit(RateLimitUnit::Minute, 0);
    let mut named = desc("user", "");
    named.rate_limit = Some(RateLimitPolicy {
        unit: RateLimitUnit::Day as i32,
        requests_per_unit: 3,
        name: "per_user".into(),
        replaces: vec![RateLimitReplace {
            name: "other".into(),
        }],
        ..RateLimitPolicy::default()
    });
    named.metadata = Some(prost_types::Struct::default());
    let resource = RateLimitConfig {
        name: "d".into(),
        domain: "d".into(),
        descriptors: vec![unlimited, deny_all, named],
    };
    let yaml = r#"
domain: d
descriptors:
  - key: bot
    rate_limit: {unlimited: true}
  - key: blocked
    value: "yes"
    rate_limit: {unit: minute}
  - key: user
    rate_limit: {unit: day, requests_per_unit: 3, name: per_user, replaces: [{name: other}]}
"#;
    let from_xds = Config::from_xds(vec![resource], LoadOptions::default()).unwrap();
    let from_yaml = Config::from_yaml_str(Path::new("d.yaml"), yaml).unwrap();
    assert_eq!(from_xds.describe(), from_yaml.describe());
    assert!(
        from_xds
            .describe()
            .contains("d.blocked_yes: unit=MINUTE requests_per_unit=0")
    );
}

#[test]
fn bad_resources_are_named_with_the_rule_and_every_problem() {
    let mut no_unit = desc("route", "route");
    no_unit.rate_limit = limit(RateLimitUnit::Unknown, 5);
    let mut bad_enum = desc("other", "");
    bad_enum.rate_limit = Some(RateLimitPolicy {
        unit: 42,
        requests_per_unit: 1,
        ..RateLimitPolicy::default()
    });
    let first = RateLimitConfig {
        name: "listener-a".into(),
        domain: "a".into(),
        descriptors: vec![no_unit, bad_enum, desc("", "x")],
    };
    let duplicate = RateLimitConfig {
        name: "listener-a-again".into(),
        domain: "a".into(),
        descriptors: vec![],
    };
    let unnamed = RateLimitConfig::default();
    let errors = Config::from_xds(vec![first, duplicate, unnamed], LoadOptions::default())
        .expect_err("invalid resources");
    let lines: Vec<String> = errors.iter().map(ToString::to_string).collect();
    let expect = [
        "xds:listener-a: route_route: `rate_limit` has no `unit` and is not `unlimited: true`",
        "xds:listener-a: other: invalid unit `enum value 42`",
        "xds:listener-a: (no key): descriptor has an empty `key`",
        "xds:listener-a-again: domain: duplicate domain `a`: already defined in xds:listener-a",
        "xds:resources[2]: domain: `domain` is empty",
    ];
    assert_eq!(lines.len(), expect.len(), "{lines:#?}");
    for (line, want) in lines.iter().zip(expect) {
        assert!(
            line.starts_with(want),
            "{line}\nexpected it to start with: {want}"
        );
    }

    // Merged across resources when asked, as files are.
    let merge = LoadOptions {
        merge_domains: true,
        ..LoadOptions::default()
    };
    let mut x = desc("x", "");
    x.rate_limit = limit(RateLimitUnit::Second, 1);
    let mut y = desc("y", "");
    y.rate_limit = limit(RateLimitUnit::Second, 2);
    let part = |name: &str, d: RateLimitDescriptor| RateLimitConfig {
        name: name.into(),
        domain: "m".into(),
        descriptors: vec![d],
    };
    let merged = Config::from_xds(vec![part("m1", x.clone()), part("m2", y)], merge).unwrap();
    assert_eq!(merged.rule_count(), 2);
    // A top-level descriptor repeated across the merged parts is refused, naming both.
    let errors = Config::from_xds(vec![part("m1", x.clone()), part("m2", x)], merge)
        .expect_err("a repeated descriptor");
    let lines: Vec<String> = errors.iter().map(ToString::to_string).collect();
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert!(
        lines[0].starts_with("xds:m2: x: descriptor `x` of domain `m` is also defined in xds:m1"),
        "{}",
        lines[0]
    );
}

/// A descriptor's `metadata` compiles to the same rule metadata from a resource as from YAML
/// (envoyproxy/ratelimit's `metadata.yaml`, nested mapping included); an empty one is none.
#[test]
fn metadata_compiles_from_a_resource_as_from_yaml() {
    let object = |v: serde_json::Value| match v {
        serde_json::Value::Object(map) => crate::metadata::struct_from_json(map),
        _ => unreachable!(),
    };
    let mut quota = desc("key2", "");
    quota.rate_limit = limit(RateLimitUnit::Minute, 20);
    quota.metadata = Some(object(
        serde_json::json!({"service_with_quota": {"name": "service_2"}, "n": 1}),
    ));
    let mut empty = desc("key3", "");
    empty.rate_limit = limit(RateLimitUnit::Minute, 20);
    empty.metadata = Some(prost_types::Struct::default());
    let resource = RateLimitConfig {
        name: "d".into(),
        domain: "d".into(),
        descriptors: vec![quota, empty],
    };
    let yaml = "
domain: d
descriptors:
  - key: key2
    rate_limit: {unit: minute, requests_per_unit: 20}
    metadata:
      service_with_quota:
        name: service_2
      n: 1
  - key: key3
    rate_limit: {unit: minute, requests_per_unit: 20}
    metadata: {}
";
    let from_xds = Config::from_xds(vec![resource], LoadOptions::default()).unwrap();
    let from_yaml = Config::from_yaml_str(Path::new("d.yaml"), yaml).unwrap();
    for config in [&from_xds, &from_yaml] {
        let lookup = |key: &str| match config.lookup("d", &[Entry::new(key, "x")]) {
            Lookup::Rule { rule, .. } => rule.metadata.clone(),
            other => panic!("no rule for {key}: {other:?}"),
        };
        let m = lookup("key2").expect("metadata");
        assert_eq!(
            serde_json::Value::Object(crate::metadata::struct_to_json(&m.0)),
            serde_json::json!({"service_with_quota": {"name": "service_2"}, "n": 1})
        );
        assert_eq!(lookup("key3"), None, "an empty mapping is no metadata");
    }
}
