//! sluice: an Envoy RLS v3 admission-control sidecar with an exact sliding-window log.
//!
//! Module map (each layer knows only the one below it):
//! - [`config`]: envoyproxy/ratelimit's YAML -> validated lookup tree of rules.
//! - [`descriptor`]: request descriptor entries -> limiter keys (one pure function).
//! - [`limiter`]: the sliding-window log (and the other algorithms, `limiter::algorithms`)
//!   behind a trait; `memory`, `redis` (standalone and cluster) backends; `guard` (deadline, in-flight bound) and `cache` (local rejections) wrappers.
//! - [`decision`]: one request's descriptors -> rules -> a limiter batch -> per-descriptor verdicts.
//! - [`headers`]: verdicts -> rate-limit response headers (one pure function).
//! - [`rls`]: one rate-limit call for both faces: proto <-> domain, errors -> status, observed.
//! - [`service`]: the tonic adapter only (the gRPC face); [`codec`]: its message decoding
//!   (a request that does not decode is `INVALID_ARGUMENT`).
//! - [`metrics`]: every metric family, recorded from what the layers below return.
//! - [`admin`]: HTTP /healthz, /readyz, /metrics.
//! - [`http_api`]: envoyproxy/ratelimit's HTTP face on the admin port: POST /json, GET /rlconfig.
//! - [`compat`]: envoyproxy/ratelimit's environment variables -> `SLUICE_*` settings.
//! - [`explain`]: `sluice explain`: which rule governs a descriptor and why.
//! - [`reload`]: polls the config path and swaps in each valid new generation.
//! - [`app`]: the production stack from plain settings: config, backend (memory, Redis,
//!   Redis Cluster) with its guard and rejection cache, metrics recorder.
//! - [`server`]: wiring: `run(settings, listeners, shutdown)`.
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
pub mod metrics;
pub mod proto;
pub mod reload;
pub mod rls;
pub mod server;
pub mod service;
pub mod sync;

pub use app::Settings;
pub use server::{run, Listeners, ServerSettings};
