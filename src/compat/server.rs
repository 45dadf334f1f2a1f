//! envoyproxy/ratelimit's variables of the server itself: the gRPC port's TLS
//! (`GRPC_SERVER_USE_TLS` and its files) -> `--grpc-tls-*` and `--grpc-client-*`, and the
//! defaults envoyproxy/ratelimit gives the variables a Deployment leaves unset, which sluice
//! applies when it runs under that name ([`with_ratelimit_defaults`]).
//!
//! Client certificates: envoyproxy/ratelimit verifies them against `GRPC_CLIENT_TLS_CACERT`
//! only. Envoy Gateway sets `GRPC_SERVER_TLS_CA_CERT` instead, which envoyproxy/ratelimit never
//! reads, so there it verifies no client. sluice verifies against the CA of either variable
//! (both, when both are set), and says so at start-up when only the second is set.

use super::{Translation, flag_var, map_var};

/// envoyproxy/ratelimit's defaults that decide where sluice listens and what it loads, for a
/// Deployment that leaves them unset: (variable, default, the `SLUICE_*` variable that makes
/// it moot).
const RATELIMIT_DEFAULTS: &[(&str, &str, &str)] = &[
    ("GRPC_PORT", "8081", "SLUICE_GRPC_ADDR"),
    ("PORT", "8080", "SLUICE_ADMIN_ADDR"),
    ("RUNTIME_ROOT", "/srv/runtime_data/current", "SLUICE_CONFIG"),
];

/// `get`, with envoyproxy/ratelimit's defaults for the variables that decide the ports and the
/// config directory (`GRPC_PORT` 8081, `PORT` 8080, `RUNTIME_ROOT` `/srv/runtime_data/current`
/// unless the limits come from xDS): what `/bin/ratelimit` with no arguments reads. A default
/// never shadows a `SLUICE_*` variable that is set.
pub fn with_ratelimit_defaults(
    get: &dyn Fn(&str) -> Option<String>,
) -> impl Fn(&str) -> Option<String> + '_ {
    move |name: &str| {
        get(name).or_else(|| {
            let (_, default, sluice) = RATELIMIT_DEFAULTS.iter().find(|(n, ..)| *n == name)?;
            if get(sluice).is_some() {
                return None;
            }
            let file_config = get("CONFIG_TYPE")
                .is_none_or(|t| t.trim().is_empty() || t.trim().eq_ignore_ascii_case("FILE"));
            if name == "RUNTIME_ROOT" && (!file_config || get("SLUICE_CONFIG_XDS").is_some()) {
                return None;
            }
            Some((*default).to_owned())
        })
    }
}

/// The gRPC TLS variables that only mean something with `GRPC_SERVER_USE_TLS=true`.
const TLS_VARIABLES: &[&str] = &[
    "GRPC_SERVER_TLS_CERT",
    "GRPC_SERVER_TLS_KEY",
    "GRPC_CLIENT_TLS_CACERT",
    "GRPC_SERVER_TLS_CA_CERT",
    "GRPC_CLIENT_TLS_SAN",
];

/// Maps the server's variables into `out`.
pub(super) fn translate(get: &dyn Fn(&str) -> Option<String>, out: &mut Translation) {
    grpc_tls(get, out);
    if flag_var(get, "RUNTIME_IGNOREDOTFILES", out) == Some(false) {
        out.notes.push(
            "RUNTIME_IGNOREDOTFILES=false ignored: entries starting with `.` are never loaded"
                .into(),
        );
    }
}

fn value(get: &dyn Fn(&str) -> Option<String>, name: &str) -> Option<String> {
    get(name).filter(|v| !v.trim().is_empty())
}

fn grpc_tls(get: &dyn Fn(&str) -> Option<String>, out: &mut Translation) {
    if flag_var(get, "GRPC_SERVER_USE_TLS", out) != Some(true) {
        for name in TLS_VARIABLES.iter().filter(|n| value(get, n).is_some()) {
            out.notes
                .push(format!("{name} ignored: GRPC_SERVER_USE_TLS is not true"));
        }
        return;
    }
    let (cert, key) = (
        value(get, "GRPC_SERVER_TLS_CERT"),
        value(get, "GRPC_SERVER_TLS_KEY"),
    );
    let (Some(cert), Some(key)) = (cert, key) else {
        // Serving plaintext where TLS was asked for would be a silent downgrade.
        out.errors.push(
            "GRPC_SERVER_USE_TLS=true needs GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY".into(),
        );
        return;
    };
    map_var(
        get,
        "GRPC_SERVER_TLS_CERT",
        "SLUICE_GRPC_TLS_CERT",
        cert,
        out,
    );
    map_var(get, "GRPC_SERVER_TLS_KEY", "SLUICE_GRPC_TLS_KEY", key, out);
    let mut cas: Vec<(&str, String)> = Vec::new();
    for name in ["GRPC_CLIENT_TLS_CACERT", "GRPC_SERVER_TLS_CA_CERT"] {
        if let Some(path) = value(get, name) {
            if path.contains(',') {
                out.errors.push(format!(
                    "{name}={path:?}: a CA file path with a comma cannot be passed on"
                ));
            } else if cas.iter().all(|(_, p)| *p != path) {
                cas.push((name, path));
            }
        }
    }
    match cas.as_slice() {
        [] => {
            if value(get, "GRPC_CLIENT_TLS_SAN").is_some() {
                out.notes.push(
                    "GRPC_CLIENT_TLS_SAN ignored: no client CA (GRPC_CLIENT_TLS_CACERT or \
                     GRPC_SERVER_TLS_CA_CERT), so no client certificate is asked for"
                        .into(),
                );
            }
            return;
        }
        [("GRPC_SERVER_TLS_CA_CERT", _)] => out.notes.push(
            "GRPC_SERVER_TLS_CA_CERT: client certificates are verified against it \
             (envoyproxy/ratelimit reads only GRPC_CLIENT_TLS_CACERT and verifies none here)"
                .into(),
        ),
        _ => {}
    }
    let joined = cas
        .iter()
        .map(|(_, p)| p.as_str())
        .collect::<Vec<_>>()
        .join(",");
    map_var(get, cas[0].0, "SLUICE_GRPC_CLIENT_CA", joined, out);
    if let Some(san) = value(get, "GRPC_CLIENT_TLS_SAN") {
        map_var(
            get,
            "GRPC_CLIENT_TLS_SAN",
            "SLUICE_GRPC_CLIENT_SAN",
            san,
            out,
        );
    }
}

#[cfg(test)]
mod tests;
