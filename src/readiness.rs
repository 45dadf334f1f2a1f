//! Readiness: what the process can serve, as the admin port's probes (`/readyz`,
//! `/healthcheck`) and gRPC health report it: the backend reachable, a config served, not
//! draining.
//!
//! Two answers come from it. Readiness ([`Readiness::is_ready`]: `/readyz`, gRPC health of the
//! server and of the rate-limit service) needs all three. envoyproxy/ratelimit's health
//! ([`Readiness::healthcheck`]: `/healthcheck`, gRPC health of its service name `ratelimit`)
//! is that service's contract, which Envoy Gateway's probes rely on: it ignores the backend
//! once serving (a Redis outage must not restart every rate-limit pod through the liveness
//! probe), fails from SIGTERM on, and asks of the config what [`ConfigRequirement`] says.
//! envoyproxy/ratelimit has three behaviours there: forced to start, OK before any config;
//! not forced, nothing listens before the first config (a failed probe), OK after it; and with
//! `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`, OK only while a config naming a domain is
//! served.
//!
//! Why a module of its own, below the faces and the config sources: the prober and the drain
//! (`server`) and the xDS client (`xds`) set it, the admin port reads it; each holds the one
//! shared value and none of them needs the others. Every change is announced
//! ([`Readiness::changed`]) so gRPC health follows at once, not at the next probe.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::watch;

/// What `/healthcheck` asks of the config ([`Readiness::healthcheck`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ConfigRequirement {
    /// Nothing: OK before any config too.
    Never,
    /// A config applied once (whatever it names): fails before the first one only.
    #[default]
    First,
    /// A config naming a domain, always: fails before one and whenever one names none.
    Always,
}

/// Readiness as the admin server and gRPC health both report it.
#[derive(Debug)]
pub struct Readiness {
    backend_up: AtomicBool,
    draining: AtomicBool,
    /// Why no config is served yet (a config source that delivers it later, e.g. xDS);
    /// `None` once one is.
    config_pending: Mutex<Option<String>>,
    /// The config served names no domain (an xDS server that pushed none).
    config_empty: AtomicBool,
    /// What `/healthcheck` asks of the config.
    requires_config: Mutex<ConfigRequirement>,
    /// Counts the changes; a subscriber misses none ([`Readiness::subscribe`]).
    changes: watch::Sender<u64>,
}

impl Default for Readiness {
    fn default() -> Self {
        Self::new()
    }
}

impl Readiness {
    /// Backend not yet probed, the first config required before `/healthcheck` answers OK.
    pub fn new() -> Self {
        Readiness {
            backend_up: AtomicBool::new(false),
            draining: AtomicBool::new(false),
            config_pending: Mutex::new(None),
            config_empty: AtomicBool::new(false),
            requires_config: Mutex::new(ConfigRequirement::First),
            changes: watch::Sender::new(0),
        }
    }

    /// What `/healthcheck` asks of the config from now on.
    pub fn require_config(&self, required: ConfigRequirement) {
        *crate::sync::lock(&self.requires_config) = required;
        self.announce();
    }

    /// No config served yet, and why (shown by `/readyz`); [`Readiness::set_config_loaded`]
    /// ends it.
    pub fn set_config_pending(&self, why: impl Into<String>) {
        *crate::sync::lock(&self.config_pending) = Some(why.into());
        self.announce();
    }

    /// A config is served; `domains` is how many domains it names.
    pub fn set_config_loaded(&self, domains: usize) {
        *crate::sync::lock(&self.config_pending) = None;
        self.config_empty.store(domains == 0, Ordering::SeqCst);
        self.announce();
    }

    /// Why no config is served yet; `None` when one is.
    pub fn config_pending(&self) -> Option<String> {
        crate::sync::lock(&self.config_pending).clone()
    }

    /// Records the latest backend probe; returns true when the state changed.
    pub fn set_backend_up(&self, up: bool) -> bool {
        self.backend_up.swap(up, Ordering::SeqCst) != up
    }

    pub fn set_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
        self.announce();
    }

    pub fn backend_up(&self) -> bool {
        self.backend_up.load(Ordering::SeqCst)
    }

    pub fn draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    pub fn is_ready(&self) -> bool {
        self.backend_up() && !self.draining() && self.config_pending().is_none()
    }

    /// envoyproxy/ratelimit's health (see the module docs): `Err` with the reason when it
    /// fails.
    pub fn healthcheck(&self) -> Result<(), String> {
        if self.draining() {
            return Err("draining".into());
        }
        let required = *crate::sync::lock(&self.requires_config);
        if required == ConfigRequirement::Never {
            return Ok(());
        }
        if let Some(why) = self.config_pending() {
            return Err(format!("no config yet: {why}"));
        }
        if required == ConfigRequirement::Always && self.config_empty.load(Ordering::SeqCst) {
            return Err("no config yet: the config served names no domain".into());
        }
        Ok(())
    }

    /// A receiver that sees every later change of what is reported (config, draining, the
    /// requirement); backend probes are published by the prober itself.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    fn announce(&self) {
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// envoyproxy/ratelimit's health under each requirement, from start to SIGTERM: OK before
    /// a config, after an empty one, after one naming domains; the backend never counts.
    #[test]
    fn healthcheck_follows_the_config_requirement_and_draining() {
        use ConfigRequirement::{Always, First, Never};
        for (required, expect) in [
            (Never, [true, true, true]),
            (First, [false, true, true]),
            (Always, [false, false, true]),
        ] {
            let r = Readiness::new();
            r.require_config(required);
            r.set_config_pending("waiting for the first config");
            let before = r.healthcheck().is_ok();
            r.set_config_loaded(0);
            let empty = r.healthcheck().is_ok();
            r.set_config_loaded(2);
            let loaded = r.healthcheck().is_ok();
            assert_eq!([before, empty, loaded], expect, "{required:?}");
            assert!(!r.is_ready(), "readiness still waits for the backend");
            r.set_draining();
            assert_eq!(r.healthcheck(), Err("draining".into()));
        }
    }

    #[tokio::test]
    async fn every_change_is_announced() {
        let r = Readiness::new();
        let mut changes = r.subscribe();
        r.set_config_pending("waiting");
        r.set_config_loaded(1);
        r.set_draining();
        assert!(changes.has_changed().unwrap());
        assert_eq!(*changes.borrow_and_update(), 3);
        assert!(!changes.has_changed().unwrap());
    }
}
