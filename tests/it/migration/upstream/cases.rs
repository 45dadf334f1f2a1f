//! The translated cases, one table per environment. Each case names the upstream test it comes
//! from; its config is a file of `tests/fixtures/upstream/<group>` written for it.

use super::{Call, Case, Group, NONE, Status, UNLIMITED, agrees, call, differs, ok, over};
use sluice::proto::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use sluice::proto::envoy::r#type::v3::RateLimitUnit;

const SECOND: Unit = Unit::Second;
const MINUTE: Unit = Unit::Minute;
const HOUR: Unit = Unit::Hour;
const DAY: Unit = Unit::Day;

/// The reason of the cases that differ by sluice's all-or-nothing counting, as
/// docs/migration.md gives it.
const ALL_OR_NOTHING: &str = "A rejected request records only what did not fit, up to the limit";
/// An error's gRPC code.
const ERROR_CODES: &str = "envoyproxy/ratelimit returns its errors as `UNKNOWN`";
/// The legacy headers' reset and `Retry-After`.
const LEGACY_HEADERS: &str = "sluice adds `Retry-After` on OVER_LIMIT";
/// A config that does not load at start-up.
pub const START_UP: &str = "A config that does not load at start-up stops the start";

/// Differences of the cases outside the tables ([`refused`]'s start-up case, the backend
/// error).
pub const OTHER_DIFFERENCES: &[&str] = &[START_UP, ERROR_CODES];

pub static DEFAULT: Group = Group {
    name: "default environment",
    dir: "default",
    env: &[("MERGE_DOMAIN_CONFIG", "true")],
    cases: default_cases,
};

pub static SHADOW: Group = Group {
    name: "SHADOW_MODE=true",
    dir: "shadow",
    env: &[("SHADOW_MODE", "true")],
    cases: shadow_cases,
};

pub static QUOTA: Group = Group {
    name: "QUOTA_MODE=true, RESPONSE_DYNAMIC_METADATA=true",
    dir: "quota",
    env: &[
        ("QUOTA_MODE", "true"),
        ("RESPONSE_DYNAMIC_METADATA", "true"),
    ],
    cases: quota_cases,
};

pub static HEADERS: Group = Group {
    name: "LIMIT_RESPONSE_HEADERS_ENABLED=true",
    dir: "headers",
    env: &[("LIMIT_RESPONSE_HEADERS_ENABLED", "true")],
    cases: header_cases,
};

pub static CUSTOM_HEADERS: Group = Group {
    name: "LIMIT_RESPONSE_HEADERS_ENABLED=true and LIMIT_*_HEADER",
    dir: "headers",
    env: &[
        ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
        ("LIMIT_LIMIT_HEADER", "A-Ratelimit-Limit"),
        ("LIMIT_REMAINING_HEADER", "A-Ratelimit-Remaining"),
        ("LIMIT_RESET_HEADER", "A-Ratelimit-Reset"),
    ],
    cases: custom_header_cases,
};

pub static GROUPS: [&Group; 5] = [&DEFAULT, &SHADOW, &QUOTA, &HEADERS, &CUSTOM_HEADERS];

fn default_cases() -> Vec<Case> {
    let mut cases = config_lookups();
    cases.extend(config_overrides_merge_shadow());
    cases.extend(wildcards());
    cases.extend(shared_thresholds());
    cases.extend(service());
    cases.extend(integration());
    cases
}

