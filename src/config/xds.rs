//! The limits as xDS delivers them: envoyproxy/ratelimit's `RateLimitConfig` resources (one per
//! domain), compiled by the same validation as YAML files.
//!
//! Why through the raw model and not a second compiler: a resource is the same schema as a file
//! (envoyproxy/ratelimit converts its protos to its YAML structs before loading them too), and
//! an operator must get the same rules and the same errors whichever way the limits arrive. So
//! each resource becomes the [`RawRoot`] its YAML would have parsed to, without lines, and
//! [`Config::from_xds`] compiles the set like a directory of files. Proto3 cannot tell an
//! unset field from its zero value; the zero values map to what an absent YAML key means:
//! `value: ""` is no value (any value matches, each counted on its own), unit `UNKNOWN` is no
//! unit, a `requests_per_unit` of 0 is absent (deny all, unless `unlimited`), an empty `name`
//! is no name. `metadata` is kept, as in files (a number that is not finite becomes null).

use std::path::PathBuf;

use serde_saphyr::{Location, Spanned};

use super::Document;
use super::raw::{RawDescriptor, RawRateLimit, RawReplace, RawRoot, Source};
use super::{Config, ConfigErrors, LoadOptions};
use crate::metadata;
use crate::proto::ratelimit::config::ratelimit::v3::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
};

/// How an xDS resource is named in errors, in place of a file: `xds:NAME`.
pub fn resource_source(index: usize, config: &RateLimitConfig) -> PathBuf {
    if config.name.is_empty() {
        PathBuf::from(format!("xds:resources[{index}]"))
    } else {
        PathBuf::from(format!("xds:{}", config.name))
    }
}

impl Config {
    /// Compiles the `RateLimitConfig` resources of one xDS response (every domain's limits) as
    /// [`Config::load_with`] compiles a directory: every problem of every resource, each named
    /// `xds:RESOURCE: RULE: MESSAGE`; one domain per resource unless `options` merges them.
    /// Each resource is consumed as it is compiled.
    pub fn from_xds(
        resources: Vec<RateLimitConfig>,
        options: LoadOptions,
    ) -> Result<Config, ConfigErrors> {
        Self::build(
            resources.into_iter().enumerate().map(|(i, r)| {
                let source = resource_source(i, &r);
                (source, Document::Xds(Box::new(XdsDocument::new(r))))
            }),
            Vec::new(),
            options,
        )
    }
}

/// One resource as the checker reads it: the domain, and its descriptors still as decoded,
/// each converted to the raw model when the walk reaches it ([`Source`]).
pub(crate) struct XdsDocument {
    root: RawRoot,
    descriptors: Vec<RateLimitDescriptor>,
}

impl XdsDocument {
    fn new(config: RateLimitConfig) -> XdsDocument {
        XdsDocument {
            root: RawRoot {
                // Present even when empty, so validation says "`domain` is empty" as for a file.
                domain: Some(spanned(config.domain)),
                ..RawRoot::default()
            },
            descriptors: config.descriptors,
        }
    }

    /// The root (without descriptors), and the descriptors.
    pub fn into_parts(self) -> (RawRoot, impl Iterator<Item = XdsDescriptor>) {
        (self.root, self.descriptors.into_iter().map(XdsDescriptor))
    }
}

/// A decoded descriptor, not yet converted.
pub(crate) struct XdsDescriptor(RateLimitDescriptor);

type Nested = std::iter::Map<
    std::vec::IntoIter<RateLimitDescriptor>,
    fn(RateLimitDescriptor) -> XdsDescriptor,
>;

impl Source for XdsDescriptor {
    type Nested = Nested;

    /// The descriptor's fields, moved into the raw model; its nested descriptors left as
    /// decoded.
    fn open(self) -> (Spanned<RawDescriptor>, Nested) {
        let d = self.0;
        let raw = RawDescriptor {
            // Present even when empty, so validation says "descriptor has an empty `key`".
            key: Some(spanned(d.key)),
            value: non_empty(d.value),
            rate_limit: d.rate_limit.as_ref().map(|p| spanned(rate_limit(p))),
            shadow_mode: Some(d.shadow_mode),
            quota_mode: Some(d.quota_mode),
            detailed_metric: Some(d.detailed_metric),
            metadata: d.metadata.as_ref().map(metadata::struct_to_json),
            ..RawDescriptor::default()
        };
        let nested: Nested = d
            .descriptors
            .into_iter()
            .map(XdsDescriptor as fn(RateLimitDescriptor) -> XdsDescriptor);
        (spanned(raw), nested)
    }
}

fn spanned<T>(value: T) -> Spanned<T> {
    Spanned::new(value, Location::UNKNOWN, Location::UNKNOWN)
}

fn non_empty(text: String) -> Option<Spanned<String>> {
    (!text.is_empty()).then(|| spanned(text))
}

fn rate_limit(p: &RateLimitPolicy) -> RawRateLimit {
    let unit = match RateLimitUnit::try_from(p.unit) {
        Ok(RateLimitUnit::Unknown) => None,
        Ok(unit) => Some(unit.as_str_name().to_ascii_lowercase()),
        // Not a unit this schema knows: validation names it as an invalid unit.
        Err(_) => Some(format!("enum value {}", p.unit)),
    };
    RawRateLimit {
        unit: unit.map(spanned),
        requests_per_unit: (p.requests_per_unit != 0).then(|| spanned(p.requests_per_unit)),
        unlimited: p.unlimited.then(|| spanned(true)),
        name: non_empty(p.name.clone()),
        replaces: (!p.replaces.is_empty()).then(|| {
            p.replaces
                .iter()
                .map(|r| {
                    spanned(RawReplace {
                        // Present even when empty: "`replaces` entry has an empty `name`".
                        name: Some(spanned(r.name.clone())),
                        extra: Vec::new(),
                    })
                })
                .collect()
        }),
        ..RawRateLimit::default()
    }
}

#[cfg(test)]
mod tests;
