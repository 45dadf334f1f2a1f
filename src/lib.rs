//! sluice: an Envoy RLS v3 admission-control sidecar with an exact sliding-window log.
//!
//! Module map (each layer knows only the one below it):
//! - [`config`]: envoyproxy/ratelimit's YAML -> validated lookup tree of rules.
//! - [`descriptor`]: request descriptor entries -> limiter keys (one pure function).
//! - [`limiter`]: the sliding-window log behind a trait; `memory`, `redis` (standalone and
//!   cluster) backends; `guard` (deadline, in-flight bound) and `cache` (local rejections) wrappers.
//! - [`decision`]: one request's descriptors -> rules -> a limiter batch -> per-descriptor verdicts.
//! - [`service`]: the tonic adapter only: proto <-> domain types, errors -> gRPC status.
//! - [`admin`]: HTTP /healthz, /readyz, /metrics.
//! - [`server`]: wiring: `run(config, listeners, shutdown)`.
#![forbid(unsafe_code)]

pub mod admin;
pub mod config;
pub mod decision;
pub mod descriptor;
pub mod limiter;
pub mod metrics;
pub mod proto;
pub mod server;
pub mod service;

pub use server::{run, ServerSettings};
