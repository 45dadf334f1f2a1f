//! The upstream stats end to end in process: a config, the engine's decisions, the counts, the
//! statsd lines and the Prometheus page, against what envoyproxy/ratelimit (its config and
//! base-limiter code, statsd_exporter's mapper) makes of the same calls.

use std::path::Path;
use std::sync::Arc;

use super::mapper::MetricType;
use super::series::ObserverKind;
use super::*;
use crate::config::{Config, Lookup};
use crate::decision::{Descriptor, Engine, LimitOverride, StatKey};
use crate::descriptor::Entry;
use crate::limiter::SystemClock;
use crate::limiter::memory::MemoryLimiter;

fn config(yaml: &str) -> Config {
    Config::from_yaml_str(Path::new("test.yaml"), yaml).unwrap()
}

fn entries(pairs: &[(&str, &str)]) -> Vec<Entry> {
    pairs.iter().map(|(k, v)| Entry::new(*k, *v)).collect()
}

/// The stat key of a request's entries, as the config's rule names it.
fn key_of(config: &Config, domain: &str, pairs: &[(&str, &str)]) -> String {
    let e = entries(pairs);
    match config.lookup(domain, &e) {
        Lookup::Rule { rule, .. } => {
            stat_key(domain, &StatKey::Rule(rule.stat.clone()), &rule.path, &e)
        }
        other => panic!("no rule for {pairs:?}: {other:?}"),
    }
}

