//! What every test suite shares, in one folder: each suite says `mod helpers;` and uses what it
//! needs (the rest is compiled and unused, hence `dead_code` allowed here).
//!
//! - [`redis_server`]: throwaway `redis-server` processes and 3-primary clusters.
//! - [`sentinel`]: a primary, its replicas and three sentinels, for failover tests.
//! - [`in_process`]: sluice itself, in the test process, on port 0 ([`TestServer`]): the
//!   production stack built by `sluice::app`, served by `sluice::run`. Most suites use this.
//! - [`process`]: the built `sluice` binary as a child process ([`Sluice`]), for the black-box
//!   tests of the binary itself: flags and environment, start-up errors, SIGTERM, its log.
//! - [`rpc`] and [`http`]: clients for the gRPC and the admin port.
//! - [`limiter`]: decisions straight through the `Limiter` trait (conformance and the Redis
//!   backend suites).
//! - [`fuzz_harness`]: the fuzz harnesses, shared with the cargo-fuzz targets under `fuzz/`.
#![allow(dead_code, unused_imports)]

pub mod fuzz_harness;
pub mod http;
pub mod in_process;
pub mod limiter;
pub mod process;
pub mod redis_server;
pub mod rpc;
pub mod sentinel;

pub use http::{http_get, http_request};
pub use in_process::{test_settings, TestServer};
pub use limiter::consume;
pub use process::Sluice;
pub use redis_server::{free_port, raw_connection, RedisCluster, RedisServer};
pub use rpc::{descriptor, grpc_channel, request};

use std::path::PathBuf;

/// A path under `tests/fixtures`.
pub fn fixture(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(rel)
}
