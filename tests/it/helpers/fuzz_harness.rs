//! The fuzz harnesses, shared by the stable property tests (`tests/it/fuzz.rs`, run in CI) and
//! the cargo-fuzz targets (`fuzz/fuzz_targets/*.rs`, nightly only), so both exercise the same
//! code and check the same invariants:
//! - [`config_loader`]: any text loads or fails with errors that each name the file, never panics;
//! - [`descriptor_keys`]: the descriptor -> limiter key function is injective, short and one
//!   Redis Cluster slot whatever the input;
//! - [`decisions`]: requests -> engine -> memory backend on a virtual clock never panics, answers
//!   every descriptor, and never admits more than a limit within its window.
//!
//! Each harness takes structured input; the `*_from_bytes` decoders turn a fuzzer's raw bytes
//! into it (every byte string decodes to something), so a crash input of either kind replays.
#![allow(dead_code)]

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use sluice::config::{Config, Unit};
use sluice::decision::{
    Code, Decision, DecisionError, Descriptor, Engine, EngineOptions, InputLimits, LimitOverride,
    Outcome, Request, validate_with,
};
use sluice::descriptor::{Entry, KEY_PREFIX, limiter_key};
use sluice::limiter::Clock;
use sluice::limiter::memory::MemoryLimiter;

/// The limits the decision harness runs against (the end-to-end fixture).
pub const DECISION_CONFIG: &str = include_str!("../../fixtures/e2e/limits/edge.yaml");

/// Keys and values of [`DECISION_CONFIG`], so generated requests mostly hit real rules.
pub const VOCABULARY: &[&str] = &[
    "generic_key",
    "demo",
    "user",
    "endpoint",
    "checkout",
    "tier",
    "premium",
    "per_second",
    "remote_address",
    "10.0.0.1",
    "bot",
    "shadow",
    "hammer",
    "path",
    "/api/x",
    "/api/",
    "a",
    "b",
    "",
];

/// Longest limiter key under the default prefix: `prefix{` + a body of at most 96 bytes + `}`.
pub const MAX_KEY_LEN: usize = KEY_PREFIX.len() + 2 + 96;

/// Reads fuzzer bytes as a stream of small choices; past the end everything reads as 0.
pub struct Bytes<'a> {
    data: &'a [u8],
}

impl<'a> Bytes<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Bytes { data }
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    pub fn u8(&mut self) -> u8 {
        match self.data.split_first() {
            Some((&b, rest)) => {
                self.data = rest;
                b
            }
            None => 0,
        }
    }

    pub fn u64(&mut self) -> u64 {
        (0..8).fold(0u64, |acc, _| (acc << 8) | u64::from(self.u8()))
    }

    /// A string: a word of [`VOCABULARY`] (most of the time), or up to 255 raw bytes.
    pub fn string(&mut self) -> String {
        let tag = self.u8();
        if tag < 200 {
            return VOCABULARY[usize::from(tag) % VOCABULARY.len()].to_owned();
        }
        let len = usize::from(self.u8()).min(self.data.len());
        let (head, rest) = self.data.split_at(len);
        self.data = rest;
        String::from_utf8_lossy(head).into_owned()
    }
}

// ---------------------------------------------------------------------------------------------
// Config loader

/// Loads `text` as a config file; it must load, or fail with errors that each name `file` and
/// say something. A loaded config must also describe itself and answer lookups.
pub fn config_loader(file: &Path, text: &str) {
    match Config::from_yaml_str(file, text) {
        Ok(config) => {
            let _ = config.describe();
            for domain in config.domains().map(str::to_owned).collect::<Vec<_>>() {
                let _ = config.lookup(&domain, &[Entry::new("user", "x")]);
            }
        }
        Err(errors) => {
            assert!(!errors.is_empty(), "an error result carries errors");
            for error in &errors {
                assert_eq!(error.file, file, "error names another file: {error}");
                assert!(!error.message.is_empty(), "empty message: {error:?}");
                assert!(!error.rule.is_empty(), "no rule: {error:?}");
            }
        }
    }
}

