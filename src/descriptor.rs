//! Request descriptors and the one function that turns them into limiter keys.
//!
//! Why one pure function: the key decides whose quota a request spends. If two distinct
//! descriptors ever mapped to the same key, one client could spend another's quota, so the
//! mapping must be injective whatever bytes Envoy puts in a value (separators, braces,
//! newlines, 10 KB strings), and short enough for Redis. Each part is escaped so the separators
//! can never appear inside it; a body that would be long is replaced by a SHA-256 digest of the
//! escaped (still injective) body. The whole body sits inside a Redis Cluster hash tag, so one
//! limiter key is one slot.

use sha2::{Digest, Sha256};
use std::fmt::Write as _;

/// One `key=value` pair of a request descriptor, as Envoy sent it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Entry {
    pub key: String,
    pub value: String,
}

impl Entry {
    pub fn new(key: impl Into<String>, value: impl Into<String>) -> Self {
        Entry {
            key: key.into(),
            value: value.into(),
        }
    }
}

/// Prefix of every key sluice writes, so its keys are easy to find and never clash with others.
pub const KEY_PREFIX: &str = "sluice:";

/// Escaped bodies longer than this are replaced by their digest.
const MAX_BODY_LEN: usize = 96;

/// Builds the limiter key for `entries` of `domain` under a window of `window_ms`.
///
/// The window is part of the key so that a limit override or a config change of unit starts a
/// log of its own instead of reading one kept for another window length; a change of
/// `requests_per_unit` alone keeps the log.
pub fn limiter_key(domain: &str, entries: &[Entry], window_ms: u64) -> String {
    limiter_key_with_prefix(KEY_PREFIX, domain, entries, window_ms)
}

/// Checks an operator-chosen key prefix (`CACHE_KEY_PREFIX`): it sits before the hash tag, so
/// braces would move the tag; a long one would waste memory in every key.
pub fn validate_key_prefix(prefix: &str) -> Result<(), String> {
    if prefix.contains(['{', '}']) {
        return Err(format!(
            "key prefix `{prefix}` must not contain `{{` or `}}` (they would move the Redis Cluster hash tag)"
        ));
    }
    if prefix.len() > 64 {
        return Err(format!("key prefix is {} bytes; at most 64", prefix.len()));
    }
    Ok(())
}

/// [`limiter_key`] under another prefix (validated by [`validate_key_prefix`]).
pub fn limiter_key_with_prefix(
    prefix: &str,
    domain: &str,
    entries: &[Entry],
    window_ms: u64,
) -> String {
    limiter_key_tagged(prefix, domain, entries, window_ms, "")
}

/// [`limiter_key_with_prefix`] with a `tag` after the window, which keeps the keys of other
/// algorithms and of stacked limits apart (`|tag`; an empty tag gives the untagged key). Tags
/// are made by the engine from `[a-z0-9]` and start with a letter, so a tagged body never
/// equals an untagged one (whose last part is all digits) nor one with more entries (whose
/// parts hold `=`).
pub fn limiter_key_tagged(
    prefix: &str,
    domain: &str,
    entries: &[Entry],
    window_ms: u64,
    tag: &str,
) -> String {
    // One allocation: the body is escaped in place after `prefix{`, and replaced by its digest
    // when it turns out long.
    let mut key = String::with_capacity(prefix.len() + 64);
    key.push_str(prefix);
    key.push('{');
    let body = key.len();
    escape_into(&mut key, domain);
    for entry in entries {
        key.push('|');
        escape_into(&mut key, &entry.key);
        key.push('=');
        escape_into(&mut key, &entry.value);
    }
    let _ = write!(key, "|{window_ms}");
    if !tag.is_empty() {
        key.push('|');
        escape_into(&mut key, tag);
    }
    if key.len() - body > MAX_BODY_LEN {
        // `#` is escaped inside parts, so a digest body never equals a plain one.
        let digest = Sha256::digest(&key.as_bytes()[body..]);
        key.truncate(body);
        key.push('#');
        for byte in &digest[..16] {
            let _ = write!(key, "{byte:02x}");
        }
    }
    key.push('}');
    key
}

