//! The YAML file as written: envoyproxy/ratelimit's schema, deserialized with source lines.
//!
//! Why hand-written map visitors instead of `#[derive(Deserialize)]` with
//! `deny_unknown_fields`: serde stops at the first unknown field, and the loader must report
//! every problem of a file at once, each with its line. So each mapping here accepts any key,
//! deserializes the known ones (wrapped in [`Spanned`] where a later check needs their line) and
//! records the others as [`Extra`]s for the validator to report. Type errors (a string where a
//! number belongs, a scalar where a mapping belongs) remain parser errors: serde-saphyr reports
//! them with line and column and the file is rejected.

use serde::Deserialize;
use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_saphyr::budget::BudgetBreach;
use serde_saphyr::{Location, Spanned};
use std::fmt;
use std::marker::PhantomData;

use super::limits::ConfigLimits;

/// 1-based line of a location, `None` when serde-saphyr does not know it (line 0).
pub(crate) fn line_of(location: &Location) -> Option<usize> {
    match location.line() {
        0 => None,
        line => usize::try_from(line).ok(),
    }
}

/// A key of a mapping that the schema does not define at that level.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Extra {
    pub name: String,
    pub line: Option<usize>,
}

/// The top level of a file: `domain` and `descriptors`.
#[derive(Debug, Default)]
pub(crate) struct RawRoot {
    pub domain: Option<Spanned<String>>,
    pub descriptors: Option<Vec<Spanned<RawDescriptor>>>,
    /// sluice extension: the domain's default response headers.
    pub response_headers: Option<Spanned<RawHeaders>>,
    pub response_headers_line: Option<usize>,
    pub extra: Vec<Extra>,
}

/// One entry of a `descriptors` list.
#[derive(Debug, Default)]
pub(crate) struct RawDescriptor {
    pub key: Option<Spanned<String>>,
    pub value: Option<Spanned<String>>,
    pub rate_limit: Option<Spanned<RawRateLimit>>,
    /// Line of the `rate_limit` key itself (the mapping's own span starts at its first key).
    pub rate_limit_line: Option<usize>,
    /// sluice extension: stacked limits, all of which must admit.
    pub rate_limits: Option<Vec<Spanned<RawRateLimit>>>,
    pub rate_limits_line: Option<usize>,
    pub descriptors: Option<Vec<Spanned<RawDescriptor>>>,
    pub shadow_mode: Option<bool>,
    pub quota_mode: Option<bool>,
    pub detailed_metric: Option<bool>,
    pub value_to_metric: Option<bool>,
    pub share_threshold: Option<Spanned<bool>>,
    /// sluice extension: what a request that does not fit records (`refuse`, `fill`, `record`).
    pub over_limit: Option<Spanned<String>>,
    /// sluice extension: response headers for this descriptor and its children.
    pub response_headers: Option<Spanned<RawHeaders>>,
    pub response_headers_line: Option<usize>,
    /// Any mapping: returned in the dynamic metadata of responses this descriptor's limit
    /// admits, when that is asked for (`crate::metadata`).
    pub metadata: Option<serde_json::Map<String, serde_json::Value>>,
    pub extra: Vec<Extra>,
}

/// `response_headers: {format: none|draft|legacy, hide_remaining: BOOL}` (sluice extension;
/// files without it load as in envoyproxy/ratelimit).
#[derive(Debug, Default)]
pub(crate) struct RawHeaders {
    pub format: Option<Spanned<String>>,
    pub hide_remaining: Option<Spanned<bool>>,
    pub extra: Vec<Extra>,
}

