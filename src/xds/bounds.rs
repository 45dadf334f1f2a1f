//! What one response may compile to, checked on its encoded bytes before any of it is decoded.
//!
//! Why on the bytes: a response's size says little about its cost. A rule encodes in about 16
//! bytes and a resource of nothing in 2, while the decoded messages, the config model and the
//! compiled tree take hundreds of bytes per node, so a response within
//! [`MAX_RESPONSE_BYTES`](super::MAX_RESPONSE_BYTES) could take gigabytes once decoded. So the
//! client receives a response as bytes and walks its wire format first (no allocation), counting
//! what decoding would build: resources, descriptors, `replaces` entries and `metadata` values
//! ([`XdsLimits::max_nodes`], `--max-xds-nodes`), the descriptors' nesting
//! ([`XdsLimits::max_depth`], `--max-xds-depth`) and the bytes of their config paths
//! ([`XdsLimits::max_path_bytes`], `--max-xds-path-bytes`). The walk stops at the first node over a limit;
//! the response is then NACKed with the limit and its flag named, and nothing of it is decoded.
//!
//! Bytes that are not protobuf end the walk without a verdict: decoding them fails next and
//! names what is wrong, as before.

use super::RATE_LIMIT_CONFIG_TYPE;

/// The bounds of one response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct XdsLimits {
    /// Resources, descriptors, `replaces` entries and `metadata` values, all of a response's
    /// resources together.
    pub max_nodes: usize,
    /// Levels of nested descriptors (1: no nesting).
    pub max_depth: usize,
    /// Bytes of the descriptors' config paths together: each compiled rule keeps its path (its
    /// ancestors' keys and values, then its own), so a long key over many nested descriptors
    /// costs its length once per descriptor.
    pub max_path_bytes: usize,
}

impl XdsLimits {
    /// 100,000 nodes compile to about 60 MiB (docs/security.md, "Config limits"); a gateway
    /// with a thousand rate-limited routes sends a few thousand.
    pub const DEFAULT_MAX_NODES: usize = 100_000;
    /// As many levels as a YAML file may nest under the default `--max-yaml-depth`, and more
    /// than Envoy Gateway generates (three).
    pub const DEFAULT_MAX_DEPTH: usize = 14;
    /// Deepest nesting the flag accepts: prost refuses deeper messages anyway (its recursion
    /// limit of 100 counts a descriptor and its `rate_limit`).
    pub const MAX_DEPTH: usize = 48;
    /// 32 MiB: 100,000 rules of 320-byte paths, or 25,000 of Envoy Gateway's (a route's name
    /// as key and value, about 1.3 KB).
    pub const DEFAULT_MAX_PATH_BYTES: usize = 32 << 20;
}

impl Default for XdsLimits {
    fn default() -> Self {
        XdsLimits {
            max_nodes: Self::DEFAULT_MAX_NODES,
            max_depth: Self::DEFAULT_MAX_DEPTH,
            max_path_bytes: Self::DEFAULT_MAX_PATH_BYTES,
        }
    }
}

/// The fields of a response the NACK needs, read while walking it.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Header {
    pub version_info: String,
    pub nonce: String,
}

/// Walks an encoded `DiscoveryResponse`. `Err` names the limit broken and its flag.
pub fn check(response: &[u8], limits: XdsLimits) -> Result<(), String> {
    let mut walk = Walk {
        limits,
        nodes: 0,
        path_bytes: 0,
        resource: 0,
    };
    match walk.response(response) {
        Ok(()) | Err(Stop::Malformed) => Ok(()),
        Err(Stop::Breach(message)) => Err(message),
    }
}

/// The version and nonce of an encoded `DiscoveryResponse` (empty when absent or unreadable):
/// what a NACK of a response too large to decode answers with.
pub fn header(response: &[u8]) -> Header {
    let mut header = Header::default();
    for field in Fields(response) {
        let Ok(Field::Bytes(number, bytes)) = field else {
            continue;
        };
        let text = || String::from_utf8_lossy(bytes).into_owned();
        match number {
            1 => header.version_info = text(),
            5 => header.nonce = text(),
            _ => {}
        }
    }
    header
}

enum Stop {
    /// Over a limit: the message names it.
    Breach(String),
    /// Not protobuf: left to the decoder to name.
    Malformed,
}

