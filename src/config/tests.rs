//! Unit tests of the config module: matching precedence and depth rules, units, and the
//! validator's messages and lines on in-memory YAML.
//!
//! Why here and not only in `tests/`: these exercise the lookup tree directly and cheaply;
//! the file-based fixtures in `tests/config_errors.rs` cover the loader end to end.

use super::*;
use proptest::prelude::*;

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

fn errors_of(yaml: &str) -> Vec<ConfigError> {
    match Config::from_yaml_str(Path::new("t.yaml"), yaml) {
        Ok(_) => panic!("expected errors for:\n{yaml}"),
        Err(e) => e.0,
    }
}

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
        assert_eq!(errors[0].line, None);
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
        errors[0].message.contains("nesting deeper than 32"),
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

#[test]
fn response_headers_inherit_field_by_field() {
    let yaml = "
domain: d
response_headers: {format: draft}
descriptors:
  - key: a
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: public
    response_headers: {hide_remaining: true}
    descriptors:
      - key: user
        rate_limit: {unit: minute, requests_per_unit: 1}
      - key: old
        response_headers: {format: Legacy}
        rate_limit: {unit: minute, requests_per_unit: 1}
";
    let config = Config::from_yaml_str(Path::new("t.yaml"), yaml).unwrap();
    let headers = |entries: &[(&str, &str)]| {
        let entries: Vec<Entry> = entries.iter().map(|(k, v)| Entry::new(*k, *v)).collect();
        match config.lookup("d", &entries) {
            Lookup::Rule { rule, .. } => rule.headers,
            other => panic!("{other:?}"),
        }
    };
    let draft = HeaderPolicy {
        format: HeaderFormat::Draft,
        hide_remaining: false,
    };
    assert_eq!(config.domain_headers("d"), draft);
    assert_eq!(headers(&[("a", "x")]), draft);
    assert_eq!(
        headers(&[("public", "p"), ("user", "u")]),
        HeaderPolicy {
            format: HeaderFormat::Draft,
            hide_remaining: true
        }
    );
    assert_eq!(
        headers(&[("public", "p"), ("old", "o")]),
        HeaderPolicy {
            format: HeaderFormat::Legacy,
            hide_remaining: true
        }
    );
    // Without the field: envoyproxy/ratelimit's behaviour, no headers.
    let plain = Config::from_yaml_str(
        Path::new("p.yaml"),
        "domain: p\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
    )
    .unwrap();
    assert_eq!(plain.domain_headers("p"), HeaderPolicy::default());
    assert_eq!(HeaderPolicy::default().format, HeaderFormat::None);
}

#[test]
fn bad_response_headers_name_file_line_and_rule() {
    let yaml = "
domain: d
response_headers: {format: rfc}
descriptors:
  - key: a
    response_headers:
      hide_remaining: true
      colour: red
    rate_limit: {unit: minute, requests_per_unit: 1}
";
    let errors = Config::from_yaml_str(Path::new("t.yaml"), yaml).unwrap_err();
    let shown: Vec<String> = errors.iter().map(ToString::to_string).collect();
    assert_eq!(
        shown,
        [
            "t.yaml:3: domain: invalid response_headers format `rfc`: expected none, draft or legacy",
            "t.yaml:8: a: unknown field `colour`, expected one of `format`, `hide_remaining`",
        ]
    );
}