/// envoyproxy/ratelimit's own expectations (its config_test.go), case by case.
#[test]
fn stat_keys_are_named_as_envoyproxy_ratelimit_names_them() {
    let yaml = "
domain: d
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit: {unit: second, requests_per_unit: 1}
          - key: detailed
            detailed_metric: true
            rate_limit: {unit: second, requests_per_unit: 1}
  - key: k1
    descriptors:
      - key: k2
        value_to_metric: true
        descriptors:
          - key: k3
            rate_limit: {unit: second, requests_per_unit: 1}
  - key: user
    value_to_metric: true
    descriptors:
      - key: action
        value: read*
        value_to_metric: true
        descriptors:
          - key: resource
            rate_limit: {unit: second, requests_per_unit: 1}
  - key: path
    value: /api/*
    share_threshold: true
    detailed_metric: true
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: key1
    value: value1
    descriptors:
      - key: subkey1
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: remote_address
    detailed_metric: true
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: file
    value: test*
    rate_limit: {unit: second, requests_per_unit: 1}
";
    let c = config(yaml);
    let cases: &[(&[(&str, &str)], &str)] = &[
        (
            &[
                ("route", "draw"),
                ("http_method", "GET"),
                ("subject_id", "123"),
            ],
            "d.route_draw.http_method_GET.subject_id",
        ),
        // detailed_metric wins over value_to_metric.
        (
            &[
                ("route", "draw"),
                ("http_method", "GET"),
                ("detailed", "123"),
            ],
            "d.route_draw.http_method_GET.detailed_123",
        ),
        (&[("k1", "X"), ("k2", "Y"), ("k3", "Z")], "d.k1.k2_Y.k3"),
        (
            &[
                ("user", "alice"),
                ("action", "readfile"),
                ("resource", "documents"),
            ],
            "d.user_alice.action_readfile.resource",
        ),
        // share_threshold keeps the pattern even with detailed_metric.
        (&[("path", "/api/users")], "d.path_/api/*"),
        (
            &[("key1", "value1"), ("subkey1", "anything")],
            "d.key1_value1.subkey1",
        ),
        // detailed_metric: the request's value, its IPv4 dots sanitized.
        (
            &[("remote_address", "10.1.2.3")],
            "d.remote_address_10_1_2_3",
        ),
        // Without flags a wildcard keeps its pattern.
        (&[("file", "test1")], "d.file_test*"),
    ];
    for (pairs, expected) in cases {
        assert_eq!(key_of(&c, "d", pairs), *expected, "{pairs:?}");
    }
    // detailed_metric keeps the `_` of an empty value.
    assert_eq!(
        key_of(&c, "d", &[("remote_address", "")]),
        "d.remote_address_"
    );
    // A request's own limit is named after its entries.
    assert_eq!(
        stat_key(
            "d",
            &StatKey::Override,
            "",
            &entries(&[("a", "1"), ("b", "")])
        ),
        "d.a_1.b"
    );
}

fn default_mapper() -> Arc<Mapper> {
    Arc::new(Mapper::default_mapping(false).unwrap())
}

/// statsd_exporter's mapping of envoyproxy/ratelimit's names with the default mapping.
#[test]
fn the_default_mapping_maps_as_statsd_exporter_does() {
    let m = default_mapper();
    let s = |name: &str, ty| {
        let series = m.series(name, ty);
        (series.family.clone(), series.labels.clone())
    };
    let labels = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    };
    assert_eq!(
        s(
            "ratelimit.service.rate_limit.edge.generic_key_demo.over_limit",
            MetricType::Counter
        ),
        (
            "ratelimit_service_rate_limit_over_limit".into(),
            labels(&[("domain", "edge"), ("key1", "generic_key_demo")])
        )
    );
    assert_eq!(
        s(
            "ratelimit.service.rate_limit.edge.tier_premium.user.total_hits",
            MetricType::Counter
        ),
        (
            "ratelimit_service_rate_limit_total_hits".into(),
            labels(&[
                ("domain", "edge"),
                ("key1", "tier_premium"),
                ("key2", "user")
            ])
        )
    );
    // Unanchored regexes: a two-level key's over_limit_with_local_cache is counted as
    // over_limit, as envoyproxy/ratelimit's page counts it.
    assert_eq!(
        s(
            "ratelimit.service.rate_limit.edge.a.b.over_limit_with_local_cache",
            MetricType::Counter
        )
        .0,
        "ratelimit_service_rate_limit_over_limit"
    );
    // A one-level key's is unmapped: its name escaped, no label.
    assert_eq!(
        s(
            "ratelimit.service.rate_limit.edge.generic_key_demo.over_limit_with_local_cache",
            MetricType::Counter
        ),
        (
            "ratelimit_service_rate_limit_edge_generic_key_demo_over_limit_with_local_cache".into(),
            vec![]
        )
    );
    assert_eq!(
        s(
            "ratelimit.service.call.should_rate_limit.redis_error",
            MetricType::Counter
        ),
        (
            "ratelimit_service_should_rate_limit_error".into(),
            labels(&[("err_type", "redis_error")])
        )
    );
    let timer = m.series(
        "ratelimit_server.ShouldRateLimit.response_time",
        MetricType::Observer,
    );
    assert_eq!(timer.family, "ratelimit_service_response_time_seconds");
    assert_eq!(timer.observer, ObserverKind::Histogram);
    assert_eq!(timer.scale, Some(0.001));
    let ms = Mapper::default_mapping(true).unwrap();
    assert_eq!(
        ms.series(
            "ratelimit_server.ShouldRateLimit.response_time",
            MetricType::Observer
        )
        .scale,
        None
    );
    // EXTRA_TAGS in the name: no rule matches it any more.
    assert_eq!(
        s(
            "ratelimit.service.config_load_success.__env=prod",
            MetricType::Counter
        )
        .0,
        "ratelimit_service_config_load_success___env_prod"
    );
    assert_eq!(escape_metric_name("0a--b.c-d"), "_0a_b_c_d");
}

#[test]
fn unsupported_mapping_fields_are_refused_with_their_line() {
    let cases = [
        (
            "defaults:\n  ttl: 1m\nmappings: []\n",
            2,
            "`defaults` is not supported",
        ),
        (
            "mappings:\n  - match: a.*\n    name: x\n    buckets: [1, 2]\n",
            4,
            "`buckets` is not supported",
        ),
        (
            "mappings:\n  - match: a.*\n    name: x\n    labels:\n      k: v\n",
            5,
            "invalid label key: k",
        ),
        (
            "mappings:\n  - match: \"a(\"\n    match_type: regex\n    name: x\n",
            2,
            "invalid regex",
        ),
        ("mappings:\n  - match: a.*\n", 2, "didn't set a metric name"),
        (
            "mappings:\n  - match: a..b\n    name: x\n",
            2,
            "invalid match",
        ),
    ];
    for (text, line, message) in cases {
        let err = Mapper::parse("conf.yaml", text).unwrap_err();
        assert_eq!(
            (err.file.as_str(), err.line),
            ("conf.yaml", line),
            "{text}: {err}"
        );
        assert!(err.to_string().contains(message), "{text}: {err}");
    }
    // Envoy Gateway's mapping (the default without `scale`) is accepted.
    let gateway = super::default_mapping::yaml(true);
    assert!(Mapper::parse("conf.yaml", &gateway).is_ok());
}

fn stats(statsd: bool, tags: &str) -> UpstreamStats {
    UpstreamStats::new(
        UpstreamSettings {
            tags: Tags::parse(tags).unwrap(),
            statsd: statsd.then(|| StatsdSettings {
                addr: "127.0.0.1:1".into(),
                protocol: Protocol::Tcp,
                flush_interval: std::time::Duration::from_secs(10),
            }),
            prometheus: Some(default_mapper()),
            max_keys: 3,
        },
        0.8,
    )
}

const EDGE: &str = "
domain: edge
descriptors:
  - key: generic_key
    value: demo
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: user
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: tier
    value: premium
    descriptors:
      - key: shadow
        shadow_mode: true
        rate_limit: {unit: minute, requests_per_unit: 1}
";

fn request(domain: &str, pairs: &[(&str, &str)]) -> crate::decision::Request {
    crate::decision::Request {
        domain: domain.into(),
        descriptors: vec![Descriptor::new(entries(pairs))],
        hits_addend: 0,
    }
}

/// Five calls on a limit of 3: three within (the third near the limit at 0.8), two over; a
/// shadow rule over its limit; an unknown domain; the Prometheus page as envoyproxy/ratelimit's
/// sink renders it.
#[tokio::test]
async fn decisions_count_and_render_as_envoyproxy_ratelimit() {
    let engine = Engine::new(
        config(EDGE),
        Arc::new(MemoryLimiter::new(Arc::new(SystemClock))),
    );
    let stats = stats(true, "");
    let send = async |r: crate::decision::Request| {
        let result = engine.decide(&r).await;
        stats.record_request(&r, result.as_ref());
    };
    for _ in 0..5 {
        send(request("edge", &[("generic_key", "demo")])).await;
    }
    for _ in 0..2 {
        send(request("edge", &[("tier", "premium"), ("shadow", "x")])).await;
    }
    send(request("nowhere", &[("a", "b")])).await;
    stats.record_grpc_call(
        GrpcMethod::ShouldRateLimit,
        std::time::Duration::from_millis(2),
    );
    let page = stats.render();
    let expected = "\
# HELP ratelimit_nowhere_domain_not_found Metric autogenerated by statsd_exporter.
# TYPE ratelimit_nowhere_domain_not_found counter
ratelimit_nowhere_domain_not_found 1
";
    // Unknown domains are unmapped: escaped names, as envoyproxy/ratelimit's page has them.
    assert!(
        page.contains(
            &expected.replace("ratelimit_nowhere", "ratelimit_service_rate_limit_nowhere")
        ),
        "{page}"
    );
    for (line, why) in [
        (
            "ratelimit_service_rate_limit_total_hits{domain=\"edge\",key1=\"generic_key_demo\"} 5",
            "every hit",
        ),
        (
            "ratelimit_service_rate_limit_within_limit{domain=\"edge\",key1=\"generic_key_demo\"} 3",
            "three admitted",
        ),
        (
            "ratelimit_service_rate_limit_near_limit{domain=\"edge\",key1=\"generic_key_demo\"} 1",
            "the third leaves 3 > floor(3 x 0.8) = 2",
        ),
        (
            "ratelimit_service_rate_limit_over_limit{domain=\"edge\",key1=\"generic_key_demo\"} 2",
            "two rejected",
        ),
        (
            "ratelimit_service_rate_limit_shadow_mode{domain=\"edge\",key1=\"tier_premium\",key2=\"shadow\"} 1",
            "the shadow rule's second call",
        ),
        (
            "ratelimit_service_total_requests{grpc_method=\"ShouldRateLimit\"} 1",
            "the gRPC layer's call",
        ),
        (
            "ratelimit_service_response_time_seconds_bucket{grpc_method=\"ShouldRateLimit\",le=\"0.005\"} 1",
            "2 ms, scaled to seconds",
        ),
        (
            "ratelimit_service_response_time_seconds_sum{grpc_method=\"ShouldRateLimit\"} 0.002",
            "the sum in seconds",
        ),
        (
            "# TYPE ratelimit_service_rate_limit_over_limit counter",
            "counters stay counters under a histogram mapping",
        ),
    ] {
        assert!(page.lines().any(|l| l == line), "{why}: {line}\n{page}");
    }
    // Series of one family: one label set of fewer labels first.
    let total_hits: Vec<&str> = page
        .lines()
        .filter(|l| l.starts_with("ratelimit_service_rate_limit_total_hits{"))
        .collect();
    assert_eq!(
        total_hits,
        [
            "ratelimit_service_rate_limit_total_hits{domain=\"edge\",key1=\"generic_key_demo\"} 5",
            "ratelimit_service_rate_limit_total_hits{domain=\"edge\",key1=\"tier_premium\",key2=\"shadow\"} 2",
        ]
    );

    // The same counts as statsd lines: each counter's increase since the last flush.
    let lines = statsd_counter_lines(&stats);
    for line in [
        "ratelimit.service.rate_limit.edge.generic_key_demo.total_hits:5|c",
        "ratelimit.service.rate_limit.edge.generic_key_demo.over_limit:2|c",
        "ratelimit.service.rate_limit.edge.tier_premium.shadow.shadow_mode:1|c",
        "ratelimit.service.rate_limit.nowhere.domain_not_found:1|c",
        "ratelimit_server.ShouldRateLimit.total_requests:1|c",
    ] {
        assert!(lines.contains(&line.to_owned()), "{line} in {lines:#?}");
    }
    // Nothing rose since: the next flush sends nothing.
    assert!(statsd_counter_lines(&stats).is_empty());
    send(request("edge", &[("generic_key", "demo")])).await;
    let again = statsd_counter_lines(&stats);
    assert!(
        again.contains(
            &"ratelimit.service.rate_limit.edge.generic_key_demo.over_limit:1|c".to_owned()
        ),
        "{again:?}"
    );
    assert_eq!(
        statsd_timer_lines(&stats),
        ["ratelimit_server.ShouldRateLimit.response_time:2|ms"]
    );
}

fn statsd_counter_lines(stats: &UpstreamStats) -> Vec<String> {
    let mut b = statsd::Buffers::new(1 << 16);
    statsd::counter_lines(&stats.store, &mut b);
    b.finish()
        .into_iter()
        .flat_map(|(bytes, _)| {
            String::from_utf8(bytes)
                .unwrap()
                .lines()
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .collect()
}

fn statsd_timer_lines(stats: &UpstreamStats) -> Vec<String> {
    let mut b = statsd::Buffers::new(1 << 16);
    statsd::timer_lines(&stats.store, &mut b);
    b.finish()
        .into_iter()
        .flat_map(|(bytes, _)| {
            String::from_utf8(bytes)
                .unwrap()
                .lines()
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Client-chosen keys past the bound fold into the rule's key; unknown domains and request
/// limits into `_overflow`; tags follow every name.
#[tokio::test]
async fn client_chosen_keys_are_bounded_and_tags_follow_every_name() {
    let engine = Engine::new(
        config(EDGE),
        Arc::new(MemoryLimiter::new(Arc::new(SystemClock))),
    );
    let stats = stats(true, "env:prod");
    for user in ["a", "b", "c", "d", "e"] {
        let r = request("edge", &[("user", user)]);
        stats.record_request(&r, engine.decide(&r).await.as_ref());
    }
    let mut over = request("edge", &[("generic_key", "x")]);
    over.descriptors[0].limit_override = Some(LimitOverride {
        requests_per_unit: 5,
        unit: crate::config::Unit::Second,
    });
    stats.record_request(&over, engine.decide(&over).await.as_ref());
    let r = request("elsewhere", &[("a", "b")]);
    stats.record_request(&r, engine.decide(&r).await.as_ref());
    let lines = statsd_counter_lines(&stats);
    for line in [
        "ratelimit.service.rate_limit.edge.user_a.total_hits.__env=prod:1|c",
        "ratelimit.service.rate_limit.edge.user_c.total_hits.__env=prod:1|c",
        // d and e, past the bound of 3: the rule's key.
        "ratelimit.service.rate_limit.edge.user.total_hits.__env=prod:2|c",
        "ratelimit.service.rate_limit._overflow.total_hits.__env=prod:1|c",
        "ratelimit.service.rate_limit._overflow.domain_not_found.__env=prod:1|c",
    ] {
        assert!(lines.contains(&line.to_owned()), "{line} in {lines:#?}");
    }
    assert_eq!(stats.folded(), 4);
}