/// `config_test.go` TestBasicConfig.
fn config_lookups() -> Vec<Case> {
    let l = "lookups";
    let from = "config_test.go TestBasicConfig";
    vec![
        agrees(from, vec![call("foo_domain", &[&[]]).ok(&[NONE])]),
        agrees(from, vec![call(l, &[&[]]).ok(&[NONE])]),
        agrees(from, vec![call(l, &[&[("tier", "something")]]).ok(&[NONE])]),
        agrees(from, vec![call(l, &[&[("tier", "gold")]]).ok(&[NONE])]),
        agrees(
            from,
            vec![call(l, &[&[("client", "partner"), ("route", "x")]]).ok(&[NONE])],
        ),
        agrees(
            from,
            vec![call(l, &[&[("region", "eu"), ("zone", "other")]]).ok(&[NONE])],
        ),
        agrees(
            from,
            vec![call(l, &[&[("tier", "gold"), ("route", "something")]]).ok(&[ok(5, SECOND, 4)])],
        ),
        agrees(
            from,
            vec![call(l, &[&[("tier", "gold"), ("route", "checkout")]]).ok(&[ok(10, SECOND, 9)])],
        ),
        agrees(
            from,
            vec![call(l, &[&[("client", "something")]]).ok(&[ok(20, MINUTE, 19)])],
        ),
        agrees(
            from,
            vec![call(l, &[&[("client", "partner")]]).ok(&[ok(30, MINUTE, 29)])],
        ),
        agrees(
            from,
            vec![call(l, &[&[("client", "internal")]]).ok(&[NONE])],
        ),
        agrees(
            from,
            vec![call(l, &[&[("report", "foo")]]).ok(&[ok(1, HOUR, 0)])],
        ),
        agrees(
            from,
            vec![call(l, &[&[("export", "foo")]]).ok(&[ok(1, DAY, 0).named("daily_export")])],
        ),
        agrees(
            from,
            vec![call(l, &[&[("healthcheck", "foo")]]).ok(&[UNLIMITED])],
        ),
        agrees(
            from,
            vec![call(l, &[&[("tenant", "unspecified_value")]]).ok(&[ok(70, MINUTE, 69)])],
        ),
        agrees(
            from,
            vec![call(l, &[&[("tenant", "another_value")]]).ok(&[ok(70, MINUTE, 69)])],
        ),
    ]
}

/// `config_test.go` TestConfigLimitOverride, TestDomainMerge, TestShadowModeConfig.
fn config_overrides_merge_shadow() -> Vec<Case> {
    let l = "lookups";
    let overrides = "config_test.go TestConfigLimitOverride";
    let merge = "config_test.go TestDomainMerge";
    let shadow = "config_test.go TestShadowModeConfig";
    let s = "shadow-rules";
    let gold =
        |route| -> Vec<(&'static str, &'static str)> { vec![("tier", "gold"), ("route", route)] };
    vec![
        agrees(
            overrides,
            vec![
                call("foo_domain", &[&[]])
                    .limit(0, 10, RateLimitUnit::Day)
                    .ok(&[NONE]),
            ],
        ),
        agrees(
            overrides,
            vec![
                call(l, &[&gold("something")])
                    .limit(0, 10, RateLimitUnit::Day)
                    .ok(&[ok(10, DAY, 9)]),
            ],
        ),
        agrees(
            overrides,
            vec![
                call(l, &[&gold("something")])
                    .limit(0, 42, RateLimitUnit::Hour)
                    .ok(&[ok(42, HOUR, 41)]),
            ],
        ),
        agrees(
            overrides,
            vec![
                call(l, &[&gold("something_else")])
                    .limit(0, 42, RateLimitUnit::Hour)
                    .ok(&[ok(42, HOUR, 41)]),
            ],
        ),
        agrees(merge, vec![call("merged", &[&[]]).ok(&[NONE])]),
        agrees(
            merge,
            vec![call("merged", &[&[("left", "a")]]).ok(&[ok(10, MINUTE, 9)])],
        ),
        agrees(
            merge,
            vec![call("merged", &[&[("right", "b")]]).ok(&[ok(20, MINUTE, 19)])],
        ),
        agrees(
            shadow,
            vec![call(s, &[&gold("something")]).ok(&[ok(5, SECOND, 4)])],
        ),
        agrees(
            shadow,
            vec![
                call(s, &[&gold("checkout")]).ok(&[ok(10, SECOND, 9)]),
                // Over its limit in shadow mode: still OK.
                call(s, &[&gold("checkout")])
                    .hits(20)
                    .ok(&[ok(10, SECOND, 0)]),
            ],
        ),
        agrees(
            shadow,
            vec![call(s, &[&[("client", "something")]]).ok(&[ok(20, MINUTE, 19)])],
        ),
        agrees(
            shadow,
            vec![call(s, &[&[("client", "partner")]]).ok(&[ok(30, MINUTE, 29)])],
        ),
    ]
}

