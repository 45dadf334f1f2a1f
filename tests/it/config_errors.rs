//! End-to-end tests of the config loader on files: one bad fixture per validation rule (each
//! asserting file, line, rule and message), directory loading with a Kubernetes-style ConfigMap
//! layout, and the shipped example under `examples/limits`.
//!
//! Why fixtures on disk: the loader's contract includes file discovery (sorting, hidden entries,
//! symlinks) and the file names in error messages, which in-memory tests cannot exercise.

use sluice::config::{Config, ConfigError, LimitSpec, Lookup, MatchKind, Unit};
use sluice::descriptor::Entry;
use std::path::{Path, PathBuf};

fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/config")
        .join(rel)
}

fn load_errors(rel: &str) -> Vec<ConfigError> {
    match Config::load(&fixture(rel)) {
        Ok(c) => panic!(
            "{rel} should not load, got domains {:?}",
            c.domains().collect::<Vec<_>>()
        ),
        Err(e) => e.0,
    }
}

/// Loads a bad fixture expected to hold exactly one problem, checks its file, line and rule,
/// and returns its message.
fn single_error(rel: &str, line: Option<usize>, rule: &str) -> String {
    let errors = load_errors(rel);
    assert_eq!(errors.len(), 1, "{rel}: {errors:#?}");
    let e = &errors[0];
    assert_eq!(e.file, fixture(rel), "{rel}: file");
    assert_eq!(e.line, line, "{rel}: line of {e}");
    assert_eq!(e.rule, rule, "{rel}: rule of {e}");
    let shown = e.to_string();
    let file_part = match line {
        Some(l) => format!("{}:{l}: {rule}: ", fixture(rel).display()),
        None => format!("{}: {rule}: ", fixture(rel).display()),
    };
    assert!(shown.starts_with(&file_part), "{shown}");
    e.message.clone()
}

#[test]
fn malformed_yaml() {
    // Line 4 is inside descriptor `a` (by its indentation), which names the rule.
    let msg = single_error("bad/malformed.yaml", Some(4), "a");
    assert!(msg.starts_with("malformed YAML: "), "{msg}");
    assert!(msg.contains("(column "), "{msg}");
}

#[test]
fn empty_domain() {
    let msg = single_error("bad/empty_domain.yaml", Some(2), "domain");
    assert_eq!(msg, "`domain` is empty");
}

#[test]
fn missing_domain() {
    let msg = single_error("bad/missing_domain.yaml", Some(1), "domain");
    assert_eq!(
        msg,
        "missing `domain`: every config file must name its domain"
    );
}

#[test]
fn empty_key() {
    let msg = single_error("bad/empty_key.yaml", Some(5), "a.(no key)");
    assert_eq!(msg, "descriptor has an empty `key`");
}

#[test]
fn missing_key() {
    let msg = single_error("bad/missing_key.yaml", Some(5), "(no key)");
    assert_eq!(msg, "descriptor has no `key`");
}

#[test]
fn duplicate_descriptor() {
    let msg = single_error(
        "bad/duplicate_descriptor.yaml",
        Some(10),
        "client.path_/login",
    );
    assert_eq!(
        msg,
        "duplicate descriptor `path_/login` at this level (first defined at line 5)"
    );
}

#[test]
fn invalid_unit() {
    let msg = single_error("bad/invalid_unit.yaml", Some(7), "path_/search");
    assert_eq!(
        msg,
        "invalid unit `fortnight`: expected one of second, minute, hour, day, week, month, year \
         (any case)"
    );
}

#[test]
fn missing_unit() {
    let msg = single_error("bad/missing_unit.yaml", Some(5), "path_/search");
    assert!(
        msg.starts_with("`rate_limit` has no `unit` and is not `unlimited: true`"),
        "{msg}"
    );
}

#[test]
fn unit_with_unlimited() {
    let msg = single_error("bad/unit_with_unlimited.yaml", Some(6), "bot");
    assert_eq!(
        msg,
        "`unit: second` must not be set together with `unlimited: true`"
    );
}

#[test]
fn requests_per_unit_with_unlimited() {
    let msg = single_error("bad/requests_with_unlimited.yaml", Some(6), "bot");
    assert_eq!(
        msg,
        "`requests_per_unit: 10` must not be set together with `unlimited: true`"
    );
}

#[test]
fn replaces_self() {
    let msg = single_error("bad/replaces_self.yaml", Some(9), "user");
    assert_eq!(
        msg,
        "`replaces` names this rule's own name `per_user`; a rule cannot replace itself"
    );
}

#[test]
fn empty_replaces() {
    let msg = single_error("bad/empty_replaces.yaml", Some(9), "user");
    assert_eq!(msg, "`replaces` entry has an empty `name`");
}

