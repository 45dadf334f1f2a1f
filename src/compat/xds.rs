//! envoyproxy/ratelimit's xDS config source variables -> `--config-xds` and its flags.
//!
//! `CONFIG_TYPE=GRPC_XDS_SOTW` turns the source on; the server URL has no scheme there
//! (`envoy-gateway:18001`) and `CONFIG_GRPC_XDS_SERVER_USE_TLS` says whether it is TLS, so the
//! URL gets `https://` or `http://` here. The TLS files apply only with TLS, as upstream.

use super::{Translation, flag_var, map_var};

/// Upstream's defaults when `CONFIG_TYPE=GRPC_XDS_SOTW` leaves them unset.
const DEFAULT_SERVER_URL: &str = "localhost:18000";

/// Variables that only mean something with `CONFIG_TYPE=GRPC_XDS_SOTW`.
const XDS_VARIABLES: &[&str] = &[
    "CONFIG_GRPC_XDS_SERVER_URL",
    "CONFIG_GRPC_XDS_NODE_ID",
    "CONFIG_GRPC_XDS_SERVER_USE_TLS",
    "CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
    "CONFIG_GRPC_XDS_CLIENT_TLS_KEY",
    "CONFIG_GRPC_XDS_SERVER_TLS_CACERT",
    "CONFIG_GRPC_XDS_SERVER_TLS_SAN",
    "FORCE_START_WITHOUT_INITIAL_CONFIG",
];

/// TLS variable -> sluice variable (applied with `CONFIG_GRPC_XDS_SERVER_USE_TLS=true`).
const TLS_VARIABLES: &[(&str, &str)] = &[
    (
        "CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
        "SLUICE_CONFIG_XDS_CLIENT_CERT",
    ),
    (
        "CONFIG_GRPC_XDS_CLIENT_TLS_KEY",
        "SLUICE_CONFIG_XDS_CLIENT_KEY",
    ),
    (
        "CONFIG_GRPC_XDS_SERVER_TLS_CACERT",
        "SLUICE_CONFIG_XDS_CA_FILE",
    ),
    (
        "CONFIG_GRPC_XDS_SERVER_TLS_SAN",
        "SLUICE_CONFIG_XDS_SERVER_NAME",
    ),
];

