//! A descriptor's limits: `rate_limit` (or the stacked `rate_limits`) checked and compiled,
//! with its unit or custom window (or `in_flight`'s lease), its algorithm and that algorithm's
//! parameters, its `name` and `replaces`.
//!
//! Why apart from the walk over levels: these are the rules about one limit, and each bound
//! here (window, quanta, GCRA token-ms) exists because a backend must represent the limit
//! exactly.

use super::Checker;
use crate::config::raw::{RATE_LIMIT_FIELDS, REPLACE_FIELDS, RawRateLimit, RawReplace, line_of};
use crate::config::tree::{Limit, LimitAlgorithm, LimitSpec};
use crate::config::{Unit, parse_duration_ms};
use serde_saphyr::Spanned;

const VALID_UNITS: &str = "second, minute, hour, day, week, month, year";
const VALID_ALGORITHMS: &str =
    "sliding_log, quantized_log, sliding_counter, gcra, fixed_window, in_flight";
/// What a malformed `window` or `lease` is told.
const DURATION_FORMAT: &str =
    "a positive whole number with ms, s, m, h or d (e.g. 1500ms, 30s, 5m), at most 365d";
/// Longest custom window: a year, the longest unit.
const MAX_WINDOW_MS: u64 = 365 * 86_400_000;
/// Most buckets a quantized log may keep per key (window / quantum).
pub(crate) const MAX_QUANTA: u64 = 3_600;
/// GCRA keeps `burst × window_ms` in integer token-ms, which must stay exact in the Redis
/// script's doubles.
const MAX_GCRA_TOKEN_MS: u64 = 1 << 52;

/// What one `rate_limit` entry compiles to.
pub(super) struct Compiled {
    /// The limit reported to the caller; `None` after an error.
    pub spec: Option<LimitSpec>,
    /// The limit the backend counts; `None` for `unlimited: true` or after an error.
    pub counted: Option<Limit>,
    /// `name`, when not empty.
    pub name: Option<String>,
    /// The names listed in `replaces`.
    pub replaces: Vec<String>,
}

/// What one descriptor limits, from its `rate_limit` or its stacked `rate_limits`: the
/// [`Rule`](crate::config::tree::Rule) fields of the same names.
#[derive(Default)]
pub(super) struct DescriptorLimits {
    /// With stacked `rate_limits`, the first entry's.
    pub limit: Option<LimitSpec>,
    /// Every counted limit: at most one for `rate_limit`.
    pub limits: Vec<Limit>,
    /// With stacked `rate_limits`, the first entry's.
    pub name: Option<String>,
    /// With stacked `rate_limits`, every entry's.
    pub replaces: Vec<String>,
}

impl From<Compiled> for DescriptorLimits {
    fn from(one: Compiled) -> Self {
        DescriptorLimits {
            limit: one.spec,
            limits: one.counted.into_iter().collect(),
            name: one.name,
            replaces: one.replaces,
        }
    }
}

/// A descriptor's `rate_limit` and `rate_limits` keys, each with the line of the key itself.
pub(super) struct RawLimits {
    pub rate_limit: Option<Spanned<RawRateLimit>>,
    pub rate_limit_line: Option<usize>,
    pub rate_limits: Option<Vec<Spanned<RawRateLimit>>>,
    pub rate_limits_line: Option<usize>,
}

