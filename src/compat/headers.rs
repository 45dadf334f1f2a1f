//! envoyproxy/ratelimit's response headers (`LIMIT_RESPONSE_HEADERS_ENABLED`,
//! `LIMIT_LIMIT_HEADER`, `LIMIT_REMAINING_HEADER`, `LIMIT_RESET_HEADER`) onto the `legacy` header
//! style and its names. envoyproxy/ratelimit sends three headers with plain numbers (the
//! tightest limit, its remaining hits, the seconds to its reset), named `RateLimit-Limit`,
//! `RateLimit-Remaining` and `RateLimit-Reset` unless renamed: sluice's `legacy` style under
//! those names, which an envoyproxy/ratelimit environment therefore gets by default. A name
//! that is not a valid header name stops `serve` (the flag's check).

use super::{Flag, Map, Translation};

/// envoyproxy/ratelimit's variable, sluice's, and envoyproxy/ratelimit's default name.
const NAMES: &[(&str, &str, &str)] = &[
    (
        "LIMIT_LIMIT_HEADER",
        "SLUICE_LEGACY_LIMIT_HEADER",
        "RateLimit-Limit",
    ),
    (
        "LIMIT_REMAINING_HEADER",
        "SLUICE_LEGACY_REMAINING_HEADER",
        "RateLimit-Remaining",
    ),
    (
        "LIMIT_RESET_HEADER",
        "SLUICE_LEGACY_RESET_HEADER",
        "RateLimit-Reset",
    ),
];

pub(super) fn translate(
    get: &dyn Fn(&str) -> Option<String>,
    map: Map<'_>,
    flag: Flag<'_>,
    out: &mut Translation,
) {
    let enabled = flag("LIMIT_RESPONSE_HEADERS_ENABLED", out);
    if let Some(on) = enabled {
        let style = if on { "legacy" } else { "none" };
        map(
            "LIMIT_RESPONSE_HEADERS_ENABLED",
            "SLUICE_RESPONSE_HEADERS",
            style.to_owned(),
            out,
        );
    }
    for (legacy, sluice, default) in NAMES {
        match get(legacy) {
            Some(name) => map(legacy, sluice, name, out),
            None if enabled == Some(true) && get(sluice).is_none() => {
                out.set.insert((*sluice).to_owned(), (*default).to_owned());
            }
            None => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::translate_pairs;

    #[test]
    fn enabled_headers_are_envoyproxys_names_in_the_legacy_style() {
        let t = translate_pairs(&[("LIMIT_RESPONSE_HEADERS_ENABLED", "true")]);
        assert_eq!(t.set["SLUICE_RESPONSE_HEADERS"], "legacy");
        assert_eq!(t.set["SLUICE_LEGACY_LIMIT_HEADER"], "RateLimit-Limit");
        assert_eq!(
            t.set["SLUICE_LEGACY_REMAINING_HEADER"],
            "RateLimit-Remaining"
        );
        assert_eq!(t.set["SLUICE_LEGACY_RESET_HEADER"], "RateLimit-Reset");
        let t = translate_pairs(&[
            ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
            ("LIMIT_LIMIT_HEADER", "X-Quota"),
            ("SLUICE_LEGACY_RESET_HEADER", "X-Reset"),
        ]);
        assert_eq!(t.set["SLUICE_LEGACY_LIMIT_HEADER"], "X-Quota");
        assert_eq!(
            t.set["SLUICE_LEGACY_REMAINING_HEADER"],
            "RateLimit-Remaining"
        );
        assert!(!t.set.contains_key("SLUICE_LEGACY_RESET_HEADER"), "{t:#?}");
        assert!(t.notes.is_empty(), "{t:#?}");
    }

    #[test]
    fn names_alone_are_carried_and_disabled_headers_are_none() {
        let t = translate_pairs(&[
            ("LIMIT_RESPONSE_HEADERS_ENABLED", "false"),
            ("LIMIT_REMAINING_HEADER", "X-Left"),
        ]);
        assert_eq!(t.set["SLUICE_RESPONSE_HEADERS"], "none");
        assert_eq!(t.set["SLUICE_LEGACY_REMAINING_HEADER"], "X-Left");
        assert_eq!(t.set.len(), 2, "{t:#?}");
    }
}
