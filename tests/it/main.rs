//! Every integration test of sluice, in one crate: compiled and linked once, the shared
//! [`helpers`] with it. Each module is one suite (its `//!` says what it proves); nextest names
//! a test by its path (`soak::two_instances_survive_redis_kills_and_a_pause_without_over_admitting`)
//! and `.config/nextest.toml` selects by that path (`test(/^soak::/)`).
//!
//! The runner is cargo-nextest (`bash scripts/test.sh`, docs/testing.md): each test in a process
//! of its own, so process-wide state (the metrics recorder, the peak resident set
//! `bounded_memory` reads) is a test's own. `cargo test --test it` runs the tests as threads of
//! one process instead, where tests that assert exact metric counts or a process's memory may
//! see each other: run one module at a time that way (`cargo test --test it soak::`).
//!
//! Fixtures are files under `tests/fixtures` ([`helpers::fixture`]); proptest keeps the failing
//! cases it found in `tests/proptest-regressions/<module>.txt` (its default place for a crate
//! whose root is `main.rs`) and replays them first.

mod helpers;

mod bounded_memory;
mod cli;
mod client_errors;
mod config_errors;
mod config_limits;
mod conformance;
mod connection_limits;
mod differential;
mod drain;
mod e2e;
mod envoy_deploy;
mod envoy_faults;
mod envoy_features;
mod envoy_gateway;
mod envoy_mtls;
mod fuzz;
mod grpc_tls;
mod headers;
mod in_flight;
mod in_flight_model;
mod input_limits;
mod istio;
mod local_cache;
mod migration;
mod observability;
mod pool_round_trips;
mod quota_service;
mod ratelimit_stats;
mod redis_backend;
mod redis_cluster;
mod redis_failures;
mod redis_isolation;
mod redis_nodelay;
mod redis_sentinel;
mod redis_sentinel_bounds;
mod redis_tls_auth;
mod reload;
mod reservation_model;
mod rlqs_envoy;
mod soak;
mod token_budget;
mod tracing;
mod xds;
mod xds_bounds;
