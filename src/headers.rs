//! Rate-limit response headers, built from a [`Decision`]'s verdicts by one pure function; the
//! gRPC adapter only copies them into `response_headers_to_add`, which Envoy adds to the
//! response it sends (the 429 included).
//!
//! Why here and not in the adapter: which limit to advertise and how to round are policy, and
//! tests pin exact header values without a network.
//!
//! Which limit: a request can match several limits (per endpoint and per client), but the
//! headers describe one: the **tightest**. A rejecting limit wins over any admitting one, and
//! among rejecting limits the one that frees a slot last (the client must wait for all of them);
//! otherwise the limit with the fewest remaining hits, then the one that resets later, then the
//! first in request order. Only limits whose rule asks for headers (`response_headers.format`
//! not `none`) are candidates; the chosen one's format and `hide_remaining` apply.
//!
//! Formats (whole seconds, rounded up, as for `duration_until_reset`):
//! - `legacy`: `X-RateLimit-Limit: 3`, `X-RateLimit-Remaining: 1`, `X-RateLimit-Reset: 60`, under
//!   the names the deployment chose ([`LegacyNames`]: envoyproxy/ratelimit lets its users rename
//!   them, so the names are passed in, validated once at start-up).
//! - `draft` (draft-ietf-httpapi-ratelimit-headers, structured fields): `RateLimit-Policy:
//!   "default";q=3;w=60` and `RateLimit: "default";r=1;t=60`; the policy name is the rule's
//!   `rate_limit.name`, else `default`.
//! - `Retry-After: N` whenever the chosen limit rejected the request (at least 1 second).
//!
//! `hide_remaining`: `legacy` drops `X-RateLimit-Remaining`; `draft` drops the whole `RateLimit`
//! field, since the draft requires its `r` (remaining) parameter, and keeps `RateLimit-Policy`.
//! The reset still reaches rejected clients as `Retry-After`.

use crate::config::HeaderFormat;
use crate::decision::{Decision, Outcome, Verdict};

/// Default names of the `legacy` style's headers.
pub const DEFAULT_LIMIT_HEADER: &str = "X-RateLimit-Limit";
pub const DEFAULT_REMAINING_HEADER: &str = "X-RateLimit-Remaining";
pub const DEFAULT_RESET_HEADER: &str = "X-RateLimit-Reset";

/// The names of the `legacy` style's three headers. Built only through [`LegacyNames::new`], so
/// every value is a valid and distinct HTTP header name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LegacyNames {
    limit: String,
    remaining: String,
    reset: String,
}

impl Default for LegacyNames {
    fn default() -> Self {
        LegacyNames {
            limit: DEFAULT_LIMIT_HEADER.into(),
            remaining: DEFAULT_REMAINING_HEADER.into(),
            reset: DEFAULT_RESET_HEADER.into(),
        }
    }
}

impl LegacyNames {
    /// The three names, or why they cannot be used: each must be an HTTP header name, and no
    /// two of them (nor `Retry-After`, which sluice adds itself) the same, ignoring case.
    pub fn new(limit: &str, remaining: &str, reset: &str) -> Result<Self, String> {
        let roles = [("limit", limit), ("remaining", remaining), ("reset", reset)];
        for (role, name) in roles {
            check_header_name(name).map_err(|why| format!("the {role} header: {why}"))?;
        }
        for (i, (role, name)) in roles.iter().enumerate() {
            if name.eq_ignore_ascii_case("Retry-After") {
                return Err(format!(
                    "the {role} header cannot be `{name}`: sluice sends Retry-After itself"
                ));
            }
            if let Some((other, _)) = roles[i + 1..]
                .iter()
                .find(|(_, n)| n.eq_ignore_ascii_case(name))
            {
                return Err(format!(
                    "the {role} and {other} headers have the same name `{name}`"
                ));
            }
        }
        Ok(LegacyNames {
            limit: limit.into(),
            remaining: remaining.into(),
            reset: reset.into(),
        })
    }
}

/// `Ok` when `name` is an HTTP field name (RFC 9110: a non-empty token of letters, digits and
/// ``!#$%&'*+-.^_`|~``), else why not; Envoy and clients would reject anything else.
pub fn check_header_name(name: &str) -> Result<(), String> {
    let token = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    if !name.is_empty() && name.bytes().all(token) {
        return Ok(());
    }
    Err(format!(
        "{name:?} is not a valid HTTP header name (letters, digits and !#$%&'*+-.^_`|~ only)"
    ))
}

