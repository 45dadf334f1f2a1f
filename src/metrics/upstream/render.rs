//! The Prometheus page of envoyproxy/ratelimit's stats, as its Prometheus sink serves it: each
//! stat through the mapping ([`super::mapper`]) to a series, series of one name in one family,
//! rendered as client_golang writes text format 0.0.4.
//!
//! What client_golang does that this keeps: families sorted by name, each with its `# HELP`
//! and `# TYPE`; a family's series sorted by their number of labels, then by their label
//! values; labels sorted by name (`le` and `quantile` last); stats that map to the same series
//! add up; numbers formatted as Go's `strconv.FormatFloat(v, 'g', -1, 64)` (`1e+06`). A series
//! whose name another kind took first is left out, as statsd_exporter refuses it (a conflict).
//! Histograms use Prometheus' default buckets (statsd_exporter's); summaries report the 0.5,
//! 0.9 and 0.99 quantiles over the last 10 minutes, exact (client_golang's are estimates within
//! 5 %, 1 % and 0.1 % of rank).

use super::series::{DEFAULT_BUCKETS, Observations, ObserverKind, QUANTILES, Series};
use super::store::Store;
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

/// A family's kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Counter,
    Histogram,
    Summary,
}

impl Kind {
    const fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Histogram => "histogram",
            Kind::Summary => "summary",
        }
    }
}

/// One family being rendered: its kind, help, and text per series (keyed for the sort).
struct Family {
    kind: Kind,
    help: String,
    counters: BTreeMap<SeriesOrder, f64>,
    observed: BTreeMap<SeriesOrder, String>,
}

/// client_golang's order of a family's series: fewer labels first, then label values.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct SeriesOrder {
    len: usize,
    values: Vec<String>,
    names: Vec<String>,
}

impl SeriesOrder {
    fn of(labels: &[(String, String)]) -> SeriesOrder {
        SeriesOrder {
            len: labels.len(),
            values: labels.iter().map(|(_, v)| v.clone()).collect(),
            names: labels.iter().map(|(k, _)| k.clone()).collect(),
        }
    }

    fn labels(&self) -> impl Iterator<Item = (&str, &str)> {
        self.names
            .iter()
            .map(String::as_str)
            .zip(self.values.iter().map(String::as_str))
    }
}

/// The page: every stat of `store` that rose (counters) or was observed (timers), mapped.
pub(super) fn render(store: &Store) -> String {
    let mut families: HashMap<String, Family> = HashMap::new();
    // Which kind took each name first: counters (the service's, then the keys') before timers,
    // as envoyproxy/ratelimit's flush sends them.
    store.for_each_counter(|counter| {
        let total = counter.total();
        if total == 0 {
            return;
        }
        if let Some(series) = &counter.series
            && let Some(family) = family_of(&mut families, series, Kind::Counter)
        {
            *family
                .counters
                .entry(SeriesOrder::of(&series.labels))
                .or_insert(0.0) += total as f64;
        }
    });
    store.with_observations(|obs| {
        if obs.count == 0 {
            return;
        }
        let kind = match obs.series.observer {
            ObserverKind::Histogram => Kind::Histogram,
            ObserverKind::Summary => Kind::Summary,
        };
        if let Some(family) = family_of(&mut families, &obs.series, kind) {
            let order = SeriesOrder::of(&obs.series.labels);
            let text = observed_text(&obs.series.family, &order, obs);
            family.observed.insert(order, text);
        }
    });
    let mut names: Vec<&String> = families.keys().collect();
    names.sort();
    let mut out = String::new();
    for name in names {
        let Some(family) = families.get(name) else {
            continue;
        };
        let _ = writeln!(out, "# HELP {name} {}", escape_help(&family.help));
        let _ = writeln!(out, "# TYPE {name} {}", family.kind.as_str());
        for (order, value) in &family.counters {
            let _ = writeln!(
                out,
                "{name}{} {}",
                label_text(order.labels(), None),
                go_float(*value)
            );
        }
        for text in family.observed.values() {
            out.push_str(text);
        }
    }
    out
}