pub fn config_loader_from_bytes(data: &[u8]) {
    config_loader(Path::new("fuzz/input.yaml"), &String::from_utf8_lossy(data));
}

// ---------------------------------------------------------------------------------------------
// Descriptor -> limiter key

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyInput {
    pub domain: String,
    pub entries: Vec<(String, String)>,
    pub window_ms: u64,
}

impl KeyInput {
    pub fn key(&self) -> String {
        let entries: Vec<Entry> = self
            .entries
            .iter()
            .map(|(k, v)| Entry::new(k.clone(), v.clone()))
            .collect();
        limiter_key(&self.domain, &entries, self.window_ms)
    }

    fn from_bytes(bytes: &mut Bytes<'_>) -> Self {
        let domain = bytes.string();
        let n = usize::from(bytes.u8() % 5);
        let entries = (0..n).map(|_| (bytes.string(), bytes.string())).collect();
        let window_ms = [1_000, 60_000, 3_600_000, u64::MAX][usize::from(bytes.u8() % 4)];
        KeyInput {
            domain,
            entries,
            window_ms,
        }
    }
}

/// Distinct descriptors get distinct keys; every key is short and holds one hash tag, and its
/// body is a digest or parts made only of the readable set and `%XX` escapes. Each input whose
/// key is readable is also keyed with its own escaped spelling as text (`a|b` next to `a%7Cb`):
/// the two are distinct inputs unless nothing needed escaping, so their keys must differ then.
pub fn descriptor_keys(inputs: &[KeyInput]) {
    let spelled: Vec<KeyInput> = inputs.iter().filter_map(escaped_spelling).collect();
    let mut seen: HashMap<String, &KeyInput> = HashMap::new();
    for input in inputs.iter().chain(&spelled) {
        let key = input.key();
        assert!(key.len() <= MAX_KEY_LEN, "key of {} bytes", key.len());
        assert!(key.starts_with(KEY_PREFIX));
        assert_eq!(key.matches('{').count(), 1, "{key}");
        assert_eq!(key.matches('}').count(), 1, "{key}");
        assert!(key.ends_with('}'), "{key}");
        check_body(&key);
        if let Some(previous) = seen.insert(key.clone(), input) {
            assert_eq!(previous, input, "collision on {key}");
        }
    }
}

/// The body between the braces: `#` and 32 hex digits, or `|`-separated parts in which every
/// byte is readable or starts a `%XX` escape (upper-case hex) and `=` only splits an entry.
fn check_body(key: &str) {
    let body = &key[KEY_PREFIX.len() + 1..key.len() - 1];
    if let Some(digest) = body.strip_prefix('#') {
        assert!(
            digest.len() == 32 && digest.bytes().all(|b| b.is_ascii_hexdigit()),
            "{key}"
        );
        return;
    }
    for part in body.split(['|', '=']) {
        let bytes = part.as_bytes();
        let mut i = 0;
        while i < bytes.len() {
            if bytes[i] == b'%' {
                let hex = bytes.get(i + 1..i + 3).unwrap_or_default();
                assert!(
                    hex.len() == 2 && hex.iter().all(|h| matches!(h, b'0'..=b'9' | b'A'..=b'F')),
                    "bare `%` in {key}"
                );
                i += 3;
            } else {
                assert!(
                    bytes[i].is_ascii_alphanumeric() || b"._-/:*".contains(&bytes[i]),
                    "unescaped byte {:#04x} in {key}",
                    bytes[i]
                );
                i += 1;
            }
        }
    }
}

