//! Input limits: what one request may carry ([`InputLimits`]), checked before anything else
//! happens, so a request over a limit is refused with INVALID_ARGUMENT and records nothing.
//!
//! Why a file of its own: the checks are the engine's first line of defence against hostile or
//! broken clients, and both faces rely on them (gRPC and `/json` decide through the same
//! engine). Every check is O(1) per field (lengths are known), so a hostile request costs no
//! more than reading it, and each error names the field as the proto spells it and the flag
//! that sets the limit.

use std::borrow::Cow;

use super::types::{InputLimits, Request};

/// A request that cannot be decided as sent. `field` names the offending field the way the
/// proto spells it, so the caller can find it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct InvalidRequest {
    pub field: String,
    pub reason: Cow<'static, str>,
}

/// Rejects requests Envoy would never send and that cannot be decided: nothing is recorded.
/// Checks the default [`InputLimits`]; [`Engine::decide`](super::Engine::decide) checks its
/// configured ones.
pub fn validate(request: &Request) -> Result<(), InvalidRequest> {
    validate_with(request, &InputLimits::default())
}

pub(crate) fn invalid(
    field: impl Into<String>,
    reason: impl Into<Cow<'static, str>>,
) -> InvalidRequest {
    InvalidRequest {
        field: field.into(),
        reason: reason.into(),
    }
}

/// `Err` naming `field` when `len` (of `unit`: bytes, entries...; none for a plain number)
/// exceeds the limit set by `flag`: `N bytes exceeds --flag LIMIT`. `field` is built only then,
/// so a valid request allocates nothing here.
pub(crate) fn at_most(
    len: impl Into<u64>,
    max: impl Into<u64>,
    unit: &str,
    flag: &str,
    field: impl FnOnce() -> String,
) -> Result<(), InvalidRequest> {
    let (len, max) = (len.into(), max.into());
    if len <= max {
        return Ok(());
    }
    let reason = if unit.is_empty() {
        format!("{len} exceeds {flag} {max}")
    } else {
        format!("{len} {unit} exceeds {flag} {max}")
    };
    Err(invalid(field(), reason))
}

/// [`validate`] under explicit limits; the first violation in field order is named.
pub fn validate_with(request: &Request, limits: &InputLimits) -> Result<(), InvalidRequest> {
    let [
        domain_flag,
        descriptors_flag,
        entries_flag,
        key_flag,
        value_flag,
        hits_flag,
        _,
    ] = InputLimits::FLAGS;
    // usize -> u64 never truncates on the platforms Rust supports.
    let n = |len: usize| len as u64;
    if request.domain.is_empty() {
        return Err(invalid("domain", "must not be empty"));
    }
    at_most(
        n(request.domain.len()),
        n(limits.max_domain_bytes),
        "bytes",
        domain_flag,
        || "domain".into(),
    )?;
    if request.descriptors.is_empty() {
        return Err(invalid("descriptors", "must hold at least one descriptor"));
    }
    at_most(
        n(request.descriptors.len()),
        n(limits.max_descriptors),
        "descriptors",
        descriptors_flag,
        || "descriptors".into(),
    )?;
    at_most(
        request.hits_addend,
        limits.max_hits_addend,
        "",
        hits_flag,
        || "hits_addend".into(),
    )?;
    // A descriptor without entries is valid and matches no rule (envoyproxy/ratelimit's
    // answer: OK, no limit); an entry without a key is not (Envoy never sends one).
    for (i, descriptor) in request.descriptors.iter().enumerate() {
        let entries = || format!("descriptors[{i}].entries");
        at_most(
            n(descriptor.entries.len()),
            n(limits.max_entries),
            "entries",
            entries_flag,
            entries,
        )?;
        for (j, entry) in descriptor.entries.iter().enumerate() {
            let key = || format!("descriptors[{i}].entries[{j}].key");
            if entry.key.is_empty() {
                return Err(invalid(key(), "must not be empty"));
            }
            at_most(
                n(entry.key.len()),
                n(limits.max_key_bytes),
                "bytes",
                key_flag,
                key,
            )?;
            at_most(
                n(entry.value.len()),
                n(limits.max_value_bytes),
                "bytes",
                value_flag,
                || format!("descriptors[{i}].entries[{j}].value"),
            )?;
        }
        if let Some(hits) = descriptor.hits_addend {
            at_most(hits, limits.max_hits_addend, "", hits_flag, || {
                format!("descriptors[{i}].hits_addend")
            })?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::test_support::req;

    #[test]
    fn the_first_violation_names_its_field_and_flag() {
        let limits = InputLimits {
            max_value_bytes: 3,
            ..InputLimits::default()
        };
        let long = req(&[&[("user", "a")], &[("user", "abcd"), ("", "x")]]);
        let err = validate_with(&long, &limits).unwrap_err();
        assert_eq!(err.field, "descriptors[1].entries[0].value");
        assert_eq!(err.reason, "4 bytes exceeds --max-value-bytes 3");
        assert!(
            validate(&long).is_err(),
            "the empty key, under the defaults"
        );
        assert_eq!(validate(&req(&[&[("user", "abcd")]])), Ok(()));
    }

    /// A descriptor without entries is decided (as no rule); one without descriptors is not.
    #[test]
    fn an_empty_descriptor_is_valid_an_empty_request_is_not() {
        assert_eq!(validate(&req(&[&[], &[("user", "a")]])), Ok(()));
        assert_eq!(validate(&req(&[])).unwrap_err().field, "descriptors");
    }
}
