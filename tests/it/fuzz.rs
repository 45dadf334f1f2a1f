//! The fuzz harnesses (`tests/it/helpers/fuzz_harness.rs`) run as property tests on stable
//! Rust, for a bounded number of cases, in CI. The same harnesses are cargo-fuzz targets under
//! `fuzz/` (nightly only, not run in CI); see README.md "Fuzzing".
//!
//! Inputs are seeded from the test fixtures: config text is a fixture file with random edits
//! (deleted, inserted and replaced bytes, duplicated lines), requests use the fixture's keys and
//! values most of the time. `SLUICE_FUZZ_CASES` raises the number of cases for a longer run.

use crate::helpers;

use std::path::{Path, PathBuf};

use helpers::fuzz_harness::{
    DECISION_CONFIG, KeyInput, Step, VOCABULARY, config_loader, config_loader_from_bytes,
    decisions, decisions_from_bytes, descriptor_keys, descriptor_keys_from_bytes,
};
use proptest::prelude::*;
use sluice::config::{Config, Unit};
use sluice::decision::{Descriptor, LimitOverride, Request};
use sluice::descriptor::Entry;

fn cases(default: u32) -> u32 {
    std::env::var("SLUICE_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Every file under the fixture directories, as bytes: the seed corpus.
fn seeds() -> Vec<Vec<u8>> {
    fn walk(dir: &Path, out: &mut Vec<Vec<u8>>) {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
            .expect("fixture dir")
            .map(|e| e.expect("dir entry").path())
            .collect();
        entries.sort();
        for path in entries {
            if path.is_dir() {
                walk(&path, out);
            } else {
                out.push(std::fs::read(&path).expect("fixture file"));
            }
        }
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mut out = Vec::new();
    walk(&root, &mut out);
    assert!(out.len() >= 20, "fixtures missing: {}", out.len());
    out
}

#[derive(Debug, Clone)]
enum Edit {
    Delete(usize, usize),
    Insert(usize, Vec<u8>),
    Replace(usize, u8),
    DuplicateLine(usize),
}

fn edit() -> impl Strategy<Value = Edit> {
    let yamlish = prop_oneof![
        Just(b": ".to_vec()),
        Just(b"\n  - ".to_vec()),
        Just(b"{".to_vec()),
        Just(b"[".to_vec()),
        Just(b"&a ".to_vec()),
        Just(b"*a".to_vec()),
        Just(b"!!binary ".to_vec()),
        Just(b"<<: ".to_vec()),
        Just(b"\t".to_vec()),
        Just(b"\"".to_vec()),
        Just(b"999999999999999999999".to_vec()),
        Just(b"-1".to_vec()),
        Just(b"unlimited: true".to_vec()),
        Just(b"rate_limit:".to_vec()),
        proptest::collection::vec(any::<u8>(), 1..8),
    ];
    prop_oneof![
        (any::<usize>(), 1usize..40).prop_map(|(p, n)| Edit::Delete(p, n)),
        (any::<usize>(), yamlish).prop_map(|(p, b)| Edit::Insert(p, b)),
        (any::<usize>(), any::<u8>()).prop_map(|(p, b)| Edit::Replace(p, b)),
        any::<usize>().prop_map(Edit::DuplicateLine),
    ]
}

fn apply(mut text: Vec<u8>, edits: &[Edit]) -> Vec<u8> {
    for e in edits {
        let len = text.len();
        match e {
            Edit::Delete(p, n) if len > 0 => {
                let p = p % len;
                let end = (p + n).min(len);
                text.drain(p..end);
            }
            Edit::Insert(p, bytes) => {
                let p = p % (len + 1);
                text.splice(p..p, bytes.iter().copied());
            }
            Edit::Replace(p, b) if len > 0 => text[p % len] = *b,
            Edit::DuplicateLine(p) if len > 0 => {
                let p = p % len;
                let start = text[..p]
                    .iter()
                    .rposition(|&b| b == b'\n')
                    .map_or(0, |i| i + 1);
                let end = text[p..]
                    .iter()
                    .position(|&b| b == b'\n')
                    .map_or(len, |i| p + i + 1);
                let line = text[start..end].to_vec();
                text.splice(start..start, line);
            }
            _ => {}
        }
    }
    text
}

/// A fixture with random edits.
fn mutated_fixture() -> impl Strategy<Value = Vec<u8>> {
    let seeds = seeds();
    (0..seeds.len(), proptest::collection::vec(edit(), 0..6))
        .prop_map(move |(i, edits)| apply(seeds[i].clone(), &edits))
}

/// A key or value: mostly the fixture's words; otherwise every byte class the key escaping
/// treats apart (readable letters of both cases and digits, so `%7C`-like spellings appear;
/// readable punctuation; the separators and `%`; space, newline and multi-byte UTF-8), short
/// or long enough to be digested.
fn word() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => proptest::sample::select(VOCABULARY).prop_map(str::to_owned),
        2 => "[a-fA-F0-9|=%#{}.:_/*\\- \\né]{0,8}",
        1 => any::<String>(),
        1 => "[a-zA-Z0-9|=%#{}:_\\n*]{90,300}",
    ]
}

fn key_input() -> impl Strategy<Value = KeyInput> {
    (
        word(),
        proptest::collection::vec((word(), word()), 0..4),
        prop_oneof![Just(1_000u64), Just(60_000u64), any::<u64>()],
    )
        .prop_map(|(domain, entries, window_ms)| KeyInput {
            domain,
            entries,
            window_ms,
        })
}

fn descriptor() -> impl Strategy<Value = Descriptor> {
    (
        proptest::collection::vec((word(), word()), 0..4),
        prop_oneof![
            6 => Just(None),
            1 => Just(Some(0u64)),
            2 => (1u64..6).prop_map(Some),
            1 => any::<u64>().prop_map(Some),
        ],
        proptest::option::weighted(0.2, (0u32..6, 0usize..4)),
        proptest::bool::weighted(0.1),
    )
        .prop_map(|(entries, hits_addend, limit, negative)| Descriptor {
            entries: entries.into_iter().map(|(k, v)| Entry::new(k, v)).collect(),
            limit_override: limit.map(|(requests_per_unit, u)| LimitOverride {
                requests_per_unit,
                unit: [Unit::Second, Unit::Minute, Unit::Hour, Unit::Day][u],
            }),
            hits_addend,
            negative,
        })
}

fn step() -> impl Strategy<Value = Step> {
    (
        prop_oneof![Just(0u64), 0u64..50, 0u64..2_000, 0u64..120_000],
        prop_oneof![9 => Just("edge".to_owned()), 1 => word()],
        proptest::collection::vec(descriptor(), 0..5),
        prop_oneof![8 => Just(0u32), 1 => 1u32..4, 1 => any::<u32>()],
    )
        .prop_map(|(advance_ms, domain, descriptors, hits_addend)| Step {
            advance_ms,
            request: Request {
                domain,
                descriptors,
                hits_addend,
            },
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases(1000)))]

    /// Config loader on edited fixtures: loads, or every error names the file.
    #[test]
    fn config_loader_on_edited_fixtures(text in mutated_fixture()) {
        config_loader(Path::new("limits/edited.yaml"), &String::from_utf8_lossy(&text));
    }

    /// Config loader on raw bytes (the cargo-fuzz target's entry point).
    #[test]
    fn config_loader_on_bytes(data in proptest::collection::vec(any::<u8>(), 0..512)) {
        config_loader_from_bytes(&data);
    }

    /// Descriptor -> key: injective, short, one hash tag.
    #[test]
    fn descriptor_keys_are_injective_and_short(
        inputs in proptest::collection::vec(key_input(), 1..24),
    ) {
        descriptor_keys(&inputs);
    }

    /// Descriptor -> key from raw bytes (the cargo-fuzz target's entry point).
    #[test]
    fn descriptor_keys_from_raw_bytes(data in proptest::collection::vec(any::<u8>(), 0..1024)) {
        descriptor_keys_from_bytes(&data);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases(300)))]

    /// Requests -> decisions on the memory backend: no panic, one verdict per descriptor, and
    /// never more than a limit admitted within its window (virtual clock).
    #[test]
    fn decisions_keep_the_limit(steps in proptest::collection::vec(step(), 1..60)) {
        decisions(DECISION_CONFIG, &steps);
    }

    /// The same from raw bytes (the cargo-fuzz target's entry point).
    #[test]
    fn decisions_from_raw_bytes(data in proptest::collection::vec(any::<u8>(), 0..2048)) {
        decisions_from_bytes(&data);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases(100)))]

    /// The file path of the loader: raw (possibly non-UTF-8) edited fixture bytes on disk load
    /// or fail with errors naming that file.
    #[test]
    fn config_files_on_disk_name_the_file(text in mutated_fixture(), invalid_utf8 in any::<bool>()) {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("limits.yaml");
        let mut bytes = text;
        if invalid_utf8 {
            bytes.extend_from_slice(&[0xff, 0xfe]);
        }
        std::fs::write(&path, &bytes).expect("write");
        if let Err(errors) = Config::load(&path) {
            for error in &errors {
                prop_assert_eq!(&error.file, &path);
            }
        }
    }
}

/// The harness finds what it should: the decision run over the fixture admits, rejects and
/// refuses invalid input (so a harness that silently checks nothing fails here).
#[test]
fn decision_harness_exercises_every_path() {
    let mut steps = Vec::new();
    for i in 0..10 {
        steps.push(Step {
            advance_ms: 1,
            request: Request {
                domain: "edge".into(),
                descriptors: vec![Descriptor::new(vec![Entry::new("user", "u")])],
                hits_addend: 0,
            },
        });
        if i == 9 {
            steps.push(Step {
                advance_ms: 0,
                request: Request {
                    domain: String::new(),
                    descriptors: vec![],
                    hits_addend: 0,
                },
            });
        }
    }
    let stats = decisions(DECISION_CONFIG, &steps);
    assert_eq!(stats.decided, 10);
    assert_eq!(stats.invalid, 1);
    assert_eq!(stats.admitted_items, 5, "user limit is 5 per minute");
}
