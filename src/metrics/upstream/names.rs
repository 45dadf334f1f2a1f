//! envoyproxy/ratelimit's stat names, typed: every stat it emits for a rate-limit call or a
//! config load is a variant here, and its name is written in one exhaustive match, so a name
//! cannot fall out of step with what is counted.
//!
//! The names are gostats' (the stats library envoyproxy/ratelimit uses): scopes joined by `.`
//! (`ratelimit.service.rate_limit.<key>.total_hits`, `ratelimit_server.ShouldRateLimit.
//! response_time`), then the `EXTRA_TAGS` serialized after the name (`.__k=v`, tags sorted by
//! key, `.`, `:` and `|` of a value replaced by `_`). A rate-limit key goes through
//! envoyproxy/ratelimit's `SanitizeStatName` (`:` and `|` become `_`, and so do the dots of
//! anything shaped like an IPv4 address), the domain of `domain_not_found` too.

use std::sync::OnceLock;

use regex::Regex;

use crate::config::push_segment;
use crate::decision::StatKey;
use crate::descriptor::Entry;

/// A counter of one rate-limit key: `ratelimit.service.rate_limit.<key>.<stat>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LimitStat {
    TotalHits,
    OverLimit,
    NearLimit,
    OverLimitWithLocalCache,
    WithinLimit,
    ShadowMode,
}

impl LimitStat {
    pub const ALL: [LimitStat; 6] = [
        LimitStat::TotalHits,
        LimitStat::OverLimit,
        LimitStat::NearLimit,
        LimitStat::OverLimitWithLocalCache,
        LimitStat::WithinLimit,
        LimitStat::ShadowMode,
    ];

    pub const fn suffix(self) -> &'static str {
        match self {
            LimitStat::TotalHits => "total_hits",
            LimitStat::OverLimit => "over_limit",
            LimitStat::NearLimit => "near_limit",
            LimitStat::OverLimitWithLocalCache => "over_limit_with_local_cache",
            LimitStat::WithinLimit => "within_limit",
            LimitStat::ShadowMode => "shadow_mode",
        }
    }

    /// The stat's slot in a key's table of counters ([`LimitStat::ALL`] order).
    pub const fn index(self) -> usize {
        match self {
            LimitStat::TotalHits => 0,
            LimitStat::OverLimit => 1,
            LimitStat::NearLimit => 2,
            LimitStat::OverLimitWithLocalCache => 3,
            LimitStat::WithinLimit => 4,
            LimitStat::ShadowMode => 5,
        }
    }
}

/// A counter of the service: `ratelimit.service.<name>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ServiceStat {
    ConfigLoadSuccess,
    ConfigLoadError,
    /// A request over its limit answered OK because of the global shadow mode.
    GlobalShadowMode,
    /// A call that failed because the backend did (`call.should_rate_limit.redis_error`).
    RedisError,
    /// A call refused as invalid or before the first config (`call.should_rate_limit.
    /// service_error`).
    ServiceError,
}

impl ServiceStat {
    pub const ALL: [ServiceStat; 5] = [
        ServiceStat::ConfigLoadSuccess,
        ServiceStat::ConfigLoadError,
        ServiceStat::GlobalShadowMode,
        ServiceStat::RedisError,
        ServiceStat::ServiceError,
    ];

    pub const fn name(self) -> &'static str {
        match self {
            ServiceStat::ConfigLoadSuccess => "ratelimit.service.config_load_success",
            ServiceStat::ConfigLoadError => "ratelimit.service.config_load_error",
            ServiceStat::GlobalShadowMode => "ratelimit.service.global_shadow_mode",
            ServiceStat::RedisError => "ratelimit.service.call.should_rate_limit.redis_error",
            ServiceStat::ServiceError => "ratelimit.service.call.should_rate_limit.service_error",
        }
    }

    pub const fn index(self) -> usize {
        match self {
            ServiceStat::ConfigLoadSuccess => 0,
            ServiceStat::ConfigLoadError => 1,
            ServiceStat::GlobalShadowMode => 2,
            ServiceStat::RedisError => 3,
            ServiceStat::ServiceError => 4,
        }
    }
}

/// The unary gRPC methods envoyproxy/ratelimit's server interceptor counts
/// (`ratelimit_server.<method>.total_requests` and `.response_time`): the rate-limit call and
/// the health check; streaming calls are not intercepted there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GrpcMethod {
    ShouldRateLimit,
    HealthCheck,
}

impl GrpcMethod {
    pub const ALL: [GrpcMethod; 2] = [GrpcMethod::ShouldRateLimit, GrpcMethod::HealthCheck];

    /// The method of a gRPC request path, when it is one the interceptor counts.
    pub fn of_path(path: &str) -> Option<GrpcMethod> {
        match path {
            "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit" => {
                Some(GrpcMethod::ShouldRateLimit)
            }
            "/grpc.health.v1.Health/Check" => Some(GrpcMethod::HealthCheck),
            _ => None,
        }
    }

