//! Requests that are the caller's fault are answered as such: a gRPC message that does not
//! decode (a string that is not UTF-8, bytes that are not protobuf) is `INVALID_ARGUMENT` naming
//! what was wrong, never `INTERNAL`; a `/json` body that does not decode is 400 naming the
//! field. Neither records anything.

use crate::helpers;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::Duration;

use bytes::{Buf, BufMut};
use helpers::{TestServer, descriptor, request, test_settings};
use tonic::Status;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};

const CONFIG: &str =
    "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 3}\n";
const METHOD: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// Sends and receives message bytes as they are: what a broken or hostile client sends.
#[derive(Default)]
struct RawCodec;

struct Raw;

impl Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = Raw;
    type Decoder = Raw;
    fn encoder(&mut self) -> Raw {
        Raw
    }
    fn decoder(&mut self) -> Raw {
        Raw
    }
}

impl Encoder for Raw {
    type Item = Vec<u8>;
    type Error = Status;
    fn encode(&mut self, item: Vec<u8>, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        buf.put_slice(&item);
        Ok(())
    }
}

impl Decoder for Raw {
    type Item = Vec<u8>;
    type Error = Status;
    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, Status> {
        Ok(Some(buf.copy_to_bytes(buf.remaining()).to_vec()))
    }
}

async fn send_raw(sluice: &TestServer, message: Vec<u8>) -> Result<Vec<u8>, Status> {
    let mut grpc = tonic::client::Grpc::new(sluice.channel().await);
    grpc.ready().await.expect("ready");
    grpc.unary(
        tonic::Request::new(message),
        METHOD.parse().expect("path"),
        RawCodec,
    )
    .await
    .map(tonic::Response::into_inner)
}

/// A length-delimited protobuf field.
fn field(number: u8, bytes: &[u8]) -> Vec<u8> {
    let mut out = vec![number << 3 | 2, u8::try_from(bytes.len()).expect("short")];
    out.extend_from_slice(bytes);
    out
}

/// `RateLimitRequest{domain: "d", descriptors: [{entries: [{key: "k", value: <value>}]}]}`.
fn request_with_value(value: &[u8]) -> Vec<u8> {
    let entry = [field(1, b"k"), field(2, value)].concat();
    let descriptor = field(1, &entry);
    [field(1, b"d"), field(2, &descriptor)].concat()
}

fn start() -> (tempfile::TempDir, TestServer) {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("d.yaml");
    std::fs::write(&config, CONFIG).expect("write config");
    let sluice = TestServer::start(test_settings(&config, None));
    (dir, sluice)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undecodable_grpc_messages_are_invalid_argument() {
    let (_dir, sluice) = start();
    // A well-formed request, sent raw, is decided (the raw client itself works).
    let ok = send_raw(&sluice, request_with_value(b"v")).await;
    assert!(ok.is_ok(), "{ok:?}");

    let not_utf8 = send_raw(&sluice, request_with_value(&[b'v', 0xff, 0xfe]))
        .await
        .expect_err("a value that is not UTF-8 is refused");
    assert_eq!(
        not_utf8.code(),
        tonic::Code::InvalidArgument,
        "{not_utf8:?}"
    );
    for part in ["Entry.value", "RateLimitRequest.descriptors", "UTF-8"] {
        assert!(not_utf8.message().contains(part), "{not_utf8:?}");
    }

    // A length prefix running past the end of the message.
    let truncated = send_raw(&sluice, vec![0x0a, 0x40, b'd'])
        .await
        .expect_err("a truncated message is refused");
    assert_eq!(
        truncated.code(),
        tonic::Code::InvalidArgument,
        "{truncated:?}"
    );
    assert!(
        truncated.message().starts_with("malformed message: "),
        "{truncated:?}"
    );
    // Wire type 7 does not exist.
    let garbage = send_raw(&sluice, vec![0x0f, 0x01])
        .await
        .expect_err("garbage is refused");
    assert_eq!(garbage.code(), tonic::Code::InvalidArgument, "{garbage:?}");

    // Nothing was recorded: the value the refused request named still has its whole limit
    // but for the one decided request above.
    let mut client = sluice.client().await;
    let reply = client
        .should_rate_limit(request("d", vec![descriptor(&[("k", "v")])]))
        .await
        .expect("decided")
        .into_inner();
    assert_eq!(reply.statuses[0].limit_remaining, 1, "{reply:?}");
    sluice.stop().await.expect("stop");
}

/// POSTs `body` to `/json`; returns (status, body).
fn post_json(addr: SocketAddr, body: &[u8]) -> (u16, String) {
    let mut stream = std::net::TcpStream::connect(addr).expect("connect admin");
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("read timeout");
    let head = format!(
        "POST /json HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).expect("write head");
    stream.write_all(body).expect("write body");
    let mut text = Vec::new();
    stream.read_to_end(&mut text).expect("read response");
    let text = String::from_utf8_lossy(&text).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status code");
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

#[test]
fn undecodable_json_names_the_field() {
    let (_dir, sluice) = start();
    let mut body = br#"{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"#.to_vec();
    body.extend_from_slice(&[0xff, 0xfe]);
    body.extend_from_slice(br#""}]}]}"#);
    let (status, text) = post_json(sluice.admin_addr, &body);
    assert_eq!(status, 400, "{text}");
    assert!(
        text.contains("descriptors[0].entries[0].value: "),
        "the field is named: {text}"
    );
    let (status, text) = post_json(
        sluice.admin_addr,
        br#"{"domain":"d","descriptors":[{"entries":[{"key":"k","value":7}]}]}"#,
    );
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("descriptors[0].entries[0].value: "), "{text}");
    // Nothing recorded: the first real request sees the whole limit.
    let (status, text) = post_json(
        sluice.admin_addr,
        br#"{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}"#,
    );
    assert_eq!(status, 200, "{text}");
    assert!(text.contains(r#""limitRemaining":2"#), "{text}");
}