/// `config_test.go` TestWildcardConfig: every value a wildcard matches is counted on its own.
fn wildcards() -> Vec<Case> {
    let w = "wildcards";
    let from = "config_test.go TestWildcardConfig";
    let limited = |pairs: &[(&str, &str)], rpu, remaining| {
        agrees(
            from,
            vec![call(w, &[pairs]).ok(&[ok(rpu, MINUTE, remaining)])],
        )
    };
    let unmatched = |pairs: &[(&str, &str)]| agrees(from, vec![call(w, &[pairs]).ok(&[NONE])]);
    vec![
        limited(&[("anykey", "foo1")], 20, 19),
        limited(&[("anykey", "foo2")], 20, 19),
        limited(&[("sku", "abc1")], 20, 19),
        limited(&[("sku", "abc2")], 20, 19),
        limited(&[("parent", "p1"), ("sku", "xyz2")], 20, 19),
        unmatched(&[("sku", "bar")]),
        unmatched(&[("plain", "abc1")]),
        limited(&[("mid", "preAApost")], 20, 19),
        limited(&[("mid", "pre123post")], 20, 19),
        limited(&[("mid", "prepost")], 20, 19),
        unmatched(&[("mid", "prea")]),
        unmatched(&[("mid", "xprepost")]),
        limited(&[("multi", "one1two2three")], 10, 9),
        limited(&[("multi", "onetwothree")], 10, 9),
        unmatched(&[("multi", "one1three")]),
        unmatched(&[("multi", "two2three")]),
    ]
}

/// `config_test.go` TestShareThreshold: the values a shared wildcard matches spend one counter.
fn shared_thresholds() -> Vec<Case> {
    let sh = "shared";
    let from = "config_test.go TestShareThreshold";
    // Calls on `pairs` each, one limit of `rpu` a minute, the first leaving `first` remaining.
    let counted = |entries: &[&[(&'static str, &'static str)]], rpu, first: u32| {
        let calls = entries
            .iter()
            .enumerate()
            .map(|(i, pairs)| call(sh, &[pairs]).ok(&[ok(rpu, MINUTE, first - i as u32)]))
            .collect();
        agrees(from, calls)
    };
    vec![
        counted(
            &[
                &[("doc", "docs/a.pdf")],
                &[("doc", "docs/b.csv")],
                &[("doc", "docs/c.txt")],
            ],
            100,
            99,
        ),
        counted(&[&[("api", "v1/x"), ("verb", "GET")]], 60, 59),
        counted(&[&[("svc", "svc/user"), ("op", "get")]], 80, 79),
        counted(
            &[&[("folder", "home"), ("doc", "inner/file1.txt")]],
            200,
            199,
        ),
        counted(
            &[&[("doc", "top/file1.txt"), ("doc", "inner/file1.txt")]],
            300,
            299,
        ),
        agrees(
            from,
            vec![
                call(
                    sh,
                    &[&[("path", "path/foo"), ("file", "file/doc1"), ("kind", "pdf")]],
                )
                .ok(&[ok(120, MINUTE, 119)]),
                // The shared parent's other value, the same child value: the same counter.
                call(
                    sh,
                    &[&[("path", "path/bar"), ("file", "file/doc1"), ("kind", "pdf")]],
                )
                .ok(&[ok(120, MINUTE, 118)]),
                // The child's wildcard is not shared: another value, another counter.
                call(
                    sh,
                    &[&[("path", "path/foo"), ("file", "file/doc2"), ("kind", "pdf")]],
                )
                .ok(&[ok(120, MINUTE, 119)]),
            ],
        ),
        counted(
            &[
                &[
                    ("user", "user/alice"),
                    ("res", "res/file1"),
                    ("action", "read"),
                ],
                &[
                    ("user", "user/bob"),
                    ("res", "res/file2"),
                    ("action", "read"),
                ],
            ],
            150,
            149,
        ),
        counted(&[&[("item", "test1")]], 50, 49),
        counted(
            &[
                &[("item", "test2")],
                &[("item", "test23")],
                &[("item", "test123")],
            ],
            100,
            99,
        ),
        counted(
            &[
                &[("midpath", "/v1x")],
                &[("midpath", "/v-beta-x")],
                &[("midpath", "/vXYZx")],
            ],
            100,
            99,
        ),
        agrees(from, vec![call(sh, &[&[("midpath", "/v2")]]).ok(&[NONE])]),
        counted(
            &[
                &[("multiroute", "a1b2c")],
                &[("multiroute", "aXXbYYc")],
                &[("multiroute", "abc")],
            ],
            50,
            49,
        ),
        agrees(
            from,
            vec![call(sh, &[&[("multiroute", "aXc")]]).ok(&[NONE])],
        ),
        counted(
            &[&[("midroute", "/w1y")], &[("midroute", "/w-beta-y")]],
            80,
            79,
        ),
        counted(
            &[
                &[("org", "o1prod"), ("bucket", "bAv2")],
                &[("org", "o99prod"), ("bucket", "bBBBv2")],
            ],
            60,
            59,
        ),
    ]
}

