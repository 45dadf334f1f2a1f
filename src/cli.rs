//! The command line: every subcommand and flag of `sluice`, each flag also read from a
//! `SLUICE_*` variable, and how `serve`'s flags become [`sluice::Settings`]. A module of the
//! binary (not of the library): only `main.rs` uses it.
//!
//! `serve`'s flags come in families, a group each (`serve` composes them, `--help` shows each
//! under its heading): where the limits come from (`source`), the ports and their TLS
//! (`ports`), the backend (`backend`), how requests are decided and answered (`decisions`),
//! tracing (`sluice::otel`). `given` reads what came from elsewhere than the command line.

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};
use sluice::config::{ConfigLimits, HeaderFormat, HeaderPolicy, LoadOptions};
use sluice::headers;

mod backend;
mod decisions;
mod given;
mod ports;
mod serve;
mod source;

pub(crate) use given::{redis_settings_given, with_translated_defaults};
pub(crate) use serve::ServeArgs;

#[derive(Parser)]
#[command(
    name = "sluice",
    version,
    about = "Envoy rate-limit service with an exact sliding-window log"
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Subcommand)]
pub(crate) enum Command {
    /// Serve Envoy's RateLimitService over gRPC.
    Serve(Box<ServeArgs>),
    /// Validate a config file or directory; prints every error and exits non-zero on any.
    CheckConfig {
        /// A limits YAML file or a directory of *.yaml files.
        path: PathBuf,
        /// Merge files that name the same domain instead of rejecting them.
        #[arg(long, env = "SLUICE_MERGE_DOMAIN_CONFIG")]
        merge_domain_config: bool,
        #[command(flatten)]
        limits: ConfigLimitArgs,
    },
    /// Show which rule governs each descriptor of a request (or quota service bucket) and why,
    /// and the limiter key it would use, without touching any backend.
    Explain {
        /// A limits YAML file or a directory of *.yaml files.
        #[arg(long, env = "SLUICE_CONFIG")]
        config: PathBuf,
        /// The request's domain.
        #[arg(long)]
        domain: String,
        /// One descriptor per argument, as key=value[,key=value...].
        #[arg(required_unless_present = "bucket")]
        descriptors: Vec<String>,
        /// A Rate Limit Quota Service bucket id, as key=value[,key=value...] (any order): what
        /// the quota service gives it. Repeatable.
        #[arg(long = "bucket")]
        bucket: Vec<String>,
    },
}

/// What a config may cost to read (docs/security.md, "Config limits"): `serve` (start-up and
/// every reload) and `check-config` take the same flags.
#[derive(clap::Args)]
pub(crate) struct ConfigLimitArgs {
    /// Bytes the config may hold, all of its files together.
    #[arg(long, env = "SLUICE_MAX_CONFIG_BYTES", default_value_t = ConfigLimits::DEFAULT_MAX_BYTES)]
    max_config_bytes: u64,
    /// YAML nodes (scalars, sequences, mappings, aliases expanded) one config file may hold.
    #[arg(long, env = "SLUICE_MAX_YAML_NODES", default_value_t = ConfigLimits::DEFAULT_MAX_YAML_NODES)]
    max_yaml_nodes: usize,
    /// YAML nesting levels one config file may use (1 to 1024).
    #[arg(long, env = "SLUICE_MAX_YAML_DEPTH", default_value_t = ConfigLimits::DEFAULT_MAX_YAML_DEPTH, value_parser = depth_in(ConfigLimits::MAX_YAML_DEPTH))]
    max_yaml_depth: usize,
    /// Aliases per anchor one config file may use, once it has 100 aliases.
    #[arg(long, env = "SLUICE_MAX_YAML_ALIASES_PER_ANCHOR", default_value_t = ConfigLimits::DEFAULT_MAX_YAML_ALIASES_PER_ANCHOR)]
    max_yaml_aliases_per_anchor: usize,
}

impl ConfigLimitArgs {
    pub(crate) fn limits(&self) -> ConfigLimits {
        ConfigLimits {
            max_bytes: self.max_config_bytes,
            max_yaml_nodes: self.max_yaml_nodes,
            max_yaml_depth: self.max_yaml_depth,
            max_yaml_aliases_per_anchor: self.max_yaml_aliases_per_anchor,
        }
    }
}

#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum LogFormat {
    Text,
    Json,
}

pub(crate) fn load_options(
    merge_domains: bool,
    default_headers: HeaderFormat,
    limits: ConfigLimits,
) -> LoadOptions {
    LoadOptions {
        merge_domains,
        default_headers: HeaderPolicy {
            format: default_headers,
            hide_remaining: false,
        },
        limits,
    }
}

/// A YAML nesting limit in 1..=[`ConfigLimits::MAX_YAML_DEPTH`].
/// A parser of nesting depths in `1..=max`.
fn depth_in(max: usize) -> impl Fn(&str) -> Result<usize, String> + Clone {
    move |text| match text.parse::<usize>() {
        Ok(depth) if (1..=max).contains(&depth) => Ok(depth),
        _ => Err(format!("{text:?} is not a depth in 1..={max}")),
    }
}

fn parse_header_format(text: &str) -> Result<HeaderFormat, String> {
    HeaderFormat::parse(text).ok_or_else(|| format!("{text:?} is not one of none, draft, legacy"))
}

fn parse_header_name(text: &str) -> Result<String, String> {
    headers::check_header_name(text).map(|()| text.to_owned())
}

/// A ratio in (0, 1].
fn parse_ratio(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(r) if r > 0.0 && r <= 1.0 => Ok(r),
        _ => Err(format!("{text:?} is not a ratio in (0, 1]")),
    }
}
