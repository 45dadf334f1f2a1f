//! Envoy Gateway's side of the contract, as it builds it (read from its sources:
//! `internal/crypto/certgen.go`, `internal/xds/translator/ratelimit.go`):
//!
//! - [`GatewayPki`]: the certificates of its certgen, made with rcgen: one self-signed RSA
//!   CA (CN `envoy-gateway`), leaf certificates with RSA 2048 keys written as PKCS#1 PEM
//!   (`RSA PRIVATE KEY`), key usages but no extended key usage, and its names (`*.NAMESPACE`
//!   for Envoy and the rate limiter, the service's names for envoy-gateway).
//! - [`ratelimit_cluster`]: the cluster Envoy calls the rate limiter through: HTTP/2 and an
//!   `UpstreamTlsContext` with the client certificate and the CA read from files; no SNI, no
//!   ALPN, no name check and no TLS parameters, so Envoy negotiates TLS 1.2 at most.
//! - [`ratelimit_filter`], [`route`]: the filter (one per listener, the listener's name as
//!   domain, `X-RateLimit-*` headers, fail closed) and a route whose rule has a request cost of
//!   0 (a check) and a response cost charged when the stream is done (`apply_on_stream_done`,
//!   here from the response header `x-tokens`), in `RateLimitPerRoute`.
//! - [`limits_yaml`], [`limits_config`]: the limits it pushes for that route, as
//!   envoyproxy/ratelimit's YAML and as the xDS resource: the route descriptor (key and value
//!   the route's name) over the rule's descriptor, the limit on the last one.
//! - [`tokens_left`]: the route's budget asked of the rate limiter directly (a check of 0 hits
//!   over mutual TLS with Envoy's certificate).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose,
};
use rsa::pkcs1::{EncodeRsaPrivateKey, LineEnding};
use rsa::pkcs8::EncodePrivateKey;
use serde_json::{Value, json};
use sluice::proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use sluice::proto::ratelimit::config::ratelimit::v3::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

use super::rpc::{descriptor, request};

use super::envoy_config::{
    generic_key, grpc_cluster, http_listener, merge, ratelimit_filter as filter,
};

/// The namespace of the test's "cluster".
pub const NAMESPACE: &str = "envoy-gateway-system";
/// A listener name (the domain) and a route name in Envoy Gateway's spelling.
pub const DOMAIN: &str = "default/eg/http";
pub const ROUTE: &str = "httproute/default/llm/rule/0/match/0/www_example_com";
/// The descriptor of a rule without matches (`rule-N-match--1`).
pub const RULE: &str = "rule-0-match--1";
/// The cluster name Envoy Gateway gives the rate-limit service.
pub const CLUSTER: &str = "ratelimit_cluster";

/// A certificate and its key as files and texts (the shape the xDS double takes).
pub use super::certs::Issued as Pem;

pub struct GatewayPki {
    pub ca: PathBuf,
    pub ca_pem: String,
    /// The rate limiter's certificate (Secret `envoy-rate-limit`): its gRPC server and its
    /// xDS client. Also names 127.0.0.1, for the tests' own clients (Envoy checks no name,
    /// and no client could match `*.NAMESPACE` to a service name of several labels).
    pub ratelimit: Pem,
    /// Envoy's (Secret `envoy`): its client certificate to the rate limiter.
    pub envoy: Pem,
    /// envoy-gateway's (Secret `envoy-gateway`): its xDS server. Also names 127.0.0.1, which
    /// the tests dial instead of the service name.
    pub gateway: Pem,
}

impl GatewayPki {
    /// A CA named `name` (a second one stands for another cluster's) and its three leaves,
    /// written under `dir/NAME/`.
    pub fn new(dir: &Path, name: &str) -> GatewayPki {
        let dir = dir.join(name);
        std::fs::create_dir_all(&dir).expect("PKI directory");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params
            .distinguished_name
            .push(DnType::CommonName, "envoy-gateway");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        let (key, _) = rsa_key();
        let ca = CertifiedIssuer::self_signed(params, key).expect("CA certificate");
        let ca_path = dir.join("ca.crt");
        std::fs::write(&ca_path, ca.pem()).expect("write the CA certificate");
        let wildcard = format!("*.{NAMESPACE}");
        let gateway = [
            "envoy-gateway".to_owned(),
            format!("envoy-gateway.{NAMESPACE}"),
            format!("envoy-gateway.{NAMESPACE}.svc"),
            format!("envoy-gateway.{NAMESPACE}.svc.cluster.local"),
            "127.0.0.1".to_owned(),
        ];
        GatewayPki {
            ca_pem: ca.pem(),
            ca: ca_path,
            ratelimit: leaf(
                &dir,
                &ca,
                "envoy-rate-limit",
                "*",
                &[&wildcard, "127.0.0.1"],
            ),
            envoy: leaf(&dir, &ca, "envoy", "*", &[&wildcard]),
            gateway: leaf(
                &dir,
                &ca,
                "envoy-gateway",
                "envoy-gateway",
                &gateway.iter().map(String::as_str).collect::<Vec<_>>(),
            ),
        }
    }

