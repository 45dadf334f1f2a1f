//! The library side of the commands besides `serve`, and of the settings `serve` reads from
//! files: `sluice check-config` ([`check_config`]), `sluice explain` ([`explain`]), the Redis
//! passwords and client certificate named by flags.
//!
//! Why here and not in `main`: what the commands print is what tests check, in process;
//! `main` only parses flags and prints. Serving is [`crate::server`]'s.

use std::path::{Path, PathBuf};

use crate::config::{Config, ConfigErrors, LoadOptions};
use crate::limiter::redis::connect::ClientCert;
use crate::server::StartError;

/// The Redis password from `file` (trailing newline ignored), else `from_env` (the value of
/// `SLUICE_REDIS_PASSWORD`) unless empty, else none (the URL's own, if any, then applies).
/// Never logged.
pub fn redis_password(
    file: Option<&Path>,
    from_env: Option<String>,
) -> Result<Option<String>, StartError> {
    password("Redis password file", file, from_env)
}

/// The sentinels' own password, like [`redis_password`] (`--redis-sentinel-password-file`,
/// else `SLUICE_REDIS_SENTINEL_PASSWORD`).
pub fn sentinel_password(
    file: Option<&Path>,
    from_env: Option<String>,
) -> Result<Option<String>, StartError> {
    password("Redis Sentinel password file", file, from_env)
}

fn password(
    what: &'static str,
    file: Option<&Path>,
    from_env: Option<String>,
) -> Result<Option<String>, StartError> {
    if let Some(path) = file {
        let text = std::fs::read_to_string(path).map_err(|error| StartError::PasswordFile {
            what,
            path: path.to_owned(),
            error,
        })?;
        let password = text.trim_end_matches(['\n', '\r']).to_owned();
        if password.is_empty() {
            return Err(StartError::EmptyPasswordFile {
                what,
                path: path.to_owned(),
            });
        }
        return Ok(Some(password));
    }
    Ok(from_env.filter(|p| !p.is_empty()))
}

/// The client certificate of `--redis-tls-cert` and `--redis-tls-key`: both or neither.
pub fn client_cert(
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
) -> Result<Option<ClientCert>, StartError> {
    match (cert, key) {
        (Some(cert), Some(key)) => Ok(Some(ClientCert { cert, key })),
        (None, None) => Ok(None),
        (Some(_), None) => Err(StartError::HalfClientCert {
            given: "--redis-tls-cert",
            missing: "--redis-tls-key",
        }),
        (None, Some(_)) => Err(StartError::HalfClientCert {
            given: "--redis-tls-key",
            missing: "--redis-tls-cert",
        }),
    }
}

/// `sluice check-config`: the summary line of a valid config.
pub fn check_config(path: &Path, options: LoadOptions) -> Result<String, ConfigErrors> {
    let config = Config::load_with(path, options)?;
    let domains: Vec<&str> = config.domains().collect();
    Ok(format!(
        "{}: ok ({} domain(s): {}; {} limit(s))",
        path.display(),
        domains.len(),
        domains.join(", "),
        config.rule_count()
    ))
}

/// `sluice explain`: the report of [`crate::explain::explain`] for `descriptors` given as
/// `key=value[,key=value...]`, or what stopped it.
pub fn explain(
    path: &Path,
    domain: &str,
    descriptors: &[String],
    buckets: &[String],
) -> Result<String, String> {
    let config = Config::load(path).map_err(|errors| errors.to_string())?;
    let parse = |what: &str, texts: &[String]| {
        texts
            .iter()
            .enumerate()
            .map(|(i, text)| {
                crate::explain::parse_descriptor(text)
                    .map_err(|err| format!("{what} {i} `{text}`: {err}"))
            })
            .collect::<Result<Vec<_>, _>>()
    };
    let descriptors = parse("descriptor", descriptors)?;
    let buckets = parse("bucket", buckets)?;
    let mut out = String::new();
    if !descriptors.is_empty() {
        out.push_str(&crate::explain::explain(&config, domain, &descriptors));
    }
    out.push_str(&crate::explain::explain_buckets(&config, domain, &buckets));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_password_file_wins_over_the_environment() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pw");
        std::fs::write(&file, "from-file\r\n").unwrap();
        let env = Some("from-env".to_owned());
        assert_eq!(
            redis_password(Some(&file), env.clone()).unwrap().as_deref(),
            Some("from-file")
        );
        assert_eq!(
            redis_password(None, env).unwrap().as_deref(),
            Some("from-env")
        );
        assert_eq!(redis_password(None, Some(String::new())).unwrap(), None);
        std::fs::write(&file, "\n").unwrap();
        let err = redis_password(Some(&file), None).unwrap_err();
        assert!(err.to_string().ends_with("is empty"), "{err}");
        let missing = dir.path().join("missing");
        let err = redis_password(Some(&missing), None).unwrap_err();
        assert!(err.to_string().contains("missing"), "{err}");
    }
}
