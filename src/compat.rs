//! envoyproxy/ratelimit's environment variables, translated into sluice's own settings.
//!
//! Why: the promise is that a team swaps the image and keeps its Deployment's environment. This
//! reads the variables envoyproxy/ratelimit documents, maps those with a sluice equivalent onto
//! the `SLUICE_*` variable of the same setting (only when that variable is not set already), and
//! reports every other one it recognises once at start-up,
//! with why it is not applied, instead of ignoring it silently. The translation is a pure
//! function of the environment so it can be tested without touching the process. The xDS
//! config source's variables (`CONFIG_TYPE=GRPC_XDS_SOTW`, `CONFIG_GRPC_XDS_*`) are in `xds`;
//! the backend's (`REDIS_*`, `BACKEND_TYPE`, `MEMCACHE_*`) in `redis`; the server's own (gRPC
//! TLS, the defaults under envoyproxy/ratelimit's name) in `server`; the stats' (statsd,
//! Prometheus, `EXTRA_TAGS`) in `stats`. A
//! variable that cannot be honoured as written, where going on would serve something else than
//! asked (memory instead of Redis, plaintext instead of TLS), is not just reported: it stops
//! `serve`. Tracing's variables are in `otel`, the response headers' in `headers`.

mod headers;
mod otel;
mod redis;
mod server;
mod stats;
mod xds;

pub use server::with_ratelimit_defaults;

use std::collections::BTreeMap;

/// What the translation decided.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Translation {
    /// Values for `SLUICE_*` variables that are not set: the binary makes each the default of
    /// the option read from that variable (a flag still wins), or reads it in its place.
    pub set: BTreeMap<String, String>,
    /// One line per recognised variable that was not applied as is, for the start-up log.
    pub notes: Vec<String>,
    /// Settings that cannot be honoured as given (a backend sluice does not have, a Redis
    /// variable without `REDIS_URL`, ...): `serve` must not start.
    pub errors: Vec<String>,
}

/// Average bytes one local-cache entry costs, to turn `LOCAL_CACHE_SIZE_IN_BYTES` into entries.
pub const LOCAL_CACHE_BYTES_PER_ENTRY: u64 = 128;

/// envoyproxy/ratelimit variables sluice recognises but does not apply, with the reason.
const UNSUPPORTED: &[(&str, &str)] = &[
    ("DEBUG_HOST", "no debug server; use the admin port"),
    ("DEBUG_PORT", "no debug server; use the admin port"),
    (
        "GRPC_UDS",
        "unix-socket gRPC is not supported; use a loopback address",
    ),
    ("GRPC_MAX_CONNECTION_AGE", "not configurable"),
    ("GRPC_MAX_CONNECTION_AGE_GRACE", "not configurable"),
    (
        "EXPIRATION_JITTER_MAX_SECONDS",
        "sliding-log keys expire exactly when their newest entry leaves the window",
    ),
    (
        "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT",
        "set per rule with `over_limit` (`refuse` records nothing for a rejected request; the \
         default, `fill`, fills the windows it did not fit)",
    ),
];

/// Sets a `SLUICE_*` variable from a legacy one, unless it is set already (then noted).
type Map<'a> = &'a dyn Fn(&str, &str, String, &mut Translation);
/// A legacy boolean variable, `None` when unset or not a boolean (then noted).
type Flag<'a> = &'a dyn Fn(&str, &mut Translation) -> Option<bool>;

fn truthy(value: &str) -> Option<bool> {
    match value.trim().to_ascii_lowercase().as_str() {
        "1" | "t" | "true" | "yes" | "on" => Some(true),
        "0" | "f" | "false" | "no" | "off" | "" => Some(false),
        _ => None,
    }
}

/// Sets `sluice` to `value` for the legacy variable `legacy`, unless `sluice` is set already.
fn map_var(
    get: &dyn Fn(&str) -> Option<String>,
    legacy: &str,
    sluice: &str,
    value: String,
    out: &mut Translation,
) {
    if get(sluice).is_some() {
        out.notes
            .push(format!("{legacy} ignored: {sluice} is set and wins"));
    } else {
        out.set.insert(sluice.to_owned(), value);
    }
}

/// A boolean variable, `None` when unset or not a boolean (noted).
fn flag_var(
    get: &dyn Fn(&str) -> Option<String>,
    name: &str,
    out: &mut Translation,
) -> Option<bool> {
    let raw = get(name)?;
    let parsed = truthy(&raw);
    if parsed.is_none() {
        out.notes
            .push(format!("{name}={raw:?} ignored: expected true or false"));
    }
    parsed
}

