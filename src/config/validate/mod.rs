//! Validation and compilation of one parsed file into a domain's lookup tree.
//!
//! Why validation and compilation are one pass: both walk the same descriptors with the same
//! config path, and compiling while checking keeps every rule's error next to the code that
//! would otherwise misinterpret it. The pass never stops early: it records every problem and
//! keeps walking (children of a bad descriptor are still checked), so a file's errors arrive
//! together. A file with any error yields no usable tree; the caller discards it.
//!
//! This file walks a file's levels and descriptors; `rate_limit` checks and compiles what one
//! descriptor limits (`rate_limit`, `rate_limits`, the algorithm and its parameters).

mod rate_limit;

use super::error::{ConfigError, DOMAIN_RULE};
use super::limits::ConfigLimits;
use super::raw::{
    self, line_of, Extra, RawDescriptor, RawHeaders, RawRoot, DESCRIPTOR_FIELDS, HEADERS_FIELDS,
    ROOT_FIELDS, UNSUPPORTED_DESCRIPTOR_FIELDS,
};
use super::tree::{
    HeaderFormat, HeaderPolicy, Level, Limit, LimitAlgorithm, Node, OverLimitSetting, Rule,
};
use serde_saphyr::Spanned;
use std::collections::HashMap;
use std::path::Path;

/// One file, compiled. `domain` is `None` when the file names no (non-empty) domain.
pub(crate) struct CompiledFile {
    pub domain: Option<(String, Option<usize>)>,
    pub root: Level,
    pub headers: HeaderPolicy,
}

/// One source of a domain's limits: a YAML file's text, or a document already in the raw
/// model (an xDS resource, converted by `config::xds`), which has no lines.
pub(crate) enum Document<'a> {
    Yaml(&'a str),
    Raw(Box<RawRoot>),
}

/// Parses (YAML), validates and compiles one document, appending its problems to `errors`.
/// `file` names the source in errors. `default_headers` is the response-header policy of a
/// domain that sets none itself.
pub(crate) fn compile_file(
    file: &Path,
    document: Document<'_>,
    default_headers: HeaderPolicy,
    limits: &ConfigLimits,
    errors: &mut Vec<ConfigError>,
) -> CompiledFile {
    let root = match document {
        Document::Raw(root) => *root,
        Document::Yaml(text) => match raw::parse(text, limits) {
            Ok(root) => root,
            Err(failure) => {
                let mut message = if failure.limit {
                    failure.message
                } else {
                    format!("malformed YAML: {}", failure.message)
                };
                if let Some(column) = failure.column {
                    message.push_str(&format!(" (column {column})"));
                }
                let rule = crate::config::locate::rule_at(text, failure.line);
                errors.push(ConfigError::new(file, failure.line, rule, message));
                return CompiledFile {
                    domain: None,
                    root: Level::default(),
                    headers: HeaderPolicy::default(),
                };
            }
        },
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

    /// `over_limit: refuse | fill | record` (default fill), only on a descriptor that counts
    /// (`limits` empty: no `rate_limit`, or `unlimited: true`), and not `fill` or `record` on
    /// one that counts only leases (`in_flight` records nothing for a refused request).
    fn over_limit(
        &mut self,
        raw: Option<&Spanned<String>>,
        limits: &[Limit],
        rule: &str,
    ) -> OverLimitSetting {
        let Some(raw) = raw else {
            return OverLimitSetting::default();
        };
        let line = line_of(&raw.referenced);
        let Some(setting) = OverLimitSetting::parse(raw.value.trim()) else {
            self.error(
                line,
                rule,
                format!(
                    "invalid over_limit `{}`: expected refuse, fill or record",
                    raw.value
                ),
            );
            return OverLimitSetting::default();
        };
        if limits.is_empty() {
            self.error(
                line,
                rule,
                "`over_limit` applies only to a descriptor with a counted `rate_limit` or \
                 `rate_limits`",
            );
        } else if setting != OverLimitSetting::Refuse
            && limits
                .iter()
                .all(|l| l.algorithm == LimitAlgorithm::InFlight)
        {
            self.error(
                line,
                rule,
                format!(
                    "`over_limit: {}` does not apply to `algorithm: in_flight`: a refused \
                     request never holds a lease (nothing would release it)",
                    setting.as_str()
                ),
            );
        }
        setting
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
            let over_limit = self.over_limit(d.over_limit.as_ref(), &limits, &path);
            let mut shared_here = shared.to_vec();
            // `share_threshold: false` is the default, wherever it is written (renderings of
            // envoyproxy/ratelimit's structs write it on every descriptor).
            if let Some(share) = d.share_threshold.as_ref().filter(|s| s.value) {
                match value {
                    Some(v) if v.contains('*') => shared_here.push((depth, v.to_string())),
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
                    over_limit,
                    shared_values: shared_here,
                    headers,
                },
                children,
            };
            level.insert(key, value, node);
        }
        level
    }
}
