//! PEM files: the certificates, private keys and CA bundles of every TLS setting (the gRPC
//! server's, the Redis client's, the xDS client's), read from disk with errors that name the
//! flag and the file.
//!
//! Why one module: the three TLS settings read the same kinds of file, and an operator who got
//! one wrong should read the same message whichever setting it was: `reading FLAG PATH: ...`
//! when the file cannot be read, `FLAG PATH: holds no CERTIFICATE block` (or no private key, or
//! not valid PEM) when it can. A [`PemFile`] keeps the bytes it read, so a caller that hands
//! the PEM text on (redis-rs, tonic) or fingerprints it (the certificate reload) checks and
//! uses the same bytes.

use std::path::{Path, PathBuf};

use rustls::RootCertStore;
use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// The largest PEM file read: a certificate chain, a key or a CA bundle (a whole system
/// bundle is about 200 KiB); what is past it is refused rather than read into memory.
pub const MAX_PEM_BYTES: u64 = 4 * 1024 * 1024;

/// Why a PEM file cannot be used; each message names the flag and the file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PemError {
    #[error("reading {flag} {}: {error}", path.display())]
    Read {
        flag: &'static str,
        path: PathBuf,
        error: String,
    },
    #[error("{flag} {}: {what}", path.display())]
    Invalid {
        flag: &'static str,
        path: PathBuf,
        what: String,
    },
}

/// The bytes of one PEM file and the flag that named it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PemFile {
    flag: &'static str,
    path: PathBuf,
    bytes: Vec<u8>,
}

impl PemFile {
    /// Reads `path`, given by `flag`; what it holds is checked when it is asked for.
    pub fn read(flag: &'static str, path: &Path) -> Result<PemFile, PemError> {
        let bytes =
            crate::file::read_regular(path, MAX_PEM_BYTES).map_err(|error| PemError::Read {
                flag,
                path: path.to_owned(),
                error: error.to_string(),
            })?;
        Ok(PemFile {
            flag,
            path: path.to_owned(),
            bytes,
        })
    }

    /// The file's bytes as read.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Every certificate of the file (a chain, leaf first, or a CA bundle); none is an error.
    pub fn certificates(&self) -> Result<Vec<CertificateDer<'static>>, PemError> {
        let certs = CertificateDer::pem_slice_iter(&self.bytes)
            .collect::<Result<Vec<_>, pem::Error>>()
            .map_err(|e| self.invalid(format!("not a valid PEM file: {e}")))?;
        if certs.is_empty() {
            return Err(self.invalid("holds no CERTIFICATE block".into()));
        }
        Ok(certs)
    }

    /// The file's private key: PKCS#8, PKCS#1 (RSA) or SEC1 (EC), the first one found.
    pub fn private_key(&self) -> Result<PrivateKeyDer<'static>, PemError> {
        PrivateKeyDer::from_pem_slice(&self.bytes).map_err(|e| match e {
            pem::Error::NoItemsFound => {
                self.invalid("holds no PRIVATE KEY, RSA PRIVATE KEY or EC PRIVATE KEY block".into())
            }
            other => self.invalid(format!("not a valid PEM file: {other}")),
        })
    }

    /// Adds every certificate of the file, a CA bundle, to `roots`.
    pub fn add_roots_to(&self, roots: &mut RootCertStore) -> Result<(), PemError> {
        for cert in self.certificates()? {
            roots
                .add(cert)
                .map_err(|e| self.invalid(format!("not a usable CA: {e}")))?;
        }
        Ok(())
    }

    fn invalid(&self, what: String) -> PemError {
        PemError::Invalid {
            flag: self.flag,
            path: self.path.clone(),
            what,
        }
    }
}

/// A certificate chain and its private key, both read and checked now.
pub fn read_identity(
    cert: (&'static str, &Path),
    key: (&'static str, &Path),
) -> Result<(PemFile, PemFile), PemError> {
    let cert = PemFile::read(cert.0, cert.1)?;
    cert.certificates()?;
    let key = PemFile::read(key.0, key.1)?;
    key.private_key()?;
    Ok((cert, key))
}

/// A CA bundle, read and checked now (at least one certificate, every block valid).
pub fn read_ca_bundle(flag: &'static str, path: &Path) -> Result<PemFile, PemError> {
    let ca = PemFile::read(flag, path)?;
    ca.certificates()?;
    Ok(ca)
}

#[cfg(test)]
mod tests {
    use rcgen::{CertificateParams, KeyPair};

    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn every_error_names_the_flag_and_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec!["a.test".to_owned()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let cert = write(dir.path(), "tls.crt", &cert.pem());
        let key = write(dir.path(), "tls.key", &key.serialize_pem());
        let text = write(dir.path(), "text.pem", "not a certificate\n");
        let cut = write(dir.path(), "cut.pem", "-----BEGIN CERTIFICATE-----\nMIIB\n");
        let missing = dir.path().join("missing.pem");

        let err = PemFile::read("--a-cert", &missing).unwrap_err().to_string();
        assert!(
            err.starts_with(&format!("reading --a-cert {}: ", missing.display())),
            "{err}"
        );
        let fifo = dir.path().join("fifo.pem");
        assert!(
            std::process::Command::new("mkfifo")
                .arg(&fifo)
                .status()
                .unwrap()
                .success()
        );
        let err = PemFile::read("--a-ca", &fifo).unwrap_err().to_string();
        assert_eq!(
            err,
            format!(
                "reading --a-ca {}: cannot read file: not a regular file (a FIFO)",
                fifo.display()
            )
        );
        let err = read_ca_bundle("--a-ca", &text).unwrap_err().to_string();
        assert_eq!(
            err,
            format!("--a-ca {}: holds no CERTIFICATE block", text.display())
        );
        let err = read_ca_bundle("--a-ca", &cut).unwrap_err().to_string();
        assert!(
            err.starts_with(&format!(
                "--a-ca {}: not a valid PEM file: missing section end marker",
                cut.display()
            )),
            "{err}"
        );
        let err = read_identity(("--a-cert", &cert), ("--a-key", &cert))
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            format!(
                "--a-key {}: holds no PRIVATE KEY, RSA PRIVATE KEY or EC PRIVATE KEY block",
                cert.display()
            )
        );
        let err = read_identity(("--a-cert", &key), ("--a-key", &key))
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            format!("--a-cert {}: holds no CERTIFICATE block", key.display())
        );

        let (chain, private) = read_identity(("--a-cert", &cert), ("--a-key", &key)).unwrap();
        assert_eq!(chain.certificates().unwrap().len(), 1);
        assert_eq!(chain.bytes(), std::fs::read(&cert).unwrap());
        assert!(private.private_key().is_ok());
        let mut roots = RootCertStore::empty();
        read_ca_bundle("--a-ca", &cert)
            .unwrap()
            .add_roots_to(&mut roots)
            .unwrap();
        assert_eq!(roots.len(), 1);
    }
}