/// `ratelimit_test.go`: its mocked limits as a config, spent by real calls.
fn service() -> Vec<Case> {
    let per_user = |s: Status| s.named("per_user");
    let user = |v| -> Vec<(&'static str, &'static str)> { vec![("user", v)] };
    vec![
        agrees(
            "ratelimit_test.go TestService: a descriptor without a limit",
            vec![call("service", &[&[("path", "/")]]).ok(&[NONE])],
        ),
        agrees(
            "ratelimit_test.go TestService: over one limit, none on the other",
            vec![
                call("service", &[&user("u1")])
                    .hits(10)
                    .ok(&[per_user(ok(10, MINUTE, 0))]),
                call("service", &[&user("u1"), &[("path", "/")]])
                    .over(&[per_user(over(10, MINUTE)), NONE]),
            ],
        ),
        agrees(
            "ratelimit_test.go TestService: the same in the other order",
            vec![
                call("service", &[&[("path", "/")], &user("u1")])
                    .over(&[NONE, per_user(over(10, MINUTE))]),
            ],
        ),
        agrees(
            "ratelimit_test.go TestUnlimited",
            vec![
                call("service", &[&user("u2"), &[("path", "/")], &[("bot", "b")]]).ok(&[
                    per_user(ok(10, MINUTE, 9)),
                    NONE,
                    UNLIMITED,
                ]),
            ],
        ),
        differs(
            "ratelimit_test.go TestEmptyDomain",
            ERROR_CODES,
            vec![call("", &[&user("u3")]).refused(tonic::Code::InvalidArgument)],
        ),
        differs(
            "ratelimit_test.go TestEmptyDescriptors",
            ERROR_CODES,
            vec![call("service", &[]).refused(tonic::Code::InvalidArgument)],
        ),
        agrees(
            "ratelimit_test.go TestRuleShadowMode",
            vec![
                call("rule-shadow", &[&[("a", "x")]])
                    .hits(10)
                    .ok(&[ok(10, MINUTE, 0)]),
                call("rule-shadow", &[&[("a", "x")], &[("b", "y")]])
                    .ok(&[ok(10, MINUTE, 0), ok(10, MINUTE, 9)]),
            ],
        ),
        agrees(
            "ratelimit_test.go TestMixedRuleShadowMode",
            vec![
                call("mixed-shadow", &[&[("a", "x")]])
                    .hits(10)
                    .ok(&[ok(10, MINUTE, 0)]),
                call("mixed-shadow", &[&[("b", "y")]])
                    .hits(10)
                    .ok(&[ok(10, MINUTE, 0)]),
                call("mixed-shadow", &[&[("a", "x")], &[("b", "y")]])
                    .over(&[ok(10, MINUTE, 0), over(10, MINUTE)]),
            ],
        ),
        differs(
            "ratelimit_test.go TestServicePerDescriptorQuotaMode (the quota descriptor's \
             remaining: 2 there, 3 here)",
            ALL_OR_NOTHING,
            vec![
                call("quota-mixed", &[&[("regular", "r1")]])
                    .hits(5)
                    .ok(&[ok(5, MINUTE, 0)]),
                call("quota-mixed", &[&[("regular", "r1")], &[("quota", "q1")]])
                    .over(&[over(5, MINUTE), ok(3, MINUTE, 3)]),
            ],
        ),
        differs(
            "ratelimit_test.go TestServiceMixedPerDescriptorModes (the limit's remaining: 4 \
             there, 5 here)",
            ALL_OR_NOTHING,
            vec![
                call("quota-mixed", &[&[("quota", "q2")]])
                    .hits(3)
                    .ok(&[ok(3, MINUTE, 0)]),
                call("quota-mixed", &[&[("regular", "r2")], &[("quota", "q2")]])
                    .over(&[ok(5, MINUTE, 5), over(3, MINUTE)]),
            ],
        ),
        agrees(
            "ratelimit_test.go TestServiceMixedPerDescriptorModesUnderLimit",
            vec![
                call("quota-mixed", &[&[("regular", "r3")], &[("quota", "q3")]])
                    .ok(&[ok(5, MINUTE, 4), ok(3, MINUTE, 2)]),
            ],
        ),
        agrees(
            "ratelimit_test.go TestServiceQuotaModeOnlyAllOverTheLimit",
            vec![
                call("quota-only", &[&[("q1", "a")]])
                    .hits(5)
                    .ok(&[ok(5, MINUTE, 0)]),
                call("quota-only", &[&[("q2", "a")]])
                    .hits(3)
                    .ok(&[ok(3, MINUTE, 0)]),
                call("quota-only", &[&[("q1", "a")], &[("q2", "a")]])
                    .over(&[over(5, MINUTE), over(3, MINUTE)]),
            ],
        ),
        agrees(
            "ratelimit_test.go TestServiceQuotaModeOnlySomeOverTheLimit",
            vec![
                call("quota-only", &[&[("q1", "b")]])
                    .hits(5)
                    .ok(&[ok(5, MINUTE, 0)]),
                call("quota-only", &[&[("q1", "b")], &[("q2", "b")]])
                    .ok(&[over(5, MINUTE), ok(3, MINUTE, 2)]),
            ],
        ),
    ]
}