    /// The files of the Secret `envoy-rate-limit` as the rate limiter's pod mounts it.
    pub fn ratelimit_secret(&self) -> [(&'static str, &str); 3] {
        [
            ("tls.crt", self.ratelimit.cert_pem.as_str()),
            ("tls.key", self.ratelimit.key_pem.as_str()),
            ("ca.crt", self.ca_pem.as_str()),
        ]
    }
}

/// A new RSA 2048 key, for rcgen and as certgen writes it (PKCS#1 PEM, `RSA PRIVATE KEY`).
fn rsa_key() -> (KeyPair, String) {
    let key = rsa::PrivateKey::new(&mut getrandom::SysRng, 2048).expect("RSA key");
    let pkcs8 = key.to_pkcs8_der().expect("PKCS#8 encoding");
    let pkcs1 = key.to_pkcs1_pem(LineEnding::LF).expect("PKCS#1 encoding");
    let pair = KeyPair::try_from(pkcs8.as_bytes()).expect("rcgen takes the RSA key");
    (pair, pkcs1.to_string())
}

/// A leaf `dir/FILE.crt` and `dir/FILE.key` with common name `cn` and the subject
/// alternative names `sans` (an IP address is an IP name, anything else a DNS name), signed by
/// `ca`: certgen's key usages, no extended key usage.
fn leaf(
    dir: &Path,
    ca: &CertifiedIssuer<'static, KeyPair>,
    file: &str,
    cn: &str,
    sans: &[&str],
) -> Pem {
    let sans: Vec<String> = sans.iter().map(|s| (*s).to_owned()).collect();
    let mut params = CertificateParams::new(sans).expect("leaf params");
    params.distinguished_name.push(DnType::CommonName, cn);
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
        KeyUsagePurpose::DataEncipherment,
        KeyUsagePurpose::ContentCommitment,
    ];
    let (key, key_pem) = rsa_key();
    let cert_pem = params.signed_by(&key, ca).expect("sign the leaf").pem();
    let (cert, key) = (
        dir.join(format!("{file}.crt")),
        dir.join(format!("{file}.key")),
    );
    std::fs::write(&cert, &cert_pem).expect("write the certificate");
    std::fs::write(&key, &key_pem).expect("write the key");
    Pem {
        cert,
        key,
        cert_pem,
        key_pem,
    }
}

/// The rate-limit service's cluster, to `addr`, presenting `client` and trusting `ca`, with
/// Envoy Gateway's connect timeout for its clusters (10 s; the TLS handshake counts in it).
pub fn ratelimit_cluster(addr: std::net::SocketAddr, client: &Pem, ca: &Path) -> Value {
    let mut cluster = grpc_cluster(CLUSTER, &[addr]);
    cluster["connect_timeout"] = json!("10s");
    cluster["transport_socket"] = json!({
        "name": "envoy.transport_sockets.tls",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
            "common_tls_context": {
                "tls_certificates": [{
                    "certificate_chain": {"filename": client.cert},
                    "private_key": {"filename": client.key},
                }],
                "validation_context": {"trusted_ca": {"filename": ca}},
            },
        },
    });
    cluster
}

/// The listener's rate-limit filter: domain [`DOMAIN`], `X-RateLimit-*` headers, fail
/// closed, `timeout_ms` (tests raise Envoy Gateway's 20 ms default: a debug build on a busy
/// machine misses it now and then).
pub fn ratelimit_filter(timeout_ms: u64) -> Value {
    filter(
        DOMAIN,
        CLUSTER,
        timeout_ms,
        true,
        json!({"enable_x_ratelimit_headers": "DRAFT_VERSION_03"}),
    )
}

