//! A bucket of the Rate Limit Quota Service read as a descriptor: its entries (a map, in no
//! order) in the order of a path of the rule tree, so that it reaches the rule, and the limiter
//! keys, the same descriptor reaches on the RLS path (docs/rlqs.md, "Which rule a bucket gets").
//!
//! Why in the config: the order is the tree's, and only the tree knows which keys each level
//! names; the quota service and `sluice explain` both read buckets through this one function.

use super::Config;
use super::tree::Level;
use crate::descriptor::Entry;

impl Config {
    /// A bucket of the Rate Limit Quota Service (its entries, in no order) as a descriptor: its
    /// entries in the order of a path of the domain's rule tree that places them all. The path
    /// is searched depth first: at each level, the keys of the bucket that a descriptor of the
    /// level names, in config order, each governing the entry's value as [`Config::lookup`]
    /// matches it (exact, wildcard, key-only); the first path that places every entry wins.
    /// When none does (or the search takes more than [`BUCKET_SEARCH_STEPS`] steps), the
    /// entries go in the order of the first choice at each level, then the rest in key order,
    /// so that [`Config::lookup`] of the result finds no rule, and [`Config::trace`] says where
    /// it stopped. An unknown domain gives the entries in key order.
    pub fn bucket_entries<'b>(
        &self,
        domain: &str,
        bucket: impl IntoIterator<Item = (&'b str, &'b str)>,
    ) -> Vec<Entry> {
        let mut left: Vec<(&str, &str)> = bucket.into_iter().collect();
        left.sort_unstable();
        let mut placed = Vec::with_capacity(left.len());
        if let Some(domain) = self.by_name.get(domain).and_then(|&i| self.domains.get(i)) {
            let mut steps = BUCKET_SEARCH_STEPS;
            if !place_all(&domain.root, &mut left, &mut placed, &mut steps) {
                let mut level = &domain.root;
                while let Some(&(i, node)) = level.governing(&left).first() {
                    placed.push(left.remove(i));
                    level = &node.children;
                }
            }
        }
        placed
            .into_iter()
            .chain(left)
            .map(|(key, value)| Entry::new(key, value))
            .collect()
    }
}

/// Steps [`Config::bucket_entries`] may take to place a bucket's entries: a bucket of a few
/// entries takes a handful; the bound keeps a hostile bucket against a wide, deep tree cheap.
pub const BUCKET_SEARCH_STEPS: usize = 4096;

/// Moves every entry of `left` to `placed` along a path from `level` down (depth first, in the
/// order of [`Level::governing`]); false, with both as they were, when no path places them all
/// within `steps`.
fn place_all<'b>(
    level: &Level,
    left: &mut Vec<(&'b str, &'b str)>,
    placed: &mut Vec<(&'b str, &'b str)>,
    steps: &mut usize,
) -> bool {
    if left.is_empty() {
        return true;
    }
    for (i, node) in level.governing(left) {
        if *steps == 0 {
            return false;
        }
        *steps -= 1;
        placed.push(left.remove(i));
        if place_all(&node.children, left, placed, steps) {
            return true;
        }
        if let Some(entry) = placed.pop() {
            left.insert(i, entry);
        }
    }
    false
}
