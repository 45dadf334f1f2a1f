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

use self::rate_limit::RawLimits;
use super::error::{ConfigError, DOMAIN_RULE};
use super::limits::ConfigLimits;
use super::raw::{
    self, DESCRIPTOR_FIELDS, Extra, HEADERS_FIELDS, ROOT_FIELDS, RawDescriptor, RawHeaders,
    RawRoot, Source, UNSUPPORTED_DESCRIPTOR_FIELDS, line_of,
};
use super::stat_path::{self, StatSegment};
use super::tree::{
    HeaderFormat, HeaderPolicy, Level, Limit, LimitAlgorithm, Node, OverLimitSetting, Rule,
};
use crate::metadata::Metadata;
use serde_saphyr::Spanned;
use std::path::Path;

/// One file, compiled. `domain` is `None` when the file names no (non-empty) domain.
pub(crate) struct CompiledFile {
    pub domain: Option<(String, Option<usize>)>,
    pub root: Level,
    pub headers: HeaderPolicy,
}

/// Parses, validates and compiles one YAML file, appending its problems to `errors`. `file`
/// names the source in errors. `default_headers` is the response-header policy of a domain
/// that sets none itself.
pub(crate) fn compile_yaml(
    file: &Path,
    text: &str,
    default_headers: HeaderPolicy,
    limits: &ConfigLimits,
    errors: &mut Vec<ConfigError>,
) -> CompiledFile {
    let mut root = match raw::parse(text, limits) {
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
    };
    let descriptors = root.descriptors.take().unwrap_or_default();
    compile_raw(file, root, descriptors, default_headers, errors)
}