#[test]
fn unknown_field() {
    let msg = single_error("bad/unknown_field.yaml", Some(7), "user");
    assert!(
        msg.starts_with("unknown field `burst`, expected one of `key`"),
        "{msg}"
    );
}

#[test]
fn over_limit_invalid() {
    let msg = single_error("bad/over_limit_invalid.yaml", Some(5), "route_tokens");
    assert_eq!(
        msg,
        "invalid over_limit `drop`: expected refuse, fill or record"
    );
}

#[test]
fn over_limit_without_limit() {
    let msg = single_error("bad/over_limit_without_limit.yaml", Some(5), "route_tokens");
    assert_eq!(
        msg,
        "`over_limit` applies only to a descriptor with a counted `rate_limit` or `rate_limits`"
    );
}

#[test]
fn in_flight_without_lease() {
    let msg = single_error("bad/in_flight_without_lease.yaml", Some(5), "client");
    assert_eq!(
        msg,
        "`algorithm: in_flight` needs `lease` (e.g. 60s): how long a request that never says it \
         is done keeps counting; set it above the longest request"
    );
}

#[test]
fn in_flight_with_unit() {
    let msg = single_error("bad/in_flight_with_unit.yaml", Some(6), "client");
    assert_eq!(
        msg,
        "`unit` does not apply to `algorithm: in_flight`, which counts requests in flight, not a \
         rate: `lease` (e.g. 60s) bounds how long one counts"
    );
}

#[test]
fn in_flight_invalid_lease() {
    let msg = single_error("bad/in_flight_invalid_lease.yaml", Some(7), "client");
    assert_eq!(
        msg,
        "invalid lease `forever`: expected a positive whole number with ms, s, m, h or d (e.g. \
         1500ms, 30s, 5m), at most 365d"
    );
}

#[test]
fn lease_without_in_flight() {
    let msg = single_error("bad/lease_without_in_flight.yaml", Some(7), "client");
    assert_eq!(
        msg,
        "`lease` applies only to `algorithm: in_flight`, not `sliding_log`"
    );
}

#[test]
fn over_limit_with_in_flight() {
    let msg = single_error("bad/over_limit_with_in_flight.yaml", Some(4), "client");
    assert_eq!(
        msg,
        "`over_limit: record` does not apply to `algorithm: in_flight`: a refused request never \
         holds a lease (nothing would release it)"
    );
}

#[test]
fn share_threshold_without_wildcard() {
    let msg = single_error(
        "bad/share_threshold_without_wildcard.yaml",
        Some(5),
        "path_/files/index.html",
    );
    assert_eq!(
        msg,
        "`share_threshold` applies only to a descriptor whose `value` holds a `*` wildcard"
    );
}

#[test]
fn duplicate_domain_names_both_files() {
    let errors = load_errors("bad/duplicate_domain");
    assert_eq!(errors.len(), 1, "{errors:#?}");
    let e = &errors[0];
    assert_eq!(e.file, fixture("bad/duplicate_domain/b_edge_again.yaml"));
    assert_eq!(e.line, Some(2));
    assert_eq!(e.rule, "domain");
    assert_eq!(
        e.message,
        format!(
            "duplicate domain `edge`: already defined in {}",
            fixture("bad/duplicate_domain/a_edge.yaml").display()
        )
    );
}

#[test]
fn empty_directory() {
    let dir = tempfile::tempdir().map_err(|e| e.to_string());
    let dir = match dir {
        Ok(d) => d,
        Err(e) => panic!("{e}"),
    };
    // Only things that must be ignored: hidden files and non-YAML files.
    std::fs::write(dir.path().join(".hidden.yaml"), "domain: x\n").ok();
    std::fs::write(dir.path().join("readme.txt"), "x").ok();
    std::fs::create_dir(dir.path().join("sub.yaml")).ok();
    let errors = match Config::load(dir.path()) {
        Ok(_) => panic!("empty dir must not load"),
        Err(e) => e.0,
    };
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0].file, dir.path());
    assert_eq!(errors[0].line, None);
    assert_eq!(
        errors[0].message,
        format!("no *.yaml files in {}", dir.path().display())
    );
}

#[test]
fn missing_path() {
    let errors = match Config::load(&fixture("does/not/exist")) {
        Ok(_) => panic!("must not load"),
        Err(e) => e.0,
    };
    assert_eq!(errors.len(), 1);
    assert!(errors[0].message.starts_with("cannot read config path"));
}

#[test]
fn errors_of_every_file_are_collected() {
    let dir = match tempfile::tempdir() {
        Ok(d) => d,
        Err(e) => panic!("{e}"),
    };
    for (name, text) in [
        (
            "a.yaml",
            "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: eon}\n",
        ),
        ("b.yml", "domain: b\ndescriptors:\n  - key: ''\n"),
        ("c.yaml", "domain: c\n"),
    ] {
        if let Err(e) = std::fs::write(dir.path().join(name), text) {
            panic!("{e}");
        }
    }
    let errors = match Config::load(dir.path()) {
        Ok(_) => panic!("must not load"),
        Err(e) => e.0,
    };
    let files: Vec<_> = errors
        .iter()
        .map(|e| e.file.file_name().map(|n| n.to_string_lossy().into_owned()))
        .collect();
    assert_eq!(files, vec![Some("a.yaml".into()), Some("b.yml".into())]);
}