struct Walk {
    limits: XdsLimits,
    nodes: usize,
    path_bytes: usize,
    /// Index of the resource being walked, for the message.
    resource: usize,
}

/// Deepest `metadata` nesting walked; prost refuses deeper messages anyway.
const MAX_METADATA_DEPTH: usize = 100;

impl Walk {
    fn node(&mut self) -> Result<(), Stop> {
        self.nodes += 1;
        if self.nodes > self.limits.max_nodes {
            return Err(Stop::Breach(format!(
                "resources[{}]: xDS node limit exceeded: more than {} nodes (resources, \
                 descriptors, `replaces` entries, `metadata` values) in one response; raise \
                 with --max-xds-nodes",
                self.resource, self.limits.max_nodes
            )));
        }
        Ok(())
    }

    /// `DiscoveryResponse`: `resources` (2) are `Any`s.
    fn response(&mut self, bytes: &[u8]) -> Result<(), Stop> {
        for field in Fields(bytes) {
            if let Field::Bytes(2, any) = field? {
                self.node()?;
                self.any(any)?;
                self.resource += 1;
            }
        }
        Ok(())
    }

    /// `Any`: `type_url` (1) and `value` (2), in either order; only a `RateLimitConfig` is
    /// walked (another type is refused without decoding its value).
    fn any(&mut self, bytes: &[u8]) -> Result<(), Stop> {
        let (mut type_url, mut value) = (None, None);
        for field in Fields(bytes) {
            match field? {
                Field::Bytes(1, t) => type_url = Some(t),
                Field::Bytes(2, v) => value = Some(v),
                _ => {}
            }
        }
        match (type_url, value) {
            (Some(t), Some(v)) if t == RATE_LIMIT_CONFIG_TYPE.as_bytes() => self.config(v),
            _ => Ok(()),
        }
    }

    /// `RateLimitConfig`: `descriptors` (3).
    fn config(&mut self, bytes: &[u8]) -> Result<(), Stop> {
        for field in Fields(bytes) {
            if let Field::Bytes(3, descriptor) = field? {
                self.descriptor(descriptor, 1, 0)?;
            }
        }
        Ok(())
    }

    /// `RateLimitDescriptor` at nesting level `depth` under a path of `parent_path` bytes: its
    /// `key` (1) and `value` (2) lengthen the path; `rate_limit` (3), `descriptors` (4),
    /// `metadata` (8).
    fn descriptor(&mut self, bytes: &[u8], depth: usize, parent_path: usize) -> Result<(), Stop> {
        self.node()?;
        // `parent.key_value`, as the compiled rule's path.
        let mut path = parent_path + 1;
        for field in Fields(bytes) {
            if let Field::Bytes(1 | 2, text) = field? {
                path += text.len() + 1;
            }
        }
        self.path_bytes += path;
        if self.path_bytes > self.limits.max_path_bytes {
            return Err(Stop::Breach(format!(
                "resources[{}]: xDS path limit exceeded: the descriptors' config paths (each \
                 its ancestors' keys and values, then its own) take more than {} bytes; raise \
                 with --max-xds-path-bytes",
                self.resource, self.limits.max_path_bytes
            )));
        }
        if depth > self.limits.max_depth {
            return Err(Stop::Breach(format!(
                "resources[{}]: xDS nesting limit exceeded: descriptors nested more than {} \
                 levels deep; raise with --max-xds-depth",
                self.resource, self.limits.max_depth
            )));
        }
        for field in Fields(bytes) {
            match field? {
                Field::Bytes(3, policy) => self.policy(policy)?,
                Field::Bytes(4, child) => self.descriptor(child, depth + 1, path)?,
                Field::Bytes(8, metadata) => self.metadata_struct(metadata, 1)?,
                _ => {}
            }
        }
        Ok(())
    }

    /// `RateLimitPolicy`: each of `replaces` (5) is a node.
    fn policy(&mut self, bytes: &[u8]) -> Result<(), Stop> {
        for field in Fields(bytes) {
            if let Field::Bytes(5, _) = field? {
                self.node()?;
            }
        }
        Ok(())
    }

