//! The tracing flags of `sluice serve` (each also read from a `SLUICE_*` variable, which
//! envoyproxy/ratelimit's `TRACING_*` and `OTEL_EXPORTER_OTLP_ENDPOINT` fill in: see `compat`),
//! flattened into the command's flags by `main`.

use super::export::{DEFAULT_SERVICE_NAME, Protocol, TracingSettings};

#[derive(Debug, Clone, clap::Args)]
pub struct TracingArgs {
    /// Export a span per decision over OTLP (OpenTelemetry), under the caller's W3C
    /// `traceparent`.
    #[arg(long, env = "SLUICE_TRACING")]
    pub tracing: bool,
    /// OTLP transport: http (protobuf, a collector's port 4318) or grpc (port 4317).
    #[arg(long, env = "SLUICE_OTLP_PROTOCOL", value_enum, default_value = "http")]
    pub otlp_protocol: OtlpProtocol,
    /// The collector's base URL, http://host:port (http appends /v1/traces). Default:
    /// http://localhost:4318 (http) or http://localhost:4317 (grpc).
    #[arg(long, env = "SLUICE_OTLP_ENDPOINT", value_name = "URL")]
    pub otlp_endpoint: Option<String>,
    /// Share of the traces starting here that are sampled, 0 to 1; a caller's `traceparent`
    /// keeps its own sampling decision.
    #[arg(long, env = "SLUICE_TRACING_SAMPLING_RATE", default_value_t = 1.0, value_parser = parse_rate)]
    pub tracing_sampling_rate: f64,
    /// `service.name` of the spans.
    #[arg(long, env = "SLUICE_TRACING_SERVICE_NAME", default_value = DEFAULT_SERVICE_NAME)]
    pub tracing_service_name: String,
    /// `service.namespace` of the spans.
    #[arg(long, env = "SLUICE_TRACING_SERVICE_NAMESPACE")]
    pub tracing_service_namespace: Option<String>,
    /// `service.instance.id` of the spans (the pod name is a good choice); default: a random
    /// UUID.
    #[arg(long, env = "SLUICE_TRACING_SERVICE_INSTANCE_ID")]
    pub tracing_service_instance_id: Option<String>,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum OtlpProtocol {
    #[value(alias = "http/protobuf")]
    Http,
    Grpc,
}

impl TracingArgs {
    /// The settings these flags describe; `None` when tracing is off.
    pub fn settings(&self) -> Option<TracingSettings> {
        self.tracing.then(|| TracingSettings {
            protocol: match self.otlp_protocol {
                OtlpProtocol::Http => Protocol::Http,
                OtlpProtocol::Grpc => Protocol::Grpc,
            },
            endpoint: self.otlp_endpoint.clone().filter(|e| !e.is_empty()),
            sampling_rate: self.tracing_sampling_rate,
            service_name: self.tracing_service_name.clone(),
            service_namespace: self.tracing_service_namespace.clone(),
            service_instance_id: self.tracing_service_instance_id.clone(),
            export_interval: None,
        })
    }
}

/// A rate in [0, 1].
fn parse_rate(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
        _ => Err(format!("{text:?} is not a rate between 0 and 1")),
    }
}
