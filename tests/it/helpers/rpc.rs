//! gRPC clients of a sluice under test, and the requests they send.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use sluice::proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use sluice::proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use sluice::proto::envoy::service::ratelimit::v3::RateLimitRequest;
use tonic::transport::Channel;

/// A channel to the gRPC server at `addr`, retried for up to 10 s while it starts.
pub async fn grpc_channel(addr: SocketAddr) -> Channel {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match Channel::from_shared(format!("http://{addr}"))
            .expect("uri")
            .connect()
            .await
        {
            Ok(channel) => return channel,
            Err(err) if Instant::now() > deadline => panic!("cannot connect to sluice: {err}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// A descriptor from `key=value` pairs.
pub fn descriptor(pairs: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: pairs
            .iter()
            .map(|(k, v)| Entry {
                key: (*k).into(),
                value: (*v).into(),
            })
            .collect(),
        ..Default::default()
    }
}

pub fn request(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors,
        hits_addend: 0,
    }
}