/// The route `/` to `app` with Envoy Gateway's `RateLimitPerRoute` for a rule with a request
/// cost of 0 and a response cost from the response header `x-tokens`.
pub fn route(app: &str) -> Value {
    let actions = json!([generic_key(ROUTE, ROUTE), generic_key(RULE, RULE)]);
    let mut r = json!({
        "name": ROUTE,
        "match": {"prefix": "/"},
        "route": {"cluster": app},
    });
    merge(
        &mut r,
        json!({"typed_per_filter_config": {"envoy.filters.http.ratelimit": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimitPerRoute",
            "rate_limits": [
                {"actions": actions, "hits_addend": {"number": 0}},
                {
                    "actions": actions,
                    "apply_on_stream_done": true,
                    "hits_addend": {"format": "%RESP(x-tokens)%"},
                },
            ],
        }}}),
    );
    r
}

/// The listener `gateway` with [`route`] and [`ratelimit_filter`].
pub fn listener(app: &str, timeout_ms: u64) -> Value {
    http_listener(
        "gateway",
        vec![route(app)],
        vec![ratelimit_filter(timeout_ms)],
    )
}

/// The limits Envoy Gateway sends for [`ROUTE`]'s rule: `requests` per `unit`.
pub fn limits_yaml(requests: u32, unit: &str) -> String {
    format!(
        "domain: {DOMAIN}\ndescriptors:\n  - key: {ROUTE}\n    value: {ROUTE}\n    descriptors:\n      \
         - key: {RULE}\n        value: {RULE}\n        rate_limit:\n          unit: {unit}\n          \
         requests_per_unit: {requests}\n"
    )
}

/// [`limits_yaml`] as the xDS resource Envoy Gateway pushes (its name is the domain).
pub fn limits_config(requests: u32, unit: RateLimitUnit) -> RateLimitConfig {
    let rule = RateLimitDescriptor {
        key: RULE.into(),
        value: RULE.into(),
        rate_limit: Some(RateLimitPolicy {
            unit: unit as i32,
            requests_per_unit: requests,
            ..RateLimitPolicy::default()
        }),
        ..RateLimitDescriptor::default()
    };
    RateLimitConfig {
        name: DOMAIN.into(),
        domain: DOMAIN.into(),
        descriptors: vec![RateLimitDescriptor {
            key: ROUTE.into(),
            value: ROUTE.into(),
            descriptors: vec![rule],
            ..RateLimitDescriptor::default()
        }],
    }
}

/// A channel to the rate limiter's gRPC port on `addr` (its certificate names 127.0.0.1), over
/// mutual TLS with Envoy's certificate.
pub async fn channel(
    addr: SocketAddr,
    pki: &GatewayPki,
) -> Result<Channel, tonic::transport::Error> {
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&pki.ca_pem))
        .identity(Identity::from_pem(&pki.envoy.cert_pem, &pki.envoy.key_pem))
        .domain_name("127.0.0.1");
    Channel::from_shared(format!("https://{addr}"))
        .expect("URI")
        .tls_config(tls)
        .expect("client TLS")
        .connect()
        .await
}

/// A check of 0 hits on [`ROUTE`]'s budget at the rate limiter on `addr` ([`channel`]): the
/// tokens left, or the status.
pub async fn check(addr: SocketAddr, pki: &GatewayPki) -> Result<u32, tonic::Status> {
    let channel = channel(addr, pki)
        .await
        .expect("mutual TLS to the rate limiter");
    let mut check = descriptor(&[(ROUTE, ROUTE), (RULE, RULE)]);
    check.hits_addend = Some(0);
    let response = RateLimitServiceClient::new(channel)
        .should_rate_limit(request(DOMAIN, vec![check]))
        .await?
        .into_inner();
    Ok(response.statuses[0].limit_remaining)
}

/// The tokens left in [`ROUTE`]'s budget ([`check`], which must succeed).
pub async fn tokens_left(addr: SocketAddr, pki: &GatewayPki) -> u32 {
    check(addr, pki).await.expect("a check of 0 hits")
}

/// Waits (2 s at most) until [`tokens_left`] is `want`: Envoy sends a stream-done charge after
/// the response, without waiting for its answer.
pub async fn until_tokens_left(addr: SocketAddr, pki: &GatewayPki, want: u32) {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let left = tokens_left(addr, pki).await;
        if left == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{left} tokens left, expected {want}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
