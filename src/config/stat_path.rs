//! How envoyproxy/ratelimit names a rule's stats: the key between the domain and the stat
//! (`ratelimit.service.rate_limit.<domain>.<key>.over_limit`), one segment per descriptor level,
//! each either fixed by the config or taken from the request's entry at that depth.
//!
//! Why here: the key is a property of the config, fixed when a rule is compiled. Its only
//! request-dependent parts are the values that `detailed_metric`, `value_to_metric` and
//! wildcards put in it, and which levels those are depends on the rule's ancestors (each
//! level's own `value_to_metric`, its match kind, `share_threshold`), which only the compiler
//! sees. So the compiler writes a [`StatPath`] per rule, the engine hands it out with each
//! verdict (an `Arc`, no copy), and the metrics layer renders it with the request's entries.
//! The rules are envoyproxy/ratelimit's `GetLimit` (its `config_impl.go`), level by level:
//! - a descriptor with a value (`key_value`): that value;
//! - a key-only descriptor: the key alone, or with `value_to_metric` the request's value
//!   (`key_value`, or `key` when the request's value is empty);
//! - a wildcard (`key_pre*`): the pattern, or with `value_to_metric` (and no
//!   `share_threshold`) the request's value;
//! - a rule with `detailed_metric`: every level `key_` + the request's value (even an empty
//!   one), except levels matched by a `share_threshold` wildcard, which keep the pattern (and
//!   then the other levels drop the `_` of an empty value).

use std::sync::Arc;

/// What a [`StatSegment`] puts after its key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StatValue {
    /// The key alone.
    Omitted,
    /// `key_` and this value, fixed by the config.
    Configured(String),
    /// `key_` and the request's value at this depth; with `keep_empty` false, an empty value
    /// leaves the key alone.
    Requested { keep_empty: bool },
}

/// One level of a [`StatPath`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatSegment {
    pub key: String,
    pub value: StatValue,
}

/// A rule's stat key below the domain.
///
/// Most rules take nothing from the request and name their stats exactly as their config
/// path reads (`key_value` levels, `key` alone where there is no value, joined by `.`): those
/// store nothing ([`StatPath::Path`]), and the key is rendered from the rule's path. Only a
/// path that takes the request's values (or, rarely, reads otherwise than the rule's path)
/// keeps its segments, shared: a push of 100,000 rules would otherwise hold 100,000 copies of
/// what their paths already say (docs/security.md, the memory a rule costs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum StatPath {
    /// The rule's own config path, as it reads.
    #[default]
    Path,
    /// One segment per level from the domain down.
    Segments(Arc<[StatSegment]>),
}

impl StatPath {
    /// Whether the key takes anything from the request (otherwise it is the same for every
    /// request of the rule).
    pub fn uses_request_values(&self) -> bool {
        match self {
            StatPath::Path => false,
            StatPath::Segments(segments) => segments
                .iter()
                .any(|s| matches!(s.value, StatValue::Requested { .. })),
        }
    }

    /// Appends the key to `out` (which holds the domain): `rule_path` is the rule's config
    /// path, `values` the request's entry values by depth.
    pub fn render<'a>(
        &self,
        out: &mut String,
        rule_path: &str,
        values: impl Fn(usize) -> Option<&'a str>,
    ) {
        match self {
            StatPath::Path => {
                if !rule_path.is_empty() {
                    out.push('.');
                    out.push_str(rule_path);
                }
            }
            StatPath::Segments(segments) => {
                for (depth, segment) in segments.iter().enumerate() {
                    segment.render(out, values(depth).unwrap_or(""));
                }
            }
        }
    }
}

impl StatSegment {
    /// Appends `.key`, then `_value` as this level names it (`requested`: the request's value
    /// at this depth).
    fn render(&self, out: &mut String, requested: &str) {
        match &self.value {
            StatValue::Omitted => push_segment(out, &self.key, "", false),
            StatValue::Configured(v) => push_segment(out, &self.key, v, true),
            StatValue::Requested { keep_empty } => {
                push_segment(out, &self.key, requested, *keep_empty)
            }
        }
    }
}

/// `.key`, then `_value` when the value is not empty (or always, with `keep_empty`).
pub fn push_segment(out: &mut String, key: &str, value: &str, keep_empty: bool) {
    out.push('.');
    out.push_str(key);
    if keep_empty || !value.is_empty() {
        out.push('_');
        out.push_str(value);
    }
}

/// The segment a descriptor adds below its parent's (without `detailed_metric`).
pub(crate) fn segment(
    key: &str,
    value: Option<&str>,
    value_to_metric: bool,
    shares_threshold: bool,
) -> StatSegment {
    let value = match value {
        None if value_to_metric => StatValue::Requested { keep_empty: false },
        None => StatValue::Omitted,
        Some(v) if v.contains('*') && value_to_metric && !shares_threshold => {
            StatValue::Requested { keep_empty: false }
        }
        Some(v) => StatValue::Configured(v.to_owned()),
    };
    StatSegment {
        key: key.to_owned(),
        value,
    }
}

/// A rule's path: its ancestors' segments and its own, or with `detailed_metric` every level
/// from the request (`shared`: the `share_threshold` wildcards by depth). `rule_path` is the
/// rule's config path: a key that reads as it does stores nothing.
pub(crate) fn rule_path(
    segments: &[StatSegment],
    detailed_metric: bool,
    shared: &[(usize, String)],
    rule_path: &str,
) -> StatPath {
    if !detailed_metric {
        let fixed = !segments
            .iter()
            .any(|s| matches!(s.value, StatValue::Requested { .. }));
        if fixed {
            let mut text = String::new();
            for s in segments {
                s.render(&mut text, "");
            }
            if text.strip_prefix('.').unwrap_or(&text) == rule_path {
                return StatPath::Path;
            }
        }
        return StatPath::Segments(segments.into());
    }
    StatPath::Segments(
        segments
            .iter()
            .enumerate()
            .map(|(depth, s)| {
                let value = match shared.iter().find(|(d, _)| *d == depth) {
                    Some((_, pattern)) => StatValue::Configured(pattern.clone()),
                    None => StatValue::Requested {
                        keep_empty: shared.is_empty(),
                    },
                };
                StatSegment {
                    key: s.key.clone(),
                    value,
                }
            })
            .collect(),
    )
}
