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

    /// Inverse of [`escape_into`], for the tests: `None` unless `escaped` is made only of the
    /// readable set and `%XX` escapes (upper-case hex) of bytes outside it, so a part that
    /// decodes proves no separator (`|`, `=`, `{`, `}`, `#`) and no bare `%` leaked into it.
    fn unescape(escaped: &str) -> Option<String> {
        let bytes = escaped.as_bytes();
        let mut out = Vec::with_capacity(bytes.len());
        let mut i = 0;
        while i < bytes.len() {
            let byte = bytes[i];
            if byte == b'%' {
                let hex = escaped.get(i + 1..i + 3)?;
                if !hex
                    .bytes()
                    .all(|h| h.is_ascii_digit() || (b'A'..=b'F').contains(&h))
                {
                    return None;
                }
                let decoded = u8::from_str_radix(hex, 16).ok()?;
                if is_readable(decoded) {
                    return None; // escaped although readable: two spellings of one byte
                }
                out.push(decoded);
                i += 3;
            } else if is_readable(byte) {
                out.push(byte);
                i += 1;
            } else {
                return None;
            }
        }
        String::from_utf8(out).ok()
    }

    /// The readable set, written out apart from the code under test.
    fn is_readable(byte: u8) -> bool {
        matches!(byte, b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'.' | b'_' | b'-' | b'/' | b':' | b'*')
    }

    fn escaped(part: &str) -> String {
        let mut out = String::new();
        escape_into(&mut out, part);
        out
    }

    #[test]
    fn every_special_byte_is_escaped_and_readable_bytes_are_not() {
        for byte in 0u8..=127 {
            let text = (byte as char).to_string();
            let expected = if is_readable(byte) {
                text.clone()
            } else {
                format!("%{byte:02X}")
            };
            assert_eq!(escaped(&text), expected, "byte {byte:#04x}");
        }
        // Non-ASCII: each UTF-8 byte on its own.
        assert_eq!(escaped("é"), "%C3%A9");
    }

    #[test]
    fn an_escaped_spelling_never_shares_a_key_with_the_bytes_it_spells() {
        // If `%` (or a hex digit's case) were not escaped, `a%7Cb` would read like `a|b`.
        for (raw, spelled) in [
            ("a|b", "a%7Cb"),
            ("a=b", "a%3Db"),
            ("a%b", "a%25b"),
            ("{x}", "%7Bx%7D"),
            ("#", "%23"),
            ("a b", "a%20b"),
            ("é", "%C3%A9"),
        ] {
            assert_eq!(escaped(raw), spelled);
            assert_ne!(escaped(spelled), spelled, "`%` escaped in {spelled}");
            assert_ne!(
                key("d", &[("k", raw)], 1000),
                key("d", &[("k", spelled)], 1000)
            );
            assert_ne!(key(raw, &[], 1000), key(spelled, &[], 1000));
            assert_ne!(
                key("d", &[(raw, "v")], 1000),
                key("d", &[(spelled, "v")], 1000)
            );
        }
    }

    #[test]
    fn bodies_up_to_the_bound_stay_readable_longer_ones_are_digested() {
        // Body `d|k=<value>|1000`: 9 bytes around the value.
        let at_bound = key("d", &[("k", &"v".repeat(MAX_BODY_LEN - 9))], 1000);
        assert_eq!(
            at_bound.len(),
            KEY_PREFIX.len() + 2 + MAX_BODY_LEN,
            "{at_bound}"
        );
        assert!(at_bound.contains("|k=v"), "{at_bound}");
        let over = key("d", &[("k", &"v".repeat(MAX_BODY_LEN - 8))], 1000);
        assert_eq!(over.len(), KEY_PREFIX.len() + 2 + 1 + 32, "{over}");
        assert!(over.starts_with("sluice:{#"), "{over}");
        // The digest is of the escaped body: one that differs by a single escaped byte differs.
        let a = key("d", &[("k", &format!("{}|", "v".repeat(100)))], 1000);
        let b = key("d", &[("k", &format!("{}=", "v".repeat(100)))], 1000);
        assert_ne!(a, b);
    }

    #[test]
    fn tags_follow_the_window_and_keep_keys_apart() {
        let entries = [Entry::new("k", "v")];
        assert_eq!(
            limiter_key_tagged(KEY_PREFIX, "d", &entries, 1000, "gcra"),
            "sluice:{d|k=v|1000|gcra}"
        );
        assert_eq!(
            limiter_key_tagged(KEY_PREFIX, "d", &entries, 1000, ""),
            limiter_key("d", &entries, 1000)
        );
    }

    #[test]
    fn prefixes_up_to_64_bytes_without_braces_are_accepted() {
        assert!(validate_key_prefix(&"p".repeat(64)).is_ok());
        assert!(validate_key_prefix("a}b").is_err());
        assert!(validate_key_prefix("").is_ok());
    }

    /// Every byte class the escaping treats apart: readable letters (both cases) and digits,
    /// readable punctuation, the separators, `%` itself (so `%7C`-like spellings appear),
    /// other ASCII (space, newline), and multi-byte UTF-8.
    fn arb_part() -> impl Strategy<Value = String> {
        prop_oneof![
            4 => "[a-fA-F0-9|=%#{}.:_/*\\- \né]{0,8}",
            1 => any::<String>(),
            1 => "[a-zA-Z0-9%|]{90,200}",
        ]
    }

    fn spelled_tokens() -> impl Strategy<Value = String> {
        let token = proptest::sample::select(vec!["a", "|", "%7C", "%", "7C", "%25", "="]);
        proptest::collection::vec(token, 0..4).prop_map(|tokens| tokens.concat())
    }

    type Descriptor = (String, Vec<(String, String)>, u64);

    /// Mostly parts from a few symbols (separators, `%` and the hex digits of `%7C`), so that
    /// descriptors which a broken join would confuse (`a|b=` as one value or as two entries)
    /// come up together often; sometimes any part.
    fn arb_descriptor() -> impl Strategy<Value = Descriptor> {
        let part = || prop_oneof![4 => "[a|=%7C]{0,3}", 1 => arb_part()];
        (
            part(),
            proptest::collection::vec((part(), part()), 0..3),
            prop_oneof![Just(1000u64), Just(60_000u64)],
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]
        /// Distinct descriptors never share a key, and every key stays short and single-slot.
        #[test]
        fn no_collisions(descs in proptest::collection::vec(arb_descriptor(), 2..32)) {
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

    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        /// Escaping has an inverse (so it is injective), and what it writes holds only the
        /// readable set and well-formed `%XX` escapes: no separator, no bare `%`.
        #[test]
        fn escaping_round_trips(part in arb_part()) {
            let e = escaped(&part);
            prop_assert_eq!(unescape(&e), Some(part), "escaped as {}", e);
        }

        /// Two parts made of a few tokens (`|` and its spelling `%7C`, `%` and its spelling
        /// `%25`, pieces of either) are often equal and often spell each other: equal escapes
        /// exactly when equal parts.
        #[test]
        fn escaping_is_injective(a in spelled_tokens(), b in spelled_tokens()) {
            prop_assert_eq!(a == b, escaped(&a) == escaped(&b), "{:?} and {:?}", a, b);
        }
    }
}
