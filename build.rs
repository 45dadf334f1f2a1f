//! Compiles the trimmed Envoy RLS protos with a pure-Rust protobuf compiler (no system protoc)
//! and writes the file descriptor set that gRPC reflection serves.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/envoy/service/ratelimit/v3/rls.proto",
        "proto/envoy/extensions/common/ratelimit/v3/ratelimit.proto",
        "proto/envoy/config/core/v3/base.proto",
        "proto/envoy/type/v3/ratelimit_unit.proto",
    ];
    for file in &files {
        println!("cargo:rerun-if-changed={file}");
    }
    let fds = protox::compile(files, ["proto"])?;
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out_dir.join("sluice_descriptor.bin"),
        prost::Message::encode_to_vec(&fds),
    )?;
    // Messages that do not decode are answered INVALID_ARGUMENT, not INTERNAL (src/codec.rs).
    tonic_prost_build::configure()
        .codec_path("crate::codec::StrictCodec")
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