fn entries(pairs: &[(&str, &str)]) -> Vec<Entry> {
    pairs.iter().map(|(k, v)| Entry::new(*k, *v)).collect()
}

fn load(path: &Path) -> Config {
    match Config::load(path) {
        Ok(c) => c,
        Err(e) => panic!("{} must load:\n{e}", path.display()),
    }
}

#[test]
fn good_directory_loads_two_domains_and_ignores_hidden_entries() {
    let c = load(&fixture("good"));
    assert_eq!(c.domains().collect::<Vec<_>>(), vec!["edge", "mongo_cps"]);
    assert_eq!(
        c.sources(),
        &[fixture("good/edge.yaml"), fixture("good/mongo.yml")]
    );
    assert_eq!(c.rule_count(), 5);

    match c.lookup("edge", &entries(&[("generic_key", "demo")])) {
        Lookup::Rule { rule, kind } => {
            assert_eq!(kind, MatchKind::Exact);
            assert_eq!(
                rule.limit,
                Some(LimitSpec::PerUnit {
                    requests_per_unit: 3,
                    unit: Unit::Minute
                })
            );
        }
        other => panic!("{other:?}"),
    }
    match c.lookup("edge", &entries(&[("remote_address", "10.0.0.1")])) {
        Lookup::Rule { rule, .. } => assert_eq!(rule.limit, None),
        other => panic!("{other:?}"),
    }
    match c.lookup("mongo_cps", &entries(&[("database", "logs_2024")])) {
        Lookup::Rule { rule, kind } => {
            assert_eq!(kind, MatchKind::Wildcard);
            assert_eq!(rule.path, "database_logs_*");
        }
        other => panic!("{other:?}"),
    }
    match c.lookup("mongo_cps", &entries(&[("client", "x"), ("path", "/y")])) {
        Lookup::Rule { rule, kind } => {
            assert_eq!(kind, MatchKind::KeyOnly);
            assert_eq!(rule.path, "client.path");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        c.lookup("mongo_cps", &entries(&[("database", "orders")])),
        Lookup::NoRule
    );
    assert_eq!(
        c.lookup("nope", &entries(&[("database", "users")])),
        Lookup::UnknownDomain
    );
}

#[test]
fn single_file_loads() {
    let c = load(&fixture("good/mongo.yml"));
    assert_eq!(c.domains().collect::<Vec<_>>(), vec!["mongo_cps"]);
    assert_eq!(c.sources(), &[fixture("good/mongo.yml")]);
}

#[test]
fn example_config_loads() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/limits");
    let c = load(&dir);
    assert_eq!(c.domains().collect::<Vec<_>>(), vec!["edge"]);
    match c.lookup("edge", &entries(&[("generic_key", "demo")])) {
        Lookup::Rule { rule, .. } => assert_eq!(
            rule.limit,
            Some(LimitSpec::PerUnit {
                requests_per_unit: 3,
                unit: Unit::Minute
            })
        ),
        other => panic!("{other:?}"),
    }
}

#[test]
fn merge_domain_config_merges_one_domain_across_files() {
    use sluice::config::{LoadOptions, Lookup};
    use sluice::descriptor::Entry;
    let merge = LoadOptions {
        merge_domains: true,
        ..LoadOptions::default()
    };
    let config = Config::load_with(&fixture("bad/duplicate_domain"), merge).expect("merged");
    assert_eq!(config.domains().collect::<Vec<_>>(), ["edge"]);
    assert_eq!(config.rule_count(), 2);
    for value in ["a", "b"] {
        let found = config.lookup("edge", &[Entry::new("generic_key", value)]);
        assert!(matches!(found, Lookup::Rule { .. }), "{value}: {found:?}");
    }
}

#[test]
fn merge_domain_config_rejects_a_repeated_top_level_descriptor() {
    use sluice::config::LoadOptions;
    let merge = LoadOptions {
        merge_domains: true,
        ..LoadOptions::default()
    };
    let errors = Config::load_with(&fixture("bad/merge_conflict"), merge)
        .expect_err("conflict")
        .0;
    assert_eq!(errors.len(), 1, "{errors:#?}");
    let e = &errors[0];
    assert_eq!(e.file, fixture("bad/merge_conflict/b_edge_conflict.yaml"));
    assert_eq!(e.rule, "generic_key_a");
    assert!(e.message.contains("also defined in"), "{e}");
    assert!(e.message.contains("a_edge.yaml"), "{e}");
}
