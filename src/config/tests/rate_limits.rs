//! What one limit compiles to: response-header policies, algorithms, custom windows and
//! stacked limits, and the errors (file, line, rule) of each.

use super::*;

/// The rule of descriptor `key=x` in domain `d`.
fn rule_of(config: &Config, key: &str) -> Rule {
    match config.lookup("d", &[Entry::new(key, "x")]) {
        Lookup::Rule { rule, .. } => rule.clone(),
        other => panic!("{key}: {other:?}"),
    }
}

/// Asserts that `yaml` is refused with exactly these errors, in file order, each shown starting
/// with its `expect` line (`file:line: rule: message`).
fn assert_errors(yaml: &str, expect: &[&str]) {
    let shown: Vec<String> = errors_of(yaml).iter().map(ToString::to_string).collect();
    assert_eq!(shown.len(), expect.len(), "{shown:#?}");
    for (shown, expect) in shown.iter().zip(expect) {
        assert!(shown.starts_with(expect), "{shown} is not {expect}");
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
    let rule = |k: &str| rule_of(&config, k);
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
    // The rule listing (`/rlconfig`) names each limit's algorithm but the sliding log's, its
    // parameter, and its window where the unit does not say it.
    assert_eq!(
        config.describe(),
        "d.a: unit=MINUTE requests_per_unit=5, algorithm=gcra, window=30000ms, burst=10\n\
         d.b: unit=MINUTE requests_per_unit=5, algorithm=quantized_log, quantum=1000ms\n\
         d.c: unit=SECOND requests_per_unit=10, algorithm[1]=sliding_counter, name=per_second\n\
         d.e: unit=SECOND requests_per_unit=3, algorithm=fixed_window, window=1500ms\n"
    );
}

/// `in_flight` takes `lease` instead of a unit or window: reported as the nearest unit, counted
/// with the lease as its window; stacked beside a rate, and with `over_limit: refuse` (what it
/// does anyway), or any `over_limit` when another limit of the rule counts.
#[test]
fn in_flight_takes_a_lease() {
    let yaml = "
domain: d
descriptors:
  - key: a
    over_limit: refuse
    rate_limit: {requests_per_unit: 3, algorithm: in_flight, lease: 2s}
  - key: b
    over_limit: record
    rate_limits:
      - {requests_per_unit: 10, algorithm: In_Flight, lease: 90s}
      - {unit: minute, requests_per_unit: 100}
";
    let config = Config::from_yaml_str(Path::new("t.yaml"), yaml).expect("loads");
    let rule = |k: &str| rule_of(&config, k);
    let a = rule("a");
    assert_eq!(
        a.limit,
        Some(LimitSpec::PerUnit {
            requests_per_unit: 3,
            unit: Unit::Second
        })
    );
    assert_eq!(
        (a.limits[0].algorithm, a.limits[0].window_ms),
        (LimitAlgorithm::InFlight, 2_000)
    );
    let b = rule("b");
    assert_eq!(b.limits[0].unit, Unit::Minute);
    assert_eq!(b.limits[0].algorithm, LimitAlgorithm::InFlight);
    assert_eq!(b.limits[1].algorithm, LimitAlgorithm::SlidingLog);
    // The rule listing (`/rlconfig`) says how each limit counts.
    assert_eq!(
        config.describe(),
        "d.a: unit=SECOND requests_per_unit=3, algorithm=in_flight, lease=2000ms, \
         over_limit=refuse\n\
         d.b: unit=MINUTE requests_per_unit=10, algorithm[0]=in_flight, lease[0]=90000ms, \
         over_limit=record\n"
    );
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

/// A `window` or `lease` may be as long as a year, the longest unit, and no longer.
#[test]
fn windows_and_leases_end_at_a_year() {
    let yaml = "\
domain: d
descriptors:
  - key: a
    rate_limit: {window: 365d, requests_per_unit: 1}
  - key: b
    rate_limit: {window: 8760h, requests_per_unit: 1, algorithm: sliding_counter}
  - key: c
    rate_limit: {lease: 365d, requests_per_unit: 1, algorithm: in_flight}
";
    let config = Config::from_yaml_str(Path::new("t.yaml"), yaml).expect("a year loads");
    for key in ["a", "b", "c"] {
        let limit = &rule_of(&config, key).limits[0];
        assert_eq!(
            (limit.window_ms, limit.unit),
            (31_536_000_000, Unit::Year),
            "{key}"
        );
    }
    let yaml = "\
domain: d
descriptors:
  - key: a
    rate_limit: {window: 366d, requests_per_unit: 1}
  - key: b
    rate_limit: {window: 31536000001ms, requests_per_unit: 1}
  - key: c
    rate_limit: {lease: 8761h, requests_per_unit: 1, algorithm: in_flight}
";
    assert_errors(
        yaml,
        &[
            "t.yaml:4: a: invalid window `366d`",
            "t.yaml:6: b: invalid window `31536000001ms`",
            "t.yaml:8: c: invalid lease `8761h`",
        ],
    );
}

/// Each algorithm parameter at its bound loads, one past it is refused: a quantum as long as
/// the window, 3600 buckets, a GCRA `burst × window` of exactly 2^52 token-ms; `quantum` only
/// on the quantized log; a GCRA rate and burst each of at least 1.
#[test]
fn algorithm_parameters_load_up_to_their_bounds() {
    let yaml = "\
domain: d
descriptors:
  - key: a
    rate_limit: {window: 10s, requests_per_unit: 1, algorithm: quantized_log, quantum: 10s}
  - key: b
    rate_limit: {unit: hour, requests_per_unit: 1, algorithm: quantized_log, quantum: 1s}
  - key: c
    rate_limit: {window: 2097152ms, requests_per_unit: 1, algorithm: gcra, burst: 2147483648}
  - key: e
    rate_limit: {window: 1s, requests_per_unit: 5, algorithm: quantized_log, quantum: 250ms}
";
    let config = Config::from_yaml_str(Path::new("t.yaml"), yaml).expect("bounds load");
    let algorithm = |k: &str| rule_of(&config, k).limits[0].algorithm;
    assert_eq!(
        algorithm("a"),
        LimitAlgorithm::QuantizedLog { quantum_ms: 10_000 }
    );
    assert_eq!(
        algorithm("b"),
        LimitAlgorithm::QuantizedLog { quantum_ms: 1_000 }
    );
    assert_eq!(
        algorithm("c"),
        LimitAlgorithm::Gcra {
            burst: 2_147_483_648
        }
    );
    assert_eq!(
        algorithm("e"),
        LimitAlgorithm::QuantizedLog { quantum_ms: 250 }
    );
    let yaml = "\
domain: d
descriptors:
  - key: a
    rate_limit: {window: 10s, requests_per_unit: 1, algorithm: quantized_log, quantum: 10001ms}
  - key: b
    rate_limit: {window: 3601s, requests_per_unit: 1, algorithm: quantized_log, quantum: 1s}
  - key: c
    rate_limit: {window: 2097152ms, requests_per_unit: 1, algorithm: gcra, burst: 2147483649}
  - key: e
    rate_limit: {unit: second, requests_per_unit: 5, algorithm: sliding_counter, quantum: 1s}
  - key: f
    rate_limit: {unit: second, requests_per_unit: 5, algorithm: gcra, burst: 0}
  - key: g
    rate_limit: {unit: second, requests_per_unit: 0, algorithm: gcra, burst: 5}
";
    assert_errors(
        yaml,
        &[
            "t.yaml:4: a: quantum of 10001 ms is longer than the window of 10000 ms",
            "t.yaml:6: b: quantum of 1000 ms splits the window of 3601000 ms into more than 3600 buckets; set `quantum` to at least 1001 ms",
            "t.yaml:8: c: gcra: burst 2147483649 × window 2097152 ms exceeds 2^52 token-ms",
            "t.yaml:10: e: `quantum` applies only to `algorithm: quantized_log`, not `sliding_counter`",
            "t.yaml:12: f: `algorithm: gcra` needs `requests_per_unit` and `burst` of at least 1",
            "t.yaml:14: g: `algorithm: gcra` needs `requests_per_unit` and `burst` of at least 1",
        ],
    );
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
    assert_errors(
        yaml,
        &[
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
        ],
    );
}
