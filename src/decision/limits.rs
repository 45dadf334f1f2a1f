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

fn invalid(field: impl Into<String>, reason: impl Into<Cow<'static, str>>) -> InvalidRequest {
    InvalidRequest {
        field: field.into(),
        reason: reason.into(),
    }
}

/// `N bytes exceeds --flag LIMIT`, or the count form for lists.
fn too_long(len: usize, unit: &str, flag: &str, limit: impl std::fmt::Display) -> String {
    format!("{len} {unit} exceeds {flag} {limit}")
}

/// [`validate`] under explicit limits; the first violation in field order is named.
pub fn validate_with(request: &Request, limits: &InputLimits) -> Result<(), InvalidRequest> {
    let [domain_flag, descriptors_flag, entries_flag, key_flag, value_flag, hits_flag, _] =
        InputLimits::FLAGS;
    if request.domain.is_empty() {
        return Err(invalid("domain", "must not be empty"));
    }
    if request.domain.len() > limits.max_domain_bytes {
        return Err(invalid(
            "domain",
            too_long(
                request.domain.len(),
                "bytes",
                domain_flag,
                limits.max_domain_bytes,
            ),
        ));
    }
    if request.descriptors.is_empty() {
        return Err(invalid("descriptors", "must hold at least one descriptor"));
    }
    if request.descriptors.len() > limits.max_descriptors {
        return Err(invalid(
            "descriptors",
            too_long(
                request.descriptors.len(),
                "descriptors",
                descriptors_flag,
                limits.max_descriptors,
            ),
        ));
    }
    if u64::from(request.hits_addend) > limits.max_hits_addend {
        return Err(invalid(
            "hits_addend",
            format!(
                "{} exceeds {hits_flag} {}",
                request.hits_addend, limits.max_hits_addend
            ),
        ));
    }
    for (i, descriptor) in request.descriptors.iter().enumerate() {
        if descriptor.entries.is_empty() {
            return Err(invalid(
                format!("descriptors[{i}].entries"),
                "must hold at least one entry",
            ));
        }
        if descriptor.entries.len() > limits.max_entries {
            return Err(invalid(
                format!("descriptors[{i}].entries"),
                too_long(
                    descriptor.entries.len(),
                    "entries",
                    entries_flag,
                    limits.max_entries,
                ),
            ));
        }
        for (j, entry) in descriptor.entries.iter().enumerate() {
            if entry.key.is_empty() {
                return Err(invalid(
                    format!("descriptors[{i}].entries[{j}].key"),
                    "must not be empty",
                ));
            }
            if entry.key.len() > limits.max_key_bytes {
                return Err(invalid(
                    format!("descriptors[{i}].entries[{j}].key"),
                    too_long(entry.key.len(), "bytes", key_flag, limits.max_key_bytes),
                ));
            }
            if entry.value.len() > limits.max_value_bytes {
                return Err(invalid(
                    format!("descriptors[{i}].entries[{j}].value"),
                    too_long(
                        entry.value.len(),
                        "bytes",
                        value_flag,
                        limits.max_value_bytes,
                    ),
                ));
            }
        }
        if let Some(hits) = descriptor.hits_addend {
            if hits > limits.max_hits_addend {
                return Err(invalid(
                    format!("descriptors[{i}].hits_addend"),
                    format!("{hits} exceeds {hits_flag} {}", limits.max_hits_addend),
                ));
            }
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
}
