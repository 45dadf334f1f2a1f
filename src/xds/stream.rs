//! The ADS call with responses as bytes: each response is walked by [`super::bounds`] before it
//! is decoded, so what decoding would cost is known first.
//!
//! Why not the generated client: it decodes every response as it arrives, so a response of
//! millions of empty resources (2 bytes each on the wire, about 50 decoded) would be built
//! before sluice could look at it. The call is the generated one otherwise: the same path, the
//! same encoder for requests, the same decoded-size limit.

use prost::bytes::{Buf, Bytes};
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder, Streaming};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::Channel;
use tonic::{IntoStreamingRequest, Status};
use tonic_prost::ProstEncoder;

use super::resources::MAX_RESPONSE_BYTES;
use crate::proto::envoy::service::discovery::v3::DiscoveryRequest;

const METHOD: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";

/// Opens the stream: `requests` go out as they come, responses arrive as their bytes.
pub(super) async fn open(
    channel: Channel,
    requests: impl IntoStreamingRequest<Message = DiscoveryRequest>,
) -> Result<Streaming<Bytes>, Status> {
    let mut grpc = tonic::client::Grpc::new(channel).max_decoding_message_size(MAX_RESPONSE_BYTES);
    grpc.ready()
        .await
        .map_err(|e| Status::unknown(format!("Service was not ready: {e}")))?;
    let response = grpc
        .streaming(
            requests.into_streaming_request(),
            PathAndQuery::from_static(METHOD),
            BytesCodec,
        )
        .await?;
    Ok(response.into_inner())
}

/// Requests encoded by prost, responses kept as bytes.
#[derive(Debug, Default)]
struct BytesCodec;

impl Codec for BytesCodec {
    type Encode = DiscoveryRequest;
    type Decode = Bytes;
    type Encoder = ProstEncoder<DiscoveryRequest>;
    type Decoder = BytesDecoder;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::default()
    }

    fn decoder(&mut self) -> Self::Decoder {
        BytesDecoder
    }
}

#[derive(Debug)]
struct BytesDecoder;

impl Decoder for BytesDecoder {
    type Item = Bytes;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        Ok(Some(buf.copy_to_bytes(buf.remaining())))
    }

    fn buffer_settings(&self) -> BufferSettings {
        BufferSettings::default()
    }
}
