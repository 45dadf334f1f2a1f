//! The xDS config source (`--config-xds`): the limits pushed by a management server, as Envoy
//! Gateway pushes them to envoyproxy/ratelimit.
//!
//! Protocol: state-of-the-world ADS (`envoy.service.discovery.v3.AggregatedDiscoveryService/
//! StreamAggregatedResources`), one wildcard subscription to [`RATE_LIMIT_CONFIG_TYPE`] under
//! the node id. Each response carries every domain's `RateLimitConfig`; the whole set is
//! compiled by the same validation as a config directory ([`Config::from_xds`]) and swapped
//! into the engine at once, like a file reload. Then the response is ACKed (its version and
//! nonce), or, when any resource does not load, NACKed (the version still served, the nonce,
//! and an `error_detail` naming each problem) and the previous config keeps serving. A stream
//! that breaks, or a connection that cannot be made, is retried with jittered exponential
//! backoff; the new stream subscribes again with the version served, so the server resends only
//! what changed. TLS files are read at every connection attempt, so a rotated certificate is
//! used from the next reconnect on.
//!
//! Before the first config: the engine answers every request `UNAVAILABLE` (Envoy's
//! `failure_mode_deny` decides) and readiness says why it is not ready. Without
//! `--force-start-without-initial-config` the gRPC server does not even start serving until
//! then (the admin port does: `/readyz`, `/metrics`). After the first config, losing the
//! management server changes nothing: the last config keeps serving and readiness is kept.
//!
//! Why this module owns the loop and not the engine: the engine only knows "a new config
//! generation"; what a stream, a nonce or a NACK is stays here (`session` runs one stream,
//! `resources` turns a response into a config or a rejection, `endpoint` builds the
//! connection and its TLS), and what happened is reported to `crate::metrics`.
//!
//! [`Config::from_xds`]: crate::config::Config::from_xds

mod bounds;
mod endpoint;
mod resources;
mod session;
mod stream;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::config::LoadOptions;
use crate::decision::Engine;
use crate::metrics;
use crate::readiness::{ConfigRequirement, Readiness};

pub use bounds::XdsLimits;
pub use endpoint::XdsError;
pub use resources::{MAX_RESPONSE_BYTES, Rejection};

/// The resource type sluice subscribes to (envoyproxy/ratelimit's config API).
pub const RATE_LIMIT_CONFIG_TYPE: &str =
    "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig";

/// First reconnect delay; each failure doubles it (plus up to 100 % jitter) up to
/// [`DEFAULT_MAX_BACKOFF`].
pub const DEFAULT_MIN_BACKOFF: Duration = Duration::from_millis(500);
pub const DEFAULT_MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Where the management server is and how to reach it.
#[derive(Debug, Clone)]
pub struct XdsSettings {
    /// `https://host:port` (TLS) or `http://host:port` (plaintext).
    pub url: String,
    /// The node id the server keys its snapshots by (Envoy Gateway: `envoy-ratelimit`).
    pub node_id: String,
    pub tls: ClientTls,
    /// Serve before the first config arrives (answering `UNAVAILABLE` until then) instead of
    /// waiting for it.
    pub force_start: bool,
    /// What `/healthcheck` (and gRPC health of `ratelimit`) asks of the config: by default
    /// the first one.
    pub health_requires_config: ConfigRequirement,
    pub min_backoff: Duration,
    pub max_backoff: Duration,
    /// What one response may hold (`--max-xds-nodes`, `--max-xds-depth`).
    pub limits: XdsLimits,
}

/// The xDS client's TLS (with an `https` URL only).
#[derive(Debug, Clone, Default)]
pub struct ClientTls {
    /// PEM CA(s) that sign the server's certificate; the system roots without it.
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate and its key (both or neither): mutual TLS.
    pub client_cert: Option<PathBuf>,
    pub client_key: Option<PathBuf>,
    /// The name the server's certificate must hold, instead of the URL's host.
    pub server_name: Option<String>,
}

