use std::path::Path;

use rcgen::{CertificateParams, CertifiedIssuer, IsCa, KeyPair};

use super::*;

/// A CA and a leaf for `name` it signs, as PEM texts (CA, leaf certificate, leaf key).
fn issue(name: &str) -> (String, String, String) {
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec![name.to_owned()])
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
    (ca.pem(), leaf.pem(), key.serialize_pem())
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn load_error(settings: TlsSettings) -> String {
    ServerTls::load(settings).expect_err("refused").to_string()
}

#[test]
fn start_up_errors_name_the_flag_and_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, cert, key) = issue("sluice.test");
    let (_, other_cert, _) = issue("other.test");
    let cert = write(dir.path(), "tls.crt", &cert);
    let key = write(dir.path(), "tls.key", &key);
    let ca = write(dir.path(), "ca.crt", &ca);
    let missing = dir.path().join("missing.crt");
    let text = write(dir.path(), "text.pem", "not a certificate\n");

    let err = load_error(TlsSettings::new(&missing, &key));
    assert!(
        err.starts_with(&format!("reading --grpc-tls-cert {}: ", missing.display())),
        "{err}"
    );
    assert_eq!(
        load_error(TlsSettings::new(&text, &key)),
        format!(
            "--grpc-tls-cert {}: holds no CERTIFICATE block",
            text.display()
        )
    );
    assert_eq!(
        load_error(TlsSettings::new(&cert, &text)),
        format!(
            "--grpc-tls-key {}: holds no PRIVATE KEY, RSA PRIVATE KEY or EC PRIVATE KEY block",
            text.display()
        )
    );
    let other = write(dir.path(), "other.crt", &other_cert);
    let err = load_error(TlsSettings::new(&other, &key));
    assert!(
        err.starts_with(&format!(
            "--grpc-tls-key {} does not go with --grpc-tls-cert {}: ",
            key.display(),
            other.display()
        )),
        "{err}"
    );
    let mut settings = TlsSettings::new(&cert, &key);
    settings.client_san = Some("envoy.test".into());
    assert!(load_error(settings.clone()).starts_with("--grpc-client-san needs --grpc-client-ca"));
    settings.client_ca = vec![text.clone()];
    assert_eq!(
        load_error(settings.clone()),
        format!(
            "--grpc-client-ca {}: holds no CERTIFICATE block",
            text.display()
        )
    );
    settings.client_ca = vec![ca.clone()];
    settings.client_san = Some("not a name!".into());
    assert_eq!(
        load_error(settings.clone()),
        "--grpc-client-san `not a name!` is not a DNS name or an IP address"
    );
    settings.client_san = Some("10.0.0.1".into());
    let tls = ServerTls::load(settings).expect("an IP address is a name");
    assert!(tls.verifies_clients());
    assert_eq!(tls.config().alpn_protocols, vec![b"h2".to_vec()]);
}

#[test]
fn a_change_is_loaded_once_and_a_broken_one_reported_once() {
    let dir = tempfile::tempdir().unwrap();
    let (_, cert, key) = issue("one.test");
    let cert_path = write(dir.path(), "tls.crt", &cert);
    let key_path = write(dir.path(), "tls.key", &key);
    let tls = ServerTls::load(TlsSettings::new(&cert_path, &key_path)).unwrap();
    let mut watcher = tls.watcher();
    let first = tls.config();
    assert!(matches!(watcher.poll(), Poll::Unchanged));
    assert!(Arc::ptr_eq(&first, &tls.config()));

    let (_, cert, key) = issue("two.test");
    write(dir.path(), "tls.crt", &cert);
    write(dir.path(), "tls.key", &key);
    assert!(matches!(watcher.poll(), Poll::Reloaded(_)));
    let second = tls.config();
    assert!(!Arc::ptr_eq(&first, &second));
    assert!(matches!(watcher.poll(), Poll::Unchanged));

    // A key of another certificate: reported once, the second config keeps serving.
    let (_, _, stray) = issue("three.test");
    write(dir.path(), "tls.key", &stray);
    match watcher.poll() {
        Poll::Rejected(TlsError::Identity { .. }) => {}
        other => panic!("expected the mismatch reported: {other:?}"),
    }
    assert!(matches!(watcher.poll(), Poll::Unchanged), "reported once");
    assert!(Arc::ptr_eq(&second, &tls.config()));
    // A vanished file is reported once too.
    std::fs::remove_file(&key_path).unwrap();
    assert!(matches!(
        watcher.poll(),
        Poll::Rejected(TlsError::Pem(PemError::Read { .. }))
    ));
    assert!(matches!(watcher.poll(), Poll::Unchanged));
    // Fixed: loaded.
    write(dir.path(), "tls.key", &key);
    assert!(
        matches!(watcher.poll(), Poll::Unchanged),
        "the files that serve, again"
    );
    let (_, cert, key) = issue("four.test");
    write(dir.path(), "tls.crt", &cert);
    write(dir.path(), "tls.key", &key);
    assert!(matches!(watcher.poll(), Poll::Reloaded(_)));
}
