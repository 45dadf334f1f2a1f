//! sluice: an Envoy RLS v3 admission-control sidecar with an exact sliding-window log.
//!
//! Module map (each layer knows only the ones below it; facts flow up: the limiter and the
//! engine return what happened, the metrics observer records it):
//! - [`config`]: envoyproxy/ratelimit's YAML -> validated lookup tree of rules.
//! - [`descriptor`]: request descriptor entries -> limiter keys (one pure function).
//! - [`limiter`]: the `Limiter` trait and its semantics; pure models with `now` passed in
//!   (`log`, `leases`, `window`, `algorithms`); the `memory` and `redis` (standalone, Sentinel, cluster)
//!   backends; the `guard` (deadline, in-flight bound) and `cache` (local rejections) decorators.
//! - [`decision`]: one request's descriptors -> rules -> a limiter batch -> per-descriptor
//!   verdicts (types, input limits, rule resolution, engine).
//! - [`headers`]: verdicts -> rate-limit response headers (one pure function).
//! - [`metrics`]: every metric family, recorded from what the layers below return.
//! - [`otel`]: OpenTelemetry traces: a span per decision under the caller's `traceparent`, a
//!   child per backend call (the tracer the faces hold and the backend decorator), OTLP export.
//! - [`rls`]: one rate-limit call for both faces: proto <-> domain, errors -> status, observed.
//! - [`service`]: the gRPC face (tonic adapter only), [`codec`] its message decoding (a request
//!   that does not decode is `INVALID_ARGUMENT`); [`http_api`]: envoyproxy/ratelimit's HTTP
//!   face on the admin port (POST /json, GET /rlconfig); [`admin`]: /healthz, /readyz, /metrics.
//! - [`reload`]: polls the config path and swaps in each valid new generation.
//! - [`compat`]: envoyproxy/ratelimit's environment variables -> `SLUICE_*` settings.
//! - [`explain`]: `sluice explain`: which rule governs a descriptor and why.
//! - [`xds`]: the xDS config source: subscribes to a management server and swaps in each
//!   valid config it pushes (ACK), keeping the previous one on an invalid push (NACK).
//! - [`app`]: the production stack from plain settings: config, backend (memory, Redis,
//!   Redis Cluster) with its guard and rejection cache, metrics recorder.
//! - [`listen`]: accepting on both ports within limits (connections, first bytes, idle time,
//!   no spin when file descriptors run out).
//! - [`logging`]: the log subscriber `sluice serve` installs, with per-connection warnings of
//!   the HTTP/2 stack rate-limited.
//! - [`tls`]: the gRPC server's TLS: certificates and client CAs from files, reloaded when they
//!   change, client certificates verified.
//! - [`server`]: wiring: `run(settings, listeners, shutdown)`.
//! - [`sync`]: the one poison-tolerant lock.
#![forbid(unsafe_code)]
#![deny(clippy::unwrap_used, clippy::expect_used)]

pub mod admin;
pub mod app;
pub mod codec;
pub mod compat;
pub mod config;
pub mod decision;
pub mod descriptor;
pub mod explain;
pub mod headers;
pub mod http_api;
pub mod limiter;
pub mod listen;
pub mod logging;
pub mod metrics;
pub mod otel;
pub mod proto;
pub mod reload;
pub mod rls;
pub mod server;
pub mod service;
pub mod sync;
pub mod tls;
pub mod xds;

pub use app::Settings;
pub use server::{Listeners, ServerSettings, run};