/// `integration_test.go` testBasicBaseConfig and testShareThreshold.
fn integration() -> Vec<Case> {
    let from = "integration_test.go testBasicBaseConfig";
    let minute: Vec<Call> = (0..25u32)
        .map(|i| {
            let c = call("another", &[&[("key2", "7361")]]);
            if i < 20 {
                c.ok(&[ok(20, MINUTE, 19 - i)])
            } else {
                c.over(&[over(20, MINUTE)])
            }
        })
        .collect();
    let pair = |i: u32| {
        call("another", &[&[("key2", "9124")], &[("key3", "9124")]])
            .ok(&[ok(20, MINUTE, 19 - i), ok(10, HOUR, 9 - i)])
    };
    let shared: Vec<Call> = (0..10u32)
        .map(|i| call("shared", &[&[("upload", "up/a.pdf")]]).ok(&[ok(10, HOUR, 9 - i)]))
        .chain([call("shared", &[&[("upload", "up/b.csv")]]).over(&[over(10, HOUR)])])
        .collect();
    let own: Vec<Call> = [
        "own/0", "own/1", "own/2", "own/3", "own/4", "own/5", "own/6", "own/7", "own/8", "own/9",
    ]
    .into_iter()
    .map(|value| call("shared", &[&[("upload_own", value)]]).ok(&[ok(10, HOUR, 9)]))
    .collect();
    vec![
        agrees(
            from,
            vec![call("foo", &[&[("hello", "world")]]).ok(&[NONE])],
        ),
        agrees(
            from,
            vec![call("basic", &[&[("key1", "foo")]]).ok(&[ok(50, SECOND, 49)])],
        ),
        agrees(
            "integration_test.go testBasicBaseConfig: 25 calls on 20 a minute",
            minute,
        ),
        agrees(
            "integration_test.go testBasicBaseConfig: two limits, until the tighter is full",
            (0..10).map(pair).collect(),
        ),
        differs(
            "integration_test.go testBasicBaseConfig: two limits, the tighter full (the other's \
             remaining keeps falling there, as with STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT \
             it stays here)",
            ALL_OR_NOTHING,
            (10..15)
                .map(|_| {
                    call("another", &[&[("key2", "9124")], &[("key3", "9124")]])
                        .over(&[ok(20, MINUTE, 10), over(10, HOUR)])
                })
                .collect(),
        ),
        agrees(
            "integration_test.go testShareThreshold: shared, then over from another value",
            shared,
        ),
        agrees(
            "integration_test.go testShareThreshold: not shared, a counter per value",
            own,
        ),
    ]
}

