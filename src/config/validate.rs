//! Validation and compilation of one parsed file into a domain's lookup tree.
//!
//! Why validation and compilation are one pass: both walk the same descriptors with the same
//! config path, and compiling while checking keeps every rule's error next to the code that
//! would otherwise misinterpret it. The pass never stops early: it records every problem and
//! keeps walking (children of a bad descriptor are still checked), so a file's errors arrive
//! together. A file with any error yields no usable tree; the caller discards it.

use super::error::ConfigError;
use super::raw::{
    self, line_of, Extra, RawDescriptor, RawHeaders, RawRateLimit, RawRoot, DESCRIPTOR_FIELDS,
    HEADERS_FIELDS, RATE_LIMIT_FIELDS, REPLACE_FIELDS, ROOT_FIELDS, UNSUPPORTED_DESCRIPTOR_FIELDS,
};
use super::tree::{
    HeaderFormat, HeaderPolicy, Level, Limit, LimitAlgorithm, LimitSpec, Node, Rule,
};
use super::{parse_duration_ms, Unit};
use serde_saphyr::Spanned;
use std::collections::HashMap;
use std::path::Path;

/// Rule name of file-level problems.
pub(crate) const DOMAIN_RULE: &str = "domain";

const VALID_UNITS: &str = "second, minute, hour, day, week, month, year";
const VALID_ALGORITHMS: &str = "sliding_log, quantized_log, sliding_counter, gcra, fixed_window";
/// Longest custom window: a year, the longest unit.
const MAX_WINDOW_MS: u64 = 365 * 86_400_000;
/// Most buckets a quantized log may keep per key (window / quantum).
pub(crate) const MAX_QUANTA: u64 = 3_600;
/// GCRA keeps `burst × window_ms` in integer token-ms, which must stay exact in the Redis
/// script's doubles.
const MAX_GCRA_TOKEN_MS: u64 = 1 << 52;

/// One file, compiled. `domain` is `None` when the file names no (non-empty) domain.
pub(crate) struct CompiledFile {
    pub domain: Option<(String, Option<usize>)>,
    pub root: Level,
    pub headers: HeaderPolicy,
}

/// Parses, validates and compiles one file, appending its problems to `errors`.
/// `default_headers` is the response-header policy of a domain that sets none itself.
pub(crate) fn compile_file(
    file: &Path,
    text: &str,
    default_headers: HeaderPolicy,
    errors: &mut Vec<ConfigError>,
) -> CompiledFile {
    let root = match raw::parse(text) {
        Ok(root) => root,
        Err(failure) => {
            let mut message = format!("malformed YAML: {}", failure.message);
            if let Some(column) = failure.column {
                message.push_str(&format!(" (column {column})"));
            }
            let rule = super::locate::rule_at(text, failure.line);
            errors.push(ConfigError::new(file, failure.line, rule, message));
            return CompiledFile {
                domain: None,
                root: Level::default(),
                headers: HeaderPolicy::default(),
            };
        }
    };
    let mut checker = Checker { file, errors };
    checker.root(root, default_headers)
}

struct Checker<'a> {
    file: &'a Path,
    errors: &'a mut Vec<ConfigError>,
}

