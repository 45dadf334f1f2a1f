//! What one config file may cost to read: its size in bytes, and the YAML parser's limits on
//! nodes, nesting and aliases, each a flag of `sluice serve` and `sluice check-config`, honoured
//! at start-up and on every reload.
//!
//! Why limits at all: YAML aliases make a small file expand into a huge one (the "billion laughs"
//! file: ten anchors of ten aliases each stand for 10^10 nodes), and each nesting level costs
//! stack in the parser. Why flags: a large but honest config (many descriptors, one anchor shared
//! by hundreds of limits) must be loadable by raising a limit, and the error must say which one
//! (`YAML node limit exceeded: ... raise with --max-yaml-nodes`), not call the file malformed.

use serde_saphyr::budget::BudgetBreach;

/// The limits of one load; [`ConfigLimits::default`] holds the defaults of the flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConfigLimits {
    /// Bytes of the config, all of its files together (`--max-config-bytes`).
    pub max_bytes: u64,
    /// YAML nodes (scalars, sequences, mappings) in one file, aliases counted where they are
    /// used (`--max-yaml-nodes`).
    pub max_yaml_nodes: usize,
    /// YAML nesting levels of one file (`--max-yaml-depth`).
    pub max_yaml_depth: usize,
    /// Aliases per anchor in one file, checked once it has [`ALIAS_RATIO_FROM`] aliases
    /// (`--max-yaml-aliases-per-anchor`).
    pub max_yaml_aliases_per_anchor: usize,
}

impl ConfigLimits {
    pub const DEFAULT_MAX_BYTES: u64 = 16 * 1024 * 1024;
    pub const DEFAULT_MAX_YAML_NODES: usize = 250_000;
    /// Deserialization recurses once per level, and in debug builds a level costs tens of KB of
    /// stack: 32 levels keep a load under about 1 MiB of stack and still allow 14 levels of
    /// nested descriptors (envoyproxy configs rarely use more than 4). A deeper limit is parsed
    /// on a thread with a stack to match ([`ConfigLimits::parser_stack_bytes`]).
    pub const DEFAULT_MAX_YAML_DEPTH: usize = 32;
    /// Deepest nesting the flag accepts.
    pub const MAX_YAML_DEPTH: usize = 1024;
    pub const DEFAULT_MAX_YAML_ALIASES_PER_ANCHOR: usize = 10;

    /// The parser budget of these limits; the parser's other limits keep its defaults, except
    /// its event count, which grows with the node limit (a node is one or two events).
    pub(crate) fn budget(&self) -> serde_saphyr::Budget {
        let mut budget = serde_saphyr::Budget::default();
        budget.max_nodes = self.max_yaml_nodes;
        budget.max_depth = self.max_yaml_depth.min(Self::MAX_YAML_DEPTH);
        budget.max_events = budget.max_events.max(self.max_yaml_nodes.saturating_mul(4));
        budget.alias_anchor_min_aliases = ALIAS_RATIO_FROM;
        budget.alias_anchor_ratio_multiplier = self.max_yaml_aliases_per_anchor;
        budget
    }

    /// Stack a parse under these limits needs: `None` for the default depth or less (it fits
    /// the 2 MiB of any thread sluice loads on), else 64 KiB per level (measured: about 30 in a
    /// debug build) and 1 MiB more.
    pub(crate) fn parser_stack_bytes(&self) -> Option<usize> {
        (self.max_yaml_depth > Self::DEFAULT_MAX_YAML_DEPTH)
            .then(|| (1 << 20) + self.max_yaml_depth.min(Self::MAX_YAML_DEPTH) * (64 << 10))
    }

    /// The message of a parser budget breach under these limits: which limit, by how much, and
    /// the flag that raises it.
    pub(crate) fn breach_message(&self, breach: &BudgetBreach) -> String {
        match breach {
            BudgetBreach::Nodes { nodes } => format!(
                "YAML node limit exceeded: {nodes} nodes (scalars, sequences, mappings, aliases \
                 expanded) of at most {}; raise with --max-yaml-nodes",
                self.max_yaml_nodes
            ),
            BudgetBreach::Depth { depth } => format!(
                "YAML nesting limit exceeded: {depth} levels of at most {} (about {} levels of \
                 nested descriptors); raise with --max-yaml-depth",
                self.max_yaml_depth,
                (self.max_yaml_depth / 2).saturating_sub(2)
            ),
            BudgetBreach::AliasAnchorRatio { aliases, anchors } => format!(
                "YAML alias limit exceeded: {aliases} aliases of {anchors} anchor(s), at most {} \
                 per anchor once a file has {ALIAS_RATIO_FROM}; raise with \
                 --max-yaml-aliases-per-anchor",
                self.max_yaml_aliases_per_anchor
            ),
            other => format!("YAML limit exceeded: {other:?}"),
        }
    }
}

/// Aliases a file may use before the aliases-per-anchor limit applies.
pub const ALIAS_RATIO_FROM: usize = 100;

impl Default for ConfigLimits {
    fn default() -> Self {
        ConfigLimits {
            max_bytes: Self::DEFAULT_MAX_BYTES,
            max_yaml_nodes: Self::DEFAULT_MAX_YAML_NODES,
            max_yaml_depth: Self::DEFAULT_MAX_YAML_DEPTH,
            max_yaml_aliases_per_anchor: Self::DEFAULT_MAX_YAML_ALIASES_PER_ANCHOR,
        }
    }
}
