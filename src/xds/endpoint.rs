//! The connection to the management server: the URL's scheme decides plaintext (`http`) or TLS
//! (`https`: rustls through tonic, ALPN h2, the CA file or the system roots, the client
//! certificate, the server name override).
//!
//! Why rebuilt for every connection attempt: the TLS files are read each time, so a rotated
//! certificate (a Kubernetes Secret updated in place) is picked up at the next reconnect
//! without a restart, and a file that turned unreadable is named in the reconnect's log line.

use std::time::Duration;

use tonic::codegen::http::uri::{InvalidUri, Uri};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

use super::XdsSettings;
use crate::pem::{self, PemError};

/// Bound on TCP connect plus TLS handshake.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// HTTP/2 pings on an idle stream: a management server that vanished without closing the
/// connection (a node lost) is noticed within interval + timeout, then reconnected.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// What is wrong with the xDS settings (each message names the flag or the file).
#[derive(Debug, thiserror::Error)]
pub enum XdsError {
    #[error("--config-xds `{url}`: {reason}")]
    Url { url: String, reason: String },
    #[error("--config-xds-node-id is empty: the management server keys its configs by it")]
    NodeId,
    #[error("{flag} is set but --config-xds `{url}` is not https://: TLS files need an https URL")]
    TlsWithoutHttps { flag: &'static str, url: String },
    #[error(
        "--config-xds-client-cert and --config-xds-client-key go together; only {given} is set"
    )]
    HalfIdentity { given: &'static str },
    #[error(transparent)]
    Pem(#[from] PemError),
    #[error("xDS client TLS: {0}")]
    Tls(String),
}

/// The endpoint for one connection attempt, TLS files read now.
pub(super) fn endpoint(settings: &XdsSettings) -> Result<Endpoint, XdsError> {
    let url_error = |reason: &str| XdsError::Url {
        url: settings.url.clone(),
        reason: reason.to_owned(),
    };
    let uri: Uri = settings
        .url
        .parse()
        .map_err(|e: InvalidUri| url_error(&e.to_string()))?;
    if uri.authority().is_none() {
        return Err(url_error(
            "expected http://HOST:PORT (plaintext) or https://HOST:PORT (TLS)",
        ));
    }
    let https = match uri.scheme_str() {
        Some("https") => true,
        Some("http") => false,
        _ => {
            return Err(url_error(
                "the scheme must be http:// (plaintext) or https:// (TLS)",
            ));
        }
    };
    let tls = &settings.tls;
    if !https {
        let set = [
            ("--config-xds-ca-file", tls.ca_file.is_some()),
            ("--config-xds-client-cert", tls.client_cert.is_some()),
            ("--config-xds-client-key", tls.client_key.is_some()),
            ("--config-xds-server-name", tls.server_name.is_some()),
        ];
        if let Some((flag, _)) = set.iter().find(|(_, given)| *given) {
            return Err(XdsError::TlsWithoutHttps {
                flag,
                url: settings.url.clone(),
            });
        }
    }
    let endpoint = Endpoint::from(uri)
        .connect_timeout(CONNECT_TIMEOUT)
        .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
        .keep_alive_timeout(KEEPALIVE_TIMEOUT)
        .keep_alive_while_idle(true);
    if !https {
        return Ok(endpoint);
    }
    let mut config = ClientTlsConfig::new();
    config = match &tls.ca_file {
        Some(path) => {
            let ca = pem::read_ca_bundle("--config-xds-ca-file", path)?;
            config.ca_certificate(Certificate::from_pem(ca.bytes()))
        }
        None => config.with_native_roots(),
    };
    match (&tls.client_cert, &tls.client_key) {
        (Some(cert), Some(key)) => {
            let (cert, key) = pem::read_identity(
                ("--config-xds-client-cert", cert),
                ("--config-xds-client-key", key),
            )?;
            config = config.identity(Identity::from_pem(cert.bytes(), key.bytes()));
        }
        (Some(_), None) => {
            return Err(XdsError::HalfIdentity {
                given: "--config-xds-client-cert",
            });
        }
        (None, Some(_)) => {
            return Err(XdsError::HalfIdentity {
                given: "--config-xds-client-key",
            });
        }
        (None, None) => {}
    }
    if let Some(name) = &tls.server_name {
        config = config.domain_name(name.clone());
    }
    // Builds the rustls config now: a key that does not go with the certificate fails here.
    endpoint
        .tls_config(config)
        .map_err(|e| XdsError::Tls(super::error_chain(&e)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(settings: &XdsSettings) -> String {
        match endpoint(settings) {
            Ok(_) => "ok".into(),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn urls_and_tls_files_are_checked_with_the_flag_named() {
        let plain = XdsSettings::new("http://127.0.0.1:18001", "n");
        assert_eq!(check(&plain), "ok");
        let no_scheme = XdsSettings::new("envoy-gateway:18001", "n");
        assert!(
            check(&no_scheme).contains("the scheme must be http:// (plaintext) or https://"),
            "{}",
            check(&no_scheme)
        );
        let mut tls_on_http = plain.clone();
        tls_on_http.tls.client_cert = Some("/c.pem".into());
        assert_eq!(
            check(&tls_on_http),
            "--config-xds-client-cert is set but --config-xds `http://127.0.0.1:18001` is not \
             https://: TLS files need an https URL"
        );
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("ca.pem");
        let mut https = XdsSettings::new("https://xds.example:443", "n");
        https.tls.ca_file = Some(missing.clone());
        assert!(check(&https).starts_with(&format!(
            "reading --config-xds-ca-file {}: ",
            missing.display()
        )));
        // The PEM files are checked here, named, not left to the TLS stack.
        std::fs::write(&missing, "not a certificate").unwrap();
        assert_eq!(
            check(&https),
            format!(
                "--config-xds-ca-file {}: holds no CERTIFICATE block",
                missing.display()
            )
        );
        https.tls.ca_file = None;
        https.tls.client_key = Some(missing.clone());
        assert!(check(&https).contains(
            "--config-xds-client-key go together; only \
                                       --config-xds-client-key is set"
        ));
        https.tls.client_cert = Some(missing.clone());
        assert_eq!(
            check(&https),
            format!(
                "--config-xds-client-cert {}: holds no CERTIFICATE block",
                missing.display()
            )
        );
    }
}
