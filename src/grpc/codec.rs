//! The gRPC codec of sluice's own services: prost's encoding, except that a message that does
//! not decode is the caller's fault, answered `INVALID_ARGUMENT` with what was wrong, instead of
//! tonic-prost's `INTERNAL`.
//!
//! Why: a request with a string field that is not UTF-8, or bytes that are not protobuf at all,
//! is a bad request like one over an input limit; `INTERNAL` tells the operator that sluice is
//! broken and the caller that retrying might help. build.rs points the generated code at
//! [`StrictCodec`] (tonic-prost-build's `codec_path`), so the transport decodes with it before
//! [`super::service`] sees the request. prost names the field in its error
//! (`Entry.value: RateLimitDescriptor.entries: RateLimitRequest.descriptors: invalid string
//! value: data is not UTF-8 encoded`, innermost first). The generated clients decode responses
//! with it too (the xDS client, tests and benchmarks): a response that does not decode is
//! reported the same way there, as a failed call like any other.

use std::marker::PhantomData;

use prost::Message;
use tonic::Status;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic_prost::{ProstCodec, ProstEncoder};

/// [`ProstCodec`] with [`StrictDecoder`].
#[derive(Debug, Clone)]
pub struct StrictCodec<T, U> {
    inner: ProstCodec<T, U>,
}

impl<T, U> Default for StrictCodec<T, U> {
    fn default() -> Self {
        StrictCodec {
            inner: ProstCodec::default(),
        }
    }
}

impl<T, U> Codec for StrictCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = StrictDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        self.inner.encoder()
    }

    fn decoder(&mut self) -> Self::Decoder {
        StrictDecoder {
            buffer_settings: self.inner.decoder().buffer_settings(),
            _message: PhantomData,
        }
    }
}

/// Decodes `U` with prost; a failure is [`decode_error`].
#[derive(Debug, Clone)]
pub struct StrictDecoder<U> {
    buffer_settings: BufferSettings,
    _message: PhantomData<U>,
}

impl<U: Message + Default> Decoder for StrictDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        U::decode(buf).map(Some).map_err(decode_error)
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.buffer_settings
    }
}

/// `INVALID_ARGUMENT` naming what prost could not decode.
pub fn decode_error(error: prost::DecodeError) -> Status {
    Status::invalid_argument(format!("malformed message: {error}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::envoy::service::ratelimit::v3::RateLimitRequest;

    #[test]
    fn a_string_that_is_not_utf8_is_the_callers_fault() {
        // Field 1 (domain), length-delimited, 2 bytes that are not UTF-8.
        let bytes: &[u8] = &[0x0a, 0x02, 0xff, 0xfe];
        let status = decode_error(RateLimitRequest::decode(bytes).unwrap_err());
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(
            status.message().contains("RateLimitRequest.domain"),
            "{status:?}"
        );
        assert!(status.message().contains("UTF-8"), "{status:?}");
    }
}
