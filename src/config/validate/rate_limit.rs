//! A descriptor's limits: `rate_limit` (or the stacked `rate_limits`) checked and compiled,
//! with its unit or custom window (or `in_flight`'s lease), its algorithm and that algorithm's
//! parameters, its `name` and `replaces`.
//!
//! Why apart from the walk over levels: these are the rules about one limit, and each bound
//! here (window, quanta, GCRA token-ms) exists because a backend must represent the limit
//! exactly.

use super::Checker;
use crate::config::raw::{line_of, RawRateLimit, RATE_LIMIT_FIELDS, REPLACE_FIELDS};
use crate::config::tree::{Limit, LimitAlgorithm, LimitSpec};
use crate::config::{parse_duration_ms, Unit};
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

/// What one `rate_limit` entry yields: the limit reported to the caller, the counted limit (if
/// any), the rule's name and the names it replaces.
type Compiled = (
    Option<LimitSpec>,
    Option<Limit>,
    Option<String>,
    Vec<String>,
);

impl Checker<'_> {
    /// `rate_limits: [...]`: every entry a counted limit; the rule's `limit` and `name` are the
    /// first entry's, its `replaces` all entries'.
    pub(super) fn stacked(
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

    pub(super) fn rate_limit(
        &mut self,
        rl: RawRateLimit,
        rl_line: Option<usize>,
        path: &str,
        stacked: bool,
    ) -> Compiled {
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
            Some(LimitSpec::Unlimited)
        } else {
            // envoyproxy/ratelimit defaults a missing count to 0: deny all.
            let requests_per_unit = rl.requests_per_unit.as_ref().map_or(0, |r| r.value);
            let in_flight = rl
                .algorithm
                .as_ref()
                .is_some_and(|a| a.value.trim().eq_ignore_ascii_case("in_flight"));
            let period = match (&rl.unit, &rl.window) {
                _ if in_flight => self.lease(&rl, path),
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
        if name != "in_flight" {
            if let Some(l) = &rl.lease {
                self.error(
                    line_of(&l.referenced),
                    path,
                    format!("`lease` applies only to `algorithm: in_flight`, not `{name}`"),
                );
            }
        }
        match name {
            "sliding_log" => Some(LimitAlgorithm::SlidingLog),
            "in_flight" => Some(LimitAlgorithm::InFlight),
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