impl Checker<'_> {
    /// A descriptor's `rate_limit` or `rate_limits` (not both); none when it has neither.
    pub(super) fn limits(&mut self, raw: RawLimits, path: &str) -> DescriptorLimits {
        match (raw.rate_limit, raw.rate_limits) {
            (Some(rl), stacked) => {
                if stacked.is_some() {
                    self.error(
                        raw.rate_limits_line,
                        path,
                        "`rate_limit` and `rate_limits` are both set; use one of them",
                    );
                }
                let rl_line = raw.rate_limit_line.or_else(|| line_of(&rl.referenced));
                self.rate_limit(rl.value, rl_line, path, false).into()
            }
            (None, Some(stacked)) => self.stacked(stacked, raw.rate_limits_line, path),
            (None, None) => DescriptorLimits::default(),
        }
    }

    /// `rate_limits: [...]`: every entry a counted limit; the rule's `limit` and `name` are the
    /// first entry's, its `replaces` all entries'.
    fn stacked(
        &mut self,
        entries: Vec<Spanned<RawRateLimit>>,
        line: Option<usize>,
        path: &str,
    ) -> DescriptorLimits {
        if entries.is_empty() {
            self.error(
                line,
                path,
                "`rate_limits` is empty: list at least one limit",
            );
        }
        let mut all = DescriptorLimits::default();
        for (i, entry) in entries.into_iter().enumerate() {
            let entry_line = line_of(&entry.referenced).or(line);
            let one = self.rate_limit(entry.value, entry_line, path, true);
            if i == 0 {
                all.limit = one.spec;
                all.name = one.name;
            }
            all.limits.extend(one.counted);
            all.replaces.extend(one.replaces);
        }
        all
    }

    /// One `rate_limit` mapping (`stacked`: an entry of `rate_limits`).
    fn rate_limit(
        &mut self,
        rl: RawRateLimit,
        rl_line: Option<usize>,
        path: &str,
        stacked: bool,
    ) -> Compiled {
        self.extras(&rl.extra, path, RATE_LIMIT_FIELDS, &[]);
        let (spec, mut counted) = if rl.unlimited.as_ref().is_some_and(|u| u.value) {
            self.unlimited(&rl, rl_line, path, stacked);
            (Some(LimitSpec::Unlimited), None)
        } else {
            self.counted(&rl, rl_line, path)
        };
        let name = rl
            .name
            .as_ref()
            .map(|n| n.value.clone())
            .filter(|n| !n.is_empty());
        let replaces = self.replaces(rl.replaces.unwrap_or_default(), name.as_deref(), path);
        if let Some(counted) = counted.as_mut() {
            counted.name.clone_from(&name);
        }
        Compiled {
            spec,
            counted,
            name,
            replaces,
        }
    }

    /// `unlimited: true` stands alone: every counting field beside it is an error, and so is
    /// being one of `rate_limits`.
    fn unlimited(&mut self, rl: &RawRateLimit, rl_line: Option<usize>, path: &str, stacked: bool) {
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
            ("lease", rl.lease.as_ref().map(|v| &v.referenced)),
        ] {
            if let Some(at) = at {
                self.error(
                    line_of(at),
                    path,
                    format!("`{field}` must not be set together with `unlimited: true`"),
                );
            }
        }
    }

    /// A limit that counts: the limit reported (`None` when its period is invalid) and the
    /// limit counted (`None` when its period or its algorithm is invalid), after reporting.
    fn counted(
        &mut self,
        rl: &RawRateLimit,
        rl_line: Option<usize>,
        path: &str,
    ) -> (Option<LimitSpec>, Option<Limit>) {
        // envoyproxy/ratelimit defaults a missing count to 0: deny all.
        let requests_per_unit = rl.requests_per_unit.as_ref().map_or(0, |r| r.value);
        let period = self.rate_period(rl, rl_line, path);
        let algorithm = self.algorithm(rl, period.map(|(_, ms)| ms), requests_per_unit, path);
        let spec = period.map(|(unit, _)| LimitSpec::PerUnit {
            requests_per_unit,
            unit,
        });
        let counted = match (period, algorithm) {
            (Some((unit, window_ms)), Some(algorithm)) => Some(Limit {
                requests_per_unit,
                unit,
                window_ms,
                algorithm,
                name: None,
            }),
            _ => None,
        };
        (spec, counted)
    }

    /// The unit reported and the window counted: from `unit` or `window` (exactly one of
    /// them), or from `lease` for `in_flight`; `None` (after reporting) when invalid.
    fn rate_period(
        &mut self,
        rl: &RawRateLimit,
        rl_line: Option<usize>,
        path: &str,
    ) -> Option<(Unit, u64)> {
        let in_flight = rl
            .algorithm
            .as_ref()
            .is_some_and(|a| a.value.trim().eq_ignore_ascii_case("in_flight"));
        match (&rl.unit, &rl.window) {
            _ if in_flight => self.lease(rl, path),
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
            (None, Some(window)) => self.period("window", window, path),
        }
    }

    /// `replaces: [{name: X}, ...]`: the names, each non-empty and not the rule's own `name`.
    fn replaces(
        &mut self,
        entries: Vec<Spanned<RawReplace>>,
        own_name: Option<&str>,
        path: &str,
    ) -> Vec<String> {
        let mut replaces = Vec::new();
        for entry in entries {
            let entry_line = line_of(&entry.referenced);
            let entry = entry.value;
            self.extras(&entry.extra, path, REPLACE_FIELDS, &[]);
            match entry.name {
                Some(n) if !n.value.is_empty() => {
                    if own_name == Some(n.value.as_str()) {
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
        replaces
    }

    /// `in_flight`'s period: its `lease`, which takes the place of `unit` or `window` (reported
    /// to Envoy as the nearest unit); `None` (after reporting) when missing or invalid.
    fn lease(&mut self, rl: &RawRateLimit, path: &str) -> Option<(Unit, u64)> {
        let at = rl.algorithm.as_ref().and_then(|a| line_of(&a.referenced));
        let rate = [
            ("unit", rl.unit.as_ref().map(|u| &u.referenced)),
            ("window", rl.window.as_ref().map(|w| &w.referenced)),
        ];
        if let Some((field, line)) = rate.into_iter().find_map(|(f, l)| Some((f, l?))) {
            self.error(
                line_of(line),
                path,
                format!(
                    "`{field}` does not apply to `algorithm: in_flight`, which counts requests \
                     in flight, not a rate: `lease` (e.g. 60s) bounds how long one counts"
                ),
            );
            return None;
        }
        let Some(lease) = &rl.lease else {
            self.error(
                at,
                path,
                "`algorithm: in_flight` needs `lease` (e.g. 60s): how long a request that never \
                 says it is done keeps counting; set it above the longest request",
            );
            return None;
        };
        self.period("lease", lease, path)
    }

    /// A `window` or `lease` duration, with the unit reported for it (the nearest); `None`
    /// (after reporting) when malformed or over a year.
    fn period(&mut self, field: &str, raw: &Spanned<String>, path: &str) -> Option<(Unit, u64)> {
        match parse_duration_ms(&raw.value).filter(|&ms| ms <= MAX_WINDOW_MS) {
            Some(ms) => Some((Unit::nearest(ms), ms)),
            None => {
                self.error(
                    line_of(&raw.referenced),
                    path,
                    format!(
                        "invalid {field} `{}`: expected {DURATION_FORMAT}",
                        raw.value
                    ),
                );
                None
            }
        }
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
        self.foreign_parameters(rl, name, path);
        match name {
            "sliding_log" => Some(LimitAlgorithm::SlidingLog),
            "in_flight" => Some(LimitAlgorithm::InFlight),
            "sliding_counter" => Some(LimitAlgorithm::SlidingCounter),
            "fixed_window" => Some(LimitAlgorithm::FixedWindow),
            "quantized_log" => self.quantized_log(rl.quantum.as_ref(), at, window_ms, path),
            "gcra" => self.gcra(rl.burst.as_ref(), at, window_ms, requests_per_unit, path),
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

    /// Each of `quantum`, `burst` and `lease` set on a limit whose algorithm (`name`) is not
    /// the one it belongs to.
    fn foreign_parameters(&mut self, rl: &RawRateLimit, name: &str, path: &str) {
        for (field, owner, at) in [
            (
                "quantum",
                "quantized_log",
                rl.quantum.as_ref().map(|v| &v.referenced),
            ),
            ("burst", "gcra", rl.burst.as_ref().map(|v| &v.referenced)),
            (
                "lease",
                "in_flight",
                rl.lease.as_ref().map(|v| &v.referenced),
            ),
        ] {
            if let Some(at) = at.filter(|_| name != owner) {
                self.error(
                    line_of(at),
                    path,
                    format!("`{field}` applies only to `algorithm: {owner}`, not `{name}`"),
                );
            }
        }
    }

    /// `quantized_log` with its `quantum` (default 1 s), which must divide the window into at
    /// most [`MAX_QUANTA`] buckets.
    fn quantized_log(
        &mut self,
        quantum: Option<&Spanned<String>>,
        at: Option<usize>,
        window_ms: Option<u64>,
        path: &str,
    ) -> Option<LimitAlgorithm> {
        let (quantum_ms, q_line) = match quantum {
            None => (Some(1_000), at),
            Some(q) => (parse_duration_ms(&q.value), line_of(&q.referenced)),
        };
        let Some(quantum_ms) = quantum_ms else {
            let q = quantum.map_or("", |q| q.value.as_str());
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
                format!("quantum of {quantum_ms} ms is longer than the window of {window_ms} ms"),
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

    /// `gcra` with its `burst` (default `requests_per_unit`), whose token-ms must stay exact in
    /// the Redis script's doubles.
    fn gcra(
        &mut self,
        burst: Option<&Spanned<u32>>,
        at: Option<usize>,
        window_ms: Option<u64>,
        requests_per_unit: u32,
        path: &str,
    ) -> Option<LimitAlgorithm> {
        let b_line = burst.and_then(|b| line_of(&b.referenced)).or(at);
        let burst = burst.map_or(requests_per_unit, |b| b.value);
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
}
