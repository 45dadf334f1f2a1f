//! What a usage report may carry: checked before any bucket of it is answered, so a report over
//! a limit is refused whole (INVALID_ARGUMENT naming the field as the proto spells it, and the
//! flag that sets the limit) and reserves nothing.
//!
//! Why the engine's input limits: a bucket id is a descriptor by another name, so its entries
//! get the same bounds (`--max-entries`, `--max-key-bytes`, `--max-value-bytes`), and the
//! stream's domain the same as a request's; `--rlqs-max-buckets` bounds a report's list, as
//! `--max-descriptors` a request's.

use std::collections::HashMap;

use crate::decision::{InputLimits, InvalidRequest, at_most, invalid};

use super::{BucketId, Usage};

/// One usage report, mapped from the wire: the domain it names (Envoy names it in every report;
/// empty is allowed after the first) and its buckets' lines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    pub domain: String,
    pub usages: Vec<Usage>,
}

/// Checks `report` against `limits`, for a stream whose domain is `stream_domain` (`None`
/// before its first report). The first violation in field order is named.
pub fn validate(
    report: &Report,
    stream_domain: Option<&str>,
    limits: &InputLimits,
) -> Result<(), InvalidRequest> {
    let [
        domain_flag,
        _,
        entries_flag,
        key_flag,
        value_flag,
        _,
        buckets_flag,
    ] = InputLimits::FLAGS;
    // usize -> u64 never truncates on the platforms Rust supports.
    let n = |len: usize| len as u64;
    match stream_domain {
        None if report.domain.is_empty() => {
            return Err(invalid(
                "domain",
                "must not be empty in a stream's first report",
            ));
        }
        None => at_most(
            n(report.domain.len()),
            n(limits.max_domain_bytes),
            "bytes",
            domain_flag,
            || "domain".into(),
        )?,
        Some(domain) if !report.domain.is_empty() && report.domain != domain => {
            return Err(invalid(
                "domain",
                "differs from the stream's domain (given in its first report); a stream serves one domain",
            ));
        }
        Some(_) => {}
    }
    at_most(
        n(report.usages.len()),
        n(limits.max_quota_buckets),
        "buckets",
        buckets_flag,
        || "bucket_quota_usages".into(),
    )?;
    let mut seen: HashMap<&BucketId, usize> = HashMap::with_capacity(report.usages.len());
    for (i, usage) in report.usages.iter().enumerate() {
        let field = || format!("bucket_quota_usages[{i}].bucket_id.bucket");
        if usage.bucket.is_empty() {
            return Err(invalid(field(), "must hold at least one entry"));
        }
        at_most(
            n(usage.bucket.len()),
            n(limits.max_entries),
            "entries",
            entries_flag,
            field,
        )?;
        for (key, value) in &usage.bucket {
            if key.is_empty() {
                return Err(invalid(field(), "an entry with an empty key"));
            }
            at_most(
                n(key.len()),
                n(limits.max_key_bytes),
                "bytes in a key",
                key_flag,
                field,
            )?;
            at_most(
                n(value.len()),
                n(limits.max_value_bytes),
                "bytes in a value",
                value_flag,
                field,
            )?;
        }
        if let Some(first) = seen.insert(&usage.bucket, i) {
            return Err(invalid(
                format!("bucket_quota_usages[{i}].bucket_id"),
                format!("the same bucket as bucket_quota_usages[{first}]"),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(entries: &[(&str, &str)]) -> Usage {
        Usage {
            bucket: entries
                .iter()
                .map(|&(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
            allowed: 0,
            denied: 0,
            elapsed_s: 0,
        }
    }

    fn report(domain: &str, usages: Vec<Usage>) -> Report {
        Report {
            domain: domain.into(),
            usages,
        }
    }

    fn error(report: &Report, stream: Option<&str>, limits: &InputLimits) -> (String, String) {
        let err = validate(report, stream, limits).unwrap_err();
        (err.field, err.reason.into_owned())
    }

    #[test]
    fn a_report_within_the_limits_passes() {
        let ok = report(
            "edge",
            vec![usage(&[("client", "a")]), usage(&[("client", "b")])],
        );
        assert_eq!(validate(&ok, None, &InputLimits::default()), Ok(()));
        // Later reports may name the domain again, or not at all.
        assert_eq!(validate(&ok, Some("edge"), &InputLimits::default()), Ok(()));
        let unnamed = report("", vec![usage(&[("client", "a")])]);
        assert_eq!(
            validate(&unnamed, Some("edge"), &InputLimits::default()),
            Ok(())
        );
    }

    #[test]
    fn each_violation_names_its_field_and_flag() {
        let limits = InputLimits {
            max_entries: 2,
            max_key_bytes: 6,
            max_value_bytes: 3,
            max_quota_buckets: 2,
            ..InputLimits::default()
        };
        let one =
            |entries: &[(&str, &str)]| report("edge", vec![usage(&[("a", "1")]), usage(entries)]);
        assert_eq!(
            error(&report("", vec![]), None, &limits),
            (
                "domain".into(),
                "must not be empty in a stream's first report".into()
            )
        );
        assert_eq!(
            error(&one(&[("a", "2")]), Some("other"), &limits).0,
            "domain"
        );
        assert_eq!(
            error(
                &report("edge", vec![usage(&[("a", "1")]); 3]),
                None,
                &limits
            ),
            (
                "bucket_quota_usages".into(),
                "3 buckets exceeds --rlqs-max-buckets 2".into()
            )
        );
        assert_eq!(
            error(&one(&[]), None, &limits),
            (
                "bucket_quota_usages[1].bucket_id.bucket".into(),
                "must hold at least one entry".into()
            )
        );
        assert_eq!(
            error(&one(&[("a", "1"), ("b", "2"), ("c", "3")]), None, &limits).1,
            "3 entries exceeds --max-entries 2"
        );
        assert_eq!(
            error(&one(&[("", "1")]), None, &limits).1,
            "an entry with an empty key"
        );
        assert_eq!(
            error(&one(&[("toolong", "1")]), None, &limits).1,
            "7 bytes in a key exceeds --max-key-bytes 6"
        );
        assert_eq!(
            error(&one(&[("a", "1234")]), None, &limits).1,
            "4 bytes in a value exceeds --max-value-bytes 3"
        );
        assert_eq!(
            error(&one(&[("a", "1")]), None, &limits),
            (
                "bucket_quota_usages[1].bucket_id".into(),
                "the same bucket as bucket_quota_usages[0]".into()
            )
        );
    }
}
