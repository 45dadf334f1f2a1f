//! What the engine's unit tests share: a fixed clock, a backend that keeps every batch it is
//! sent, the test config and request builders.

use std::path::Path;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;

use super::{Descriptor, Engine, EngineOptions, Request};
use crate::config::Config;
use crate::descriptor::Entry;
use crate::limiter::memory::MemoryLimiter;
use crate::limiter::{BatchOutcome, Clock, Item, Limiter, LimiterError};

pub struct FixedClock(pub u64);

impl Clock for FixedClock {
    fn now_ms(&self) -> u64 {
        self.0
    }
}

/// The memory backend, with every batch it receives, and the time it was asked to decide it at,
/// kept for inspection.
pub struct Recording {
    pub inner: MemoryLimiter,
    pub batches: Mutex<Vec<Vec<Item>>>,
    /// The `now` of each call, in the order of `batches`.
    pub nows: Mutex<Vec<Option<u64>>>,
}

impl Recording {
    pub fn new() -> Self {
        Recording {
            inner: MemoryLimiter::new(Arc::new(FixedClock(1_000_000))),
            batches: Mutex::new(Vec::new()),
            nows: Mutex::new(Vec::new()),
        }
    }
}

#[async_trait]
impl Limiter for Recording {
    async fn decide(&self, batch: &[Item], now: Option<u64>) -> Result<BatchOutcome, LimiterError> {
        self.batches.lock().unwrap().push(batch.to_vec());
        self.nows.lock().unwrap().push(now);
        self.inner.decide(batch, now).await
    }
    async fn ping(&self) -> Result<(), LimiterError> {
        Ok(())
    }
    fn name(&self) -> &'static str {
        "recording"
    }
}

pub const YAML: &str = "
domain: d
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2, name: per_user}
  - key: user
    value: trusted
  - key: bot
    rate_limit: {unlimited: true}
  - key: vip
    rate_limit:
      unit: hour
      requests_per_unit: 10
      replaces: [{name: per_user}]
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: path
    value: /api/*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: path
    value: /web/*
    rate_limit: {unit: minute, requests_per_unit: 2}
";

pub fn config(yaml: &str) -> Config {
    Config::from_yaml_str(Path::new("test.yaml"), yaml).unwrap()
}

pub fn engine() -> (Engine, Arc<Recording>) {
    engine_with(EngineOptions::default())
}

pub fn engine_with(options: EngineOptions) -> (Engine, Arc<Recording>) {
    let limiter = Arc::new(Recording::new());
    (
        Engine::with_options(config(YAML), limiter.clone(), options),
        limiter,
    )
}

/// A request in domain `d`, one descriptor per list of `(key, value)` entries.
pub fn req(descriptors: &[&[(&str, &str)]]) -> Request {
    Request {
        domain: "d".into(),
        descriptors: descriptors
            .iter()
            .map(|pairs| Descriptor::new(pairs.iter().map(|(k, v)| Entry::new(*k, *v)).collect()))
            .collect(),
        hits_addend: 0,
    }
}