/// envoyproxy/ratelimit's health and the config: with
/// `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED=true` it fails while no config naming a domain is
/// served (`always`); without it, forced to start, it answers OK before any config (`never`);
/// not forced, nothing listens before the first config and it is OK after it, which sluice's
/// default (`first`) is.
fn health(get: &dyn Fn(&str) -> Option<String>, forced: bool, out: &mut Translation) {
    let (legacy, required) = match flag_var(get, "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", out) {
        Some(true) => ("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "always"),
        _ if forced => ("FORCE_START_WITHOUT_INITIAL_CONFIG", "never"),
        _ => return,
    };
    map_var(
        get,
        legacy,
        "SLUICE_HEALTH_REQUIRES_CONFIG",
        required.into(),
        out,
    );
}

/// Recognised xDS variables sluice does not apply, with the reason.
const UNSUPPORTED: &[(&str, &str)] = &[
    (
        "CONFIG_GRPC_XDS_NODE_METADATA",
        "the node sent carries its id only",
    ),
    (
        "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
        "no extra headers are sent to the xDS server",
    ),
    (
        "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL",
        "reconnects back off from 0.5 s to 30 s with jitter",
    ),
    (
        "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL",
        "reconnects back off from 0.5 s to 30 s with jitter",
    ),
    (
        "XDS_CLIENT_BACKOFF_MAX_INTERVAL",
        "reconnects back off from 0.5 s to 30 s with jitter",
    ),
    (
        "XDS_CLIENT_BACKOFF_RANDOM_FACTOR",
        "reconnects back off from 0.5 s to 30 s with jitter",
    ),
    (
        "XDS_CLIENT_BACKOFF_JITTER",
        "reconnects back off from 0.5 s to 30 s with jitter",
    ),
    (
        "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES",
        "xDS responses up to 16 MiB are accepted",
    ),
];

/// Maps the xDS variables into `out`; returns whether the limits come from xDS.
pub(super) fn translate(get: &dyn Fn(&str) -> Option<String>, out: &mut Translation) -> bool {
    let kind = get("CONFIG_TYPE").map(|k| k.trim().to_ascii_uppercase());
    match kind.as_deref() {
        Some("GRPC_XDS_SOTW") => {}
        None | Some("" | "FILE") => {
            for name in XDS_VARIABLES.iter().filter(|n| get(n).is_some()) {
                out.notes.push(format!(
                    "{name} ignored: CONFIG_TYPE is FILE (the limits come from RUNTIME_ROOT)"
                ));
            }
            return false;
        }
        Some(other) => {
            out.notes.push(format!(
                "CONFIG_TYPE={other} is not supported: FILE or GRPC_XDS_SOTW"
            ));
            return false;
        }
    }
    let tls = flag_var(get, "CONFIG_GRPC_XDS_SERVER_USE_TLS", out).unwrap_or(false);
    let address = get("CONFIG_GRPC_XDS_SERVER_URL")
        .filter(|u| !u.trim().is_empty())
        .unwrap_or_else(|| DEFAULT_SERVER_URL.into());
    let url = if address.contains("://") {
        address
    } else {
        format!("{}://{address}", if tls { "https" } else { "http" })
    };
    map_var(get, "CONFIG_TYPE", "SLUICE_CONFIG_XDS", url, out);
    if let Some(node) = get("CONFIG_GRPC_XDS_NODE_ID").filter(|n| !n.is_empty()) {
        map_var(
            get,
            "CONFIG_GRPC_XDS_NODE_ID",
            "SLUICE_CONFIG_XDS_NODE_ID",
            node,
            out,
        );
    }
    for (legacy, sluice) in TLS_VARIABLES {
        let Some(value) = get(legacy).filter(|v| !v.is_empty()) else {
            continue;
        };
        if tls {
            map_var(get, legacy, sluice, value, out);
        } else {
            out.notes.push(format!(
                "{legacy} ignored: CONFIG_GRPC_XDS_SERVER_USE_TLS is not true"
            ));
        }
    }
    let force = flag_var(get, "FORCE_START_WITHOUT_INITIAL_CONFIG", out);
    if let Some(force) = force {
        map_var(
            get,
            "FORCE_START_WITHOUT_INITIAL_CONFIG",
            "SLUICE_FORCE_START_WITHOUT_INITIAL_CONFIG",
            force.to_string(),
            out,
        );
    }
    health(get, force == Some(true), out);
    for (name, why) in UNSUPPORTED {
        if get(name).is_some() {
            out.notes.push(format!("{name} is not supported: {why}"));
        }
    }
    true
}

#[cfg(test)]
pub(super) mod tests {
    use super::super::tests::run;

    /// What Envoy Gateway sets on its rate-limit Deployment (the xDS and file parts).
    pub(in crate::compat) const ENVOY_GATEWAY: &[(&str, &str)] = &[
        ("RUNTIME_ROOT", "/data"),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ("RUNTIME_IGNOREDOTFILES", "true"),
        ("RUNTIME_WATCH_ROOT", "false"),
        ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
        ("CONFIG_GRPC_XDS_SERVER_URL", "envoy-gateway:18001"),
        ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit"),
        ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "/certs/tls.crt"),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "/certs/tls.key"),
        ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/certs/ca.crt"),
        ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
    ];

    #[test]
    fn envoy_gateway_environment_maps_to_the_xds_flags() {
        let t = run(ENVOY_GATEWAY);
        let expect = [
            ("SLUICE_CONFIG_XDS", "https://envoy-gateway:18001"),
            ("SLUICE_CONFIG_XDS_NODE_ID", "envoy-ratelimit"),
            ("SLUICE_CONFIG_XDS_CLIENT_CERT", "/certs/tls.crt"),
            ("SLUICE_CONFIG_XDS_CLIENT_KEY", "/certs/tls.key"),
            ("SLUICE_CONFIG_XDS_CA_FILE", "/certs/ca.crt"),
            ("SLUICE_FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
            // Envoy Gateway leaves HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED unset.
            ("SLUICE_HEALTH_REQUIRES_CONFIG", "never"),
        ];
        for (k, v) in expect {
            assert_eq!(t.set.get(k).map(String::as_str), Some(v), "{k}: {t:#?}");
        }
        // RUNTIME_ROOT must not also set --config: the two sources are exclusive.
        assert_eq!(t.set.len(), expect.len(), "{t:#?}");
        for name in ["RUNTIME_ROOT", "RUNTIME_WATCH_ROOT"] {
            assert!(
                t.notes
                    .iter()
                    .any(|n| n.starts_with(&format!("{name} ignored: CONFIG_TYPE=GRPC_XDS_SOTW"))),
                "{t:#?}"
            );
        }
    }

    /// envoyproxy/ratelimit's health and the config, per combination of its two variables:
    /// `always` with HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED=true, `never` forced without it,
    /// sluice's default `first` otherwise (not forced, nothing listens before the first config).
    #[test]
    fn health_before_the_first_config_per_combination() {
        for (force, healthy_with, requires) in [
            (None, None, None),
            (Some("false"), Some("false"), None),
            (Some("true"), None, Some("never")),
            (Some("true"), Some("false"), Some("never")),
            (Some("true"), Some("true"), Some("always")),
            (None, Some("true"), Some("always")),
        ] {
            let mut vars = vec![("CONFIG_TYPE", "GRPC_XDS_SOTW")];
            vars.extend(force.map(|v| ("FORCE_START_WITHOUT_INITIAL_CONFIG", v)));
            vars.extend(healthy_with.map(|v| ("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", v)));
            let t = run(&vars);
            assert_eq!(
                t.set
                    .get("SLUICE_HEALTH_REQUIRES_CONFIG")
                    .map(String::as_str),
                requires,
                "{vars:?}: {t:#?}"
            );
            assert!(t.notes.is_empty(), "{vars:?}: {t:#?}");
        }
        // sluice's own variable wins, and says so.
        let t = run(&[
            ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
            ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
            ("SLUICE_HEALTH_REQUIRES_CONFIG", "true"),
        ]);
        assert!(!t.set.contains_key("SLUICE_HEALTH_REQUIRES_CONFIG"));
        assert_eq!(
            t.notes,
            [
                "FORCE_START_WITHOUT_INITIAL_CONFIG ignored: SLUICE_HEALTH_REQUIRES_CONFIG is set and wins"
            ]
        );
    }

    #[test]
    fn plaintext_defaults_san_and_file_mode() {
        let t = run(&[
            ("CONFIG_TYPE", "grpc_xds_sotw"),
            ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/ca.pem"),
        ]);
        assert_eq!(t.set["SLUICE_CONFIG_XDS"], "http://localhost:18000");
        assert!(!t.set.contains_key("SLUICE_CONFIG_XDS_CA_FILE"));
        assert_eq!(
            t.notes,
            [
                "CONFIG_GRPC_XDS_SERVER_TLS_CACERT ignored: CONFIG_GRPC_XDS_SERVER_USE_TLS is not true"
            ]
        );

        let t = run(&[
            ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
            ("CONFIG_GRPC_XDS_SERVER_URL", "xds.internal:443"),
            ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
            ("CONFIG_GRPC_XDS_SERVER_TLS_SAN", "envoy-gateway"),
            ("XDS_CLIENT_BACKOFF_JITTER", "true"),
        ]);
        assert_eq!(t.set["SLUICE_CONFIG_XDS"], "https://xds.internal:443");
        assert_eq!(t.set["SLUICE_CONFIG_XDS_SERVER_NAME"], "envoy-gateway");
        assert!(t.notes[0].starts_with("XDS_CLIENT_BACKOFF_JITTER is not supported"));

        // File mode (the default): the xDS variables are reported, the files still load.
        let t = run(&[
            ("RUNTIME_ROOT", "/data"),
            ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
        ]);
        assert_eq!(t.set["SLUICE_CONFIG"], "/data/config");
        assert!(!t.set.contains_key("SLUICE_CONFIG_XDS"));
        assert!(
            t.notes[0]
                .starts_with("FORCE_START_WITHOUT_INITIAL_CONFIG ignored: CONFIG_TYPE is FILE")
        );

        let t = run(&[("CONFIG_TYPE", "GRPC_XDS_DELTA")]);
        assert_eq!(
            t.notes,
            ["CONFIG_TYPE=GRPC_XDS_DELTA is not supported: FILE or GRPC_XDS_SOTW"]
        );
    }
}