/// A descriptor's `rate_limit` mapping. `replaces` sits inside it, as in envoyproxy/ratelimit.
#[derive(Debug, Default)]
pub(crate) struct RawRateLimit {
    pub unit: Option<Spanned<String>>,
    /// sluice extensions: `window` (instead of `unit`), `algorithm`, `quantum`, `burst`, and
    /// `lease` (instead of `unit` or `window`, for `algorithm: in_flight`).
    pub window: Option<Spanned<String>>,
    pub algorithm: Option<Spanned<String>>,
    pub quantum: Option<Spanned<String>>,
    pub burst: Option<Spanned<u32>>,
    pub lease: Option<Spanned<String>>,
    pub requests_per_unit: Option<Spanned<u32>>,
    pub unlimited: Option<Spanned<bool>>,
    pub name: Option<Spanned<String>>,
    pub replaces: Option<Vec<Spanned<RawReplace>>>,
    pub extra: Vec<Extra>,
}

/// One `replaces` entry: `{name: X}`.
#[derive(Debug, Default)]
pub(crate) struct RawReplace {
    pub name: Option<Spanned<String>>,
    pub extra: Vec<Extra>,
}

/// A descriptor as the checker reads it: its own fields in the raw model, and its nested
/// descriptors, produced one at a time.
///
/// Why not a tree of [`RawDescriptor`]s for every source: the raw model keeps a line and a
/// column with every field (about 1.5 KB a descriptor), which a parsed file needs for its
/// errors and an xDS resource does not have. Converted as the walk reaches it, a resource is
/// never in the raw model but for the descriptor being checked and its ancestors, so what a
/// push costs is its decoded messages and the compiled tree (docs/security.md).
pub(crate) trait Source: Sized {
    type Nested: Iterator<Item = Self>;
    fn open(self) -> (Spanned<RawDescriptor>, Self::Nested);
}

impl Source for Spanned<RawDescriptor> {
    type Nested = std::vec::IntoIter<Spanned<RawDescriptor>>;

    fn open(mut self) -> (Spanned<RawDescriptor>, Self::Nested) {
        let nested = self.value.descriptors.take().unwrap_or_default();
        (self, nested.into_iter())
    }
}

/// A mapping whose known keys are deserialized into fields and whose other keys are recorded.
trait Fields: Default {
    const EXPECTING: &'static str;

    /// Deserializes the value of `name` (a key at `line`) if it is a known field; returns false
    /// otherwise (the value has not been consumed then).
    fn field<'de, A: MapAccess<'de>>(
        &mut self,
        name: &str,
        line: Option<usize>,
        map: &mut A,
    ) -> Result<bool, A::Error>;

    fn extra(&mut self) -> &mut Vec<Extra>;
}

struct FieldsVisitor<T>(PhantomData<T>);

impl<'de, T: Fields> Visitor<'de> for FieldsVisitor<T> {
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(T::EXPECTING)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<T, A::Error> {
        let mut out = T::default();
        while let Some(key) = map.next_key::<Spanned<String>>()? {
            let line = line_of(&key.referenced);
            if !out.field(&key.value, line, &mut map)? {
                map.next_value::<IgnoredAny>()?;
                out.extra().push(Extra {
                    name: key.value,
                    line,
                });
            }
        }
        Ok(out)
    }
}

macro_rules! deserialize_via_fields {
    ($($ty:ty),*) => {$(
        impl<'de> Deserialize<'de> for $ty {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                deserializer.deserialize_map(FieldsVisitor::<$ty>(PhantomData))
            }
        }
    )*};
}

deserialize_via_fields!(RawRoot, RawDescriptor, RawRateLimit, RawReplace, RawHeaders);

impl Fields for RawRoot {
    const EXPECTING: &'static str = "a mapping with `domain` and `descriptors`";