/// The input whose domain, keys and values are the escaped text of `input`'s, read back from its
/// readable key (`None` once the body is a digest).
fn escaped_spelling(input: &KeyInput) -> Option<KeyInput> {
    let key = input.key();
    let body = key[KEY_PREFIX.len() + 1..key.len() - 1].to_owned();
    if body.starts_with('#') {
        return None;
    }
    let mut parts = body.split('|');
    let domain = parts.next()?.to_owned();
    let entries = parts
        .take(input.entries.len())
        .map(|entry| {
            let (k, v) = entry.split_once('=')?;
            Some((k.to_owned(), v.to_owned()))
        })
        .collect::<Option<Vec<_>>>()?;
    Some(KeyInput {
        domain,
        entries,
        window_ms: input.window_ms,
    })
}

pub fn descriptor_keys_from_bytes(data: &[u8]) {
    let mut bytes = Bytes::new(data);
    let mut inputs = Vec::new();
    while !bytes.is_empty() && inputs.len() < 64 {
        inputs.push(KeyInput::from_bytes(&mut bytes));
    }
    descriptor_keys(&inputs);
}

// ---------------------------------------------------------------------------------------------
// Request -> decision on the memory backend

/// A clock the harness moves by hand.
#[derive(Debug, Default)]
pub struct VirtualClock(AtomicU64);

