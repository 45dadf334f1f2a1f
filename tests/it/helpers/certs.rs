//! Certificates made by the test itself (rcgen): a private CA, and server or client
//! certificates it signs, written as PEM files into a temporary directory.
//!
//! An IP address given as a name becomes an IP subject alternative name, anything else a DNS
//! name.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

/// What a leaf certificate is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Usage {
    Server,
    Client,
}

/// A certificate and its key, as PEM files.
#[derive(Debug, Clone)]
pub struct Issued {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub cert_pem: String,
    pub key_pem: String,
}

pub struct TestCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
    /// The CA certificate, PEM.
    pub cert: PathBuf,
    pub cert_pem: String,
    dir: PathBuf,
}

impl TestCa {
    /// A self-signed CA named `name`, its certificate written to `dir/NAME-ca.pem`.
    pub fn new(dir: &Path, name: &str) -> TestCa {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, format!("{name} test CA"));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().expect("CA key");
        let issuer = CertifiedIssuer::self_signed(params, key).expect("CA certificate");
        let cert_pem = issuer.pem();
        let cert = dir.join(format!("{name}-ca.pem"));
        std::fs::write(&cert, &cert_pem).expect("write CA certificate");
        TestCa {
            issuer,
            cert,
            cert_pem,
            dir: dir.to_owned(),
        }
    }

    /// A certificate for `names` signed by this CA, written to `FILE.pem` and `FILE-key.pem`
    /// next to the CA's.
    pub fn issue(&self, file: &str, names: &[&str], usage: Usage) -> Issued {
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let mut params = CertificateParams::new(names.clone()).expect("leaf params");
        params.distinguished_name.push(
            DnType::CommonName,
            names.first().cloned().unwrap_or_default(),
        );
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![match usage {
            Usage::Server => ExtendedKeyUsagePurpose::ServerAuth,
            Usage::Client => ExtendedKeyUsagePurpose::ClientAuth,
        }];
        let key = KeyPair::generate().expect("leaf key");
        let cert = params.signed_by(&key, &self.issuer).expect("sign leaf");
        let (cert_pem, key_pem) = (cert.pem(), key.serialize_pem());
        let cert = self.dir.join(format!("{file}.pem"));
        let key = self.dir.join(format!("{file}-key.pem"));
        std::fs::write(&cert, &cert_pem).expect("write certificate");
        std::fs::write(&key, &key_pem).expect("write key");
        Issued {
            cert,
            key,
            cert_pem,
            key_pem,
        }
    }
}
