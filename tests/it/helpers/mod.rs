//! What every test suite shares, in one module of the one test crate: each suite says
//! `use crate::helpers;` and takes what it needs. The crate is compiled once, so a helper no
//! suite uses is a dead-code warning (the fuzz harness, also built by `fuzz/`, excepted).
//!
//! - [`redis_server`]: throwaway `redis-server` processes and 3-primary clusters.
//! - [`sentinel`]: a primary, its replicas and three sentinels, for failover tests.
//! - [`in_process`]: sluice itself, in the test process, on port 0 ([`TestServer`]): the
//!   production server built by `sluice::Server::build`, served by its `run`. Most suites use
//!   this.
//! - [`process`]: the built `sluice` binary as a child process ([`Sluice`]), for the black-box
//!   tests of the binary itself: flags and environment, start-up errors, SIGTERM, its log.
//! - [`rpc`] and [`http`]: clients for the gRPC and HTTP ports (the admin's, and Envoy's as a
//!   client sees it).
//! - [`envoy`]: a real Envoy process (and a trivial upstream behind it); [`envoy_config`]: the
//!   configs it runs, shipped ones rendered with only addresses changed, or built by a test;
//!   [`istio`]: the EnvoyFilters of `deploy/istio/` applied to istiod-shaped configs;
//!   [`edge_limits`]: what `deploy/base/limits` promises a client through them.
//! - [`otlp`]: an OTLP trace receiver (gRPC or HTTP) standing in for an OpenTelemetry collector.
//! - [`prometheus`]: the reader of `/metrics` pages (samples, labels, values), and the
//!   Prometheus project's own parser of them (families, types, help).
//! - [`statsd`]: Etsy's statsd daemon, logging every line it receives.
//! - [`timing`]: waiting for a condition under a deadline; percentiles of latencies.
//! - [`limiter`]: decisions straight through the `Limiter` trait (conformance and the Redis
//!   backend suites).
//! - [`fuzz_harness`]: the fuzz harnesses, shared with the cargo-fuzz targets under `fuzz/`.
//! - [`xds_server`]: a test double of an xDS management server (plaintext or mutual TLS 1.3);
//!   [`certs`]: a private CA and the certificates it signs, made by the test (rcgen);
//!   [`secret`]: a Kubernetes Secret volume on disk, rotated the way the kubelet does it;
//!   [`gateway`]: Envoy Gateway's certificates, rate-limit cluster, route shapes and limits;
//!   [`gateway_pod`]: the rate limiter as its pod runs it, and the pod's probes.
pub mod certs;
pub mod edge_limits;
pub mod envoy;
pub mod envoy_config;
pub mod fuzz_harness;
pub mod gateway;
pub mod gateway_pod;
pub mod http;
pub mod in_process;
pub mod istio;
pub mod limiter;
pub mod otlp;
pub mod process;
pub mod prometheus;
pub mod redis_server;
pub mod rpc;
pub mod secret;
pub mod sentinel;
pub mod statsd;
pub mod timing;
pub mod xds_server;

pub use envoy::{Envoy, Upstream};
pub use http::{HttpResponse, Req, http_get, http_request};
pub use in_process::{TestServer, test_settings};
pub use limiter::consume;
pub use process::Sluice;
pub use redis_server::{RedisCluster, RedisServer, fcall, free_port, info_number, raw_connection};
pub use rpc::{QuotaStream, descriptor, grpc_channel, quota_actions, quota_line, request};
pub use timing::{percentile, wait_until};

use std::path::PathBuf;

/// A path under `tests/fixtures`.
pub fn fixture(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(rel)
}
