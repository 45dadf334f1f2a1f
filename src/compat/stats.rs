//! envoyproxy/ratelimit's stats variables -> sluice's stats flags: the statsd sink
//! (`USE_STATSD`, `STATSD_HOST`, `STATSD_PORT`, gostats' `STATSD_PROTOCOL`,
//! `STATS_FLUSH_INTERVAL`, `EXTRA_TAGS`) and the Prometheus sink (`USE_PROMETHEUS`,
//! `PROMETHEUS_ADDR`, `PROMETHEUS_PATH`, `PROMETHEUS_MAPPER_YAML`,
//! `PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS`), `DISABLE_STATS`, and the DogStatsD variables
//! sluice does not serve (reported).
//!
//! envoyproxy/ratelimit defaults `USE_STATSD` to true and then sends to `localhost:8125`;
//! sluice sends statsd when `USE_STATSD=true`, or when it is unset and `STATSD_HOST` or
//! `STATSD_PORT` names a daemon, so a Deployment without statsd does not get a sink retrying
//! a port nobody listens on. Both sinks may be on at once (envoyproxy/ratelimit refuses to
//! start then).

use super::{Translation, flag_var, map_var};

/// Where envoyproxy/ratelimit serves Prometheus when `USE_PROMETHEUS=true` names no address.
const DEFAULT_PROMETHEUS_ADDR: &str = ":9090";

/// Maps the stats variables into `out`.
pub(super) fn translate(get: &dyn Fn(&str) -> Option<String>, out: &mut Translation) {
    let disabled = flag_var(get, "DISABLE_STATS", out) == Some(true);
    if disabled {
        out.notes.push(
            "DISABLE_STATS=true: envoyproxy/ratelimit's stats are neither sent to statsd nor \
             served on PROMETHEUS_ADDR (sluice's own /metrics stays on the admin port)"
                .into(),
        );
    }
    let statsd = statsd(get, disabled, out);
    let prometheus = prometheus(get, disabled, out);
    dogstatsd(get, out);
    if let Some(tags) = get("EXTRA_TAGS").filter(|t| !t.is_empty()) {
        if !(statsd || prometheus) {
            out.notes
                .push("EXTRA_TAGS ignored: neither USE_STATSD nor USE_PROMETHEUS is on".into());
        } else {
            match crate::metrics::upstream::Tags::parse(&tags) {
                Ok(_) => map_var(get, "EXTRA_TAGS", "SLUICE_STATS_TAGS", tags, out),
                Err(e) => out.errors.push(format!("EXTRA_TAGS: {e}")),
            }
        }
    }
    if !statsd && get("STATS_FLUSH_INTERVAL").is_some() {
        out.notes.push(
            "STATS_FLUSH_INTERVAL ignored: there is no statsd sink, and the Prometheus page \
             shows every count as it happens"
                .into(),
        );
    }
}

fn value(get: &dyn Fn(&str) -> Option<String>, name: &str) -> Option<String> {
    get(name).filter(|v| !v.trim().is_empty())
}

/// The statsd sink's variables; whether the sink is on.
fn statsd(get: &dyn Fn(&str) -> Option<String>, disabled: bool, out: &mut Translation) -> bool {
    let asked = match flag_var(get, "USE_STATSD", out) {
        Some(on) => on,
        None => value(get, "STATSD_HOST").is_some() || value(get, "STATSD_PORT").is_some(),
    };
    if !asked || disabled {
        for name in ["STATSD_HOST", "STATSD_PORT", "STATSD_PROTOCOL"] {
            if value(get, name).is_some() {
                let why = if disabled {
                    "DISABLE_STATS=true"
                } else {
                    "USE_STATSD is not true"
                };
                out.notes.push(format!("{name} ignored: {why}"));
            }
        }
        return false;
    }
    let host = value(get, "STATSD_HOST").unwrap_or_else(|| "localhost".into());
    let port = value(get, "STATSD_PORT").unwrap_or_else(|| "8125".into());
    if port.trim().parse::<u16>().is_err() {
        out.errors
            .push(format!("STATSD_PORT={port:?} is not a port number"));
        return false;
    }
    // Go's net.JoinHostPort: an IPv6 host is bracketed.
    let addr = if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{}", port.trim())
    } else {
        format!("{host}:{}", port.trim())
    };
    map_var(get, "STATSD_HOST", "SLUICE_STATSD_ADDR", addr, out);
    if let Some(protocol) = value(get, "STATSD_PROTOCOL") {
        map_var(
            get,
            "STATSD_PROTOCOL",
            "SLUICE_STATSD_PROTOCOL",
            protocol.trim().to_ascii_lowercase(),
            out,
        );
    }
    if let Some(interval) = value(get, "STATS_FLUSH_INTERVAL") {
        match parse_go_duration(interval.trim()) {
            Some(ms) if ms > 0 => map_var(
                get,
                "STATS_FLUSH_INTERVAL",
                "SLUICE_STATS_FLUSH_INTERVAL_MS",
                ms.to_string(),
                out,
            ),
            _ => out.errors.push(format!(
                "STATS_FLUSH_INTERVAL={interval:?} is not a positive duration (e.g. 10s, 500ms)"
            )),
        }
    }
    true
}