    /// The method's name, as the stat names it.
    pub const fn name(self) -> &'static str {
        match self {
            GrpcMethod::ShouldRateLimit => "ShouldRateLimit",
            GrpcMethod::HealthCheck => "Check",
        }
    }

    pub const fn index(self) -> usize {
        match self {
            GrpcMethod::ShouldRateLimit => 0,
            GrpcMethod::HealthCheck => 1,
        }
    }

    pub fn total_requests(self) -> String {
        format!("ratelimit_server.{}.total_requests", self.name())
    }

    pub fn response_time(self) -> String {
        format!("ratelimit_server.{}.response_time", self.name())
    }
}

/// The scope of every rate-limit key's stats.
const RATE_LIMIT_SCOPE: &str = "ratelimit.service.rate_limit.";

/// `ratelimit.service.rate_limit.<key>.<stat>` (before tags).
pub fn limit_stat_name(key: &str, stat: LimitStat) -> String {
    format!("{RATE_LIMIT_SCOPE}{key}.{}", stat.suffix())
}

/// `ratelimit.service.rate_limit.<domain>.domain_not_found` (before tags; `domain`
/// sanitized).
pub fn domain_not_found_name(domain: &str) -> String {
    format!("{RATE_LIMIT_SCOPE}{domain}.domain_not_found")
}

/// The `EXTRA_TAGS` as gostats appends them to every name of the `ratelimit` and
/// `ratelimit_server` scopes: `.__key=value` per tag, sorted by key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tags {
    suffix: String,
}

impl Tags {
    /// `EXTRA_TAGS`' format (envconfig's map): `k1:v1,k2:v2`; an empty text is no tag. A pair
    /// without exactly one `:` is an error, as it stops envoyproxy/ratelimit at start-up.
    pub fn parse(text: &str) -> Result<Tags, String> {
        let mut pairs = std::collections::BTreeMap::new();
        if !text.is_empty() {
            for pair in text.split(',') {
                let mut kv = pair.split(':');
                match (kv.next(), kv.next(), kv.next()) {
                    (Some(k), Some(v), None) => {
                        pairs.insert(k.to_owned(), v.to_owned());
                    }
                    _ => return Err(format!("invalid map item: {pair:?} (expected key:value)")),
                }
            }
        }
        let mut suffix = String::new();
        // gostats drops tags with an empty key or value and cleans the value only.
        for (k, v) in pairs.iter().filter(|(k, v)| !k.is_empty() && !v.is_empty()) {
            suffix.push_str(".__");
            suffix.push_str(k);
            suffix.push('=');
            suffix.extend(v.chars().map(|c| match c {
                '.' | ':' | '|' => '_',
                c => c,
            }));
        }
        Ok(Tags { suffix })
    }

    /// `name` with the tags after it.
    pub fn apply(&self, mut name: String) -> String {
        name.push_str(&self.suffix);
        name
    }
}

/// envoyproxy/ratelimit's `SanitizeStatName`: `:` and `|` become `_`, then the dots of every
/// IPv4-shaped run (`\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}`, ASCII digits) become `_`.
pub fn sanitize(name: &str) -> String {
    static IPV4: OnceLock<Option<Regex>> = OnceLock::new();
    let replaced = name.replace([':', '|'], "_");
    let ipv4 =
        IPV4.get_or_init(|| Regex::new(r"[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}").ok());
    match ipv4 {
        Some(re) => re
            .replace_all(&replaced, |c: &regex::Captures<'_>| c[0].replace('.', "_"))
            .into_owned(),
        None => replaced,
    }
}

/// The key (`<domain>.<path>`, sanitized) of a verdict's stats: its rule's path (`rule_path`,
/// the rule's config path) with the request's values where the path takes them, or for a
/// `limit` override the request's entries.
pub fn stat_key(domain: &str, key: &StatKey, rule_path: &str, entries: &[Entry]) -> String {
    let mut out = String::from(domain);
    match key {
        StatKey::Override => {
            for e in entries {
                push_segment(&mut out, &e.key, &e.value, false);
            }
        }
        StatKey::Rule(path) => {
            path.render(&mut out, rule_path, |depth| {
                entries.get(depth).map(|e| e.value.as_str())
            });
        }
    }
    sanitize(&out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sanitize_is_envoyproxy_ratelimits() {
        assert_eq!(
            sanitize("d.remote_address_10.1.2.3"),
            "d.remote_address_10_1_2_3"
        );
        assert_eq!(sanitize("d.k_a:b|c"), "d.k_a_b_c");
        // Only IPv4-shaped runs lose their dots; version numbers keep theirs.
        assert_eq!(sanitize("d.path_/v1.2/x"), "d.path_/v1.2/x");
        assert_eq!(sanitize("d.ip_1234.5.6.7.8"), "d.ip_1234_5_6_7.8");
        // ASCII digits only (Go's \d).
        assert_eq!(sanitize("d.k_١.٢.٣.٤"), "d.k_١.٢.٣.٤");
    }

    #[test]
    fn tags_are_sorted_cleaned_and_appended() {
        let tags = Tags::parse("zone:eu.west,app:rl|1,empty:").unwrap();
        assert_eq!(
            tags.apply("ratelimit.service.config_load_success".into()),
            "ratelimit.service.config_load_success.__app=rl_1.__zone=eu_west"
        );
        assert_eq!(Tags::parse("").unwrap(), Tags::default());
        assert!(Tags::parse("a:b:c").unwrap_err().contains("a:b:c"));
        assert!(Tags::parse("novalue").is_err());
    }
}