/// Builds the response headers for a decision, in a fixed order; `legacy` headers take the
/// names in `names`.
pub fn response_headers(decision: &Decision, names: &LegacyNames) -> Vec<(String, String)> {
    let Some(chosen) = tightest(&decision.verdicts) else {
        return Vec::new();
    };
    let Some(limit) = &chosen.limit else {
        return Vec::new();
    };
    let rejected = chosen.outcome == Outcome::Rejected;
    let reset = whole_seconds(chosen.reset_ms);
    let hide = chosen.headers.hide_remaining;
    let mut out = Vec::with_capacity(4);
    match chosen.headers.format {
        HeaderFormat::None => return Vec::new(),
        HeaderFormat::Legacy => {
            out.push((names.limit.clone(), limit.requests_per_unit.to_string()));
            if !hide {
                out.push((names.remaining.clone(), chosen.remaining.to_string()));
            }
            out.push((names.reset.clone(), reset.to_string()));
        }
        HeaderFormat::Draft => {
            let name = sf_string(limit.name.as_deref().unwrap_or("default"));
            let window = whole_seconds(limit.window_ms);
            out.push((
                "RateLimit-Policy".into(),
                format!("{name};q={};w={window}", limit.requests_per_unit),
            ));
            if !hide {
                out.push((
                    "RateLimit".into(),
                    format!("{name};r={};t={reset}", chosen.remaining),
                ));
            }
        }
    }
    if rejected {
        out.push(("Retry-After".into(), reset.max(1).to_string()));
    }
    out
}

/// The verdict the headers describe (see the module docs), or `None` when no limit of the
/// request asks for headers.
pub fn tightest(verdicts: &[Verdict]) -> Option<&Verdict> {
    verdicts
        .iter()
        .enumerate()
        .filter(|(_, v)| v.limit.is_some() && v.headers.format != HeaderFormat::None)
        .filter(|(_, v)| {
            matches!(
                v.outcome,
                Outcome::Admitted | Outcome::Rejected | Outcome::NotRecorded
            )
        })
        // max_by_key keeps the LAST maximum; the reversed index makes it the first.
        .max_by_key(|(i, v)| {
            let rejected = v.outcome == Outcome::Rejected;
            let remaining_rank = if rejected { 0 } else { u32::MAX - v.remaining };
            (rejected, remaining_rank, v.reset_ms, usize::MAX - i)
        })
        .map(|(_, v)| v)
}

fn whole_seconds(ms: u64) -> u64 {
    ms.div_ceil(1000)
}

