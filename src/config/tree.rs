//! The compiled lookup tree: one [`Level`] per descriptor nesting level, matched entry by entry.
//!
//! Why this shape: lookups run for every descriptor of every request, so a level indexes its
//! nodes by key first (one hash probe with the borrowed request key), then by exact value (a
//! second probe with the borrowed value), then scans the few wildcard nodes of that key in
//! config order, then falls back to the key-only node. Nothing is allocated per lookup.

use super::Unit;
use super::stat_path::StatPath;
use crate::metadata::Metadata;
use std::collections::HashMap;

/// The limit a rule sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitSpec {
    /// `unlimited: true`: always allowed, never counted.
    Unlimited,
    PerUnit {
        requests_per_unit: u32,
        unit: Unit,
    },
}

/// How a limit counts (sluice extension `algorithm`; see docs/algorithms.md). The decision
/// engine maps it onto the limiter's algorithm.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LimitAlgorithm {
    #[default]
    SlidingLog,
    QuantizedLog {
        quantum_ms: u64,
    },
    SlidingCounter,
    Gcra {
        burst: u32,
    },
    FixedWindow,
    /// At most `requests_per_unit` requests in flight, each counted until it is done or its
    /// lease (the limit's `window_ms`) runs out.
    InFlight,
}

impl LimitAlgorithm {
    /// The config name.
    pub const fn name(self) -> &'static str {
        match self {
            LimitAlgorithm::SlidingLog => "sliding_log",
            LimitAlgorithm::QuantizedLog { .. } => "quantized_log",
            LimitAlgorithm::SlidingCounter => "sliding_counter",
            LimitAlgorithm::Gcra { .. } => "gcra",
            LimitAlgorithm::FixedWindow => "fixed_window",
            LimitAlgorithm::InFlight => "in_flight",
        }
    }
}

/// One counted limit of a rule: `rate_limit`, or one entry of `rate_limits`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limit {
    pub requests_per_unit: u32,
    /// The unit reported to Envoy: the configured `unit`, or for a custom `window` the nearest
    /// unit ([`Unit::nearest`]).
    pub unit: Unit,
    /// The real window length (for `in_flight`, the lease).
    pub window_ms: u64,
    pub algorithm: LimitAlgorithm,
    pub name: Option<String>,
}

/// What a request that does not fit records on a rule's limits (sluice extension `over_limit`;
/// docs/algorithms.md, "Costs charged after the response"). The decision engine maps it onto
/// the limiter's `OverLimit`, whose doc defines each setting.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum OverLimitSetting {
    /// Nothing: a refused request costs nothing.
    Refuse,
    /// A cost that did not fit fills the window to its limit (the default).
    #[default]
    Fill,
    /// The whole cost, even past the limit.
    Record,
}

impl OverLimitSetting {
    /// The settings by config name.
    pub const NAMES: [(&'static str, OverLimitSetting); 3] = [
        ("refuse", OverLimitSetting::Refuse),
        ("fill", OverLimitSetting::Fill),
        ("record", OverLimitSetting::Record),
    ];

    pub fn parse(name: &str) -> Option<OverLimitSetting> {
        Self::NAMES
            .into_iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, s)| s)
    }

    pub fn as_str(self) -> &'static str {
        Self::NAMES
            .into_iter()
            .find(|&(_, s)| s == self)
            .map_or("fill", |(n, _)| n)
    }
}

/// Which rate-limit response headers a rule asks for (sluice extension `response_headers`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum HeaderFormat {
    /// No headers: envoyproxy/ratelimit's behaviour, and the default.
    #[default]
    None,
    /// IETF draft-ietf-httpapi-ratelimit-headers: `RateLimit` and `RateLimit-Policy`.
    Draft,
    /// `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset`.
    Legacy,
}

