//! [`Server::build`]: everything that can fail from the settings, in order, before a port is
//! bound, so a mistake stops the start with a message and nothing served.

use std::path::Path;
use std::sync::Arc;

use crate::config::{Config, LoadOptions};
use crate::decision::Engine;
use crate::reload::{ReloadSettings, Reloader};
use crate::xds::XdsSource;

use super::settings::{ConfigSource, DEFAULT_PROBE_INTERVAL, MIN_WATCH_INTERVAL};
use super::stack::Stack;
use super::tls::{ServerTls, TlsSettings};
use super::{Server, Settings, StartError, Updates};

impl Server {
    /// Checks `settings`, installs the process's metrics recorder (first: the config's load is
    /// recorded), loads the config (files) or prepares its source (xDS), loads the gRPC TLS,
    /// builds the limiter stack (connecting on first use, so Redis may still be down) and the
    /// engine. With tracing on it must run inside the Tokio runtime that serves
    /// ([`Stack::build`]).
    pub fn build(settings: Settings) -> Result<Server, StartError> {
        check(&settings)?;
        let metrics = crate::metrics::prometheus()?;
        let (config, updates) = first_config(&settings)?;
        let grpc_tls = grpc_tls(&settings)?;
        let stack = Stack::build(&settings)?;
        log_policies(&settings);
        let engine = match &updates {
            Some(Updates::Xds(_)) => {
                Engine::awaiting_config(stack.limiter.clone(), settings.engine.clone())
            }
            _ => Engine::with_options(config, stack.limiter.clone(), settings.engine.clone()),
        };
        Ok(Server {
            engine: Arc::new(engine),
            stack,
            updates,
            grpc_tls,
            metrics,
            settings,
        })
    }

    /// How often readiness re-probes the backend (at least [`DEFAULT_PROBE_INTERVAL`]).
    pub(super) fn probe_interval(&self) -> std::time::Duration {
        self.settings.probe_interval.max(DEFAULT_PROBE_INTERVAL)
    }
}

/// The settings checked on their own, before anything is read.
fn check(settings: &Settings) -> Result<(), StartError> {
    crate::descriptor::validate_key_prefix(&settings.engine.key_prefix)
        .map_err(StartError::KeyPrefix)?;
    if let Some(tracing) = &settings.tracing {
        tracing.validate()?;
    }
    Ok(())
}

/// The config served from the start (empty with xDS, whose first push brings it), and where
/// the later ones come from.
fn first_config(settings: &Settings) -> Result<(Config, Option<Updates>), StartError> {
    match &settings.config {
        ConfigSource::Files(path) => {
            // Before the load: a change made while sluice starts is then seen by the first poll.
            let loaded = settings
                .watch_interval
                .and_then(|_| Reloader::fingerprint(path, &settings.load));
            let config = load_config(path, settings.load)?;
            let unix_now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            crate::metrics::record_config_loaded(path, &config, unix_now);
            let reload = settings.watch_interval.map(|interval| {
                Updates::Reload(ReloadSettings {
                    path: path.clone(),
                    interval: interval.max(MIN_WATCH_INTERVAL),
                    load_options: settings.load,
                    loaded,
                })
            });
            Ok((config, reload))
        }
        ConfigSource::Xds(xds) => {
            xds.check()?;
            let source = XdsSource {
                settings: xds.clone(),
                load: settings.load,
            };
            Ok((Config::empty(), Some(Updates::Xds(source))))
        }
    }
}

/// Loads and validates the config at `path`.
pub fn load_config(path: &Path, options: LoadOptions) -> Result<Config, StartError> {
    Config::load_with(path, options).map_err(|errors| StartError::Config {
        path: path.to_owned(),
        errors,
    })
}

/// The gRPC port's TLS, its files checked at least every [`MIN_WATCH_INTERVAL`].
fn grpc_tls(settings: &Settings) -> Result<Option<Arc<ServerTls>>, StartError> {
    let Some(tls) = &settings.grpc_tls else {
        return Ok(None);
    };
    let loaded = ServerTls::load(TlsSettings {
        reload_interval: tls.reload_interval.max(MIN_WATCH_INTERVAL),
        ..tls.clone()
    })?;
    Ok(Some(loaded))
}

fn log_policies(settings: &Settings) {
    if settings.backend.redis.is_some() {
        tracing::info!(
            on_backend_error = settings.engine.on_backend_error.as_str(),
            "backend failure policy"
        );
    }
    if settings.engine.shadow_mode {
        tracing::warn!("global shadow mode: every request is answered OK overall");
    }
    if settings.engine.quota_mode {
        tracing::info!(
            "global quota mode: a request is over the limit only when all of its descriptors are"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::EngineOptions;
    use crate::xds::XdsSettings;

    #[test]
    fn a_bad_key_prefix_or_config_stops_the_start() {
        let dir = tempfile::tempdir().unwrap();
        let mut settings = Settings::new(dir.path().join("absent.yaml"));
        settings.engine.key_prefix = "a{b".into();
        let err = Server::build(settings.clone()).err().expect("bad prefix");
        assert!(err.to_string().starts_with("--key-prefix: "), "{err}");
        settings.engine.key_prefix = EngineOptions::default().key_prefix;
        let err = Server::build(settings).err().expect("no config");
        assert!(err.to_string().starts_with("loading config from "), "{err}");
    }

    #[test]
    fn an_xds_source_is_checked_and_starts_without_limits() {
        let xds = |url: &str| Settings::with_source(ConfigSource::Xds(XdsSettings::new(url, "n")));
        let err = Server::build(xds("ftp://xds:18001"))
            .err()
            .expect("bad scheme");
        assert!(
            err.to_string()
                .starts_with("--config-xds `ftp://xds:18001`: "),
            "{err}"
        );
        let server = Server::build(xds("http://127.0.0.1:18001")).expect("built");
        let Some(Updates::Xds(source)) = &server.updates else {
            panic!("xDS pushes its changes: no reload");
        };
        assert_eq!(source.settings.url, "http://127.0.0.1:18001");
        assert!(!server.engine.is_configured());
        assert_eq!(server.engine.config().domains().count(), 0);
    }
}
