//! One ADS stream: connect, subscribe, then apply and ACK (or NACK) each response until the
//! stream ends.
//!
//! The requests, as envoyproxy/ratelimit's client and Envoy send them: the first carries the
//! node, the type URL, no resource names (wildcard), the version served (empty before the
//! first config) and no nonce; each later one answers one response with its nonce: an ACK
//! carries the response's version, a NACK the version still served and `error_detail`
//! (`INVALID_ARGUMENT`, the problems one per line).

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

use prost::Message;

#[cfg(doc)]
use super::MAX_SHOWN_CHARS;
use super::resources::{self, MAX_LOGGED_ERRORS, Rejection};
use super::shown;
use super::{Context, RATE_LIMIT_CONFIG_TYPE, bounds, endpoint, error_chain, stream};
use crate::config::Config;
use crate::grpc::codec::decode_error;
use crate::metrics;
use crate::proto::envoy::config::core::v3::{Node, node::UserAgentVersionType};
use crate::proto::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use crate::proto::google::rpc::Status;

/// How a session ended.
pub(super) enum Ended {
    /// Shutdown was asked for.
    Stopped,
    /// The connection could not be made, or the stream broke; `delivered` when it had carried
    /// at least one response.
    Broken { reason: String, delivered: bool },
}

/// `google.rpc.Code.INVALID_ARGUMENT`, the code of a NACK's `error_detail`.
const INVALID_ARGUMENT: i32 = 3;

/// Runs one stream until it ends. `served_version` is the version of the config being served
/// (sent on subscribing, updated on each ACK).
pub(super) async fn run(
    ctx: &Context,
    served_version: &mut String,
    stop: &CancellationToken,
) -> Ended {
    let broken = |reason: String, delivered| Ended::Broken { reason, delivered };
    let endpoint = match endpoint::endpoint(&ctx.source.settings) {
        Ok(endpoint) => endpoint,
        Err(err) => return broken(err.to_string(), false),
    };
    let channel = tokio::select! {
        connected = endpoint.connect() => connected,
        () = stop.cancelled() => return Ended::Stopped,
    };
    let channel = match channel {
        Ok(channel) => channel,
        Err(err) => return broken(format!("connecting failed: {}", error_chain(&err)), false),
    };
    metrics::record_xds_connected(true);
    tracing::info!(
        server = ctx.server(),
        "xds: connected to the management server"
    );

    // Requests go out through a channel the stream reads; dropping `requests` (at the end of
    // this function) half-closes the stream.
    let (requests, outbound) = mpsc::channel(4);
    let subscribe = request(ctx, served_version, String::new(), None);
    if requests.try_send(subscribe).is_err() {
        return broken("the request channel closed".into(), false);
    }
    let call = tokio::select! {
        call = stream::open(channel, ReceiverStream::new(outbound)) => call,
        () = stop.cancelled() => return Ended::Stopped,
    };
    let mut inbound = match call {
        Ok(inbound) => inbound,
        Err(status) => return broken(status_text(&status), false),
    };
    let mut delivered = false;
    loop {
        let next = tokio::select! {
            next = inbound.message() => next,
            () = stop.cancelled() => return Ended::Stopped,
        };
        let bytes = match next {
            Ok(Some(bytes)) => bytes,
            Ok(None) => return broken("the management server ended the stream".into(), delivered),
            Err(status) => return broken(status_text(&status), delivered),
        };
        delivered = true;
        let answer = if let Err(breach) = bounds::check(&bytes, ctx.source.settings.limits) {
            refuse(ctx, bounds::header(&bytes), breach, served_version)
        } else {
            match DiscoveryResponse::decode(bytes) {
                Ok(response) => apply(ctx, response, served_version).await,
                Err(err) => return broken(status_text(&decode_error(err)), delivered),
            }
        };
        if requests.send(answer).await.is_err() {
            return broken("the stream closed".into(), delivered);
        }
    }
}