/// An RFC 8941 sf-string: printable ASCII with `"` and `\` escaped; anything else becomes `_`.
fn sf_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => out.push('_'),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{HeaderPolicy, Unit};
    use crate::decision::{Code, CurrentLimit};

    fn verdict(
        outcome: Outcome,
        rpu: u32,
        remaining: u32,
        reset_ms: u64,
        format: HeaderFormat,
        hide: bool,
    ) -> Verdict {
        Verdict {
            code: if outcome == Outcome::Rejected {
                Code::OverLimit
            } else {
                Code::Ok
            },
            outcome,
            limit: Some(CurrentLimit {
                requests_per_unit: rpu,
                unit: Unit::Minute,
                name: None,
                window_ms: 60_000,
            }),
            remaining,
            reset_ms,
            rule: None,
            window_count: 0,
            detailed_metric: false,
            key: None,
            stat: None,
            headers: HeaderPolicy {
                format,
                hide_remaining: hide,
            },
            metadata: None,
        }
    }

    fn decision(verdicts: Vec<Verdict>) -> Decision {
        Decision {
            lease: None,
            overall: if verdicts.iter().any(|v| v.code == Code::OverLimit) {
                Code::OverLimit
            } else {
                Code::Ok
            },
            verdicts,
            hits: 1,
            known_domain: true,
            answered_by: crate::limiter::AnsweredBy::Backend,
            backend_failed: None,
        }
    }

    fn pairs(h: &[(String, String)]) -> Vec<(&str, &str)> {
        h.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
    }

    #[test]
    fn legacy_and_draft_values() {
        let ok = decision(vec![verdict(
            Outcome::Admitted,
            3,
            2,
            59_001,
            HeaderFormat::Legacy,
            false,
        )]);
        assert_eq!(
            pairs(&response_headers(&ok, &LegacyNames::default())),
            [
                ("X-RateLimit-Limit", "3"),
                ("X-RateLimit-Remaining", "2"),
                ("X-RateLimit-Reset", "60")
            ]
        );
        let mut over = verdict(Outcome::Rejected, 3, 0, 1_500, HeaderFormat::Draft, false);
        over.limit.as_mut().unwrap().name = Some("per \"user\"".into());
        assert_eq!(
            pairs(&response_headers(
                &decision(vec![over]),
                &LegacyNames::default()
            )),
            [
                ("RateLimit-Policy", r#""per \"user\"";q=3;w=60"#),
                ("RateLimit", r#""per \"user\"";r=0;t=2"#),
                ("Retry-After", "2")
            ]
        );
    }

    #[test]
    fn hide_remaining_keeps_limit_and_reset() {
        let legacy = decision(vec![verdict(
            Outcome::Rejected,
            5,
            0,
            0,
            HeaderFormat::Legacy,
            true,
        )]);
        assert_eq!(
            pairs(&response_headers(&legacy, &LegacyNames::default())),
            [
                ("X-RateLimit-Limit", "5"),
                ("X-RateLimit-Reset", "0"),
                ("Retry-After", "1")
            ]
        );
        let draft = decision(vec![verdict(
            Outcome::Admitted,
            5,
            4,
            60_000,
            HeaderFormat::Draft,
            true,
        )]);
        assert_eq!(
            pairs(&response_headers(&draft, &LegacyNames::default())),
            [("RateLimit-Policy", "\"default\";q=5;w=60")]
        );
    }

    #[test]
    fn tightest_prefers_rejection_then_fewest_remaining() {
        use HeaderFormat::Legacy;
        let v = vec![
            verdict(Outcome::Admitted, 100, 90, 1_000, Legacy, false),
            verdict(Outcome::Admitted, 10, 3, 2_000, Legacy, false),
            verdict(Outcome::Admitted, 10, 3, 5_000, Legacy, false),
            verdict(Outcome::Admitted, 1, 0, 9_000, HeaderFormat::None, false),
        ];
        assert_eq!(tightest(&v).unwrap().reset_ms, 5_000);
        let mut w = v.clone();
        w.push(verdict(Outcome::Rejected, 50, 0, 3_000, Legacy, false));
        w.push(verdict(Outcome::Rejected, 60, 0, 4_000, Legacy, false));
        assert_eq!(tightest(&w).unwrap().reset_ms, 4_000);
        // Equal in everything: the first in request order.
        let mut x = vec![
            verdict(Outcome::Admitted, 10, 3, 2_000, Legacy, false),
            verdict(Outcome::Admitted, 10, 3, 2_000, Legacy, false),
        ];
        x[0].rule = Some("first".into());
        assert_eq!(tightest(&x).unwrap().rule.as_deref(), Some("first"));
        // Admitted with nothing left (the last slot taken) is tighter than one left, whatever
        // the resets; remaining counts far apart rank by the count too.
        let y = vec![
            verdict(Outcome::Admitted, 10, 1, 9_000, Legacy, false),
            verdict(Outcome::Admitted, 10, 0, 1_000, Legacy, false),
            verdict(
                Outcome::Admitted,
                u32::MAX,
                u32::MAX / 2,
                8_000,
                Legacy,
                false,
            ),
        ];
        assert_eq!(tightest(&y).unwrap().remaining, 0);
        let z = vec![
            verdict(Outcome::Admitted, u32::MAX, 1 << 31, 1_000, Legacy, false),
            verdict(
                Outcome::Admitted,
                u32::MAX,
                (1 << 31) + 5,
                9_000,
                Legacy,
                false,
            ),
        ];
        assert_eq!(tightest(&z).unwrap().remaining, 1 << 31);
    }

    #[test]
    fn no_headers_without_an_asking_limit() {
        let none = decision(vec![verdict(
            Outcome::Rejected,
            1,
            0,
            1_000,
            HeaderFormat::None,
            false,
        )]);
        assert!(response_headers(&none, &LegacyNames::default()).is_empty());
        let shadow = decision(vec![verdict(
            Outcome::ShadowRejected,
            1,
            0,
            1_000,
            HeaderFormat::Legacy,
            false,
        )]);
        assert!(response_headers(&shadow, &LegacyNames::default()).is_empty());
    }

    #[test]
    fn legacy_headers_take_the_names_given() {
        let names = LegacyNames::new("RateLimit-Limit", "RateLimit-Remaining", "X-Reset").unwrap();
        let over = decision(vec![verdict(
            Outcome::Rejected,
            3,
            0,
            1_500,
            HeaderFormat::Legacy,
            false,
        )]);
        assert_eq!(
            pairs(&response_headers(&over, &names)),
            [
                ("RateLimit-Limit", "3"),
                ("RateLimit-Remaining", "0"),
                ("X-Reset", "2"),
                ("Retry-After", "2")
            ]
        );
    }

    #[test]
    fn bad_or_clashing_names_are_refused() {
        for bad in [
            "",
            "X RateLimit",
            "X-Limit:",
            "Limit\r\n",
            "Grenzwert-ü",
            ":status",
        ] {
            let err = LegacyNames::new(bad, "R", "T").unwrap_err();
            assert!(err.starts_with("the limit header: "), "{bad:?}: {err}");
            assert!(err.contains("not a valid HTTP header name"), "{err}");
        }
        let err = LegacyNames::new("L", "x-limit-r", "X-Limit-R").unwrap_err();
        assert_eq!(
            err,
            "the remaining and reset headers have the same name `x-limit-r`"
        );
        let err = LegacyNames::new("L", "R", "retry-after").unwrap_err();
        assert!(err.contains("sends Retry-After itself"), "{err}");
        assert!(LegacyNames::new("x_limit", "X.Remaining", "reset~1").is_ok());
    }
}
