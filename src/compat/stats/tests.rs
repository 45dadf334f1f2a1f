use super::super::tests::run;
use super::parse_go_duration;

#[test]
fn prometheus_variables_turn_on_the_page_of_envoyproxy_ratelimit_names() {
    let t = run(&[("USE_PROMETHEUS", "true")]);
    assert_eq!(
        t.set["SLUICE_METRICS_ADDR"], "0.0.0.0:9090",
        "upstream's default"
    );
    assert_eq!(t.set["SLUICE_METRICS_RATELIMIT_NAMES"], "true");
    assert!(t.notes.is_empty(), "{t:#?}");
    let t = run(&[
        ("USE_PROMETHEUS", "true"),
        ("PROMETHEUS_ADDR", "127.0.0.1:19001"),
        ("PROMETHEUS_PATH", "/stats/prometheus"),
        ("PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", "true"),
    ]);
    assert_eq!(t.set["SLUICE_METRICS_ADDR"], "127.0.0.1:19001");
    assert_eq!(t.set["SLUICE_METRICS_PATH"], "/stats/prometheus");
    assert_eq!(t.set["SLUICE_METRICS_RESPONSE_TIME_MS"], "true");
    // With a mapping file of its own, the milliseconds switch has nothing to change.
    let t = run(&[
        ("USE_PROMETHEUS", "true"),
        ("PROMETHEUS_MAPPER_YAML", "/etc/statsd-exporter/conf.yaml"),
        ("PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", "true"),
    ]);
    assert_eq!(
        t.set["SLUICE_METRICS_MAPPER"],
        "/etc/statsd-exporter/conf.yaml"
    );
    assert!(!t.set.contains_key("SLUICE_METRICS_RESPONSE_TIME_MS"));
    assert!(t.notes[0].starts_with("PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS ignored"));
    let t = run(&[
        ("USE_PROMETHEUS", "true"),
        ("PROMETHEUS_ADDR", "metrics:19001"),
    ]);
    assert!(t.errors[0].starts_with("PROMETHEUS_ADDR=\"metrics:19001\" is not [IP]:PORT"));
    let t = run(&[("USE_PROMETHEUS", "false"), ("PROMETHEUS_ADDR", ":19001")]);
    assert!(t.set.is_empty());
    assert_eq!(
        t.notes,
        ["PROMETHEUS_ADDR ignored: USE_PROMETHEUS is not true"]
    );
}

#[test]
fn statsd_variables_turn_on_the_statsd_sink() {
    // Envoy Gateway's older deployments: statsd beside a statsd-exporter container.
    let t = run(&[("USE_STATSD", "true"), ("STATSD_PORT", "9125")]);
    assert_eq!(t.set["SLUICE_STATSD_ADDR"], "localhost:9125");
    assert!(t.notes.is_empty(), "{t:#?}");
    let t = run(&[
        ("STATSD_HOST", "statsd.monitoring"),
        ("STATSD_PROTOCOL", "UDP"),
        ("STATS_FLUSH_INTERVAL", "1m30s"),
        ("EXTRA_TAGS", "env:prod,team:edge"),
    ]);
    assert_eq!(t.set["SLUICE_STATSD_ADDR"], "statsd.monitoring:8125");
    assert_eq!(t.set["SLUICE_STATSD_PROTOCOL"], "udp");
    assert_eq!(t.set["SLUICE_STATS_FLUSH_INTERVAL_MS"], "90000");
    assert_eq!(t.set["SLUICE_STATS_TAGS"], "env:prod,team:edge");
    let t = run(&[("USE_STATSD", "true"), ("STATSD_HOST", "::1")]);
    assert_eq!(t.set["SLUICE_STATSD_ADDR"], "[::1]:8125");
    // Nothing asks for statsd: no sink, and what would shape it is reported.
    let t = run(&[("USE_STATSD", "false"), ("STATSD_PORT", "9125")]);
    assert!(t.set.is_empty(), "{t:#?}");
    assert_eq!(t.notes, ["STATSD_PORT ignored: USE_STATSD is not true"]);
    assert!(run(&[]).set.is_empty());
    // What envoyproxy/ratelimit would refuse to start on stops sluice too.
    for (vars, error) in [
        (
            &[("USE_STATSD", "true"), ("STATSD_PORT", "x")][..],
            "STATSD_PORT",
        ),
        (
            &[("USE_STATSD", "true"), ("EXTRA_TAGS", "novalue")][..],
            "EXTRA_TAGS",
        ),
        (
            &[("USE_STATSD", "true"), ("STATS_FLUSH_INTERVAL", "10")][..],
            "STATS_FLUSH_INTERVAL",
        ),
    ] {
        let t = run(vars);
        assert!(t.errors[0].starts_with(error), "{vars:?}: {t:#?}");
    }
}

#[test]
fn disable_stats_and_dogstatsd_are_reported() {
    let t = run(&[
        ("DISABLE_STATS", "true"),
        ("USE_PROMETHEUS", "true"),
        ("PROMETHEUS_ADDR", ":19001"),
        ("USE_STATSD", "true"),
    ]);
    assert!(t.set.is_empty(), "{t:#?}");
    assert!(t.notes[0].starts_with("DISABLE_STATS=true"), "{t:#?}");
    let t = run(&[
        ("USE_DOG_STATSD", "true"),
        ("USE_DOG_STATSD_MOGRIFIERS", "TAGS"),
    ]);
    assert!(t.set.is_empty(), "{t:#?}");
    assert!(t.notes[0].starts_with("USE_DOG_STATSD is not supported"));
    assert!(t.notes[1].starts_with("USE_DOG_STATSD_MOGRIFIERS is not supported"));
}

#[test]
fn go_durations() {
    for (text, ms) in [
        ("10s", Some(10_000)),
        ("500ms", Some(500)),
        ("1m30s", Some(90_000)),
        ("1.5s", Some(1_500)),
        ("1h", Some(3_600_000)),
        ("0", Some(0)),
        ("10", None),
        ("", None),
        ("5x", None),
    ] {
        assert_eq!(parse_go_duration(text), ms, "{text}");
    }
}
