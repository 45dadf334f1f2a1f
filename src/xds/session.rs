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

use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;

use super::resources::{self, Rejection, MAX_RESPONSE_BYTES};
use super::{endpoint, error_chain, stopped, Context, RATE_LIMIT_CONFIG_TYPE};
use crate::config::Config;
use crate::metrics;
use crate::proto::envoy::config::core::v3::{node::UserAgentVersionType, Node};
use crate::proto::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
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
    stop: &mut watch::Receiver<bool>,
) -> Ended {
    let broken = |reason: String, delivered| Ended::Broken { reason, delivered };
    let endpoint = match endpoint::endpoint(&ctx.source.settings) {
        Ok(endpoint) => endpoint,
        Err(err) => return broken(err.to_string(), false),
    };
    let channel = tokio::select! {
        connected = endpoint.connect() => connected,
        _ = stopped(stop) => return Ended::Stopped,
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
    let mut client = AggregatedDiscoveryServiceClient::new(channel)
        .max_decoding_message_size(MAX_RESPONSE_BYTES);
    let call = tokio::select! {
        call = client.stream_aggregated_resources(ReceiverStream::new(outbound)) => call,
        _ = stopped(stop) => return Ended::Stopped,
    };
    let mut inbound = match call {
        Ok(response) => response.into_inner(),
        Err(status) => return broken(status_text(&status), false),
    };
    let mut delivered = false;
    loop {
        let next = tokio::select! {
            next = inbound.message() => next,
            _ = stopped(stop) => return Ended::Stopped,
        };
        let response = match next {
            Ok(Some(response)) => response,
            Ok(None) => return broken("the management server ended the stream".into(), delivered),
            Err(status) => return broken(status_text(&status), delivered),
        };
        delivered = true;
        let answer = apply(ctx, response, served_version).await;
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
    let compiled = tokio::task::spawn_blocking(move || resources::compile(&response, load))
        .await
        .unwrap_or_else(|err| {
            Err(Rejection {
                kind: metrics::XdsRejection::InvalidConfig,
                errors: vec![format!("compiling the config failed: {err}")],
            })
        });
    match compiled {
        Ok(config) => {
            served(ctx, &version, config);
            served_version.clone_from(&version);
            request(ctx, served_version, nonce, None)
        }
        Err(rejection) => {
            metrics::record_xds_rejected(rejection.kind);
            // Each error as check-config prints a file's: `xds:RESOURCE: RULE: MESSAGE`.
            for error in &rejection.errors {
                tracing::error!(
                    server = ctx.server(),
                    version = %version,
                    error = %error,
                    "xds: config rejected (NACK); keeping the previous config"
                );
            }
            let first = rejection.errors.first().map_or("", String::as_str);
            ctx.pending(format_args!("version {version} rejected: {first}"));
            let detail = Status {
                code: INVALID_ARGUMENT,
                message: rejection.detail(),
                details: Vec::new(),
            };
            request(ctx, served_version, nonce, Some(detail))
        }
    }
}

/// Swaps `config` in and records it.
fn served(ctx: &Context, version: &str, config: Config) {
    let config = Arc::new(config);
    ctx.engine.replace_config_arc(config.clone());
    ctx.readiness.set_config_loaded();
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
