//! envoyproxy/ratelimit's default Prometheus mapping, the series its Prometheus sink serves when
//! no `PROMETHEUS_MAPPER_YAML` is given, written as the statsd_exporter mapping file that
//! [`super::Mapper`] compiles (so a deployment's own file and the default go through one
//! compiler).
//!
//! What the default says, and so what dashboards built on envoyproxy/ratelimit query:
//! - each rate-limit stat (`ratelimit.service.rate_limit.<domain>.<key...>.<stat>`) is a
//!   histogram-typed series `ratelimit_service_rate_limit_<stat>` labelled `domain` and `key1`
//!   (a one-level key, by a glob), or `domain`, `key1` and `key2` (the first two levels of a
//!   deeper key, by a regex; levels below the second are dropped);
//! - `ratelimit.service.call.should_rate_limit.<err_type>` counts
//!   `ratelimit_service_should_rate_limit_error{err_type}`;
//! - the server's per-method stats: `ratelimit_service_total_requests{grpc_method}` and
//!   `ratelimit_service_response_time_seconds{grpc_method}` (milliseconds scaled to seconds,
//!   unless `PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS`);
//! - the config loads: `ratelimit_service_config_load_success` / `_error`.

use std::fmt::Write as _;

/// The rate-limit stats, in the order their mappings are tried.
const LIMIT_STATS: [&str; 5] = [
    "near_limit",
    "over_limit",
    "total_hits",
    "within_limit",
    "shadow_mode",
];

/// One component of a stat name, as the deeper keys' regex matches it.
const COMPONENT: &str = r"([^\\.]*)";

/// The default mapping's YAML; `milliseconds` leaves response times unscaled.
pub fn yaml(milliseconds: bool) -> String {
    let mut out = String::from("mappings:\n");
    for stat in LIMIT_STATS {
        rule(
            &mut out,
            &format!("ratelimit.service.rate_limit.*.*.{stat}"),
            None,
            &format!("ratelimit_service_rate_limit_{stat}"),
            &[("timer_type", "histogram")],
            &[("domain", "$1"), ("key1", "$2")],
        );
    }
    for stat in LIMIT_STATS {
        let pattern = format!(
            r"ratelimit\\.service\\.rate_limit\\.{COMPONENT}\\.{COMPONENT}\\.{COMPONENT}(\\..*)?\\.{stat}"
        );
        rule(
            &mut out,
            &pattern,
            Some("regex"),
            &format!("ratelimit_service_rate_limit_{stat}"),
            &[("timer_type", "histogram")],
            &[("domain", "$1"), ("key1", "$2"), ("key2", "$3")],
        );
    }
    let counter = [("match_metric_type", "counter")];
    rule(
        &mut out,
        "ratelimit.service.call.should_rate_limit.*",
        None,
        "ratelimit_service_should_rate_limit_error",
        &counter,
        &[("err_type", "$1")],
    );
    rule(
        &mut out,
        "ratelimit_server.*.total_requests",
        None,
        "ratelimit_service_total_requests",
        &counter,
        &[("grpc_method", "$1")],
    );
    let timer: &[(&str, &str)] = if milliseconds {
        &[("timer_type", "histogram")]
    } else {
        &[("timer_type", "histogram"), ("scale", "0.001")]
    };
    rule(
        &mut out,
        "ratelimit_server.*.response_time",
        None,
        "ratelimit_service_response_time_seconds",
        timer,
        &[("grpc_method", "$1")],
    );
    for load in ["success", "error"] {
        rule(
            &mut out,
            &format!("ratelimit.service.config_load_{load}"),
            None,
            &format!("ratelimit_service_config_load_{load}"),
            &counter,
            &[],
        );
    }
    out
}

/// Appends one mapping: its match (and `match_type` unless a glob), name, other fields and
/// labels.
fn rule(
    out: &mut String,
    pattern: &str,
    match_type: Option<&str>,
    name: &str,
    fields: &[(&str, &str)],
    labels: &[(&str, &str)],
) {
    // Writing to a String cannot fail.
    let _ = writeln!(out, "  - match: \"{pattern}\"");
    if let Some(kind) = match_type {
        let _ = writeln!(out, "    match_type: {kind}");
    }
    let _ = writeln!(out, "    name: \"{name}\"");
    for (field, value) in fields {
        let _ = writeln!(out, "    {field}: {value}");
    }
    if !labels.is_empty() {
        out.push_str("    labels:\n");
        for (label, value) in labels {
            let _ = writeln!(out, "      {label}: \"{value}\"");
        }
    }
}
