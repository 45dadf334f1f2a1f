//! An OTLP trace receiver on loopback, standing in for an OpenTelemetry collector: OTLP/gRPC
//! (`opentelemetry.proto.collector.trace.v1.TraceService/Export`, the generated tonic server of
//! `opentelemetry-proto`) or OTLP/HTTP (`POST /v1/traces`, protobuf body). It keeps every export
//! it receives, as decoded messages and as the bytes they encode to, and answers success.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;

type Exports = Arc<Mutex<Vec<ExportTraceServiceRequest>>>;

pub struct OtlpReceiver {
    pub addr: SocketAddr,
    exports: Exports,
    task: tokio::task::JoinHandle<()>,
}

/// One received span with its resource's attributes.
#[derive(Debug, Clone)]
pub struct Received {
    pub span: Span,
    pub resource: Vec<KeyValue>,
}

struct Collector(Exports);

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.0.lock().unwrap().push(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

impl OtlpReceiver {
    /// OTLP/gRPC on an ephemeral loopback port.
    pub async fn grpc() -> OtlpReceiver {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().unwrap();
        let exports = Exports::default();
        let server = tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(Collector(exports.clone())))
            .serve_with_incoming(TcpListenerStream::new(listener));
        let task = tokio::spawn(async move {
            server.await.expect("OTLP/gRPC receiver");
        });
        OtlpReceiver {
            addr,
            exports,
            task,
        }
    }

    /// OTLP/HTTP (protobuf) on an ephemeral loopback port.
    pub async fn http() -> OtlpReceiver {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().unwrap();
        let exports = Exports::default();
        let sink = exports.clone();
        let app = axum::Router::new().route(
            "/v1/traces",
            axum::routing::post(move |body: Bytes| {
                let sink = sink.clone();
                async move {
                    let request = ExportTraceServiceRequest::decode(body).expect("OTLP protobuf");
                    sink.lock().unwrap().push(request);
                    let response = ExportTraceServiceResponse {
                        partial_success: None,
                    };
                    (
                        [("content-type", "application/x-protobuf")],
                        response.encode_to_vec(),
                    )
                }
            }),
        );
        let task = tokio::spawn(async move {
            axum::serve(listener, app)
                .await
                .expect("OTLP/HTTP receiver");
        });
        OtlpReceiver {
            addr,
            exports,
            task,
        }
    }

    /// The base URL an exporter is given (`--otlp-endpoint`).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every span received so far, in arrival order.
    pub fn spans(&self) -> Vec<Received> {
        let exports = self.exports.lock().unwrap();
        let mut out = Vec::new();
        for export in exports.iter() {
            for resource_spans in &export.resource_spans {
                let resource = resource_spans
                    .resource
                    .as_ref()
                    .map(|r| r.attributes.clone())
                    .unwrap_or_default();
                for scope in &resource_spans.scope_spans {
                    for span in &scope.spans {
                        out.push(Received {
                            span: span.clone(),
                            resource: resource.clone(),
                        });
                    }
                }
            }
        }
        out
    }

    /// Every export received, encoded again: whatever sluice sent, byte for byte in content.
    pub fn raw(&self) -> Vec<u8> {
        let exports = self.exports.lock().unwrap();
        exports.iter().flat_map(Message::encode_to_vec).collect()
    }

    /// Waits (up to `timeout`) until `done` holds for the spans received; returns them.
    pub async fn wait_for(
        &self,
        timeout: Duration,
        done: impl Fn(&[Received]) -> bool,
    ) -> Vec<Received> {
        let deadline = Instant::now() + timeout;
        loop {
            let spans = self.spans();
            if done(&spans) {
                return spans;
            }
            assert!(
                Instant::now() < deadline,
                "the receiver did not get the expected spans within {timeout:?}; it has:\n{spans:#?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The value of attribute `key`, if any.
pub fn attr<'a>(attributes: &'a [KeyValue], key: &str) -> Option<&'a Value> {
    attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v| v.value.as_ref())
}

/// A string attribute's value; panics naming the key when it is missing or not a string.
pub fn str_attr<'a>(attributes: &'a [KeyValue], key: &str) -> &'a str {
    match attr(attributes, key) {
        Some(Value::StringValue(s)) => s,
        other => panic!("attribute {key}: expected a string, found {other:?}"),
    }
}

/// An integer attribute's value.
pub fn int_attr(attributes: &[KeyValue], key: &str) -> i64 {
    match attr(attributes, key) {
        Some(Value::IntValue(i)) => *i,
        other => panic!("attribute {key}: expected an integer, found {other:?}"),
    }
}

/// A string-array attribute's values.
pub fn strings_attr(attributes: &[KeyValue], key: &str) -> Vec<String> {
    match attr(attributes, key) {
        Some(Value::ArrayValue(array)) => array
            .values
            .iter()
            .map(|v| match &v.value {
                Some(Value::StringValue(s)) => s.clone(),
                other => panic!("attribute {key}: expected strings, found {other:?}"),
            })
            .collect(),
        other => panic!("attribute {key}: expected an array, found {other:?}"),
    }
}

/// A W3C `traceparent` value.
pub fn traceparent(trace_id: &[u8; 16], span_id: &[u8; 8], sampled: bool) -> String {
    format!(
        "00-{}-{}-{}",
        hex(trace_id),
        hex(span_id),
        if sampled { "01" } else { "00" }
    )
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