impl Clock for VirtualClock {
    fn now_ms(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

#[derive(Debug, Clone)]
pub struct Step {
    /// Milliseconds the clock moves before the request.
    pub advance_ms: u64,
    pub request: Request,
}

fn unit_from(byte: u8) -> Unit {
    [Unit::Second, Unit::Minute, Unit::Hour, Unit::Day][usize::from(byte % 4)]
}

fn descriptor_from(bytes: &mut Bytes<'_>) -> Descriptor {
    let n = usize::from(bytes.u8() % 4);
    let entries = (0..n)
        .map(|_| Entry::new(bytes.string(), bytes.string()))
        .collect();
    let flags = bytes.u8();
    let hits_addend = match flags % 8 {
        0 => Some(0),
        1 => Some(u64::from(bytes.u8() % 8)),
        2 => Some(bytes.u64()),
        _ => None,
    };
    let limit_override = (flags & 0x10 != 0).then(|| LimitOverride {
        requests_per_unit: u32::from(bytes.u8() % 6),
        unit: unit_from(bytes.u8()),
    });
    Descriptor {
        entries,
        limit_override,
        hits_addend,
        negative: flags & 0x20 != 0 && flags & 0x40 != 0,
    }
}

pub fn steps_from_bytes(data: &[u8]) -> Vec<Step> {
    let mut bytes = Bytes::new(data);
    let mut steps = Vec::new();
    while !bytes.is_empty() && steps.len() < 256 {
        let advance_ms = match bytes.u8() % 4 {
            0 => 0,
            1 => u64::from(bytes.u8()),
            2 => u64::from(bytes.u8()) * 100,
            _ => u64::from(bytes.u8()) * 10_000,
        };
        let domain = if bytes.u8() < 230 {
            "edge".to_owned()
        } else {
            bytes.string()
        };
        let n = usize::from(bytes.u8() % 5);
        let descriptors = (0..n).map(|_| descriptor_from(&mut bytes)).collect();
        let hits_addend = match bytes.u8() % 8 {
            0 => u32::from(bytes.u8() % 4),
            1 => u32::MAX,
            _ => 0,
        };
        steps.push(Step {
            advance_ms,
            request: Request {
                domain,
                descriptors,
                hits_addend,
            },
        });
    }
    steps
}

/// What the harness saw, for the caller to report.
#[derive(Debug, Default, Clone, Copy)]
pub struct DecisionStats {
    pub decided: u64,
    pub invalid: u64,
    pub admitted_items: u64,
}

/// Runs `steps` through an engine over the memory backend on a virtual clock and checks:
/// - no panic, and the memory backend never fails;
/// - a request is refused as invalid exactly when [`validate_with`] says so;
/// - one verdict per descriptor, overall OVER_LIMIT exactly when some verdict is (an exhausted
///   quota aside), remaining never above the limit;
/// - for every key never refunded: whenever an item is admitted at `t`, the hits admitted on its
///   key within `(t - window, t]` (this item included) are at most that item's limit.
pub fn decisions(config_text: &str, steps: &[Step]) -> DecisionStats {
    let Ok(config) = Config::from_yaml_str(Path::new("fuzz/limits.yaml"), config_text) else {
        return DecisionStats::default();
    };
    let clock = Arc::new(VirtualClock(AtomicU64::new(1_000_000)));
    let limiter = Arc::new(MemoryLimiter::new(clock.clone()));
    let limits = InputLimits::default();
    let engine = Engine::with_options(
        config,
        limiter,
        EngineOptions {
            limits,
            ..EngineOptions::default()
        },
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");

    let mut history: HashMap<String, Vec<(u64, u64)>> = HashMap::new();
    let mut refunded: HashSet<String> = HashSet::new();
    let mut stats = DecisionStats::default();
    for step in steps {
        let now = clock.0.fetch_add(step.advance_ms, Ordering::SeqCst) + step.advance_ms;
        let request = &step.request;
        let result = runtime.block_on(engine.decide(request));
        let decision = match result {
            Err(DecisionError::Invalid(invalid)) => {
                assert_eq!(
                    validate_with(request, &limits),
                    Err(invalid),
                    "engine and validation disagree"
                );
                stats.invalid += 1;
                continue;
            }
            Err(DecisionError::Backend(err)) => panic!("memory backend failed: {err}"),
            Err(DecisionError::NoConfig) => panic!("an engine built with a config has one"),
            Ok(decision) => decision,
        };
        assert!(validate_with(request, &limits).is_ok());
        stats.decided += 1;
        check_decision(request, &decision);

        let request_hits = if request.hits_addend == 0 {
            1
        } else {
            u64::from(request.hits_addend)
        };
        for verdict in &decision.verdicts {
            if verdict.outcome == Outcome::Refunded
                && let Some(key) = &verdict.key
            {
                refunded.insert(key.clone());
            }
        }
        for (verdict, descriptor) in decision.verdicts.iter().zip(&request.descriptors) {
            let hits = descriptor.hits_addend.unwrap_or(request_hits);
            let (Outcome::Admitted, Some(key), Some(limit)) =
                (verdict.outcome, &verdict.key, &verdict.limit)
            else {
                continue;
            };
            if hits == 0 || descriptor.negative {
                continue;
            }
            stats.admitted_items += 1;
            let window = limit.unit.window_ms();
            let log = history.entry(key.clone()).or_default();
            log.push((now, hits));
            if refunded.contains(key) {
                continue;
            }
            let in_window: u64 = log
                .iter()
                .filter(|(t, _)| t.saturating_add(window) > now)
                .map(|(_, h)| *h)
                .sum();
            assert!(
                in_window <= u64::from(limit.requests_per_unit),
                "{key}: {in_window} hits admitted within {window} ms, limit {}",
                limit.requests_per_unit
            );
        }
    }
    stats
}

fn check_decision(request: &Request, decision: &Decision) {
    assert_eq!(decision.verdicts.len(), request.descriptors.len());
    // An exhausted quota says OVER_LIMIT in its status on an admitted request.
    let any_over = decision
        .verdicts
        .iter()
        .any(|v| v.code == Code::OverLimit && v.outcome != Outcome::QuotaExhausted);
    assert_eq!(decision.overall == Code::OverLimit, any_over);
    for verdict in &decision.verdicts {
        if let Some(limit) = &verdict.limit {
            assert!(verdict.remaining <= limit.requests_per_unit, "{verdict:?}");
        }
        if let Some(key) = &verdict.key {
            assert!(key.len() <= MAX_KEY_LEN, "{key}");
        }
    }
}

pub fn decisions_from_bytes(data: &[u8]) {
    decisions(DECISION_CONFIG, &steps_from_bytes(data));
}