impl HeaderFormat {
    pub fn parse(name: &str) -> Option<HeaderFormat> {
        [
            ("none", HeaderFormat::None),
            ("draft", HeaderFormat::Draft),
            ("legacy", HeaderFormat::Legacy),
        ]
        .into_iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, f)| f)
    }
}

/// A rule's response-header policy, resolved: the descriptor's own `response_headers`, else its
/// parent's, else the domain's, field by field.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HeaderPolicy {
    pub format: HeaderFormat,
    /// Public endpoints: tell the limit and the reset, never the exact remaining count.
    pub hide_remaining: bool,
}

/// One config descriptor, compiled.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rule {
    /// Config path of this descriptor: `key_value` segments (`key` when it has no value) joined
    /// by `.`, e.g. `client.path`, `database_users`, `path_/api/*`. The domain is not included.
    pub path: String,
    /// `None`: this node has no `rate_limit` (a whitelist when a request ends here). With
    /// stacked `rate_limits`, the first of them.
    pub limit: Option<LimitSpec>,
    /// Every counted limit (one for `rate_limit`, several for `rate_limits`); empty when
    /// `limit` is `None` or `Unlimited`. A request is admitted only if all of them admit.
    pub limits: Vec<Limit>,
    /// `rate_limit.name`.
    pub name: Option<String>,
    /// The names listed in `rate_limit.replaces`.
    pub replaces: Vec<String>,
    pub shadow_mode: bool,
    /// `quota_mode`: over its limit, this rule fails a request only when every quota-mode
    /// descriptor of the request is over too.
    pub quota_mode: bool,
    pub detailed_metric: bool,
    /// `value_to_metric`: metrics name this rule with the request's values, not the config's.
    pub value_to_metric: bool,
    /// `over_limit` (sluice extension): what a request that does not fit records.
    pub over_limit: OverLimitSetting,
    /// Entries (by depth) matched by a `share_threshold` wildcard, with the wildcard: every
    /// value matching it shares one counter, so the limiter key uses the wildcard, not the value.
    pub shared_values: Vec<(usize, String)>,
    pub headers: HeaderPolicy,
    /// How envoyproxy/ratelimit names this rule's stats (`detailed_metric`, `value_to_metric`
    /// and wildcards included).
    pub stat: StatPath,
    /// `metadata`: what responses this rule's limit admits carry in their dynamic metadata
    /// when `--response-dynamic-metadata` is on; `None` when absent or empty.
    pub metadata: Option<Metadata>,
}

/// How the node of a request's last entry was matched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatchKind {
    /// Config key and value equal the entry's.
    Exact,
    /// Config value holds `*` and matches the entry's value.
    Wildcard,
    /// Config descriptor has a key and no value.
    KeyOnly,
}

/// The result of [`Config::lookup`](super::Config::lookup).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup<'a> {
    /// The request names a domain no config file defines.
    UnknownDomain,
    /// No rule governs the request's last entry: some entry matched nothing, a matched node had
    /// no children for the next entry, or the request is deeper than the config.
    NoRule,
    /// The node matched at the request's last entry. Its `limit` may be `None`: whitelisted.
    Rule { rule: &'a Rule, kind: MatchKind },
}

/// A compiled descriptor and its nested descriptors.
#[derive(Debug, Clone, Default)]
pub(crate) struct Node {
    /// The descriptor's key and value as configured (kept for merging levels).
    pub key: String,
    pub value: Option<String>,
    pub rule: Rule,
    pub children: Level,
}

/// The nodes of one key at one level.
#[derive(Debug, Clone, Default)]
struct KeySlot {
    /// Every node with a value, wildcard ones included (a request value may equal a pattern).
    exact: HashMap<String, usize>,
    /// Nodes whose value contains `*`, in config order: (pattern, node index).
    wildcard: Vec<(String, usize)>,
    key_only: Option<usize>,
}

/// One nesting level: its nodes in config order, indexed by key.
#[derive(Debug, Clone, Default)]
pub(crate) struct Level {
    nodes: Vec<Node>,
    by_key: HashMap<String, KeySlot>,
}

