//! envoyproxy/ratelimit's tracing variables, as Envoy Gateway sets them (`TRACING_ENABLED`,
//! `TRACING_SERVICE_NAME`, `TRACING_SERVICE_NAMESPACE`, `TRACING_SERVICE_INSTANCE_ID`,
//! `TRACING_SAMPLING_RATE`, `TRACING_EXPORTER_PROTOCOL`, `OTEL_EXPORTER_OTLP_ENDPOINT`), onto the
//! `--tracing*` and `--otlp-*` flags. Their meanings are the same: OTLP/HTTP unless the protocol
//! says `grpc`, the endpoint a base URL, a parent-based sampler at the rate. An
//! envoyproxy/ratelimit environment keeps envoyproxy/ratelimit's defaults: spans named
//! `service.name=RateLimit` unless it names the service.

use super::{Flag, Map, Translation};

/// envoyproxy/ratelimit's `service.name` when `TRACING_SERVICE_NAME` is not set.
pub const ENVOYPROXY_SERVICE_NAME: &str = "RateLimit";

const SERVICE_NAME: &str = "SLUICE_TRACING_SERVICE_NAME";

/// Variables whose value carries over as it is.
const SAME: &[(&str, &str)] = &[
    ("TRACING_SERVICE_NAME", SERVICE_NAME),
    (
        "TRACING_SERVICE_NAMESPACE",
        "SLUICE_TRACING_SERVICE_NAMESPACE",
    ),
    (
        "TRACING_SERVICE_INSTANCE_ID",
        "SLUICE_TRACING_SERVICE_INSTANCE_ID",
    ),
    ("TRACING_SAMPLING_RATE", "SLUICE_TRACING_SAMPLING_RATE"),
    ("OTEL_EXPORTER_OTLP_ENDPOINT", "SLUICE_OTLP_ENDPOINT"),
];

pub(super) fn translate(
    get: &dyn Fn(&str) -> Option<String>,
    map: Map<'_>,
    flag: Flag<'_>,
    out: &mut Translation,
) {
    let enabled = flag("TRACING_ENABLED", out);
    if let Some(on) = enabled {
        map("TRACING_ENABLED", "SLUICE_TRACING", on.to_string(), out);
    }
    for (legacy, sluice) in SAME {
        if let Some(value) = get(legacy) {
            map(legacy, sluice, value.trim().to_owned(), out);
        }
    }
    if let Some(protocol) = get("TRACING_EXPORTER_PROTOCOL") {
        let protocol = protocol.trim().to_ascii_lowercase();
        map(
            "TRACING_EXPORTER_PROTOCOL",
            "SLUICE_OTLP_PROTOCOL",
            protocol,
            out,
        );
    }
    if enabled == Some(true) && get("TRACING_SERVICE_NAME").is_none() && get(SERVICE_NAME).is_none()
    {
        out.set
            .insert(SERVICE_NAME.to_owned(), ENVOYPROXY_SERVICE_NAME.to_owned());
    }
}

#[cfg(test)]
mod tests {
    use super::super::translate_pairs;

    #[test]
    fn envoy_gateways_tracing_environment_maps_onto_the_flags() {
        let t = translate_pairs(&[
            ("TRACING_ENABLED", "true"),
            ("TRACING_SERVICE_NAME", "envoy-ratelimit"),
            ("TRACING_SERVICE_NAMESPACE", "envoy-gateway-system"),
            ("TRACING_SERVICE_INSTANCE_ID", "envoy-ratelimit-5d9c-x7"),
            ("TRACING_SAMPLING_RATE", "0.5"),
            (
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                "http://otel-svc.observability:4318",
            ),
        ]);
        let expect = [
            ("SLUICE_TRACING", "true"),
            ("SLUICE_TRACING_SERVICE_NAME", "envoy-ratelimit"),
            ("SLUICE_TRACING_SERVICE_NAMESPACE", "envoy-gateway-system"),
            (
                "SLUICE_TRACING_SERVICE_INSTANCE_ID",
                "envoy-ratelimit-5d9c-x7",
            ),
            ("SLUICE_TRACING_SAMPLING_RATE", "0.5"),
            ("SLUICE_OTLP_ENDPOINT", "http://otel-svc.observability:4318"),
        ];
        for (k, v) in expect {
            assert_eq!(t.set.get(k).map(String::as_str), Some(v), "{k}: {t:#?}");
        }
        assert_eq!(t.set.len(), expect.len(), "{t:#?}");
        assert!(t.notes.is_empty(), "{t:#?}");
    }

    #[test]
    fn envoyproxy_defaults_and_the_grpc_protocol() {
        let t = translate_pairs(&[
            ("TRACING_ENABLED", "TRUE"),
            ("TRACING_EXPORTER_PROTOCOL", "GRPC"),
        ]);
        assert_eq!(t.set["SLUICE_TRACING"], "true");
        assert_eq!(t.set["SLUICE_OTLP_PROTOCOL"], "grpc");
        assert_eq!(t.set["SLUICE_TRACING_SERVICE_NAME"], "RateLimit");
        // Tracing off: no default is carried; sluice's own variable wins over both.
        let t = translate_pairs(&[("TRACING_ENABLED", "false")]);
        assert_eq!(t.set.len(), 1, "{t:#?}");
        let t = translate_pairs(&[
            ("TRACING_ENABLED", "true"),
            ("SLUICE_TRACING_SERVICE_NAME", "mine"),
            ("TRACING_SAMPLING_RATE", "0.1"),
            ("SLUICE_TRACING_SAMPLING_RATE", "1"),
        ]);
        assert!(!t.set.contains_key("SLUICE_TRACING_SERVICE_NAME"), "{t:#?}");
        assert!(
            !t.set.contains_key("SLUICE_TRACING_SAMPLING_RATE"),
            "{t:#?}"
        );
        assert_eq!(
            t.notes,
            ["TRACING_SAMPLING_RATE ignored: SLUICE_TRACING_SAMPLING_RATE is set and wins"]
        );
    }
}
