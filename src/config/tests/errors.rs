//! The validator's errors on in-memory YAML: every problem of a file collected with its line,
//! and no input (deep nesting, arbitrary text) panics the loader.

use super::*;
use proptest::prelude::*;

#[test]
fn all_errors_are_collected_with_lines() {
    let yaml = "\
domain: d
descriptors:
  - key: a
    rate_limit: {unit: fortnight}
  - key: ''
  - key: b
    bogus: 1
    descriptors:
      - key: c
        rate_limit: {unlimited: true, unit: second}
";
    let errors = errors_of(yaml);
    let shown: Vec<String> = errors.iter().map(ToString::to_string).collect();
    assert_eq!(shown.len(), 4, "{shown:#?}");
    assert!(
        shown[0].starts_with("t.yaml:4: a: invalid unit `fortnight`"),
        "{}",
        shown[0]
    );
    assert_eq!(
        shown[1],
        "t.yaml:5: (no key): descriptor has an empty `key`"
    );
    assert!(
        shown[2].starts_with("t.yaml:7: b: unknown field `bogus`"),
        "{}",
        shown[2]
    );
    assert_eq!(
        shown[3],
        "t.yaml:10: b.c: `unit: second` must not be set together with `unlimited: true`"
    );
}

#[test]
fn empty_file_is_missing_domain() {
    for text in ["", "# only a comment\n", "~\n"] {
        let errors = errors_of(text);
        assert_eq!(errors.len(), 1, "{text:?}: {errors:?}");
        assert_eq!(errors[0].rule, "domain");
        assert_eq!(errors[0].line, Some(1), "{text:?}");
        assert!(errors[0].message.contains("missing `domain`"));
    }
}

#[test]
fn display_without_line() {
    let e = ConfigError::new("/etc/x.yaml", None, "domain", "m");
    assert_eq!(e.to_string(), "/etc/x.yaml: domain: m");
    let e = ConfigError::new("/etc/x.yaml", Some(3), "a.b", "m");
    assert_eq!(e.to_string(), "/etc/x.yaml:3: a.b: m");
}

#[test]
fn config_is_send_sync() {
    fn assert_send_sync<T: Send + Sync + 'static>() {}
    assert_send_sync::<Config>();
    assert_send_sync::<ConfigErrors>();
}

#[test]
fn deep_nesting_is_an_error_not_a_stack_overflow() {
    let mut yaml = String::from("domain: d\ndescriptors:\n");
    for depth in 0..300 {
        let pad = "  ".repeat(2 * depth + 1);
        yaml.push_str(&format!("{pad}- key: k{depth}\n{pad}  descriptors:\n"));
    }
    // Run on a thread with tokio's default worker stack (2 MiB): the depth limit must fire
    // before the stack runs out, even in debug builds.
    let handle = std::thread::Builder::new()
        .stack_size(2 * 1024 * 1024)
        .spawn(move || errors_of(&yaml));
    let errors = match handle.map(|h| h.join()) {
        Ok(Ok(errors)) => errors,
        _ => panic!("loader thread failed"),
    };
    assert_eq!(errors.len(), 1, "{errors:?}");
    // The descriptor the parser stopped in, read from the indentation.
    assert!(errors[0].rule.starts_with("k0.k1.k2."), "{errors:?}");
    assert!(
        errors[0]
            .message
            .starts_with("YAML nesting limit exceeded: 33 levels of at most 32"),
        "{errors:?}"
    );
    let flow = format!(
        "domain: d\ndescriptors: {}{}\n",
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    assert!(Config::from_yaml_str(Path::new("f.yaml"), &flow).is_err());
}

#[test]
fn moderate_nesting_loads() {
    let mut yaml = String::from("domain: d\ndescriptors:\n");
    let depth = 10;
    for i in 0..depth {
        let pad = "  ".repeat(2 * i + 1);
        yaml.push_str(&format!("{pad}- key: k{i}\n"));
        if i + 1 < depth {
            yaml.push_str(&format!("{pad}  descriptors:\n"));
        } else {
            yaml.push_str(&format!(
                "{pad}  rate_limit: {{unit: second, requests_per_unit: 1}}\n"
            ));
        }
    }
    let c = match Config::from_yaml_str(Path::new("f.yaml"), &yaml) {
        Ok(c) => c,
        Err(e) => panic!("{e}"),
    };
    let request: Vec<(String, String)> =
        (0..depth).map(|i| (format!("k{i}"), "v".into())).collect();
    let request: Vec<Entry> = request
        .iter()
        .map(|(k, v)| Entry::new(k.as_str(), v.as_str()))
        .collect();
    match c.lookup("d", &request) {
        Lookup::Rule { rule, .. } => assert!(rule.path.ends_with("k9")),
        other => panic!("{other:?}"),
    }
    // Ending one level early lands on an intermediate node: a rule without limit.
    match c.lookup("d", &request[..depth - 1]) {
        Lookup::Rule { rule, kind } => {
            assert_eq!(rule.limit, None);
            assert_eq!(kind, MatchKind::KeyOnly);
        }
        other => panic!("{other:?}"),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Arbitrary text never panics the loader.
    #[test]
    fn arbitrary_text_never_panics(text in any::<String>()) {
        let _ = Config::from_yaml_str(Path::new("f.yaml"), &text);
    }

    /// Text built from YAML-ish fragments (much likelier to parse) never panics either, and
    /// every error names the file.
    #[test]
    fn yamlish_text_never_panics(parts in proptest::collection::vec(prop_oneof![
        Just("domain: d\n"), Just("descriptors:\n"), Just("  - key: k\n"), Just("    value: v*\n"),
        Just("    rate_limit: {unit: second}\n"), Just("    rate_limit:\n      unlimited: true\n"),
        Just("      replaces: [{name: x}, {}]\n"), Just("    descriptors:\n"), Just("      - key: z\n"),
        Just("    foo: 1\n"), Just("  - &a {key: q}\n"), Just("  - *a\n"), Just(": :\n"), Just("\t"),
    ], 0..24)) {
        let text: String = parts.concat();
        if let Err(errors) = Config::from_yaml_str(Path::new("f.yaml"), &text) {
            prop_assert!(!errors.is_empty());
            for e in &errors {
                prop_assert_eq!(&e.file, Path::new("f.yaml"));
            }
        }
    }
}

/// `metadata` is any mapping; anything else is malformed, at its line (envoyproxy/ratelimit
/// refuses it too: "error parsing metadata").
#[test]
fn metadata_must_be_a_mapping() {
    let yaml = "\
domain: d
descriptors:
  - key: a
    rate_limit: {unit: second, requests_per_unit: 1}
    metadata: [1, 2]
";
    let errors = errors_of(yaml);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].line, Some(5), "{}", errors[0]);
    assert!(
        errors[0].message.starts_with("malformed YAML"),
        "{}",
        errors[0]
    );
}