fn shadow_cases() -> Vec<Case> {
    vec![
        agrees(
            "ratelimit_test.go TestServiceGlobalShadowMode",
            vec![
                call("global-shadow", &[&[("user", "u")]])
                    .hits(10)
                    .ok(&[ok(10, MINUTE, 0)]),
                call("global-shadow", &[&[("user", "u")], &[("path", "/")]])
                    .ok(&[over(10, MINUTE), NONE]),
            ],
        ),
        agrees(
            "ratelimit_test.go TestServiceQuotaModeWithShadowMode",
            vec![
                call("quota-shadow", &[&[("q1", "a")]])
                    .hits(5)
                    .ok(&[ok(5, MINUTE, 0)]),
                call("quota-shadow", &[&[("q2", "a")]])
                    .hits(3)
                    .ok(&[ok(3, MINUTE, 0)]),
                call("quota-shadow", &[&[("q1", "a")], &[("q2", "a")]])
                    .ok(&[over(5, MINUTE), over(3, MINUTE)]),
            ],
        ),
        agrees(
            "ratelimit_test.go TestServiceMixedModeWithShadowMode",
            vec![
                call("mixed-shadow-quota", &[&[("regular", "a")]])
                    .hits(5)
                    .ok(&[ok(5, MINUTE, 0)]),
                call("mixed-shadow-quota", &[&[("quota", "a")]])
                    .hits(3)
                    .ok(&[ok(3, MINUTE, 0)]),
                call(
                    "mixed-shadow-quota",
                    &[&[("regular", "a")], &[("quota", "a")]],
                )
                .ok(&[over(5, MINUTE), over(3, MINUTE)]),
            ],
        ),
    ]
}