#[test]
fn algorithms_windows_and_stacked_limits_compile() {
    let yaml = "\
domain: d
descriptors:
  - key: a
    rate_limit: {window: 30s, requests_per_unit: 5, algorithm: gcra, burst: 10}
  - key: b
    rate_limit: {unit: minute, requests_per_unit: 5, algorithm: quantized_log}
  - key: c
    rate_limits:
      - {unit: second, requests_per_unit: 10, name: per_second}
      - {window: 1h, requests_per_unit: 1000, algorithm: sliding_counter}
  - key: e
    rate_limit: {window: 1500ms, requests_per_unit: 3, algorithm: FIXED_WINDOW}
";
    let config = Config::from_yaml_str(Path::new("t.yaml"), yaml).expect("loads");
    let rule = |k: &str| match config.lookup("d", &[Entry::new(k, "x")]) {
        Lookup::Rule { rule, .. } => rule.clone(),
        other => panic!("{k}: {other:?}"),
    };
    let a = rule("a");
    assert_eq!(
        a.limit,
        Some(LimitSpec::PerUnit {
            requests_per_unit: 5,
            unit: Unit::Minute
        })
    );
    assert_eq!(a.limits[0].window_ms, 30_000);
    assert_eq!(a.limits[0].algorithm, LimitAlgorithm::Gcra { burst: 10 });
    assert_eq!(
        rule("b").limits[0].algorithm,
        LimitAlgorithm::QuantizedLog { quantum_ms: 1000 }
    );
    let c = rule("c");
    assert_eq!(c.limits.len(), 2);
    assert_eq!(c.name.as_deref(), Some("per_second"));
    assert_eq!(c.limits[1].unit, Unit::Hour);
    assert_eq!(c.limits[1].algorithm, LimitAlgorithm::SlidingCounter);
    let e = rule("e");
    assert_eq!(
        (e.limits[0].unit, e.limits[0].window_ms),
        (Unit::Second, 1500)
    );
    assert_eq!(e.limits[0].algorithm, LimitAlgorithm::FixedWindow);
}

#[test]
fn nearest_unit_and_durations() {
    assert_eq!(Unit::nearest(1_000), Unit::Second);
    assert_eq!(Unit::nearest(1_500), Unit::Second);
    assert_eq!(Unit::nearest(7_745), Unit::Second);
    assert_eq!(Unit::nearest(7_746), Unit::Minute);
    assert_eq!(Unit::nearest(30_000), Unit::Minute);
    assert_eq!(Unit::nearest(300_000), Unit::Minute);
    assert_eq!(Unit::nearest(3_600_000), Unit::Hour);
    assert_eq!(Unit::nearest(365 * 86_400_000), Unit::Year);
    assert_eq!(parse_duration_ms("1500ms"), Some(1500));
    assert_eq!(parse_duration_ms("30s"), Some(30_000));
    assert_eq!(parse_duration_ms("5m"), Some(300_000));
    assert_eq!(parse_duration_ms("2d"), Some(172_800_000));
    for bad in ["", "0s", "s", "5", "1.5s", "-1s", "5 m", "5w"] {
        assert_eq!(parse_duration_ms(bad), None, "{bad}");
    }
}

#[test]
fn algorithm_errors_name_file_line_and_rule() {
    let yaml = "\
domain: d
descriptors:
  - key: a
    rate_limit: {unit: second, window: 5s, requests_per_unit: 1}
  - key: b
    rate_limit: {requests_per_unit: 1, algorithm: leaky}
  - key: c
    rate_limit: {window: 2fortnights, requests_per_unit: 1}
  - key: d
    rate_limit: {unit: second, requests_per_unit: 1, burst: 5}
  - key: e
    rate_limit: {unit: day, requests_per_unit: 1, algorithm: quantized_log}
  - key: f
    rate_limit: {unit: second, requests_per_unit: 0, algorithm: gcra}
  - key: g
    rate_limit: {unit: second, requests_per_unit: 1}
    rate_limits: [{unit: second, requests_per_unit: 1}]
  - key: h
    rate_limits: []
  - key: i
    rate_limits:
      - {unlimited: true}
";
    let shown: Vec<String> = errors_of(yaml).iter().map(ToString::to_string).collect();
    let expect = [
        "t.yaml:4: a: `unit: second` and `window: 5s` are both set",
        "t.yaml:6: b: `rate_limit` has no `unit` and is not `unlimited: true`",
        "t.yaml:6: b: invalid algorithm `leaky`",
        "t.yaml:8: c: invalid window `2fortnights`",
        "t.yaml:10: d: `burst` applies only to `algorithm: gcra`",
        "t.yaml:12: e: quantum of 1000 ms splits the window of 86400000 ms into more than 3600 buckets; set `quantum` to at least 24000 ms",
        "t.yaml:14: f: `algorithm: gcra` needs `requests_per_unit` and `burst` of at least 1",
        "t.yaml:17: g: `rate_limit` and `rate_limits` are both set",
        "t.yaml:19: h: `rate_limits` is empty",
        "t.yaml:22: i: `unlimited: true` cannot be one of `rate_limits`",
    ];
    for e in expect {
        assert!(
            shown.iter().any(|s| s.starts_with(e)),
            "missing {e:?} in {shown:#?}"
        );
    }
    assert_eq!(shown.len(), expect.len(), "{shown:#?}");
}
