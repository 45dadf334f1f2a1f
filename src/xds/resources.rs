//! One response's resources -> a config, or the rejection its NACK carries.
//!
//! Why all or nothing: a state-of-the-world response is every domain's limits at one version;
//! applying the domains that load and dropping the others would serve a config the server
//! never sent. So any resource of another type, any that does not decode, and any config rule
//! broken rejects the whole response, and the previous config keeps serving.

use prost::Message;

use super::{RATE_LIMIT_CONFIG_TYPE, shown};
use crate::config::{Config, LoadOptions};
use crate::metrics::XdsRejection;
use crate::proto::envoy::service::discovery::v3::DiscoveryResponse;
use crate::proto::ratelimit::config::ratelimit::v3::RateLimitConfig;

/// Largest response accepted, encoded (every domain's limits in one message). gRPC's default
/// of 4 MiB could be reached by a gateway with thousands of routes. This bounds the bytes
/// received, not what they decode and compile to (a rule is about 16 bytes on the wire and
/// 900 in memory): that is bounded by `--max-xds-nodes` and `--max-xds-depth`, on the bytes,
/// before decoding (`super::bounds`).
pub const MAX_RESPONSE_BYTES: usize = 16 * 1024 * 1024;

/// Errors listed in a NACK's `error_detail`, and logged, at most; the rest are counted.
pub const MAX_LOGGED_ERRORS: usize = 20;

#[cfg(doc)]
use super::MAX_SHOWN_CHARS;

/// Why a response was not applied: every problem, one line each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    pub kind: XdsRejection,
    pub errors: Vec<String>,
}

impl Rejection {
    /// The NACK's `error_detail` message: the problems, one per line, at most
    /// [`MAX_LOGGED_ERRORS`] of them, each cut to [`MAX_SHOWN_CHARS`].
    pub fn detail(&self) -> String {
        let mut text = self
            .errors
            .iter()
            .take(MAX_LOGGED_ERRORS)
            .map(|e| shown(e))
            .collect::<Vec<_>>()
            .join("\n");
        if self.errors.len() > MAX_LOGGED_ERRORS {
            text.push_str(&format!(
                "\n... and {} more",
                self.errors.len() - MAX_LOGGED_ERRORS
            ));
        }
        text
    }
}

/// Decodes every resource of `response` and compiles them into one config. Each resource's
/// bytes are dropped once decoded, each decoded resource once compiled.
pub fn compile(response: DiscoveryResponse, load: LoadOptions) -> Result<Config, Rejection> {
    let invalid = |errors| Rejection {
        kind: XdsRejection::InvalidResource,
        errors,
    };
    if !response.type_url.is_empty() && response.type_url != RATE_LIMIT_CONFIG_TYPE {
        return Err(invalid(vec![format!(
            "response of type {}: sluice subscribes to {RATE_LIMIT_CONFIG_TYPE} only",
            response.type_url
        )]));
    }
    let mut configs = Vec::with_capacity(response.resources.len());
    let mut errors = Vec::new();
    for (i, any) in response.resources.into_iter().enumerate() {
        if any.type_url != RATE_LIMIT_CONFIG_TYPE {
            errors.push(format!(
                "resources[{i}]: type {}, expected {RATE_LIMIT_CONFIG_TYPE}",
                any.type_url
            ));
            continue;
        }
        match RateLimitConfig::decode(any.value.as_slice()) {
            Ok(config) => configs.push(config),
            Err(e) => errors.push(format!(
                "resources[{i}]: not a valid RateLimitConfig message: {e}"
            )),
        }
    }
    if !errors.is_empty() {
        return Err(invalid(errors));
    }
    Config::from_xds(configs, load).map_err(|errors| Rejection {
        kind: XdsRejection::InvalidConfig,
        errors: errors.iter().map(ToString::to_string).collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::ratelimit::config::ratelimit::v3::{
        RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
    };

    fn any(config: &RateLimitConfig) -> prost_types::Any {
        prost_types::Any {
            type_url: RATE_LIMIT_CONFIG_TYPE.into(),
            value: config.encode_to_vec(),
        }
    }

    fn domain(name: &str, unit: RateLimitUnit) -> RateLimitConfig {
        RateLimitConfig {
            name: name.into(),
            domain: name.into(),
            descriptors: vec![RateLimitDescriptor {
                key: "k".into(),
                rate_limit: Some(RateLimitPolicy {
                    unit: unit as i32,
                    requests_per_unit: 1,
                    ..RateLimitPolicy::default()
                }),
                ..RateLimitDescriptor::default()
            }],
        }
    }

    fn response(resources: Vec<prost_types::Any>) -> DiscoveryResponse {
        DiscoveryResponse {
            version_info: "1".into(),
            resources,
            type_url: RATE_LIMIT_CONFIG_TYPE.into(),
            nonce: "n".into(),
            ..DiscoveryResponse::default()
        }
    }

    #[test]
    fn every_domain_or_none() {
        let good = response(vec![
            any(&domain("a", RateLimitUnit::Second)),
            any(&domain("b", RateLimitUnit::Week)),
        ]);
        let config = compile(good, LoadOptions::default()).unwrap();
        assert_eq!(config.domains().collect::<Vec<_>>(), ["a", "b"]);
        // No resource at all: a valid config with no domain (nothing limited).
        assert_eq!(
            compile(response(vec![]), LoadOptions::default())
                .unwrap()
                .domains()
                .count(),
            0
        );

        let one_bad = response(vec![
            any(&domain("a", RateLimitUnit::Second)),
            any(&domain("b", RateLimitUnit::Unknown)),
        ]);
        let rejection = compile(one_bad, LoadOptions::default()).unwrap_err();
        assert_eq!(rejection.kind, XdsRejection::InvalidConfig);
        assert_eq!(rejection.errors.len(), 1, "{rejection:?}");
        assert!(rejection.errors[0].starts_with("xds:b: k: `rate_limit` has no `unit`"));
    }

    #[test]
    fn foreign_and_undecodable_resources_are_named() {
        let mut foreign = any(&domain("a", RateLimitUnit::Second));
        foreign.type_url = "type.googleapis.com/envoy.config.cluster.v3.Cluster".into();
        let garbage = prost_types::Any {
            type_url: RATE_LIMIT_CONFIG_TYPE.into(),
            value: vec![0xff, 0xff, 0xff],
        };
        let rejection =
            compile(response(vec![foreign, garbage]), LoadOptions::default()).unwrap_err();
        assert_eq!(rejection.kind, XdsRejection::InvalidResource);
        assert_eq!(
            rejection.errors[0],
            format!(
                "resources[0]: type type.googleapis.com/envoy.config.cluster.v3.Cluster, \
                 expected {RATE_LIMIT_CONFIG_TYPE}"
            )
        );
        assert!(rejection.errors[1].starts_with("resources[1]: not a valid RateLimitConfig"));

        let mut other_type = response(vec![]);
        other_type.type_url = "type.googleapis.com/envoy.config.listener.v3.Listener".into();
        assert!(
            compile(other_type, LoadOptions::default())
                .unwrap_err()
                .errors[0]
                .starts_with(
                    "response of type type.googleapis.com/envoy.config.listener.v3.Listener"
                )
        );
    }

    #[test]
    fn the_nack_detail_is_bounded() {
        let rejection = Rejection {
            kind: XdsRejection::InvalidConfig,
            errors: (0..25).map(|i| format!("error {i}")).collect(),
        };
        let detail = rejection.detail();
        assert_eq!(detail.lines().count(), MAX_LOGGED_ERRORS + 1);
        assert!(detail.ends_with("... and 5 more"), "{detail}");
    }
}