/// The Prometheus sink's variables; whether the sink is on.
fn prometheus(get: &dyn Fn(&str) -> Option<String>, disabled: bool, out: &mut Translation) -> bool {
    let on = flag_var(get, "USE_PROMETHEUS", out) == Some(true);
    if !on || disabled {
        for name in [
            "PROMETHEUS_ADDR",
            "PROMETHEUS_PATH",
            "PROMETHEUS_MAPPER_YAML",
            "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS",
        ] {
            if get(name).is_some() {
                let why = if disabled {
                    "DISABLE_STATS=true"
                } else {
                    "USE_PROMETHEUS is not true"
                };
                out.notes.push(format!("{name} ignored: {why}"));
            }
        }
        return false;
    }
    let raw = value(get, "PROMETHEUS_ADDR").unwrap_or_else(|| DEFAULT_PROMETHEUS_ADDR.into());
    // Go's ":PORT" listens on every address.
    let addr = match raw.trim() {
        a if a.starts_with(':') => format!("0.0.0.0{a}"),
        a => a.to_owned(),
    };
    if addr.parse::<std::net::SocketAddr>().is_err() {
        out.errors.push(format!(
            "PROMETHEUS_ADDR={raw:?} is not [IP]:PORT (e.g. :19001 or 0.0.0.0:19001)"
        ));
        return false;
    }
    map_var(get, "PROMETHEUS_ADDR", "SLUICE_METRICS_ADDR", addr, out);
    map_var(
        get,
        "USE_PROMETHEUS",
        "SLUICE_METRICS_RATELIMIT_NAMES",
        "true".into(),
        out,
    );
    if let Some(path) = value(get, "PROMETHEUS_PATH") {
        map_var(
            get,
            "PROMETHEUS_PATH",
            "SLUICE_METRICS_PATH",
            path.trim().to_owned(),
            out,
        );
    }
    if let Some(file) = value(get, "PROMETHEUS_MAPPER_YAML") {
        map_var(
            get,
            "PROMETHEUS_MAPPER_YAML",
            "SLUICE_METRICS_MAPPER",
            file,
            out,
        );
    }
    if let Some(ms) = flag_var(get, "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", out) {
        if ms && value(get, "PROMETHEUS_MAPPER_YAML").is_some() {
            out.notes.push(
                "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS ignored: it changes the default mapping \
                 only, and PROMETHEUS_MAPPER_YAML replaces it"
                    .into(),
            );
        } else if ms {
            map_var(
                get,
                "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS",
                "SLUICE_METRICS_RESPONSE_TIME_MS",
                "true".into(),
                out,
            );
        }
    }
    true
}

fn dogstatsd(get: &dyn Fn(&str) -> Option<String>, out: &mut Translation) {
    if flag_var(get, "USE_DOG_STATSD", out) == Some(true) {
        out.notes.push(
            "USE_DOG_STATSD is not supported: DogStatsD's tagged lines are not sent; use \
             USE_STATSD=true (plain statsd over TCP) or USE_PROMETHEUS=true"
                .into(),
        );
    }
    if get("USE_DOG_STATSD_MOGRIFIERS").is_some() {
        out.notes.push(
            "USE_DOG_STATSD_MOGRIFIERS is not supported: it shapes DogStatsD's tags, and \
             DogStatsD is not sent"
                .into(),
        );
    }
}

/// Go's `time.ParseDuration`, in whole milliseconds: a sequence of decimal numbers with a
/// unit each (`ns`, `us`, `µs`, `ms`, `s`, `m`, `h`), e.g. `10s`, `1m30s`, `1.5s`; `0` alone.
pub(crate) fn parse_go_duration(text: &str) -> Option<u64> {
    if text == "0" {
        return Some(0);
    }
    let mut rest = text;
    let mut total_ns: f64 = 0.0;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let number_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let number: f64 = rest.get(..number_end)?.parse().ok()?;
        rest = rest.get(number_end..)?;
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match rest.get(..unit_end)? {
            "ns" => 1.0,
            "us" | "µs" | "μs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => return None,
        };
        rest = rest.get(unit_end..)?;
        total_ns += number * scale;
    }
    Some((total_ns / 1e6) as u64)
}

#[cfg(test)]
mod tests;