/// The family `series` belongs to, made on first use; `None` for a dropped series or one whose
/// name another kind took first (statsd_exporter's conflict).
fn family_of<'a>(
    families: &'a mut HashMap<String, Family>,
    series: &Series,
    kind: Kind,
) -> Option<&'a mut Family> {
    if series.dropped {
        return None;
    }
    let family = families
        .entry(series.family.clone())
        .or_insert_with(|| Family {
            kind,
            help: series.help.clone(),
            counters: BTreeMap::new(),
            observed: BTreeMap::new(),
        });
    (family.kind == kind).then_some(family)
}

/// A histogram's or summary's lines.
fn observed_text(name: &str, order: &SeriesOrder, obs: &Observations) -> String {
    let mut out = String::new();
    match obs.series.observer {
        ObserverKind::Histogram => {
            for (bound, n) in DEFAULT_BUCKETS.iter().zip(&obs.histogram) {
                let le = go_float(*bound);
                let labels = label_text(order.labels(), Some(("le", &le)));
                let _ = writeln!(out, "{name}_bucket{labels} {}", go_float(*n as f64));
            }
            let labels = label_text(order.labels(), Some(("le", "+Inf")));
            let _ = writeln!(out, "{name}_bucket{labels} {}", go_float(obs.count as f64));
        }
        ObserverKind::Summary => {
            for q in QUANTILES {
                let quantile = go_float(q);
                let labels = label_text(order.labels(), Some(("quantile", &quantile)));
                let _ = writeln!(out, "{name}{labels} {}", go_float(obs.quantile(q)));
            }
        }
    }
    let labels = label_text(order.labels(), None);
    let _ = writeln!(out, "{name}_sum{labels} {}", go_float(obs.sum));
    let _ = writeln!(out, "{name}_count{labels} {}", go_float(obs.count as f64));
    out
}

/// `{k="v",...}` (nothing without labels), `extra` last.
fn label_text<'a>(
    labels: impl Iterator<Item = (&'a str, &'a str)>,
    extra: Option<(&str, &str)>,
) -> String {
    let mut parts: Vec<String> = labels
        .map(|(k, v)| format!("{k}=\"{}\"", escape_label(v)))
        .collect();
    if let Some((k, v)) = extra {
        parts.push(format!("{k}=\"{}\"", escape_label(v)));
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!("{{{}}}", parts.join(","))
    }
}

fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('\n', "\\n")
        .replace('"', "\\\"")
}

fn escape_help(v: &str) -> String {
    v.replace('\\', "\\\\").replace('\n', "\\n")
}

/// A number as client_golang writes it: `strconv.FormatFloat(v, 'g', -1, 64)` (the shortest
/// digits that read back the same; an exponent below -4 or above 5 written
/// `d.ddde±XX`), `+Inf`, `-Inf`, `NaN`.
pub fn go_float(v: f64) -> String {
    if v.is_nan() {
        return "NaN".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "+Inf" } else { "-Inf" }.into();
    }
    if v == 0.0 {
        return if v.is_sign_negative() { "-0" } else { "0" }.into();
    }
    // Rust's `{:e}` gives the shortest round-tripping digits: `1.2345e6`.
    let sci = format!("{v:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    // Go's %g with the shortest precision: exponent form when exp < -4 || exp >= 6.
    if !(-4..6).contains(&exp) {
        let (first, rest) = digits.split_at(1);
        let dot = if rest.is_empty() { "" } else { "." };
        let esign = if exp < 0 { '-' } else { '+' };
        return format!("{sign}{first}{dot}{rest}e{esign}{:02}", exp.abs());
    }
    let point = exp + 1; // digits before the decimal point
    let body = if point <= 0 {
        format!("0.{}{digits}", "0".repeat(point.unsigned_abs() as usize))
    } else if point as usize >= digits.len() {
        format!("{digits}{}", "0".repeat(point as usize - digits.len()))
    } else {
        let (int, frac) = digits.split_at(point as usize);
        format!("{int}.{frac}")
    };
    format!("{sign}{body}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_formatted_as_go_formats_them() {
        for (v, text) in [
            (1.0, "1"),
            (3.0, "3"),
            (0.005, "0.005"),
            (2.5, "2.5"),
            (10.0, "10"),
            (123456.0, "123456"),
            (1e6, "1e+06"),
            (1234567.0, "1.234567e+06"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (0.1 + 0.2, "0.30000000000000004"),
            (1e21, "1e+21"),
            (-2.5, "-2.5"),
            (f64::INFINITY, "+Inf"),
        ] {
            assert_eq!(go_float(v), text, "{v}");
        }
    }
}