impl XdsSettings {
    /// The defaults for the server at `url` under `node_id`: no TLS files, wait for the first
    /// config, the default backoff.
    pub fn new(url: impl Into<String>, node_id: impl Into<String>) -> Self {
        XdsSettings {
            url: url.into(),
            node_id: node_id.into(),
            tls: ClientTls::default(),
            force_start: false,
            health_requires_config: ConfigRequirement::First,
            min_backoff: DEFAULT_MIN_BACKOFF,
            max_backoff: DEFAULT_MAX_BACKOFF,
            limits: XdsLimits::default(),
        }
    }

    /// Checks the settings as a connection attempt would use them (URL, node id, TLS files
    /// readable and valid), so a mistake stops the start instead of looping on reconnects.
    pub fn check(&self) -> Result<(), XdsError> {
        if self.node_id.trim().is_empty() {
            return Err(XdsError::NodeId);
        }
        endpoint::endpoint(self).map(|_| ())
    }
}

/// The xDS source as the server runs it: the settings, and how its configs are compiled.
#[derive(Debug, Clone)]
pub struct XdsSource {
    pub settings: XdsSettings,
    /// The same options a file config would be loaded with (domain merging, default headers).
    pub load: LoadOptions,
}

/// What the client updates: the engine it swaps configs into, the readiness it reports to,
/// and `applied`, set once the first config serves (the gRPC server waits for it unless
/// forced to start).
pub struct Context {
    pub source: XdsSource,
    pub engine: Arc<Engine>,
    pub readiness: Arc<Readiness>,
    pub applied: watch::Sender<bool>,
}

impl Context {
    fn server(&self) -> &str {
        &self.source.settings.url
    }

    /// Tells readiness why there is no config yet (only before the first one).
    fn pending(&self, why: impl std::fmt::Display) {
        if !self.engine.is_configured() {
            self.readiness
                .set_config_pending(format!("xDS server {}: {why}", self.server()));
        }
    }
}

/// Subscribes, applies every response and reconnects after every failure, until `stop` is
/// cancelled.
pub async fn run(ctx: Context, stop: CancellationToken) {
    let settings = &ctx.source.settings;
    let new_backoff = || {
        ExponentialBuilder::default()
            .with_min_delay(settings.min_backoff)
            .with_max_delay(settings.max_backoff.max(settings.min_backoff))
            .with_jitter()
            .without_max_times()
            .build()
    };
    tracing::info!(
        server = ctx.server(),
        node_id = %settings.node_id,
        resource_type = RATE_LIMIT_CONFIG_TYPE,
        "xds: subscribing to the limits"
    );
    let mut served_version = String::new();
    let mut backoff = new_backoff();
    loop {
        let ended = session::run(&ctx, &mut served_version, &stop).await;
        metrics::record_xds_connected(false);
        let session::Ended::Broken { reason, delivered } = ended else {
            return;
        };
        metrics::record_xds_stream_failure();
        if delivered {
            // The stream worked for a while: start the delays over.
            backoff = new_backoff();
        }
        let delay = backoff.next().unwrap_or(settings.max_backoff);
        tracing::warn!(
            server = ctx.server(),
            error = %reason,
            retry_in_ms = delay.as_millis() as u64,
            "xds: no stream to the management server; reconnecting"
        );
        ctx.pending(&reason);
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            () = stop.cancelled() => return,
        }
    }
}

/// Characters of a server-chosen string (a version, one config error) shown in a log line, a
/// NACK or `/readyz`; a longer one is cut and ends in `~`. The management server chooses
/// them, and a 5 MB `version_info` must not become a 5 MB log line.
pub const MAX_SHOWN_CHARS: usize = 512;

/// `text` cut to [`MAX_SHOWN_CHARS`] characters (then `~`).
fn shown(text: &str) -> std::borrow::Cow<'_, str> {
    match text.char_indices().nth(MAX_SHOWN_CHARS) {
        None => text.into(),
        Some((end, _)) => format!("{}~", &text[..end]).into(),
    }
}

/// An error and its sources, joined: transport errors say little at the top ("transport
/// error") and everything at the bottom ("invalid peer certificate: UnknownIssuer").
fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.ends_with(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}
