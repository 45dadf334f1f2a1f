//! Readiness: what the process can serve, as the admin port's probes (`/readyz`,
//! `/healthcheck`) and gRPC health report it: the backend reachable, a config served, not
//! draining.
//!
//! Why a module of its own, below the faces and the config sources: the prober and the drain
//! (`server`) and the xDS client (`xds`) set it, the admin port reads it; each holds the one
//! shared value and none of them needs the others.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

/// Readiness as the admin server and gRPC health both report it.
#[derive(Debug, Default)]
pub struct Readiness {
    backend_up: AtomicBool,
    draining: AtomicBool,
    /// Why no config is served yet (a config source that delivers it later, e.g. xDS);
    /// `None` once one is.
    config_pending: Mutex<Option<String>>,
}

impl Readiness {
    pub fn new() -> Self {
        Readiness {
            backend_up: AtomicBool::new(false),
            draining: AtomicBool::new(false),
            config_pending: Mutex::new(None),
        }
    }

    /// No config served yet, and why (shown by `/readyz`); [`Readiness::set_config_loaded`]
    /// ends it.
    pub fn set_config_pending(&self, why: impl Into<String>) {
        *crate::sync::lock(&self.config_pending) = Some(why.into());
    }

    pub fn set_config_loaded(&self) {
        *crate::sync::lock(&self.config_pending) = None;
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
}
