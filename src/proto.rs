//! Generated types (from proto/ via build.rs): Envoy's RLS v3 and Rate Limit Quota Service v3,
//! which the gRPC server serves;
//! the discovery service, `google.rpc.Status` and envoyproxy/ratelimit's `RateLimitConfig`,
//! which the xDS client speaks; and the encoded descriptor set that gRPC reflection serves (the
//! served files only), so `grpcurl` works without proto files.
// Generated code: no lint of ours applies (its functions are as long as the protos make them).
#![allow(clippy::all, clippy::too_many_lines, missing_docs)]

pub mod envoy {
    pub mod config {
        pub mod core {
            pub mod v3 {
                tonic::include_proto!("envoy.config.core.v3");
            }
        }
    }
    pub mod r#type {
        pub mod v3 {
            tonic::include_proto!("envoy.r#type.v3");
        }
    }
    pub mod extensions {
        pub mod common {
            pub mod ratelimit {
                pub mod v3 {
                    tonic::include_proto!("envoy.extensions.common.ratelimit.v3");
                }
            }
        }
    }
    pub mod service {
        pub mod rate_limit_quota {
            pub mod v3 {
                tonic::include_proto!("envoy.service.rate_limit_quota.v3");
            }
        }
        pub mod ratelimit {
            pub mod v3 {
                tonic::include_proto!("envoy.service.ratelimit.v3");
            }
        }
        pub mod discovery {
            pub mod v3 {
                tonic::include_proto!("envoy.service.discovery.v3");
            }
        }
    }
}

pub mod google {
    pub mod rpc {
        tonic::include_proto!("google.rpc");
    }
}

/// envoyproxy/ratelimit's config API: the `RateLimitConfig` xDS resource.
pub mod ratelimit {
    pub mod config {
        pub mod ratelimit {
            pub mod v3 {
                tonic::include_proto!("ratelimit.config.ratelimit.v3");
            }
        }
    }
}

/// Encoded `FileDescriptorSet` of every proto sluice serves.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("sluice_descriptor");