    /// `google.protobuf.Struct`: `fields` (1) are map entries, whose `value` (2) is a `Value`.
    fn metadata_struct(&mut self, bytes: &[u8], depth: usize) -> Result<(), Stop> {
        if depth > MAX_METADATA_DEPTH {
            return Err(Stop::Malformed);
        }
        for field in Fields(bytes) {
            if let Field::Bytes(1, entry) = field? {
                for field in Fields(entry) {
                    if let Field::Bytes(2, value) = field? {
                        self.metadata_value(value, depth)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// `google.protobuf.Value`: a node; `struct_value` (5) and `list_value` (6) nest.
    fn metadata_value(&mut self, bytes: &[u8], depth: usize) -> Result<(), Stop> {
        self.node()?;
        for field in Fields(bytes) {
            match field? {
                Field::Bytes(5, inner) => self.metadata_struct(inner, depth + 1)?,
                Field::Bytes(6, list) => {
                    for field in Fields(list) {
                        if let Field::Bytes(1, value) = field? {
                            self.metadata_value(value, depth + 1)?;
                        }
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }
}

/// One field of a message: a length-delimited one with its bytes, or another (skipped).
enum Field<'a> {
    Bytes(u64, &'a [u8]),
    Other,
}

/// The fields of an encoded message, in order; a wire error ends them with
/// [`Stop::Malformed`].
///
/// Why by hand: the walk needs only tags, varints and lengths (the protobuf wire format's
/// stable core, a few lines), and prost's own readers are not public API.
struct Fields<'a>(&'a [u8]);

impl<'a> Iterator for Fields<'a> {
    type Item = Result<Field<'a>, Stop>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.0.is_empty() {
            return None;
        }
        let field = self.field();
        if field.is_err() {
            self.0 = &[];
        }
        Some(field)
    }
}

impl<'a> Fields<'a> {
    fn field(&mut self) -> Result<Field<'a>, Stop> {
        let key = self.varint()?;
        let (number, wire_type) = (key >> 3, key & 7);
        match wire_type {
            0 => self.varint().map(|_| Field::Other),
            1 => self.skip(8).map(|_| Field::Other),
            2 => {
                let len = usize::try_from(self.varint()?).map_err(|_| Stop::Malformed)?;
                self.skip(len).map(|bytes| Field::Bytes(number, bytes))
            }
            5 => self.skip(4).map(|_| Field::Other),
            // Groups (3, 4) are not in these messages; 6 and 7 are not wire types.
            _ => Err(Stop::Malformed),
        }
    }

    fn varint(&mut self) -> Result<u64, Stop> {
        let mut value = 0u64;
        for (i, &byte) in self.0.iter().enumerate().take(10) {
            value |= u64::from(byte & 0x7f) << (7 * i);
            if byte & 0x80 == 0 {
                self.0 = &self.0[i + 1..];
                return Ok(value);
            }
        }
        Err(Stop::Malformed)
    }

    fn skip(&mut self, len: usize) -> Result<&'a [u8], Stop> {
        if len > self.0.len() {
            return Err(Stop::Malformed);
        }
        let (taken, rest) = self.0.split_at(len);
        self.0 = rest;
        Ok(taken)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::envoy::service::discovery::v3::DiscoveryResponse;
    use crate::proto::ratelimit::config::ratelimit::v3::{
        RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitReplace,
    };
    use prost::Message;

    fn response(configs: &[RateLimitConfig]) -> Vec<u8> {
        DiscoveryResponse {
            version_info: "v7".into(),
            nonce: "n3".into(),
            type_url: RATE_LIMIT_CONFIG_TYPE.into(),
            resources: configs
                .iter()
                .map(|c| prost_types::Any {
                    type_url: RATE_LIMIT_CONFIG_TYPE.into(),
                    value: c.encode_to_vec(),
                })
                .collect(),
            ..DiscoveryResponse::default()
        }
        .encode_to_vec()
    }

    fn leaf(i: usize) -> RateLimitDescriptor {
        RateLimitDescriptor {
            key: "k".into(),
            value: i.to_string(),
            rate_limit: Some(RateLimitPolicy {
                unit: 1,
                requests_per_unit: 1,
                replaces: vec![RateLimitReplace { name: "a".into() }],
                ..RateLimitPolicy::default()
            }),
            ..RateLimitDescriptor::default()
        }
    }

    fn config(descriptors: Vec<RateLimitDescriptor>) -> RateLimitConfig {
        RateLimitConfig {
            name: "d".into(),
            domain: "d".into(),
            descriptors,
        }
    }

    fn limits(max_nodes: usize, max_depth: usize) -> XdsLimits {
        XdsLimits {
            max_nodes,
            max_depth,
            ..XdsLimits::default()
        }
    }

    #[test]
    fn every_node_counts_up_to_the_limit_exactly() {
        // 2 resources, 3 descriptors each with one replace: 2 + 3 * 2 nodes.
        let two = response(&[config((0..3).map(leaf).collect()), config(vec![leaf(9)])]);
        let nodes = 2 + 4 * 2;
        assert_eq!(check(&two, limits(nodes, 1)), Ok(()));
        let err = check(&two, limits(nodes - 1, 1)).unwrap_err();
        assert_eq!(
            err,
            format!(
                "resources[1]: xDS node limit exceeded: more than {} nodes (resources, \
                 descriptors, `replaces` entries, `metadata` values) in one response; raise \
                 with --max-xds-nodes",
                nodes - 1
            )
        );
    }

    #[test]
    fn metadata_values_count_and_nesting_is_bounded() {
        use prost_types::{ListValue, Struct, Value, value::Kind};
        let null = || Value {
            kind: Some(Kind::NullValue(0)),
        };
        let mut with_metadata = leaf(0);
        with_metadata.rate_limit = None;
        with_metadata.metadata = Some(Struct {
            fields: [(
                "list".to_string(),
                Value {
                    kind: Some(Kind::ListValue(ListValue {
                        values: vec![null(), null(), null()],
                    })),
                },
            )]
            .into(),
        });
        let bytes = response(&[config(vec![with_metadata])]);
        // The resource, the descriptor, the list and its 3 values.
        assert_eq!(check(&bytes, limits(6, 1)), Ok(()));
        assert!(check(&bytes, limits(5, 1)).is_err());

        let mut deep = leaf(0);
        for _ in 0..3 {
            deep = RateLimitDescriptor {
                key: "k".into(),
                descriptors: vec![deep],
                ..RateLimitDescriptor::default()
            };
        }
        let bytes = response(&[config(vec![deep])]);
        assert_eq!(check(&bytes, limits(100, 4)), Ok(()));
        assert_eq!(
            check(&bytes, limits(100, 3)).unwrap_err(),
            "resources[0]: xDS nesting limit exceeded: descriptors nested more than 3 levels \
             deep; raise with --max-xds-depth"
        );
    }

    #[test]
    fn a_long_key_counts_once_per_nested_descriptor() {
        let children: Vec<_> = (0..10).map(leaf).collect();
        let parent = RateLimitDescriptor {
            key: "p".repeat(1000),
            descriptors: children,
            ..RateLimitDescriptor::default()
        };
        let bytes = response(&[config(vec![parent])]);
        // The parent's path: 1,002 bytes; each child's: that plus `.k_N` (and a separator).
        let paths = 1002 + 10 * (1002 + 5);
        let within = XdsLimits {
            max_path_bytes: paths,
            ..XdsLimits::default()
        };
        assert_eq!(check(&bytes, within), Ok(()));
        let over = XdsLimits {
            max_path_bytes: paths - 1,
            ..XdsLimits::default()
        };
        let err = check(&bytes, over).unwrap_err();
        assert!(err.contains("raise with --max-xds-path-bytes"), "{err}");
    }

    #[test]
    fn other_types_and_garbage_are_left_to_the_decoder() {
        let mut foreign =
            DiscoveryResponse::decode(response(&[config((0..50).map(leaf).collect())]).as_slice())
                .unwrap();
        foreign.resources[0].type_url = "type.googleapis.com/other".into();
        // One node: the resource; its value is not walked.
        assert_eq!(check(&foreign.encode_to_vec(), limits(1, 1)), Ok(()));
        for garbage in [&[0xffu8, 0xff, 0xff][..], &[0x12, 0x40, 0x01], &[0x0b]] {
            assert_eq!(check(garbage, limits(0, 1)), Ok(()));
        }
    }

    #[test]
    fn the_header_is_read_without_decoding() {
        let bytes = response(&[config(vec![leaf(1)])]);
        assert_eq!(
            header(&bytes),
            Header {
                version_info: "v7".into(),
                nonce: "n3".into()
            }
        );
        assert_eq!(header(&[0xff]), Header::default());
    }
}