/// Translates envoyproxy/ratelimit's variables, read through `get`, into `SLUICE_*` ones.
pub fn translate(get: &dyn Fn(&str) -> Option<String>) -> Translation {
    let mut out = Translation::default();
    let map = |legacy: &str, sluice: &str, value: String, out: &mut Translation| {
        map_var(get, legacy, sluice, value, out);
    };
    let flag = |name: &str, out: &mut Translation| flag_var(get, name, out);
    // The limits from xDS: RUNTIME_ROOT (the file source) is then not mapped.
    let from_xds = xds::translate(get, &mut out);
    server::translate(get, &mut out);
    stats::translate(get, &mut out);
    redis::translate(get, &mut out);
    runtime(get, from_xds, &mut out);
    addresses(get, &mut out);
    switches(get, &mut out);
    headers::translate(get, &map, &flag, &mut out);
    otel::translate(get, &map, &flag, &mut out);
    cache_and_keys(get, &mut out);
    logs(get, &mut out);
    for (name, why) in UNSUPPORTED {
        if get(name).is_some() {
            out.notes.push(format!("{name} is not supported: {why}"));
        }
    }
    out
}

/// The config directory (`RUNTIME_ROOT`, its sub- and app directories), unless the limits come
/// from xDS (then noted as ignored). `RUNTIME_WATCH_ROOT` chooses what envoyproxy/ratelimit
/// watches (a swap of the root's symlink, or the files of the config directory), and either
/// way it reloads; sluice's watcher sees both, so the variable asks for nothing more (a value
/// that is not a boolean is noted). It never turns reloading off.
fn runtime(get: &dyn Fn(&str) -> Option<String>, from_xds: bool, out: &mut Translation) {
    if from_xds {
        for name in ["RUNTIME_ROOT", "RUNTIME_WATCH_ROOT"] {
            if get(name).is_some() {
                out.notes.push(format!(
                    "{name} ignored: CONFIG_TYPE=GRPC_XDS_SOTW takes the limits from xDS"
                ));
            }
        }
    } else if let Some(root) = get("RUNTIME_ROOT") {
        let mut path = std::path::PathBuf::from(root);
        if let Some(sub) = get("RUNTIME_SUBDIRECTORY").filter(|s| !s.is_empty()) {
            path.push(sub);
        }
        path.push(get("RUNTIME_APPDIRECTORY").unwrap_or_else(|| "config".into()));
        let path = path.to_string_lossy().into_owned();
        map_var(get, "RUNTIME_ROOT", "SLUICE_CONFIG", path, out);
    }
    if !from_xds {
        flag_var(get, "RUNTIME_WATCH_ROOT", out);
    }
}

/// The gRPC (`GRPC_HOST`, `GRPC_PORT`) and HTTP (`HOST`, `PORT`) listen addresses.
fn addresses(get: &dyn Fn(&str) -> Option<String>, out: &mut Translation) {
    for (host, port, default_port, sluice) in [
        ("GRPC_HOST", "GRPC_PORT", "8081", "SLUICE_GRPC_ADDR"),
        ("HOST", "PORT", "8080", "SLUICE_ADMIN_ADDR"),
    ] {
        if get(port).is_some() || get(host).is_some() {
            let h = get(host).unwrap_or_else(|| "0.0.0.0".into());
            let p = get(port).unwrap_or_else(|| default_port.into());
            map_var(get, port, sluice, format!("{h}:{p}"), out);
        }
    }
}

/// Shadow and quota modes, the response's dynamic metadata, domain merging and the near-limit
/// ratio.
fn switches(get: &dyn Fn(&str) -> Option<String>, out: &mut Translation) {
    for (legacy, sluice) in [
        ("SHADOW_MODE", "SLUICE_SHADOW_MODE"),
        ("QUOTA_MODE", "SLUICE_QUOTA_MODE"),
        (
            "RESPONSE_DYNAMIC_METADATA",
            "SLUICE_RESPONSE_DYNAMIC_METADATA",
        ),
        ("MERGE_DOMAIN_CONFIG", "SLUICE_MERGE_DOMAIN_CONFIG"),
    ] {
        if let Some(on) = flag_var(get, legacy, out) {
            map_var(get, legacy, sluice, on.to_string(), out);
        }
    }
    if let Some(ratio) = get("NEAR_LIMIT_RATIO") {
        map_var(
            get,
            "NEAR_LIMIT_RATIO",
            "SLUICE_NEAR_LIMIT_RATIO",
            ratio,
            out,
        );
    }
}