impl Level {
    /// An empty level with room for `nodes` nodes: a level of 100,000 descriptors is built
    /// without growing (and copying) its node vector on the way.
    pub fn with_capacity(nodes: usize) -> Self {
        Level {
            nodes: Vec::with_capacity(nodes),
            by_key: HashMap::new(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The index of the node defined for exactly `key` and `value` (`None`: key-only).
    pub fn position(&self, key: &str, value: Option<&str>) -> Option<usize> {
        let slot = self.by_key.get(key)?;
        match value {
            Some(v) => slot.exact.get(v).copied(),
            None => slot.key_only,
        }
    }

    /// Adds a node. The caller rejects duplicates; should one arrive anyway, the first node
    /// keeps the index entry.
    pub fn insert(&mut self, key: &str, value: Option<&str>, node: Node) {
        let index = self.nodes.len();
        self.nodes.push(node);
        let slot = self.by_key.entry(key.to_string()).or_default();
        match value {
            Some(v) => {
                if slot.exact.contains_key(v) {
                    return;
                }
                slot.exact.insert(v.to_string(), index);
                if v.contains('*') {
                    slot.wildcard.push((v.to_string(), index));
                }
            }
            None => {
                if slot.key_only.is_none() {
                    slot.key_only = Some(index);
                }
            }
        }
    }

    /// The node governing one request entry: exact value, else first matching wildcard, else
    /// key-only.
    pub fn find(&self, key: &str, value: &str) -> Option<(&Node, MatchKind)> {
        let slot = self.by_key.get(key)?;
        let (index, kind) = if let Some(&i) = slot.exact.get(value) {
            (i, MatchKind::Exact)
        } else if let Some((_, i)) = slot.wildcard.iter().find(|(p, _)| wildcard_match(p, value)) {
            (*i, MatchKind::Wildcard)
        } else {
            (slot.key_only?, MatchKind::KeyOnly)
        };
        self.nodes.get(index).map(|node| (node, kind))
    }

    /// For a bucket's `entries` (key, value): the nodes of this level that govern one of them,
    /// in config order of each key's first node, one per key (the node [`Level::find`] gives
    /// for that entry's value: exact, wildcard, key-only), each with the entry's index.
    pub fn governing(&self, entries: &[(&str, &str)]) -> Vec<(usize, &Node)> {
        self.nodes
            .iter()
            .enumerate()
            .filter_map(|(index, node)| {
                let i = entries.iter().position(|&(key, _)| key == node.key)?;
                // Each key once: at the first of its nodes.
                if self.nodes[..index]
                    .iter()
                    .any(|earlier| earlier.key == node.key)
                {
                    return None;
                }
                let (found, _) = self.find(entries[i].0, entries[i].1)?;
                Some((i, found))
            })
            .collect()
    }

    /// Whether a node with this key and value is already at this level.
    pub fn contains(&self, key: &str, value: Option<&str>) -> bool {
        self.by_key.get(key).is_some_and(|slot| match value {
            Some(v) => slot.exact.contains_key(v),
            None => slot.key_only.is_some(),
        })
    }

    /// Moves `other`'s top-level nodes into this level (merging one domain across files).
    /// Returns the config paths of `other`'s nodes already present here; those are left out.
    pub fn merge(&mut self, other: Level) -> Vec<String> {
        let mut conflicts = Vec::new();
        for node in other.nodes {
            if self.contains(&node.key, node.value.as_deref()) {
                conflicts.push(node.rule.path);
            } else {
                let (key, value) = (node.key.clone(), node.value.clone());
                self.insert(&key, value.as_deref(), node);
            }
        }
        conflicts
    }

    /// Every rule at this level and below, depth first in config order, each with whether its
    /// descriptor has nested descriptors.
    pub fn collect_rules<'a>(&'a self, out: &mut Vec<(&'a Rule, bool)>) {
        for node in &self.nodes {
            out.push((&node.rule, !node.children.nodes.is_empty()));
            node.children.collect_rules(out);
        }
    }

    /// Number of nodes with a rate_limit, at this level and below.
    pub fn rule_count(&self) -> usize {
        self.nodes
            .iter()
            .map(|n| usize::from(n.rule.limit.is_some()) + n.children.rule_count())
            .sum()
    }
}

/// Glob match where `*` matches any run of characters (possibly empty) and every other
/// character matches itself. A trailing `*` is thus a prefix match, as in envoyproxy/ratelimit.
///
/// Linear-space, no recursion: the classic backtrack-to-last-star algorithm, at worst
/// O(pattern × text). Works on bytes; `*` is ASCII so UTF-8 text cannot be split wrongly.
pub(crate) fn wildcard_match(pattern: &str, text: &str) -> bool {
    let p = pattern.as_bytes();
    let t = text.as_bytes();
    let (mut pi, mut ti) = (0usize, 0usize);
    // (index of the last `*` in p, index in t it currently resumes from)
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        match p.get(pi) {
            Some(b'*') => {
                star = Some((pi, ti));
                pi += 1;
            }
            Some(&c) if t.get(ti) == Some(&c) => {
                pi += 1;
                ti += 1;
            }
            _ => match star {
                Some((sp, st)) => {
                    pi = sp + 1;
                    ti = st + 1;
                    star = Some((sp, st + 1));
                }
                None => return false,
            },
        }
    }
    p.get(pi..)
        .is_some_and(|rest| rest.iter().all(|&c| c == b'*'))
}

#[cfg(test)]
mod tests {
    use super::{OverLimitSetting, wildcard_match};
    use proptest::prelude::*;

    #[test]
    fn over_limit_settings_by_name() {
        for (name, setting) in [
            ("refuse", OverLimitSetting::Refuse),
            ("fill", OverLimitSetting::Fill),
            ("record", OverLimitSetting::Record),
        ] {
            assert_eq!(setting.as_str(), name);
            assert_eq!(OverLimitSetting::parse(name), Some(setting));
            assert_eq!(OverLimitSetting::parse(&name.to_uppercase()), Some(setting));
        }
        assert_eq!(OverLimitSetting::parse("drop"), None);
    }

    #[test]
    fn wildcard_cases() {
        assert!(wildcard_match("/api/*", "/api/"));
        assert!(wildcard_match("/api/*", "/api/users/1"));
        assert!(!wildcard_match("/api/*", "/ap"));
        assert!(!wildcard_match("/api/*", "/v2/api/x"));
        assert!(wildcard_match("*", ""));
        assert!(wildcard_match("a*b*c", "aXXbYYc"));
        assert!(wildcard_match("a*b*c", "abc"));
        assert!(!wildcard_match("a*b*c", "aXXbYY"));
        assert!(wildcard_match("*.example.com", "api.example.com"));
        assert!(!wildcard_match("*.example.com", "example.com"));
        assert!(wildcard_match("a**", "a"));
        assert!(!wildcard_match("abc", "abcd"));
        assert!(wildcard_match("é*", "été"));
    }

    proptest! {
        /// A trailing `*` is exactly a prefix match.
        #[test]
        fn trailing_star_is_prefix(prefix in "[a-c/*]{0,5}", text in "[a-c/]{0,8}") {
            let prefix = prefix.replace('*', "");
            let pattern = format!("{prefix}*");
            prop_assert_eq!(wildcard_match(&pattern, &text), text.starts_with(&prefix));
        }

        /// Without `*` a pattern matches only itself.
        #[test]
        fn no_star_is_equality(p in "[ab]{0,4}", t in "[ab]{0,4}") {
            prop_assert_eq!(wildcard_match(&p, &t), p == t);
        }
    }
}