/// Applies one response (or not) and returns its ACK (or NACK).
async fn apply(
    ctx: &Context,
    response: DiscoveryResponse,
    served_version: &mut String,
) -> DiscoveryRequest {
    let load = ctx.source.load;
    let version = response.version_info.clone();
    let nonce = response.nonce.clone();
    // Compiling every domain's limits is CPU work off the request path's threads.
    let compiled = tokio::task::spawn_blocking(move || resources::compile(response, load))
        .await
        .unwrap_or_else(|err| {
            Err(Rejection {
                kind: metrics::XdsRejection::InvalidConfig,
                errors: vec![format!("compiling the config failed: {err}")],
            })
        });
    match compiled {
        Ok(config) => {
            served(ctx, &shown(&version), config);
            served_version.clone_from(&version);
            request(ctx, served_version, nonce, None)
        }
        Err(rejection) => nack(ctx, &version, nonce, rejection, served_version),
    }
}

/// The NACK of a response over a bound of [`bounds`], which was not decoded.
fn refuse(
    ctx: &Context,
    header: bounds::Header,
    breach: String,
    served_version: &str,
) -> DiscoveryRequest {
    let rejection = Rejection {
        kind: metrics::XdsRejection::TooLarge,
        errors: vec![breach],
    };
    nack(
        ctx,
        &header.version_info,
        header.nonce,
        rejection,
        served_version,
    )
}

/// Records and logs a rejection; returns its NACK.
///
/// The log is bounded like the NACK's detail: the first [`MAX_LOGGED_ERRORS`] problems, each
/// cut to [`MAX_SHOWN_CHARS`], then one line counting the rest, so a push of 50,000 broken
/// rules writes 21 lines, not 50,000. The version is cut the same way wherever it is shown.
fn nack(
    ctx: &Context,
    version: &str,
    nonce: String,
    rejection: Rejection,
    served_version: &str,
) -> DiscoveryRequest {
    metrics::record_xds_rejected(rejection.kind);
    let shown_version = shown(version);
    // Each error as check-config prints a file's: `xds:RESOURCE: RULE: MESSAGE`.
    for error in rejection.errors.iter().take(MAX_LOGGED_ERRORS) {
        tracing::error!(
            server = ctx.server(),
            version = %shown_version,
            error = %shown(error),
            "xds: config rejected (NACK); keeping the previous config"
        );
    }
    if let Some(more) = rejection.errors.len().checked_sub(MAX_LOGGED_ERRORS)
        && more > 0
    {
        tracing::error!(
            server = ctx.server(),
            version = %shown_version,
            errors = rejection.errors.len(),
            not_logged = more,
            "xds: config rejected (NACK); more errors than logged"
        );
    }
    let first = rejection.errors.first().map_or("".into(), |e| shown(e));
    ctx.pending(format_args!("version {shown_version} rejected: {first}"));
    let detail = Status {
        code: INVALID_ARGUMENT,
        message: rejection.detail(),
        details: Vec::new(),
    };
    request(ctx, served_version, nonce, Some(detail))
}

/// Swaps `config` in and records it.
fn served(ctx: &Context, version: &str, config: Config) {
    let config = Arc::new(config);
    ctx.engine.replace_config_arc(config.clone());
    ctx.readiness.set_config_loaded(config.domains().count());
    ctx.applied.send_replace(true);
    let unix_now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO);
    metrics::record_xds_applied(ctx.server(), version, &config, unix_now);
}

fn request(
    ctx: &Context,
    version: &str,
    nonce: String,
    error_detail: Option<Status>,
) -> DiscoveryRequest {
    DiscoveryRequest {
        version_info: version.to_owned(),
        node: Some(Node {
            id: ctx.source.settings.node_id.clone(),
            user_agent_name: "sluice".into(),
            user_agent_version_type: Some(UserAgentVersionType::UserAgentVersion(
                env!("CARGO_PKG_VERSION").into(),
            )),
            ..Node::default()
        }),
        resource_names: Vec::new(),
        type_url: RATE_LIMIT_CONFIG_TYPE.into(),
        response_nonce: nonce,
        error_detail,
    }
}

fn status_text(status: &tonic::Status) -> String {
    let mut detail = status.message().to_owned();
    if let Some(source) = std::error::Error::source(status) {
        let chain = error_chain(source);
        // A transport failure's message is its source's first line: say it once.
        if chain.starts_with(&detail) {
            detail = chain;
        } else {
            detail = format!("{detail}: {chain}");
        }
    }
    format!("stream failed: {:?}: {detail}", status.code())
}
