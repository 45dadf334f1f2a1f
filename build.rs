//! Compiles the trimmed protos with a pure-Rust protobuf compiler (no system protoc) and writes
//! the file descriptor set that gRPC reflection serves.
//!
//! Two sets of files: what the gRPC server serves (RLS and the Rate Limit Quota Service;
//! reflection lists exactly these), and
//! what the xDS client speaks (the discovery service and envoyproxy/ratelimit's
//! `RateLimitConfig` resource). Both are generated in one run, since they share the
//! `envoy.config.core.v3` package (prost writes one file per package), but only the first is
//! in the reflection set: sluice does not serve the discovery service.

use std::path::PathBuf;

/// Served by sluice's gRPC server, and listed by reflection.
const SERVED: [&str; 7] = [
    "proto/envoy/service/ratelimit/v3/rls.proto",
    "proto/envoy/extensions/common/ratelimit/v3/ratelimit.proto",
    "proto/envoy/config/core/v3/base.proto",
    "proto/envoy/type/v3/ratelimit_unit.proto",
    "proto/envoy/service/rate_limit_quota/v3/rlqs.proto",
    "proto/envoy/type/v3/ratelimit_strategy.proto",
    "proto/envoy/type/v3/token_bucket.proto",
];

/// Spoken by the xDS client (`--config-xds`); not served.
const XDS: [&str; 5] = [
    "proto/envoy/service/discovery/v3/ads.proto",
    "proto/envoy/service/discovery/v3/discovery.proto",
    "proto/envoy/config/core/v3/node.proto",
    "proto/google/rpc/status.proto",
    "proto/ratelimit/config/ratelimit/v3/rls_conf.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    for file in SERVED.iter().chain(&XDS) {
        println!("cargo:rerun-if-changed={file}");
    }
    let served = protox::compile(SERVED, ["proto"])?;
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out_dir.join("sluice_descriptor.bin"),
        prost::Message::encode_to_vec(&served),
    )?;
    let all = protox::compile(SERVED.iter().chain(&XDS), ["proto"])?;
    // Messages that do not decode are answered INVALID_ARGUMENT, not INTERNAL (src/grpc/codec.rs).
    tonic_prost_build::configure()
        .codec_path("crate::grpc::codec::StrictCodec")
        // A bucket id's entries in key order: the same bucket always reads the same.
        .btree_map(".envoy.service.rate_limit_quota.v3.BucketId.bucket")
        .build_client(true)
        .build_server(true)
        .compile_fds(all)?;
    Ok(())
}
