//! The exporting half: settings as plain values (validated at start-up), the OTLP exporter for
//! either protocol, the sampler, the resource that names this instance, and the batch
//! processor that takes export off the request path.

use std::time::Duration;

use async_trait::async_trait;
use opentelemetry::KeyValue;
use opentelemetry_http::hyper::HyperClient;
use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use opentelemetry_otlp::{WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, IdGenerator as _, RandomIdGenerator, Sampler,
    SdkTracerProvider,
};

/// `service.name` unless told otherwise (envoyproxy/ratelimit's variables bring its own
/// default, `RateLimit`).
pub const DEFAULT_SERVICE_NAME: &str = "sluice";
/// How long one export may take over HTTP (the gRPC exporter's own default is the same).
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// The OTLP transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Protocol {
    /// OTLP/gRPC, the collector's port 4317.
    Grpc,
    /// OTLP/HTTP with protobuf bodies, the collector's port 4318 (envoyproxy/ratelimit's default).
    #[default]
    Http,
}

impl Protocol {
    pub const fn as_str(self) -> &'static str {
        match self {
            Protocol::Grpc => "grpc",
            Protocol::Http => "http",
        }
    }

    /// The OpenTelemetry specification's default endpoint.
    pub const fn default_endpoint(self) -> &'static str {
        match self {
            Protocol::Grpc => "http://localhost:4317",
            Protocol::Http => "http://localhost:4318",
        }
    }
}

/// Everything tracing needs, as plain values; [`TracingSettings::default`] gives the defaults of
/// `sluice serve --help`.
#[derive(Debug, Clone, PartialEq)]
pub struct TracingSettings {
    pub protocol: Protocol,
    /// The collector's base URL (`http://host:port`; OTLP/HTTP appends `/v1/traces`, as
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` does); `None`: [`Protocol::default_endpoint`].
    pub endpoint: Option<String>,
    /// Share of the traces that start here that are sampled, in [0, 1]; a caller's sampled or
    /// unsampled `traceparent` decides for its own trace.
    pub sampling_rate: f64,
    pub service_name: String,
    pub service_namespace: Option<String>,
    /// `service.instance.id`; `None`: a random UUID (the pod name is the usual choice).
    pub service_instance_id: Option<String>,
    /// Time between batch exports; `None`: the SDK's default (5 s, `OTEL_BSP_SCHEDULE_DELAY`).
    pub export_interval: Option<Duration>,
}

impl Default for TracingSettings {
    fn default() -> Self {
        TracingSettings {
            protocol: Protocol::default(),
            endpoint: None,
            sampling_rate: 1.0,
            service_name: DEFAULT_SERVICE_NAME.into(),
            service_namespace: None,
            service_instance_id: None,
            export_interval: None,
        }
    }
}

/// Why tracing cannot start as configured.
#[derive(Debug, thiserror::Error)]
pub enum TracingError {
    #[error("--otlp-endpoint {url:?}: {why}")]
    Endpoint { url: String, why: String },
    #[error("--tracing-sampling-rate {0}: must be between 0 and 1")]
    SamplingRate(f64),
    #[error("--tracing-service-name must not be empty")]
    ServiceName,
    #[error("the OTLP exporter: {0}")]
    Exporter(String),
}

impl TracingSettings {
    /// Checks everything that can be checked before starting.
    pub fn validate(&self) -> Result<(), TracingError> {
        if !(0.0..=1.0).contains(&self.sampling_rate) {
            return Err(TracingError::SamplingRate(self.sampling_rate));
        }
        if self.service_name.trim().is_empty() {
            return Err(TracingError::ServiceName);
        }
        self.export_url().map(drop)
    }

    /// The URL the exporter sends to: the endpoint (or the default) for gRPC, with
    /// `/v1/traces` appended for HTTP. Plain `http://` only: no TLS to the collector.
    pub fn export_url(&self) -> Result<String, TracingError> {
        let base = self
            .endpoint
            .as_deref()
            .unwrap_or(self.protocol.default_endpoint());
        let bad = |why: &str| TracingError::Endpoint {
            url: base.to_owned(),
            why: why.to_owned(),
        };
        let uri: http::Uri = base
            .parse()
            .map_err(|err: http::uri::InvalidUri| bad(&err.to_string()))?;
        match uri.scheme_str() {
            Some("http") => {}
            Some("https") => {
                return Err(bad(
                    "TLS to the collector is not supported: use http:// (a collector agent on \
                     the node or in the pod)",
                ));
            }
            _ => return Err(bad("must be an http://host:port URL")),
        }
        if uri.authority().is_none_or(|a| a.host().is_empty()) {
            return Err(bad("must be an http://host:port URL"));
        }
        Ok(match self.protocol {
            Protocol::Grpc => base.to_owned(),
            Protocol::Http => format!("{}/v1/traces", base.trim_end_matches('/')),
        })
    }
}