/// The local cache's size (bytes there, entries here) and the limiter keys' prefix.
fn cache_and_keys(get: &dyn Fn(&str) -> Option<String>, out: &mut Translation) {
    if let Some(bytes) = get("LOCAL_CACHE_SIZE_IN_BYTES") {
        match bytes.trim().parse::<u64>() {
            Ok(bytes) => map_var(
                get,
                "LOCAL_CACHE_SIZE_IN_BYTES",
                "SLUICE_LOCAL_CACHE_SIZE",
                (bytes / LOCAL_CACHE_BYTES_PER_ENTRY).to_string(),
                out,
            ),
            Err(_) => out.notes.push(format!(
                "LOCAL_CACHE_SIZE_IN_BYTES={bytes:?} ignored: expected a number of bytes"
            )),
        }
    }
    if let Some(prefix) = get("CACHE_KEY_PREFIX") {
        map_var(get, "CACHE_KEY_PREFIX", "SLUICE_KEY_PREFIX", prefix, out);
    }
}

/// The log level and format, lowercased as sluice spells them.
fn logs(get: &dyn Fn(&str) -> Option<String>, out: &mut Translation) {
    for (legacy, sluice) in [
        ("LOG_LEVEL", "SLUICE_LOG"),
        ("LOG_FORMAT", "SLUICE_LOG_FORMAT"),
    ] {
        if let Some(value) = get(legacy) {
            map_var(get, legacy, sluice, value.to_ascii_lowercase(), out);
        }
    }
}

/// [`translate`] of a fixed environment, for tests.
#[cfg(test)]
fn translate_pairs(vars: &[(&str, &str)]) -> Translation {
    let env: BTreeMap<&str, &str> = vars.iter().copied().collect();
    translate(&|name| env.get(name).map(|v| (*v).to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    pub(super) fn run(vars: &[(&str, &str)]) -> Translation {
        let env: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        translate(&|name| env.get(name).cloned())
    }

    #[test]
    fn maps_a_typical_envoyproxy_deployment() {
        let t = run(&[
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", "redis:6379"),
            ("REDIS_POOL_SIZE", "20"),
            ("REDIS_PIPELINE_LIMIT", "8"),
            ("RUNTIME_ROOT", "/data"),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("RUNTIME_WATCH_ROOT", "false"),
            ("GRPC_PORT", "8081"),
            ("PORT", "8080"),
            ("SHADOW_MODE", "true"),
            ("QUOTA_MODE", "true"),
            ("RESPONSE_DYNAMIC_METADATA", "true"),
            ("NEAR_LIMIT_RATIO", "0.9"),
            ("LOCAL_CACHE_SIZE_IN_BYTES", "1048576"),
            ("CACHE_KEY_PREFIX", "rl_"),
            ("USE_STATSD", "false"),
            ("LOG_LEVEL", "DEBUG"),
        ]);
        let expect = [
            ("SLUICE_REDIS_URL", "redis://redis:6379"),
            ("SLUICE_REDIS_POOL_SIZE", "20"),
            ("SLUICE_REDIS_BATCH_MAX", "8"),
            ("SLUICE_CONFIG", "/data/ratelimit/config"),
            ("SLUICE_GRPC_ADDR", "0.0.0.0:8081"),
            ("SLUICE_ADMIN_ADDR", "0.0.0.0:8080"),
            ("SLUICE_SHADOW_MODE", "true"),
            ("SLUICE_QUOTA_MODE", "true"),
            ("SLUICE_RESPONSE_DYNAMIC_METADATA", "true"),
            ("SLUICE_NEAR_LIMIT_RATIO", "0.9"),
            ("SLUICE_LOCAL_CACHE_SIZE", "8192"),
            ("SLUICE_KEY_PREFIX", "rl_"),
            ("SLUICE_LOG", "debug"),
        ];
        for (k, v) in expect {
            assert_eq!(t.set.get(k).map(String::as_str), Some(v), "{k}: {t:#?}");
        }
        assert_eq!(t.set.len(), expect.len(), "{t:#?}");
        // USE_STATSD=false asks for nothing sluice does; RUNTIME_WATCH_ROOT=false reloads a
        // changed file there as here (it does not turn reloading off).
        assert!(t.notes.is_empty(), "{t:#?}");
        assert!(t.errors.is_empty(), "{t:#?}");
    }

    #[test]
    fn sluice_variables_win_and_bad_values_are_reported() {
        let t = run(&[
            ("GRPC_PORT", "9000"),
            ("SLUICE_GRPC_ADDR", "127.0.0.1:8081"),
            ("SHADOW_MODE", "maybe"),
            ("LOCAL_CACHE_SIZE_IN_BYTES", "lots"),
        ]);
        assert!(t.set.is_empty(), "{t:#?}");
        assert_eq!(t.notes.len(), 3, "{t:#?}");
        assert!(
            t.notes
                .iter()
                .any(|n| n.contains("SLUICE_GRPC_ADDR is set and wins"))
        );
    }
}
