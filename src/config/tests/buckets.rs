//! [`Config::bucket_entries`]: a bucket's entries (no order of their own) in the order of a
//! path of the rule tree, so that the bucket reaches the rule the same descriptor reaches on
//! the RLS path, and reaches none exactly when no path places every entry.

use super::*;

const TREE: &str = r#"
domain: edge
descriptors:
  - key: tenant
    value: acme
    descriptors:
      - key: client
        rate_limit: {unit: minute, requests_per_unit: 100}
      - key: path
        value: "/api/*"
        descriptors:
          - key: client
            rate_limit: {unit: minute, requests_per_unit: 10}
  - key: client
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: zone
    rate_limit: {unit: minute, requests_per_unit: 7}
"#;

fn config() -> Config {
    Config::from_yaml_str(Path::new("edge.yaml"), TREE).unwrap()
}

fn order(bucket: &[(&str, &str)]) -> Vec<String> {
    config()
        .bucket_entries("edge", bucket.iter().copied())
        .into_iter()
        .map(|e| format!("{}={}", e.key, e.value))
        .collect()
}

fn limit_of(bucket: &[(&str, &str)]) -> Option<u32> {
    let config = config();
    let entries = config.bucket_entries("edge", bucket.iter().copied());
    match config.lookup("edge", &entries) {
        Lookup::Rule { rule, .. } => rule.limits.first().map(|l| l.requests_per_unit),
        _ => None,
    }
}

#[test]
fn entries_follow_the_tree_whatever_their_order() {
    let bucket = [("client", "c1"), ("path", "/api/x"), ("tenant", "acme")];
    assert_eq!(order(&bucket), ["tenant=acme", "path=/api/x", "client=c1"]);
    assert_eq!(limit_of(&bucket), Some(10));
    assert_eq!(
        order(&[("tenant", "acme"), ("client", "c1")]),
        ["tenant=acme", "client=c1"]
    );
    assert_eq!(limit_of(&[("tenant", "acme"), ("client", "c1")]), Some(100));
    assert_eq!(limit_of(&[("client", "c1")]), Some(5));
}

/// Two keys a level names: the first descriptor in config order is tried first, and the next
/// when it leads nowhere (under `tenant=acme`, `client` comes before `path`, but only `path`
/// leads on to `client`; see the first test); when no path places every entry, the first
/// choices are kept.
#[test]
fn a_level_tries_its_descriptors_in_config_order() {
    // Neither `client` nor `zone` has nested descriptors for the other: no path, and the
    // first choice at the top level is `client`.
    assert_eq!(
        order(&[("zone", "z"), ("client", "c1")]),
        ["client=c1", "zone=z"]
    );
    assert_eq!(limit_of(&[("zone", "z"), ("client", "c1")]), None);
    // A value the level does not govern is passed over: `tenant=other` matches no descriptor,
    // so the walk takes `client`.
    assert_eq!(
        order(&[("tenant", "other"), ("client", "c1")]),
        ["client=c1", "tenant=other"]
    );
}

/// What no level places follows in key order, and the RLS lookup finds no rule for it.
#[test]
fn a_bucket_the_tree_cannot_place_reaches_no_rule() {
    assert_eq!(
        order(&[("user", "u"), ("color", "red")]),
        ["color=red", "user=u"]
    );
    assert_eq!(limit_of(&[("user", "u"), ("color", "red")]), None);
    assert_eq!(
        order(&[("tenant", "acme"), ("path", "/other"), ("client", "c")]),
        ["tenant=acme", "client=c", "path=/other"]
    );
    assert_eq!(
        limit_of(&[("tenant", "acme"), ("path", "/other"), ("client", "c")]),
        None
    );
    assert_eq!(
        config()
            .bucket_entries("nowhere", [("b", "2"), ("a", "1")])
            .into_iter()
            .map(|e| e.key)
            .collect::<Vec<_>>(),
        ["a", "b"]
    );
}

/// A bucket longer than every path of a tree whose levels name all its keys: every order is
/// tried down to the leaves, none places it, and it reaches no rule; three of its entries do.
#[test]
fn a_bucket_longer_than_every_path_reaches_no_rule() {
    // Keys k0..k9, each with nested descriptors naming them all again, 3 levels deep, and no
    // limit at the third: every order is a path of 3, none places 10 entries.
    fn level(depth: usize) -> String {
        let indent = "  ".repeat(depth * 2);
        (0..10)
            .map(|k| {
                let nested = if depth < 2 {
                    format!("\n{indent}    descriptors:\n{}", level(depth + 1))
                } else {
                    format!("\n{indent}    rate_limit: {{unit: minute, requests_per_unit: 1}}")
                };
                format!("{indent}  - key: k{k}{nested}\n")
            })
            .collect()
    }
    let yaml = format!("domain: wide\ndescriptors:\n{}", level(0));
    let config = Config::from_yaml_str(Path::new("wide.yaml"), &yaml).unwrap();
    let keys: Vec<String> = (0..10).map(|k| format!("k{k}")).collect();
    let bucket: Vec<(&str, &str)> = keys.iter().map(|k| (k.as_str(), "v")).collect();
    let entries = config.bucket_entries("wide", bucket.iter().copied());
    assert_eq!(entries.len(), 10);
    assert!(matches!(config.lookup("wide", &entries), Lookup::NoRule));
    // Three entries fit a path of three.
    let entries = config.bucket_entries("wide", bucket[7..].iter().copied());
    assert!(matches!(
        config.lookup("wide", &entries),
        Lookup::Rule { .. }
    ));
}