/// The tracer provider: the exporter behind a batch processor, the parent-based ratio sampler
/// and the resource.
pub(super) fn provider(settings: &TracingSettings) -> Result<SdkTracerProvider, TracingError> {
    settings.validate()?;
    let url = settings.export_url()?;
    let exporter = match settings.protocol {
        Protocol::Grpc => opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(url)
            .build(),
        Protocol::Http => opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .with_endpoint(url)
            .with_http_client(OnRuntime::current()?)
            .build(),
    }
    .map_err(|err| TracingError::Exporter(err.to_string()))?;
    let mut batch = BatchConfigBuilder::default();
    if let Some(interval) = settings.export_interval {
        batch = batch.with_scheduled_delay(interval);
    }
    let processor = BatchSpanProcessor::builder(exporter)
        .with_batch_config(batch.build())
        .build();
    Ok(SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
            settings.sampling_rate,
        ))))
        .with_resource(resource(settings))
        .build())
}

/// `service.*` attributes (`OTEL_RESOURCE_ATTRIBUTES` may add more).
fn resource(settings: &TracingSettings) -> Resource {
    let instance = settings
        .service_instance_id
        .clone()
        .filter(|id| !id.is_empty())
        .unwrap_or_else(random_uuid);
    let mut attributes = vec![
        KeyValue::new("service.instance.id", instance),
        KeyValue::new("service.version", env!("CARGO_PKG_VERSION")),
    ];
    if let Some(namespace) = settings.service_namespace.clone().filter(|n| !n.is_empty()) {
        attributes.push(KeyValue::new("service.namespace", namespace));
    }
    Resource::builder()
        .with_service_name(settings.service_name.clone())
        .with_attributes(attributes)
        .build()
}

/// A random (version 4) UUID, as envoyproxy/ratelimit names an instance by default.
fn random_uuid() -> String {
    let mut b = RandomIdGenerator::default().new_trace_id().to_bytes();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let hex: String = b.iter().map(|byte| format!("{byte:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

/// Hyper, driven by the runtime that serves. The batch processor exports from a thread of its
/// own that has no Tokio runtime, and hyper's connections are Tokio tasks: each request is
/// spawned onto the serving runtime and awaited from the exporting thread.
#[derive(Debug)]
struct OnRuntime {
    runtime: tokio::runtime::Handle,
    client: HyperClient,
}

impl OnRuntime {
    fn current() -> Result<Self, TracingError> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
            TracingError::Exporter("the OTLP/HTTP client needs a Tokio runtime".into())
        })?;
        Ok(OnRuntime {
            runtime,
            client: HyperClient::with_default_connector(EXPORT_TIMEOUT, None),
        })
    }
}

#[async_trait]
impl HttpClient for OnRuntime {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let client = self.client.clone();
        self.runtime
            .spawn(async move { client.send_bytes(request).await })
            .await
            .map_err(|err| -> HttpError { Box::new(err) })?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(endpoint: &str, protocol: Protocol) -> TracingSettings {
        TracingSettings {
            endpoint: Some(endpoint.into()),
            protocol,
            ..TracingSettings::default()
        }
    }

    #[test]
    fn endpoints_are_base_urls_as_in_the_otlp_variables() {
        let http = with("http://collector:4318/", Protocol::Http);
        assert_eq!(
            http.export_url().unwrap(),
            "http://collector:4318/v1/traces"
        );
        let prefixed = with("http://gw:80/otlp", Protocol::Http);
        assert_eq!(
            prefixed.export_url().unwrap(),
            "http://gw:80/otlp/v1/traces"
        );
        let grpc = with("http://collector:4317", Protocol::Grpc);
        assert_eq!(grpc.export_url().unwrap(), "http://collector:4317");
        let default = TracingSettings::default();
        assert_eq!(
            default.export_url().unwrap(),
            "http://localhost:4318/v1/traces"
        );
    }

    #[test]
    fn bad_settings_are_named() {
        for (url, why) in [
            (
                "https://collector:4318",
                "TLS to the collector is not supported",
            ),
            ("collector:4318", "must be an http://host:port URL"),
            ("http://", ""),
            ("http://bad host:1", ""),
        ] {
            let err = with(url, Protocol::Http)
                .validate()
                .unwrap_err()
                .to_string();
            assert!(
                err.starts_with(&format!("--otlp-endpoint {url:?}: ")),
                "{err}"
            );
            assert!(err.contains(why), "{err}");
        }
        for rate in [-0.1, 1.5, f64::NAN] {
            let settings = TracingSettings {
                sampling_rate: rate,
                ..TracingSettings::default()
            };
            assert!(matches!(
                settings.validate(),
                Err(TracingError::SamplingRate(_))
            ));
        }
    }

    #[test]
    fn instances_get_distinct_v4_uuids() {
        let (a, b) = (random_uuid(), random_uuid());
        assert_ne!(a, b);
        assert_eq!(a.len(), 36);
        assert_eq!(&a[14..15], "4");
        assert!("89ab".contains(&a[19..20]), "{a}");
    }
}