fn quota_cases() -> Vec<Case> {
    use serde_json::json;
    let two =
        |domain: &'static str| call(domain, &[&[("regular", "a")], &[("quota", "a")]]).hits(1);
    let described = |domain: &str, metadata: serde_json::Value| {
        json!({
            "domain": domain,
            "descriptors": [{"entries": ["regular=a"]}, {"entries": ["quota=a"]}],
            "hitsAddend": 1,
            "metadata": metadata,
        })
    };
    vec![
        agrees(
            "ratelimit_test.go TestServiceGlobalQuotaMode",
            vec![
                call("global-quota", &[&[("first", "a")]])
                    .hits(10)
                    .ok(&[ok(10, MINUTE, 0)]),
                call("global-quota", &[&[("second", "a")]])
                    .hits(5)
                    .ok(&[ok(5, MINUTE, 0)]),
                call("global-quota", &[&[("first", "a")], &[("second", "a")]])
                    .over(&[over(10, MINUTE), over(5, MINUTE)]),
            ],
        ),
        agrees(
            "ratelimit_test.go TestMetadataReturnedForPassedDescriptors",
            vec![
                call("meta-passed", &[&[("quota", "a")]])
                    .hits(5)
                    .ok(&[ok(5, MINUTE, 0)]),
                two("meta-passed")
                    .ok(&[ok(10, MINUTE, 9), over(5, MINUTE)])
                    .metadata(described("meta-passed", json!({"name": "service_1"}))),
            ],
        ),
        agrees(
            "ratelimit_test.go TestMetadataReturnedForAllPassedDescriptors",
            vec![
                two("meta-all")
                    .ok(&[ok(10, MINUTE, 9), ok(5, MINUTE, 4)])
                    .metadata(described(
                        "meta-all",
                        json!({"name": "service_1", "some_other_name": "service_2"}),
                    )),
            ],
        ),
        agrees(
            "ratelimit_test.go TestOverlappingMetadataReturnsTheFirstValue",
            vec![
                two("meta-overlap")
                    .ok(&[ok(10, MINUTE, 9), ok(5, MINUTE, 4)])
                    .metadata(described("meta-overlap", json!({"name": "service_1"}))),
            ],
        ),
        agrees(
            "config_test.go TestMetadata",
            vec![
                call(
                    "meta-lookups",
                    &[&[("tier", "gold"), ("route", "something")]],
                )
                .ok(&[ok(5, SECOND, 4)])
                .metadata(json!({
                    "domain": "meta-lookups",
                    "descriptors": [{"entries": ["tier=gold", "route=something"]}],
                    "metadata": {"name": "service_1"},
                })),
                call("meta-lookups", &[&[("client", "something")]])
                    .ok(&[ok(20, MINUTE, 19)])
                    .metadata(json!({
                        "domain": "meta-lookups",
                        "descriptors": [{"entries": ["client=something"]}],
                        "metadata": {"service_with_quota": {"name": "service_2"}},
                    })),
                call("meta-lookups", &[&[]]).ok(&[NONE]).metadata(json!({
                    "domain": "meta-lookups",
                    "descriptors": [{"entries": []}],
                })),
            ],
        ),
    ]
}

/// The service tests' response headers under `names` (limit, remaining, reset).
fn headers_cases(from: &'static str, names: [&'static str; 3]) -> Vec<Case> {
    vec![differs(
        from,
        LEGACY_HEADERS,
        vec![
            call("headers", &[&[("user", "a")]])
                .hits(10)
                .ok(&[ok(10, MINUTE, 0)]),
            call("headers", &[&[("user", "a")], &[("path", "/")]])
                .over(&[over(10, MINUTE), NONE])
                .headers(&[
                    (names[0], "10"),
                    (names[1], "0"),
                    (names[2], "*"),
                    ("Retry-After", "*"),
                ]),
        ],
    )]
}

fn header_cases() -> Vec<Case> {
    headers_cases(
        "ratelimit_test.go TestServiceWithDefaultRatelimitHeaders",
        ["RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"],
    )
}

fn custom_header_cases() -> Vec<Case> {
    headers_cases(
        "ratelimit_test.go TestServiceWithCustomRatelimitHeaders",
        [
            "A-Ratelimit-Limit",
            "A-Ratelimit-Remaining",
            "A-Ratelimit-Reset",
        ],
    )
}

