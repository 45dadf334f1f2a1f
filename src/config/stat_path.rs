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

/// A rule's stat key, one segment per level from the domain down (shared, cheap to clone).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StatPath(Arc<[StatSegment]>);

impl StatPath {
    pub fn segments(&self) -> &[StatSegment] {
        &self.0
    }

    /// Whether the key takes anything from the request (otherwise it is the same for every
    /// request of the rule).
    pub fn uses_request_values(&self) -> bool {
        self.0
            .iter()
            .any(|s| matches!(s.value, StatValue::Requested { .. }))
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
/// from the request (`shared`: the `share_threshold` wildcards by depth).
pub(crate) fn rule_path(
    segments: &[StatSegment],
    detailed_metric: bool,
    shared: &[(usize, String)],
) -> StatPath {
    if !detailed_metric {
        return StatPath(segments.into());
    }
    StatPath(
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