/// Percent-escapes every byte outside a conservative readable set. `|`, `=`, `{`, `}`, `#` and
/// `%` are never emitted unescaped, which makes the joined body injective.
fn escape_into(out: &mut String, part: &str) {
    for &byte in part.as_bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'_' | b'-' | b'/' | b':' | b'*') {
            out.push(byte as char);
        } else {
            let _ = write!(out, "%{byte:02X}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    fn key(domain: &str, pairs: &[(&str, &str)], window: u64) -> String {
        let entries: Vec<Entry> = pairs.iter().map(|(k, v)| Entry::new(*k, *v)).collect();
        limiter_key(domain, &entries, window)
    }

    #[test]
    fn readable_short_keys() {
        assert_eq!(
            key("edge", &[("remote_address", "10.0.0.1")], 60_000),
            "sluice:{edge|remote_address=10.0.0.1|60000}"
        );
    }

    #[test]
    fn separators_inside_values_do_not_collide() {
        let a = key("d", &[("a", "b|c=d")], 1000);
        let b = key("d", &[("a", "b"), ("c", "d")], 1000);
        assert_ne!(a, b);
        let c = key("d|a=b", &[], 1000);
        let d = key("d", &[("a", "b")], 1000);
        assert_ne!(c, d);
    }

    #[test]
    fn one_hash_tag_per_key() {
        let k = key("d", &[("k", "{}{x}\n}")], 1000);
        assert_eq!(k.matches('{').count(), 1);
        assert_eq!(k.matches('}').count(), 1);
        assert!(k.ends_with('}'));
    }

    #[test]
    fn long_values_are_hashed_and_short() {
        let long = "x".repeat(10_000);
        let k = key("d", &[("user", &long)], 1000);
        assert!(k.len() <= KEY_PREFIX.len() + 2 + 1 + 32, "{k}");
        assert_ne!(k, key("d", &[("user", &"x".repeat(10_001))], 1000));
    }

    #[test]
    fn prefixes_are_checked_and_applied() {
        assert!(validate_key_prefix("rl_").is_ok());
        assert!(validate_key_prefix("a{b").is_err());
        assert!(validate_key_prefix(&"p".repeat(65)).is_err());
        let k = limiter_key_with_prefix("rl_", "d", &[Entry::new("k", "v")], 1000);
        assert_eq!(k, "rl_{d|k=v|1000}");
    }

    #[test]
    fn window_separates_logs() {
        assert_ne!(
            key("d", &[("k", "v")], 1000),
            key("d", &[("k", "v")], 60_000)
        );
    }

    fn arb_part() -> impl Strategy<Value = String> {
        prop_oneof!["[a-z|=%#{}:_\\n]{0,6}", any::<String>(), "[a-z]{90,200}",]
    }

    type Descriptor = (String, Vec<(String, String)>, u64);

    fn arb_descriptor() -> impl Strategy<Value = Descriptor> {
        (
            arb_part(),
            proptest::collection::vec((arb_part(), arb_part()), 0..4),
            prop_oneof![Just(1000u64), Just(60_000u64)],
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        /// Distinct descriptors never share a key, and every key stays short and single-slot.
        #[test]
        fn no_collisions(descs in proptest::collection::vec(arb_descriptor(), 2..40)) {
            let mut seen: HashMap<String, Descriptor> = HashMap::new();
            for d in descs {
                let entries: Vec<Entry> = d.1.iter().map(|(k, v)| Entry::new(k.clone(), v.clone())).collect();
                let k = limiter_key(&d.0, &entries, d.2);
                prop_assert!(k.len() <= 160, "key too long: {}", k.len());
                prop_assert_eq!(k.matches('{').count(), 1);
                if let Some(prev) = seen.get(&k) {
                    prop_assert_eq!(prev, &d, "collision on {}", k);
                }
                seen.insert(k, d);
            }
        }

        /// The escaped body is injective on its own (the digest only shortens it).
        #[test]
        fn escaping_is_injective(a in any::<String>(), b in any::<String>()) {
            let mut ea = String::new();
            let mut eb = String::new();
            escape_into(&mut ea, &a);
            escape_into(&mut eb, &b);
            prop_assert_eq!(a == b, ea == eb);
            prop_assert!(!ea.contains(['|', '=', '{', '}', '#']), "separator leaked into {}", ea);
        }
    }
}