/// A config file `sluice check-config` must refuse, and what its message says.
pub struct Refused {
    pub from: &'static str,
    /// Under `tests/fixtures/upstream/bad`, and whether domains are merged.
    pub path: (&'static str, bool),
    pub says: &'static str,
}

/// `config_test.go`'s refused files.
pub fn refused() -> Vec<Refused> {
    let r = |from, path, merge, says| Refused {
        from,
        path: (path, merge),
        says,
    };
    vec![
        r(
            "config_test.go TestEmptyDomain",
            "no_domain.yaml",
            false,
            "no_domain.yaml:1: domain: missing `domain`",
        ),
        r(
            "config_test.go TestDuplicateDomain",
            "duplicate_domain",
            false,
            "duplicate domain `twice`",
        ),
        r(
            "config_test.go TestEmptyKey",
            "empty_key.yaml",
            false,
            "descriptor has no `key`",
        ),
        r(
            "config_test.go TestDuplicateKey",
            "duplicate_key.yaml",
            false,
            "duplicate descriptor `k1_v1`",
        ),
        r(
            "config_test.go TestDuplicateKeyDomainMerge",
            "merged_duplicate_key",
            true,
            "merged domains must not repeat a top-level descriptor",
        ),
        r(
            "config_test.go TestBadLimitUnit",
            "bad_unit.yaml",
            false,
            "invalid unit `fortnight`",
        ),
        r(
            "config_test.go TestReplacesSelf",
            "replaces_self.yaml",
            false,
            "a rule cannot replace itself",
        ),
        r(
            "config_test.go TestReplacesEmpty",
            "replaces_empty.yaml",
            false,
            "`replaces` entry has no `name`",
        ),
        r(
            "config_test.go TestBadYaml",
            "not_yaml.yaml",
            false,
            "malformed YAML",
        ),
        r(
            "config_test.go TestMisspelledKey",
            "misspelled_field.yaml",
            false,
            "unknown field `ratelimit`",
        ),
        r(
            "config_test.go TestMisspelledKey",
            "misspelled_limit_field.yaml",
            false,
            "unknown field `requestsperunit`",
        ),
        r(
            "config_test.go TestNonStringKey",
            "number_key.yaml",
            false,
            "unknown field `0.25`",
        ),
        r(
            "config_test.go TestNonMapList",
            "scalar_descriptors.yaml",
            false,
            "malformed YAML",
        ),
        r(
            "config_test.go TestUnlimitedWithRateLimitUnit",
            "unlimited_with_unit.yaml",
            false,
            "must not be set together with `unlimited: true`",
        ),
    ]
}

/// One step of the reload cases.
pub enum ReloadStep {
    Write(&'static str, &'static str),
    Remove(&'static str),
    /// Wait until the log holds this text.
    Logged(&'static str),
    /// Wait until the call gets its answer (case name, call).
    Until(&'static str, Call),
}

/// How many upstream cases [`reload_steps`] translates.
pub const RELOAD_CASES: usize = 4;

const RELOADED: &str = "# Added by the reload test.
domain: reload
descriptors:
  - key: key1
    rate_limit: {unit: second, requests_per_unit: 50}
  - key: block
    rate_limit: {unit: second, requests_per_unit: 0}
";

pub fn reload_steps() -> Vec<ReloadStep> {
    use ReloadStep::{Logged, Remove, Until, Write};
    let from = "integration_test.go testConfigReload";
    let failed = "ratelimit_test.go TestService: a config that fails to load keeps the last";
    vec![
        Until(from, call("reload", &[&[("block", "foo")]]).ok(&[NONE])),
        Write("reload.yaml", RELOADED),
        Until(
            from,
            call("reload", &[&[("block", "foo")]]).over(&[over(0, SECOND)]),
        ),
        Until(
            from,
            call("reload", &[&[("key1", "foo")]]).ok(&[ok(50, SECOND, 49)]),
        ),
        Write(
            "broken.yaml",
            "domain: broken\ndescriptors:\n  - key: k\n    rate_limit: {unit: eon}\n",
        ),
        // The broken file is refused as a whole: the last config keeps serving.
        Logged("broken.yaml:4: k: invalid unit `eon`"),
        Until(
            failed,
            call("steady", &[&[("user", "u")]]).ok(&[ok(10, MINUTE, 9)]),
        ),
        Remove("broken.yaml"),
        Remove("reload.yaml"),
        Until(from, call("reload", &[&[("block", "foo")]]).ok(&[NONE])),
    ]
}
