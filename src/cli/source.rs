//! Where `serve`'s limits come from: files (`--config`, watched for changes) or an xDS
//! management server (`--config-xds`), exactly one.

use std::path::PathBuf;
use std::time::Duration;

use clap::ValueEnum;
use sluice::readiness::ConfigRequirement;
use sluice::server::{self, ConfigSource, StartError};
use sluice::xds::{ClientTls, XdsLimits, XdsSettings};

use super::{ConfigLimitArgs, depth_in};

/// The limits from files.
#[derive(clap::Args)]
pub(crate) struct ConfigArgs {
    /// A limits YAML file or a directory of *.yaml files (envoyproxy/ratelimit's format).
    /// Either this or --config-xds.
    #[arg(long, env = "SLUICE_CONFIG")]
    pub(super) config: Option<PathBuf>,
    /// Reload the config when it changes (a Kubernetes ConfigMap's `..data` swap included);
    /// an invalid change is logged and the previous config keeps serving.
    #[arg(
        long,
        env = "SLUICE_WATCH_CONFIG",
        default_value_t = true,
        action = clap::ArgAction::Set,
        value_name = "BOOL"
    )]
    pub(super) watch_config: bool,
    /// Milliseconds between checks of the config for changes.
    #[arg(long, env = "SLUICE_WATCH_INTERVAL_MS", default_value_t = server::DEFAULT_WATCH_INTERVAL.as_millis() as u64)]
    pub(super) watch_interval_ms: u64,
    /// Merge config files that name the same domain (a top-level descriptor repeated across
    /// them is still an error) instead of rejecting the duplicate domain.
    #[arg(long, env = "SLUICE_MERGE_DOMAIN_CONFIG")]
    pub(super) merge_domain_config: bool,
    #[command(flatten)]
    pub(super) limits: ConfigLimitArgs,
}

impl ConfigArgs {
    /// How often the config is checked for changes; `None`: not watched.
    pub(super) fn watch_interval(&self) -> Option<Duration> {
        self.watch_config
            .then(|| Duration::from_millis(self.watch_interval_ms))
    }
}

/// The limits from an xDS management server.
#[derive(clap::Args)]
pub(crate) struct XdsArgs {
    /// Take the limits from an xDS management server instead of files: https://HOST:PORT
    /// (TLS) or http://HOST:PORT (plaintext), e.g. Envoy Gateway's
    /// https://envoy-gateway:18001.
    #[arg(long, env = "SLUICE_CONFIG_XDS", value_name = "URL")]
    pub(super) config_xds: Option<String>,
    /// Node id sent to the xDS server, which keys its configs by it (Envoy Gateway:
    /// envoy-ratelimit; envoyproxy/ratelimit's default: default).
    #[arg(long, env = "SLUICE_CONFIG_XDS_NODE_ID", default_value = "default")]
    pub(super) config_xds_node_id: String,
    /// PEM CA(s) that sign the xDS server's certificate (default: the system roots).
    #[arg(long, env = "SLUICE_CONFIG_XDS_CA_FILE", value_name = "PEM")]
    pub(super) config_xds_ca_file: Option<PathBuf>,
    /// PEM client certificate for the xDS server (mutual TLS), with --config-xds-client-key.
    #[arg(long, env = "SLUICE_CONFIG_XDS_CLIENT_CERT", value_name = "PEM")]
    pub(super) config_xds_client_cert: Option<PathBuf>,
    /// PEM private key of --config-xds-client-cert.
    #[arg(long, env = "SLUICE_CONFIG_XDS_CLIENT_KEY", value_name = "PEM")]
    pub(super) config_xds_client_key: Option<PathBuf>,
    /// Name the xDS server's certificate must hold, instead of the URL's host.
    #[arg(long, env = "SLUICE_CONFIG_XDS_SERVER_NAME", value_name = "NAME")]
    pub(super) config_xds_server_name: Option<String>,
    /// With --config-xds: serve before the first config arrives, answering UNAVAILABLE until
    /// it does, instead of waiting for it.
    #[arg(long, env = "SLUICE_FORCE_START_WITHOUT_INITIAL_CONFIG")]
    pub(super) force_start_without_initial_config: bool,
    /// With --config-xds: what /healthcheck (and gRPC health of `ratelimit`) asks of the
    /// config: first (fail until the first config is applied), always (fail while no config
    /// naming a domain is served) or never.
    #[arg(
        long,
        env = "SLUICE_HEALTH_REQUIRES_CONFIG",
        value_enum,
        default_value = "first"
    )]
    pub(super) health_requires_config: HealthRequires,
    /// With --config-xds: nodes (resources, descriptors, `replaces` entries, `metadata`
    /// values) one response may hold; more is NACKed before decoding.
    #[arg(long, env = "SLUICE_MAX_XDS_NODES", default_value_t = XdsLimits::DEFAULT_MAX_NODES)]
    pub(super) max_xds_nodes: usize,
    /// With --config-xds: levels of nested descriptors one response may hold (1 to 48).
    #[arg(long, env = "SLUICE_MAX_XDS_DEPTH", default_value_t = XdsLimits::DEFAULT_MAX_DEPTH, value_parser = depth_in(XdsLimits::MAX_DEPTH))]
    pub(super) max_xds_depth: usize,
    /// With --config-xds: bytes the config paths of one response's descriptors may take.
    #[arg(long, env = "SLUICE_MAX_XDS_PATH_BYTES", default_value_t = XdsLimits::DEFAULT_MAX_PATH_BYTES)]
    pub(super) max_xds_path_bytes: usize,
}

