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
//! - [`metadata`]: a descriptor's `metadata` as a protobuf `Struct` (from YAML or xDS, to
//!   JSON), and the merge envoyproxy/ratelimit applies to a response's.
//! - [`quota`]: the Rate Limit Quota Service without the wire: usage reports -> a bucket's rule
//!   -> allotments reserved in the rule's window through the limiter (held items) -> assignments.
//! - [`metrics`]: every metric family, recorded from what the layers below return.
//! - [`otel`]: OpenTelemetry traces: a span per decision under the caller's `traceparent`, a
//!   child per backend call (the tracer the faces hold and the backend decorator), OTLP export.
//! - [`rls`]: one rate-limit call for both faces: proto <-> domain, errors -> status, observed.
//! - [`rlqs`]: one Rate Limit Quota Service stream for the gRPC face: reports proto <-> domain,
//!   checked, answered by [`quota`], recorded.
//! - [`grpc`]: the gRPC face: the RLS service (a tonic adapter only), the quota service (a task
//!   per stream), health, reflection, and
//!   the strict message codec (a request that does not decode is `INVALID_ARGUMENT`).
//! - [`http`]: the HTTP face on the admin port: /healthz, /readyz, /healthcheck, /metrics, and
//!   envoyproxy/ratelimit's POST /json and GET /rlconfig.
//! - [`readiness`]: what the probes report (backend reachable, config served, not draining),
//!   and envoyproxy/ratelimit's health (`/healthcheck`, gRPC `ratelimit`).
//! - [`watcher`]: the one file watcher: polls files by fingerprint on a thread of its own,
//!   swaps in content that changed and loads, reports a broken change once.
//! - [`reload`]: the config path as the watcher polls it; each valid new generation swapped in.
//! - [`xds`]: the xDS config source: subscribes to a management server and swaps in each
//!   valid config it pushes (ACK), keeping the previous one on an invalid push (NACK).
//! - [`server`]: serving: one [`Settings`] value in; the limiter stack (backend, guard,
//!   rejection cache, tracing, metrics) built in one place; `run(settings, listeners,
//!   shutdown)` in named steps over owned tasks; accepting within limits (`listen`), the gRPC
//!   port's TLS (`tls`), two-step shutdown.
//! - [`app`]: the library side of `check-config`, `explain` and the settings read from files.
//! - [`compat`]: envoyproxy/ratelimit's environment variables -> `SLUICE_*` settings.
//! - [`explain`]: `sluice explain`: which rule governs a descriptor and why.
//! - [`logging`]: the log subscriber `sluice serve` installs, with per-connection warnings of
//!   the HTTP/2 stack rate-limited.
//! - [`pem`]: certificates, private keys and CA bundles read from PEM files, for every TLS
//!   setting (gRPC server, Redis, xDS), errors naming the flag and the file.
//! - [`file`]: reading a config or PEM file without trusting what sits at its path (no FIFO,
//!   device or oversized file).
//! - [`sync`]: the one poison-tolerant lock.
#![forbid(unsafe_code)]
#![deny(clippy::unwrap_used, clippy::expect_used)]
// Long functions (threshold and why: clippy.toml). Tests tell one scenario top to bottom and
// are left out.
#![cfg_attr(not(test), deny(clippy::too_many_lines))]

pub mod app;
pub mod compat;
pub mod config;
pub mod decision;
pub mod descriptor;
pub mod explain;
pub mod file;
pub mod grpc;
pub mod headers;
pub mod http;
pub mod limiter;
pub mod logging;
pub mod metadata;
pub mod metrics;
pub mod otel;
pub mod pem;
pub mod proto;
pub mod quota;
pub mod readiness;
pub mod reload;
pub mod rlqs;
pub mod rls;
pub mod server;
pub mod sync;
pub mod watcher;
pub mod xds;

pub use server::{Listeners, Server, Settings, run};