    fn field<'de, A: MapAccess<'de>>(
        &mut self,
        name: &str,
        line: Option<usize>,
        map: &mut A,
    ) -> Result<bool, A::Error> {
        match name {
            "domain" => self.domain = map.next_value()?,
            "descriptors" => self.descriptors = map.next_value()?,
            "response_headers" => {
                self.response_headers = map.next_value()?;
                self.response_headers_line = line;
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    fn extra(&mut self) -> &mut Vec<Extra> {
        &mut self.extra
    }
}

impl Fields for RawDescriptor {
    const EXPECTING: &'static str = "a descriptor mapping (`key`, `value`, `rate_limit`, ...)";

    fn field<'de, A: MapAccess<'de>>(
        &mut self,
        name: &str,
        line: Option<usize>,
        map: &mut A,
    ) -> Result<bool, A::Error> {
        match name {
            "key" => self.key = map.next_value()?,
            "value" => self.value = map.next_value()?,
            "rate_limit" => {
                self.rate_limit = map.next_value()?;
                self.rate_limit_line = line;
            }
            "rate_limits" => {
                self.rate_limits = map.next_value()?;
                self.rate_limits_line = line;
            }
            "descriptors" => self.descriptors = map.next_value()?,
            "shadow_mode" => self.shadow_mode = map.next_value()?,
            "quota_mode" => self.quota_mode = map.next_value()?,
            "detailed_metric" => self.detailed_metric = map.next_value()?,
            "value_to_metric" => self.value_to_metric = map.next_value()?,
            "share_threshold" => self.share_threshold = map.next_value()?,
            "over_limit" => self.over_limit = map.next_value()?,
            "metadata" => self.metadata = map.next_value()?,
            "response_headers" => {
                self.response_headers = map.next_value()?;
                self.response_headers_line = line;
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    fn extra(&mut self) -> &mut Vec<Extra> {
        &mut self.extra
    }
}

impl Fields for RawRateLimit {
    const EXPECTING: &'static str = "a rate_limit mapping (`unit`, `requests_per_unit`, ...)";

    fn field<'de, A: MapAccess<'de>>(
        &mut self,
        name: &str,
        _line: Option<usize>,
        map: &mut A,
    ) -> Result<bool, A::Error> {
        match name {
            "unit" => self.unit = map.next_value()?,
            "window" => self.window = map.next_value()?,
            "algorithm" => self.algorithm = map.next_value()?,
            "quantum" => self.quantum = map.next_value()?,
            "burst" => self.burst = map.next_value()?,
            "lease" => self.lease = map.next_value()?,
            "requests_per_unit" => self.requests_per_unit = map.next_value()?,
            "unlimited" => self.unlimited = map.next_value()?,
            "name" => self.name = map.next_value()?,
            "replaces" => self.replaces = map.next_value()?,
            _ => return Ok(false),
        }
        Ok(true)
    }

    fn extra(&mut self) -> &mut Vec<Extra> {
        &mut self.extra
    }
}

impl Fields for RawReplace {
    const EXPECTING: &'static str = "a replaces entry `{name: ...}`";

    fn field<'de, A: MapAccess<'de>>(
        &mut self,
        name: &str,
        _line: Option<usize>,
        map: &mut A,
    ) -> Result<bool, A::Error> {
        match name {
            "name" => self.name = map.next_value()?,
            _ => return Ok(false),
        }
        Ok(true)
    }

    fn extra(&mut self) -> &mut Vec<Extra> {
        &mut self.extra
    }
}

impl Fields for RawHeaders {
    const EXPECTING: &'static str = "a response_headers mapping (`format`, `hide_remaining`)";

    fn field<'de, A: MapAccess<'de>>(
        &mut self,
        name: &str,
        _line: Option<usize>,
        map: &mut A,
    ) -> Result<bool, A::Error> {
        match name {
            "format" => self.format = map.next_value()?,
            "hide_remaining" => self.hide_remaining = map.next_value()?,
            _ => return Ok(false),
        }
        Ok(true)
    }

    fn extra(&mut self) -> &mut Vec<Extra> {
        &mut self.extra
    }
}

/// Field names per level, for "unknown field" messages.
pub(crate) const ROOT_FIELDS: &[&str] = &["domain", "descriptors", "response_headers"];
pub(crate) const DESCRIPTOR_FIELDS: &[&str] = &[
    "key",
    "value",
    "rate_limit",
    "rate_limits",
    "descriptors",
    "shadow_mode",
    "quota_mode",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "metadata",
    "response_headers",
    "over_limit",
];
pub(crate) const HEADERS_FIELDS: &[&str] = &["format", "hide_remaining"];
pub(crate) const RATE_LIMIT_FIELDS: &[&str] = &[
    "unit",
    "window",
    "requests_per_unit",
    "unlimited",
    "name",
    "replaces",
    "algorithm",
    "quantum",
    "burst",
    "lease",
];
pub(crate) const REPLACE_FIELDS: &[&str] = &["name"];

/// Descriptor fields envoyproxy/ratelimit accepts that sluice does not implement yet. They are
/// rejected with their own message rather than silently ignored: accepting the file without
/// their behaviour would mislead.
pub(crate) const UNSUPPORTED_DESCRIPTOR_FIELDS: &[&str] = &[];

/// A parser error: its message without the location suffix, and the location.
#[derive(Debug)]
pub(crate) struct ParseFailure {
    pub message: String,
    pub line: Option<usize>,
    pub column: Option<usize>,
    /// A limit of [`ConfigLimits`] stopped the parser: the file may well be valid YAML.
    pub limit: bool,
}

/// Parses one file's text under `limits`. An empty document (or one holding only `~`/comments)
/// yields a default, empty root, which validation then reports as missing its domain.
pub(crate) fn parse(text: &str, limits: &ConfigLimits) -> Result<RawRoot, ParseFailure> {
    let Some(stack) = limits.parser_stack_bytes() else {
        return parse_here(text, limits);
    };
    // A nesting limit above the default needs more stack than a tokio thread has.
    std::thread::scope(|scope| {
        std::thread::Builder::new()
            .name("sluice-yaml".into())
            .stack_size(stack)
            .spawn_scoped(scope, || parse_here(text, limits))
            .map_err(|e| e.to_string())
            .and_then(|parser| parser.join().map_err(|_| "the parser panicked".to_owned()))
            .unwrap_or_else(|reason| {
                Err(ParseFailure {
                    message: format!("cannot run the YAML parser: {reason}"),
                    line: None,
                    column: None,
                    limit: false,
                })
            })
    })
}

fn parse_here(text: &str, limits: &ConfigLimits) -> Result<RawRoot, ParseFailure> {
    let mut options = serde_saphyr::Options::default();
    options.budget = Some(limits.budget());
    match serde_saphyr::from_str_with_options::<Option<RawRoot>>(text, options) {
        Ok(root) => Ok(root.unwrap_or_default()),
        Err(err) => {
            let location = err.location();
            let line = location.as_ref().and_then(line_of);
            let column = location.and_then(|l| usize::try_from(l.column()).ok().filter(|c| *c > 0));
            if let Some(breach) = budget_breach(&err) {
                return Err(ParseFailure {
                    message: limits.breach_message(breach),
                    line,
                    column,
                    limit: true,
                });
            }
            let mut message = err.without_snippet().to_string();
            // Advice aimed at the library's user, not at whoever edits the config file.
            if let Some(at) = message.find(", set DuplicateKeyPolicy in Options")
                && let Some(rest) = message.get(at..)
            {
                let tail = rest
                    .find(" at line ")
                    .map_or("", |i| &rest[i..])
                    .to_string();
                message.truncate(at);
                message.push_str(&tail);
            }
            if let Some(l) = location {
                let suffix = format!(" at line {}, column {}", l.line(), l.column());
                if let Some(stripped) = message.strip_suffix(&suffix) {
                    message = stripped.to_string();
                }
            }
            Err(ParseFailure {
                message,
                line,
                column,
                limit: false,
            })
        }
    }
}

/// The parser limit an error reports, under its snippet and alias wrappers.
fn budget_breach(mut err: &serde_saphyr::Error) -> Option<&BudgetBreach> {
    loop {
        match err {
            serde_saphyr::Error::WithSnippet { error, .. }
            | serde_saphyr::Error::AliasError { error, .. } => err = error,
            serde_saphyr::Error::Budget { breach, .. } => return Some(breach),
            _ => return None,
        }
    }
}