impl XdsArgs {
    fn settings(&self, url: &str) -> XdsSettings {
        XdsSettings {
            tls: ClientTls {
                ca_file: self.config_xds_ca_file.clone(),
                client_cert: self.config_xds_client_cert.clone(),
                client_key: self.config_xds_client_key.clone(),
                server_name: self.config_xds_server_name.clone(),
            },
            force_start: self.force_start_without_initial_config,
            health_requires_config: self.health_requires_config.into(),
            limits: XdsLimits {
                max_nodes: self.max_xds_nodes,
                max_depth: self.max_xds_depth,
                max_path_bytes: self.max_xds_path_bytes,
            },
            ..XdsSettings::new(url, &self.config_xds_node_id)
        }
    }

    /// The first flag given that only `--config-xds` uses.
    fn first_given(&self) -> Option<&'static str> {
        [
            ("--config-xds-ca-file", self.config_xds_ca_file.is_some()),
            (
                "--config-xds-client-cert",
                self.config_xds_client_cert.is_some(),
            ),
            (
                "--config-xds-client-key",
                self.config_xds_client_key.is_some(),
            ),
            (
                "--config-xds-server-name",
                self.config_xds_server_name.is_some(),
            ),
            (
                "--force-start-without-initial-config",
                self.force_start_without_initial_config,
            ),
        ]
        .into_iter()
        .find_map(|(flag, given)| given.then_some(flag))
    }
}

/// `--health-requires-config`.
#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum HealthRequires {
    Never,
    First,
    Always,
}

impl From<HealthRequires> for ConfigRequirement {
    fn from(r: HealthRequires) -> Self {
        match r {
            HealthRequires::Never => ConfigRequirement::Never,
            HealthRequires::First => ConfigRequirement::First,
            HealthRequires::Always => ConfigRequirement::Always,
        }
    }
}

/// Where the limits come from: `--config` or `--config-xds` (exactly one).
pub(super) fn source(config: &ConfigArgs, xds: &XdsArgs) -> Result<ConfigSource, StartError> {
    let usage = |text: &str| Err(StartError::Usage(text.to_owned()));
    match (&config.config, &xds.config_xds) {
        (Some(_), Some(_)) => usage(
            "--config and --config-xds are exclusive: the limits come from files or from an xDS \
             server, not both",
        ),
        (None, None) => usage(
            "no config source: give --config PATH (a limits file or directory) or --config-xds \
             URL (an xDS management server)",
        ),
        (None, Some(url)) => Ok(ConfigSource::Xds(xds.settings(url))),
        (Some(path), None) => match xds.first_given() {
            Some(flag) => usage(&format!(
                "{flag} applies to --config-xds only; the limits come from --config"
            )),
            None => Ok(ConfigSource::Files(path.clone())),
        },
    }
}
