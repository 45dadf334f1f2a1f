//! The one reader of Prometheus text pages (sluice's `/metrics`, or the recorder rendered in
//! process): samples with their series (name and labels, as rendered) and value. Tests compare
//! values, not text, so `1` and `1.0` are alike and a missing series fails with the page.
//! [`parse_families`] reads a page with the Prometheus project's own parser instead
//! (`prometheus_client.parser`, Python), for tests that hold a page to the format: families,
//! their types and help, each sample's labels.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::net::SocketAddr;
use std::process::{Command, Stdio};

use super::http::http_get;

/// One sample line: `series` is the name with its labels as rendered
/// (`sluice_requests_total{domain="edge",code="ok"}`).
#[derive(Debug, Clone, Copy)]
pub struct Sample<'a> {
    pub series: &'a str,
    pub value: f64,
}

impl<'a> Sample<'a> {
    /// The metric name, without labels (`sluice_backend_call_duration_seconds_bucket`).
    pub fn name(&self) -> &'a str {
        self.series.split('{').next().unwrap_or(self.series)
    }

    /// The family the sample belongs to: a histogram's `_bucket`, `_sum` and `_count` are one.
    pub fn family(&self) -> &'a str {
        let name = self.name();
        ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| name.strip_suffix(suffix))
            .unwrap_or(name)
    }

    /// The value of label `key`, unescaped; `None` when the sample has no such label.
    pub fn label(&self, key: &str) -> Option<String> {
        labels(self.series)
            .into_iter()
            .find_map(|(k, v)| (k == key).then_some(v))
    }

    /// Whether the sample is of metric `name` and has every label of `labels`.
    pub fn matches(&self, name: &str, labels: &[(&str, &str)]) -> bool {
        self.name() == name
            && labels
                .iter()
                .all(|(k, v)| self.label(k).as_deref() == Some(*v))
    }
}

/// The samples of `page`, in page order (comments and blank lines skipped). Panics on a line
/// that is not `SERIES VALUE`.
pub fn samples(page: &str) -> Vec<Sample<'_>> {
    page.lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|line| {
            let (series, value) = line
                .rsplit_once(' ')
                .unwrap_or_else(|| panic!("not a sample line: {line}"));
            let value = value
                .parse()
                .unwrap_or_else(|_| panic!("not a sample value: {line}"));
            Sample { series, value }
        })
        .collect()
}

/// The value of the sample whose series is exactly `series`, if the page has one.
pub fn find(page: &str, series: &str) -> Option<f64> {
    samples(page)
        .into_iter()
        .find_map(|s| (s.series == series).then_some(s.value))
}

/// The value of the sample whose series is exactly `series`; panics with the page when it is
/// missing.
pub fn value(page: &str, series: &str) -> f64 {
    find(page, series).unwrap_or_else(|| panic!("no series {series} in:\n{page}"))
}

/// The sum of the samples of metric `name` that have every label of `labels` (0 when none).
pub fn sum(page: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    samples(page)
        .into_iter()
        .filter(|s| s.matches(name, labels))
        .map(|s| s.value)
        .sum()
}

/// GET `/metrics` on the admin address `admin`; fails the test unless it answers 200.
pub fn scrape(admin: SocketAddr) -> String {
    let (status, body) = http_get(admin, "/metrics");
    assert_eq!(status, 200, "/metrics on {admin}: {body}");
    body
}

/// A metric family as `prometheus_client.parser` reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct Family {
    pub name: String,
    /// `counter`, `gauge`, `histogram`, `summary`, `unknown`.
    pub kind: String,
    pub help: String,
    pub samples: Vec<ParsedSample>,
}

/// One sample of a [`Family`]. The parser names a counter's samples `<family>_total`.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedSample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

impl Family {
    /// The value of the sample named `name` with exactly `labels`, if any.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let want: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        self.samples
            .iter()
            .find(|s| s.name == name && s.labels == want)
            .map(|s| s.value)
    }
}

/// `page` read by the Prometheus project's text-format parser (`prometheus_client`, which
/// scripts/setup.sh installs); fails the test when it rejects the page.
pub fn parse_families(page: &str) -> Vec<Family> {
    const SCRIPT: &str = r#"
import json, sys
from prometheus_client.parser import text_string_to_metric_families
out = []
for f in text_string_to_metric_families(sys.stdin.read()):
    out.append({"name": f.name, "type": f.type, "help": f.documentation,
                "samples": [{"name": s.name, "labels": s.labels, "value": repr(s.value)}
                            for s in f.samples]})
json.dump(out, sys.stdout)
"#;
    let mut child = Command::new("python3")
        .args(["-c", SCRIPT])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 runs");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(page.as_bytes())
        .expect("page written to the parser");
    let out = child.wait_with_output().expect("parser output");
    assert!(
        out.status.success(),
        "prometheus_client rejected the page: {}\n{page}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("parser JSON");
    let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_owned();
    json.as_array()
        .expect("families")
        .iter()
        .map(|f| Family {
            name: text(&f["name"]),
            kind: text(&f["type"]),
            help: text(&f["help"]),
            samples: f["samples"]
                .as_array()
                .expect("samples")
                .iter()
                .map(|s| ParsedSample {
                    name: text(&s["name"]),
                    labels: s["labels"]
                        .as_object()
                        .expect("labels")
                        .iter()
                        .map(|(k, v)| (k.clone(), text(v)))
                        .collect(),
                    value: text(&s["value"]).parse().expect("a number"),
                })
                .collect(),
        })
        .collect()
}

/// The labels of `series` (`name{k="v",...}`) as (key, unescaped value), in order.
fn labels(series: &str) -> Vec<(&str, String)> {
    let Some(body) = series
        .split_once('{')
        .and_then(|(_, rest)| rest.strip_suffix('}'))
    else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut rest = body;
    while let Some((key, after)) = rest.split_once("=\"") {
        let mut value = String::new();
        let mut chars = after.char_indices();
        let mut end = after.len();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, other)) => value.push(other),
                    None => {}
                },
                '"' => {
                    end = i + 1;
                    break;
                }
                c => value.push(c),
            }
        }
        out.push((key.trim_start_matches(','), value));
        rest = &after[end..];
    }
    out
}

#[test]
fn samples_are_read_with_their_labels() {
    let page = "# HELP x y\n# TYPE x counter\n\
                sluice_requests_total{domain=\"edge\",code=\"ok\"} 3\n\
                sluice_requests_total{domain=\"a\\\"b,c\",code=\"ok\"} 4\n\
                sluice_up 1\n\nh_bucket{le=\"0.5\"} 2\n";
    let all = samples(page);
    assert_eq!(all.len(), 4);
    assert_eq!(value(page, "sluice_up"), 1.0);
    assert_eq!(find(page, "sluice_down"), None);
    assert_eq!(all[1].label("domain").as_deref(), Some("a\"b,c"));
    assert_eq!(all[1].label("code").as_deref(), Some("ok"));
    assert_eq!(all[3].family(), "h");
    assert_eq!(sum(page, "sluice_requests_total", &[("code", "ok")]), 7.0);
    assert_eq!(
        sum(page, "sluice_requests_total", &[("domain", "edge")]),
        3.0
    );
}