/// Validates and compiles a document in the raw model: `root` (without its descriptors) and
/// its `descriptors`, each opened as the walk reaches it ([`Source`]).
pub(crate) fn compile_raw<S: Source>(
    file: &Path,
    root: RawRoot,
    descriptors: impl IntoIterator<Item = S>,
    default_headers: HeaderPolicy,
    errors: &mut Vec<ConfigError>,
) -> CompiledFile {
    Checker { file, errors }.root(root, descriptors, default_headers)
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

    /// `root` without its descriptors, which are `descriptors`.
    fn root<S: Source>(
        &mut self,
        root: RawRoot,
        descriptors: impl IntoIterator<Item = S>,
        default_headers: HeaderPolicy,
    ) -> CompiledFile {
        self.extras(&root.extra, DOMAIN_RULE, ROOT_FIELDS, &[]);
        let domain = match root.domain {
            // A file without `domain` (an xDS resource always has one, maybe empty): the
            // error points at the file's first line, where the key belongs.
            None => {
                self.error(
                    Some(1),
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
        let root = self.level(descriptors, "", 0, &[], &[], headers);
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
    /// `share_threshold` wildcards by depth, `stat` their stat-key segments.
    fn level<S: Source>(
        &mut self,
        descriptors: impl IntoIterator<Item = S>,
        parent: &str,
        depth: usize,
        shared: &[(usize, String)],
        stat: &[StatSegment],
        inherited: HeaderPolicy,
    ) -> Level {
        let descriptors = descriptors.into_iter();
        let mut level = Level::with_capacity(descriptors.size_hint().0);
        // The line of each node's definition, by node index, for duplicate messages.
        let mut lines: Vec<Option<usize>> = Vec::with_capacity(descriptors.size_hint().0);
        for source in descriptors {
            let (spanned, nested) = source.open();
            let line = line_of(&spanned.referenced);
            let d = spanned.value;
            let place = Place::of(&d, parent);
            let key_line = d.key.as_ref().and_then(|k| line_of(&k.referenced)).or(line);
            let ancestry = Ancestry {
                depth,
                shared,
                stat,
            };
            let (rule, children) =
                self.descriptor::<S>((d, nested), line, &place, &ancestry, inherited);

            let Some(key) = place.key else { continue };
            if let Some(first) = level.position(&key, place.value.as_deref()) {
                let at = lines
                    .get(first)
                    .copied()
                    .flatten()
                    .map(|l| format!(" (first defined at line {l})"))
                    .unwrap_or_default();
                self.error(
                    key_line,
                    &rule.path,
                    format!("duplicate descriptor `{}` at this level{at}", place.segment),
                );
                continue;
            }
            let value = place.value;
            level.insert(&key, value.as_deref(), {
                let key = key.clone();
                Node {
                    key,
                    value: value.clone(),
                    rule,
                    children,
                }
            });
            lines.push(line);
        }
        level
    }

    /// One descriptor at `place` (its line `line`): its rule, and its nested descriptors
    /// compiled one level deeper.
    fn descriptor<S: Source>(
        &mut self,
        (d, nested): (RawDescriptor, S::Nested),
        line: Option<usize>,
        place: &Place,
        ancestry: &Ancestry<'_>,
        inherited: HeaderPolicy,
    ) -> (Rule, Level) {
        let Ancestry {
            depth,
            shared,
            stat,
        } = *ancestry;
        let path = place.path.as_str();
        self.key(d.key.as_ref(), line, path);
        self.extras(
            &d.extra,
            path,
            DESCRIPTOR_FIELDS,
            UNSUPPORTED_DESCRIPTOR_FIELDS,
        );
        let limits = self.limits(
            RawLimits {
                rate_limit: d.rate_limit,
                rate_limit_line: d.rate_limit_line,
                rate_limits: d.rate_limits,
                rate_limits_line: d.rate_limits_line,
            },
            path,
        );
        let over_limit = self.over_limit(d.over_limit.as_ref(), &limits.limits, path);
        let shares_threshold = d.share_threshold.as_ref().is_some_and(|s| s.value);
        let shared_values = self.shared_values(
            d.share_threshold.as_ref(),
            place.value.as_deref(),
            depth,
            shared,
            path,
        );
        let value_to_metric = d.value_to_metric.unwrap_or(false);
        let detailed_metric = d.detailed_metric.unwrap_or(false);
        let mut stat = stat.to_vec();
        stat.push(stat_path::segment(
            place.key.as_deref().unwrap_or_default(),
            place.value.as_deref(),
            value_to_metric,
            shares_threshold,
        ));
        let headers = self.headers(d.response_headers, d.response_headers_line, path, inherited);
        let children = self.level(nested, path, depth + 1, &shared_values, &stat, headers);
        let rule = Rule {
            path: place.path.clone(),
            limit: limits.limit,
            limits: limits.limits,
            name: limits.name,
            replaces: limits.replaces,
            shadow_mode: d.shadow_mode.unwrap_or(false),
            quota_mode: d.quota_mode.unwrap_or(false),
            detailed_metric,
            value_to_metric,
            over_limit,
            stat: stat_path::rule_path(&stat, detailed_metric, &shared_values, &place.path),
            shared_values,
            headers,
            metadata: d.metadata.and_then(Metadata::from_json),
        };
        (rule, children)
    }

    /// A descriptor's `key`: required, not empty.
    fn key(&mut self, key: Option<&Spanned<String>>, line: Option<usize>, path: &str) {
        match key {
            None => self.error(line, path, "descriptor has no `key`"),
            Some(k) if k.value.is_empty() => self.error(
                line_of(&k.referenced),
                path,
                "descriptor has an empty `key`",
            ),
            Some(_) => {}
        }
    }

    /// The ancestors' `share_threshold` wildcards, and this descriptor's own when it sets
    /// `share_threshold: true` on a `value` with a `*` (anything else is an error).
    fn shared_values(
        &mut self,
        share: Option<&Spanned<bool>>,
        value: Option<&str>,
        depth: usize,
        shared: &[(usize, String)],
        path: &str,
    ) -> Vec<(usize, String)> {
        let mut shared_here = shared.to_vec();
        // `share_threshold: false` is the default, wherever it is written (renderings of
        // envoyproxy/ratelimit's structs write it on every descriptor).
        if let Some(share) = share.filter(|s| s.value) {
            match value {
                Some(v) if v.contains('*') => shared_here.push((depth, v.to_string())),
                _ => self.error(
                    line_of(&share.referenced),
                    path,
                    "`share_threshold` applies only to a descriptor whose `value` holds a `*` wildcard",
                ),
            }
        }
        shared_here
    }
}

/// What a descriptor inherits from the levels above it: its depth (its entry's index in a
/// request), their `share_threshold` wildcards by depth and their stat-key segments.
#[derive(Clone, Copy)]
struct Ancestry<'a> {
    depth: usize,
    shared: &'a [(usize, String)],
    stat: &'a [StatSegment],
}

/// Where a descriptor sits: its key and value (an empty one counts as none, as in
/// envoyproxy/ratelimit), its segment of the config path (`key_value`, or `key`) and the
/// path itself (the parent's, then `.` and the segment).
struct Place {
    key: Option<String>,
    value: Option<String>,
    segment: String,
    path: String,
}

impl Place {
    fn of(d: &RawDescriptor, parent: &str) -> Place {
        let non_empty = |s: &Option<Spanned<String>>| {
            s.as_ref()
                .map(|s| s.value.clone())
                .filter(|s| !s.is_empty())
        };
        let (key, value) = (non_empty(&d.key), non_empty(&d.value));
        let segment = match (&key, &value) {
            (Some(k), Some(v)) => format!("{k}_{v}"),
            (Some(k), None) => k.clone(),
            (None, _) => "(no key)".to_string(),
        };
        let path = if parent.is_empty() {
            segment.clone()
        } else {
            format!("{parent}.{segment}")
        };
        Place {
            key,
            value,
            segment,
            path,
        }
    }
}