impl Checker<'_> {
    fn error(&mut self, line: Option<usize>, rule: &str, message: impl Into<String>) {
        self.errors
            .push(ConfigError::new(self.file, line, rule, message));
    }

    fn extras(&mut self, extras: &[Extra], rule: &str, fields: &[&str], unsupported: &[&str]) {
        for extra in extras {
            if unsupported.contains(&extra.name.as_str()) {
                self.error(
                    extra.line,
                    rule,
                    format!("`{}` is not supported yet", extra.name),
                );
            } else {
                let expected = fields
                    .iter()
                    .map(|f| format!("`{f}`"))
                    .collect::<Vec<_>>()
                    .join(", ");
                self.error(
                    extra.line,
                    rule,
                    format!("unknown field `{}`, expected one of {expected}", extra.name),
                );
            }
        }
    }

    fn root(&mut self, root: RawRoot, default_headers: HeaderPolicy) -> CompiledFile {
        self.extras(&root.extra, DOMAIN_RULE, ROOT_FIELDS, &[]);
        let domain = match root.domain {
            None => {
                self.error(
                    None,
                    DOMAIN_RULE,
                    "missing `domain`: every config file must name its domain",
                );
                None
            }
            Some(d) if d.value.trim().is_empty() => {
                self.error(line_of(&d.referenced), DOMAIN_RULE, "`domain` is empty");
                None
            }
            Some(d) => Some((d.value, line_of(&d.referenced))),
        };
        let headers = self.headers(
            root.response_headers,
            root.response_headers_line,
            DOMAIN_RULE,
            default_headers,
        );
        let root = self.level(root.descriptors.unwrap_or_default(), "", 0, &[], headers);
        CompiledFile {
            domain,
            root,
            headers,
        }
    }

    /// Resolves a `response_headers` mapping over the inherited policy, field by field.
    fn headers(
        &mut self,
        raw: Option<Spanned<RawHeaders>>,
        key_line: Option<usize>,
        rule: &str,
        inherited: HeaderPolicy,
    ) -> HeaderPolicy {
        let Some(raw) = raw else { return inherited };
        let raw = raw.value;
        self.extras(&raw.extra, rule, HEADERS_FIELDS, &[]);
        let mut policy = inherited;
        if let Some(format) = &raw.format {
            match HeaderFormat::parse(format.value.trim()) {
                Some(f) => policy.format = f,
                None => self.error(
                    line_of(&format.referenced).or(key_line),
                    rule,
                    format!(
                        "invalid response_headers format `{}`: expected none, draft or legacy",
                        format.value
                    ),
                ),
            }
        }
        if let Some(hide) = &raw.hide_remaining {
            policy.hide_remaining = hide.value;
        }
        policy
    }

    /// `depth` is this level's entry index in a request; `shared` lists the ancestors'
    /// `share_threshold` wildcards by depth.
    fn level(
        &mut self,
        descriptors: Vec<Spanned<RawDescriptor>>,
        parent: &str,
        depth: usize,
        shared: &[(usize, String)],
        inherited: HeaderPolicy,
    ) -> Level {
        let mut level = Level::default();
        // (key, value) -> line of its first definition, for duplicate messages.
        let mut first_line: HashMap<(String, Option<String>), Option<usize>> = HashMap::new();
        for spanned in descriptors {
            let line = line_of(&spanned.referenced);
            let d = spanned.value;
            // envoyproxy/ratelimit treats an empty value as no value.
            let value = d
                .value
                .as_ref()
                .map(|v| v.value.as_str())
                .filter(|v| !v.is_empty());
            let key = d
                .key
                .as_ref()
                .map(|k| k.value.as_str())
                .filter(|k| !k.is_empty());
            let segment = match (key, value) {
                (Some(k), Some(v)) => format!("{k}_{v}"),
                (Some(k), None) => k.to_string(),
                (None, _) => "(no key)".to_string(),
            };
            let path = if parent.is_empty() {
                segment.clone()
            } else {
                format!("{parent}.{segment}")
            };

            match &d.key {
                None => self.error(line, &path, "descriptor has no `key`"),
                Some(k) if k.value.is_empty() => self.error(
                    line_of(&k.referenced),
                    &path,
                    "descriptor has an empty `key`",
                ),
                Some(_) => {}
            }
            self.extras(
                &d.extra,
                &path,
                DESCRIPTOR_FIELDS,
                UNSUPPORTED_DESCRIPTOR_FIELDS,
            );

            let (limit, limits, name, replaces) = match (d.rate_limit, d.rate_limits) {
                (Some(rl), stacked) => {
                    if stacked.is_some() {
                        self.error(
                            d.rate_limits_line,
                            &path,
                            "`rate_limit` and `rate_limits` are both set; use one of them",
                        );
                    }
                    let rl_line = d.rate_limit_line.or_else(|| line_of(&rl.referenced));
                    let (spec, limit, name, replaces) =
                        self.rate_limit(rl.value, rl_line, &path, false);
                    (spec, limit.into_iter().collect(), name, replaces)
                }
                (None, Some(stacked)) => self.stacked(stacked, d.rate_limits_line, &path),
                (None, None) => (None, Vec::new(), None, Vec::new()),
            };
            let mut shared_here = shared.to_vec();
            if let Some(share) = &d.share_threshold {
                match value {
                    Some(v) if v.contains('*') => {
                        if share.value {
                            shared_here.push((depth, v.to_string()));
                        }
                    }
                    _ => self.error(
                        line_of(&share.referenced),
                        &path,
                        "`share_threshold` applies only to a descriptor whose `value` holds a `*` wildcard",
                    ),
                }
            }
            let headers = self.headers(
                d.response_headers,
                d.response_headers_line,
                &path,
                inherited,
            );
            let children = self.level(
                d.descriptors.unwrap_or_default(),
                &path,
                depth + 1,
                &shared_here,
                headers,
            );

            let Some(key) = key else { continue };
            let id = (key.to_string(), value.map(str::to_string));
            if let Some(first) = first_line.get(&id) {
                let at = first
                    .map(|l| format!(" (first defined at line {l})"))
                    .unwrap_or_default();
                let this_line = d.key.as_ref().and_then(|k| line_of(&k.referenced)).or(line);
                self.error(
                    this_line,
                    &path,
                    format!("duplicate descriptor `{segment}` at this level{at}"),
                );
                continue;
            }
            first_line.insert(id, line);
            let node = Node {
                key: key.to_string(),
                value: value.map(str::to_string),
                rule: Rule {
                    path,
                    limit,
                    limits,
                    name,
                    replaces,
                    shadow_mode: d.shadow_mode.unwrap_or(false),
                    quota_mode: d.quota_mode.unwrap_or(false),
                    detailed_metric: d.detailed_metric.unwrap_or(false),
                    value_to_metric: d.value_to_metric.unwrap_or(false),
                    shared_values: shared_here,
                    headers,
                },
                children,
            };
            level.insert(key, value, node);
        }
        level
    }

    /// `rate_limits: [...]`: every entry a counted limit; the rule's `limit` and `name` are the
    /// first entry's, its `replaces` all entries'.
    fn stacked(
        &mut self,
        entries: Vec<Spanned<RawRateLimit>>,
        line: Option<usize>,
        path: &str,
    ) -> (Option<LimitSpec>, Vec<Limit>, Option<String>, Vec<String>) {
        if entries.is_empty() {
            self.error(
                line,
                path,
                "`rate_limits` is empty: list at least one limit",
            );
        }
        let (mut first, mut limits, mut first_name, mut replaces) =
            (None, Vec::new(), None, Vec::new());
        for (i, entry) in entries.into_iter().enumerate() {
            let entry_line = line_of(&entry.referenced).or(line);
            let (spec, limit, name, more) = self.rate_limit(entry.value, entry_line, path, true);
            if i == 0 {
                first = spec;
                first_name = name;
            }
            limits.extend(limit);
            replaces.extend(more);
        }
        (first, limits, first_name, replaces)
    }

    fn rate_limit(
        &mut self,
        rl: RawRateLimit,
        rl_line: Option<usize>,
        path: &str,
        stacked: bool,
    ) -> (
        Option<LimitSpec>,
        Option<Limit>,
        Option<String>,
        Vec<String>,
    ) {
        self.extras(&rl.extra, path, RATE_LIMIT_FIELDS, &[]);
        let unlimited = rl.unlimited.as_ref().is_some_and(|u| u.value);
        let mut counted = None;

        let limit = if unlimited {
            if stacked {
                self.error(
                    rl_line,
                    path,
                    "`unlimited: true` cannot be one of `rate_limits`; use `rate_limit: {unlimited: true}`",
                );
            }
            if let Some(unit) = &rl.unit {
                self.error(
                    line_of(&unit.referenced),
                    path,
                    format!(
                        "`unit: {}` must not be set together with `unlimited: true`",
                        unit.value
                    ),
                );
            }
            if let Some(rpu) = &rl.requests_per_unit {
                self.error(
                    line_of(&rpu.referenced),
                    path,
                    format!(
                        "`requests_per_unit: {}` must not be set together with `unlimited: true`",
                        rpu.value
                    ),
                );
            }
            for (field, at) in [
                ("window", rl.window.as_ref().map(|v| &v.referenced)),
                ("algorithm", rl.algorithm.as_ref().map(|v| &v.referenced)),
                ("quantum", rl.quantum.as_ref().map(|v| &v.referenced)),
                ("burst", rl.burst.as_ref().map(|v| &v.referenced)),
            ] {
                if let Some(at) = at {
                    self.error(
                        line_of(at),
                        path,
                        format!("`{field}` must not be set together with `unlimited: true`"),
                    );
                }
            }
            Some(LimitSpec::Unlimited)
        } else {
            // envoyproxy/ratelimit defaults a missing count to 0: deny all.
            let requests_per_unit = rl.requests_per_unit.as_ref().map_or(0, |r| r.value);
            let period = match (&rl.unit, &rl.window) {
                (Some(unit), Some(window)) => {
                    self.error(
                        line_of(&window.referenced),
                        path,
                        format!(
                            "`unit: {}` and `window: {}` are both set; use one of them",
                            unit.value, window.value
                        ),
                    );
                    None
                }
                (None, None) => {
                    self.error(
                        rl_line,
                        path,
                        format!(
                            "`rate_limit` has no `unit` and is not `unlimited: true`; \
                             valid units: {VALID_UNITS}; or a custom `window` (e.g. 30s)"
                        ),
                    );
                    None
                }
                (Some(unit), None) => match Unit::parse(unit.value.trim()) {
                    Some(u) => Some((u, u.window_ms())),
                    None => {
                        self.error(
                            line_of(&unit.referenced),
                            path,
                            format!(
                                "invalid unit `{}`: expected one of {VALID_UNITS} (any case)",
                                unit.value
                            ),
                        );
                        None
                    }
                },
                (None, Some(window)) => {
                    match parse_duration_ms(&window.value).filter(|&ms| ms <= MAX_WINDOW_MS) {
                        Some(ms) => Some((Unit::nearest(ms), ms)),
                        None => {
                            self.error(
                                line_of(&window.referenced),
                                path,
                                format!(
                                "invalid window `{}`: expected a positive whole number with ms, s, \
                                 m, h or d (e.g. 1500ms, 30s, 5m), at most 365d",
                                window.value
                            ),
                            );
                            None
                        }
                    }
                }
            };
            let algorithm = self.algorithm(&rl, period.map(|(_, ms)| ms), requests_per_unit, path);
            if let (Some((unit, window_ms)), Some(algorithm)) = (period, algorithm) {
                counted = Some(Limit {
                    requests_per_unit,
                    unit,
                    window_ms,
                    algorithm,
                    name: None,
                });
            }
            period.map(|(unit, _)| LimitSpec::PerUnit {
                requests_per_unit,
                unit,
            })
        };

        let name = rl
            .name
            .as_ref()
            .map(|n| n.value.clone())
            .filter(|n| !n.is_empty());
        let mut replaces = Vec::new();
        for entry in rl.replaces.unwrap_or_default() {
            let entry_line = line_of(&entry.referenced);
            let entry = entry.value;
            self.extras(&entry.extra, path, REPLACE_FIELDS, &[]);
            match entry.name {
                Some(n) if !n.value.is_empty() => {
                    if name.as_deref() == Some(n.value.as_str()) {
                        self.error(
                            line_of(&n.referenced),
                            path,
                            format!(
                                "`replaces` names this rule's own name `{}`; a rule cannot \
                                 replace itself",
                                n.value
                            ),
                        );
                    } else {
                        replaces.push(n.value);
                    }
                }
                Some(n) => self.error(
                    line_of(&n.referenced).or(entry_line),
                    path,
                    "`replaces` entry has an empty `name`",
                ),
                None => self.error(entry_line, path, "`replaces` entry has no `name`"),
            }
        }
        if let Some(counted) = counted.as_mut() {
            counted.name.clone_from(&name);
        }
        (limit, counted, name, replaces)
    }

    /// `algorithm` with its `quantum` / `burst`; `None` (after reporting) when invalid.
    fn algorithm(
        &mut self,
        rl: &RawRateLimit,
        window_ms: Option<u64>,
        requests_per_unit: u32,
        path: &str,
    ) -> Option<LimitAlgorithm> {
        let name = rl
            .algorithm
            .as_ref()
            .map(|a| a.value.trim().to_ascii_lowercase());
        let at = rl.algorithm.as_ref().and_then(|a| line_of(&a.referenced));
        let name = name.as_deref().unwrap_or("sliding_log");
        if name != "quantized_log" {
            if let Some(q) = &rl.quantum {
                self.error(
                    line_of(&q.referenced),
                    path,
                    format!("`quantum` applies only to `algorithm: quantized_log`, not `{name}`"),
                );
            }
        }
        if name != "gcra" {
            if let Some(b) = &rl.burst {
                self.error(
                    line_of(&b.referenced),
                    path,
                    format!("`burst` applies only to `algorithm: gcra`, not `{name}`"),
                );
            }
        }
        match name {
            "sliding_log" => Some(LimitAlgorithm::SlidingLog),
            "sliding_counter" => Some(LimitAlgorithm::SlidingCounter),
            "fixed_window" => Some(LimitAlgorithm::FixedWindow),
            "quantized_log" => {
                let (quantum_ms, q_line) = match &rl.quantum {
                    None => (Some(1_000), at),
                    Some(q) => (parse_duration_ms(&q.value), line_of(&q.referenced)),
                };
                let Some(quantum_ms) = quantum_ms else {
                    let q = rl.quantum.as_ref().map_or("", |q| q.value.as_str());
                    self.error(
                        q_line,
                        path,
                        format!("invalid quantum `{q}`: expected e.g. 100ms, 1s, 10s"),
                    );
                    return None;
                };
                let window_ms = window_ms?;
                if quantum_ms > window_ms {
                    self.error(
                        q_line,
                        path,
                        format!(
                            "quantum of {quantum_ms} ms is longer than the window of {window_ms} ms"
                        ),
                    );
                    return None;
                }
                if window_ms / quantum_ms > MAX_QUANTA {
                    self.error(
                        q_line,
                        path,
                        format!(
                            "quantum of {quantum_ms} ms splits the window of {window_ms} ms into \
                             more than {MAX_QUANTA} buckets; set `quantum` to at least {} ms",
                            window_ms.div_ceil(MAX_QUANTA)
                        ),
                    );
                    return None;
                }
                Some(LimitAlgorithm::QuantizedLog { quantum_ms })
            }
            "gcra" => {
                let burst = rl.burst.as_ref().map_or(requests_per_unit, |b| b.value);
                let b_line = rl
                    .burst
                    .as_ref()
                    .and_then(|b| line_of(&b.referenced))
                    .or(at);
                if requests_per_unit == 0 || burst == 0 {
                    self.error(
                        b_line,
                        path,
                        "`algorithm: gcra` needs `requests_per_unit` and `burst` of at least 1",
                    );
                    return None;
                }
                let window_ms = window_ms?;
                if u64::from(burst).saturating_mul(window_ms) > MAX_GCRA_TOKEN_MS {
                    self.error(
                        b_line,
                        path,
                        format!(
                            "gcra: burst {burst} × window {window_ms} ms exceeds 2^52 token-ms; \
                             use a smaller burst or a shorter window"
                        ),
                    );
                    return None;
                }
                Some(LimitAlgorithm::Gcra { burst })
            }
            other => {
                self.error(
                    at,
                    path,
                    format!("invalid algorithm `{other}`: expected one of {VALID_ALGORITHMS}"),
                );
                None
            }
        }
    }
}
